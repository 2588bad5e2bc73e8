"""Several managers on a real 3-member etcd (docs/operations.md "Several managers";
manager/ha/leader_election.h, manager/ha/etcd_store.h).

TakeoverTest: three managers and two agents on loopback share an etcd started by
scripts/etcd_test_cluster.sh; varunactl and the agents are given all three managers. A job
runs while the leader is SIGKILLed again and again (each time the killed manager is started
again, as its unit would): a new leader is elected each time (the takeover time of every kill
is printed, and the median must be under 5 s), a job submitted just before a kill is there
after it, a submit in flight during a kill ends with a job (exactly one: the request id
makes its retry on the new leader return the first), and the job runs to SUCCEEDED with
every step's loss equal to an uninterrupted run (1e-4) and no step run twice. A stopped leader (SIGSTOP past its lease, then SIGCONT) finds
itself deposed and exits before it changes anything.
MorphTakeoverTest: with TLS on every port, etcd's too (client certificates required), the
leader is killed right after a drain starts a morph; the new leader finishes the morph from
its stored record, the job grows back when the node is undrained, and every step's loss
equals an uninterrupted run.
PartitionTest: the leader runs in a network namespace (lib.cluster.Hosts); its routes
to etcd are cut (blackholed), its links to agents and clients are not. It stops (exit 75)
before another manager is elected (glog's timestamps of both), the job loses no step, and
the old leader rejoins as a standby when its links return.
EtcdTroubleTest: losing one etcd member of three (a raft follower) changes nothing; losing two (no quorum)
leaves no leader (`varunactl managers` says why) while the job's workers keep training; when
the members return a leader is elected and the job finishes.

Without etcd-server installed every class skips (exit 77).
"""

import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import harness  # noqa: E402
from lib.cluster import AGENT, CTL, Hosts, MANAGER  # noqa: E402
from lib.main import main  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ETCD_SCRIPT = os.path.join(ROOT, "scripts", "etcd_test_cluster.sh")
ETCD_ENV = dict(os.environ, VARUNA_ETCD_DIR=os.environ.get("VARUNA_E2E_ETCD_DIR",
                                                            "/tmp/varuna-etcd-e2e"),
                VARUNA_ETCD_PORT=os.environ.get("VARUNA_E2E_ETCD_PORT", "23890"))
LEASE_S = 3
EXIT_DEPOSED = 75


def wait_for(fn, timeout, what, period=0.1):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = fn()
        if v:
            return v
        time.sleep(period)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def etcd_follower(endpoints):
    """A member (1-based) that is not etcd's raft leader, from `etcdctl endpoint status`."""
    r = subprocess.run(["etcdctl", "--endpoints", endpoints, "endpoint", "status", "-w", "json"],
                       env=dict(ETCD_ENV, ETCDCTL_API="3"), capture_output=True, text=True,
                       timeout=30)
    status = json.loads(r.stdout)
    for k, s in enumerate(status):
        if s["Status"]["header"]["member_id"] != s["Status"]["leader"]:
            return k + 1
    raise AssertionError(f"no follower in {r.stdout}")


def etcd(*args, env=None):
    r = subprocess.run([ETCD_SCRIPT, *args], env=env or ETCD_ENV, capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"etcd_test_cluster.sh {' '.join(args)}: {r.stderr}")
    return r.stdout.strip()


class HaCluster:
    """Three managers on one etcd, two agents; each process's log under one directory.
    tls: every port, etcd's too, uses TLS with the cluster's certificates.
    hosts: a lib.cluster.Hosts with one host, where the first manager runs (it is
    made the leader); etcd also listens on the bridge's second address, its way there."""

    def __init__(self, managers=3, agents=2, slots=1, tls=False, hosts=None):
        self.dir = tempfile.mkdtemp(prefix="varuna-ha-")
        self.certs = None
        self.etcd_env = dict(ETCD_ENV)
        if tls:
            self.certs = os.path.join(self.dir, "certs")
            subprocess.run([os.path.join(ROOT, "scripts", "make_certs.sh"), self.certs,
                            "varuna-manager=127.0.0.1", "etcd=127.0.0.1",
                            *[f"node{k}=127.0.0.1" for k in range(agents)]],
                           check=True, capture_output=True)
            self.etcd_env["VARUNA_ETCD_TLS"] = self.certs
        self.hosts = hosts
        if hosts:
            self.etcd_env["VARUNA_ETCD_EXTRA_HOST"] = hosts.etcd_ip
        self.endpoints = self.etcd("start", "3").splitlines()[-1]
        self.ports = [harness.free_port() for _ in range(managers)]
        self.addresses = [f"127.0.0.1:{p}" for p in self.ports]
        if hosts:
            _, ip = hosts.agent_host("m0")
            self.addresses[0] = f"{ip}:{self.ports[0]}"
        self.all = ",".join(self.addresses)
        self.config = os.path.join(self.dir, "manager.yaml")
        with open(self.config, "w") as f:
            f.write("heartbeat_period_s: 0.5\nsuspect_after_missed: 4\ndead_after_missed: 12\n"
                    f"stop_grace_s: 3\nlease_ttl_s: {LEASE_S}\netcd_flush_s: 1\n"
                    "scale_up_delay_s: 2\nstragglers: {policy: report}\n")
        self.managers = [None] * managers
        self.stopped = set()  # SIGSTOPped managers: not asked who leads
        self.agents = {}
        for i in range(managers):
            self.start_manager(i)
            if hosts and i == 0:
                # 90 s: at the start of a CI run, beside the heaviest tests, a 3-member etcd
                # and the first election took over 30 s once (2026-11-29).
                wait_for(lambda: self.managers_view(self.addresses[0]).get("leader") ==
                         self.addresses[0], 90, "the first manager to lead")
        for k in range(agents):
            name = f"node{k}"
            with open(os.path.join(self.dir, f"{name}.log"), "a") as log:
                self.agents[name] = subprocess.Popen(
                    [AGENT, "--manager", self.all, "--listen",
                     f"{hosts.bridge_ip if hosts else '127.0.0.1'}:0", "--slots",
                     str(slots), "--name", name, "--work_dir", os.path.join(self.dir, name),
                     "--standby_workers=0", "--startup_probe_ms=0"]
                    + (["--allow_root_workers"] if os.geteuid() == 0 else [])
                    + (["--allow_insecure"] if hosts and not self.certs else [])
                    + self.tls_flags(name),
                    stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.leader(), 30, "a leader")
        wait_for(lambda: len([n for n in self.nodes() if n["state"] == "ALIVE"]) == agents,
                 30, "agents to register")

    def etcd(self, *args):
        return etcd(*args, env=self.etcd_env)

    def tls_flags(self, name):
        if not self.certs:
            return []
        return ["--tls_ca", os.path.join(self.certs, "ca.pem"),
                "--tls_cert", os.path.join(self.certs, name + ".pem"),
                "--tls_key", os.path.join(self.certs, name + ".key")]

    def start_manager(self, i):
        prefix, endpoints = [], self.endpoints
        if self.hosts and i == 0:  # in its namespace, reaching etcd over the bridge
            prefix, _ = self.hosts.agent_host("m0")
            endpoints = endpoints.replace("127.0.0.1", self.hosts.etcd_ip)
        with open(os.path.join(self.dir, f"manager{i}.log"), "a") as log:
            self.managers[i] = subprocess.Popen(
                prefix + [MANAGER, "--listen", self.addresses[i], "--state_dir",
                          os.path.join(self.dir, f"state{i}"), "--config", self.config,
                          "--etcd_endpoints", endpoints]
                + (["--allow_insecure"] if prefix and not self.certs else [])
                + self.tls_flags("varuna-manager"),
                stdout=log, stderr=subprocess.STDOUT)

    def revive_exited(self):
        """What systemd's Restart= does: a manager that exited is started again."""
        for i, p in enumerate(self.managers):
            if p.poll() is not None:
                self.start_manager(i)

    def ctl_argv(self, *args, manager=None):
        tls = ["--tls_ca", os.path.join(self.certs, "ca.pem")] if self.certs else []
        return [CTL, "--manager", manager or self.all, *tls, *args]

    def ctl(self, *args, timeout=60, check=None, manager=None):
        r = subprocess.run(self.ctl_argv(*args, manager=manager), capture_output=True,
                           text=True, timeout=timeout)
        if check is not None and r.returncode != check:
            raise AssertionError(f"varunactl {' '.join(args)} exited {r.returncode}:\n"
                                 f"{r.stdout}\n{r.stderr}\n{self.tail()}")
        return r

    def managers_view(self, manager=None):
        r = self.ctl("-o", "json", "managers", manager=manager, timeout=10)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def leader(self):
        """The leader's index once every live manager agrees on it, else None."""
        views = []
        for i, a in enumerate(self.addresses):
            if self.managers[i].poll() is None and i not in self.stopped:
                views.append(self.managers_view(a).get("leader", ""))
        if views and views[0] and all(v == views[0] for v in views):
            return self.addresses.index(views[0]) + 1  # 1-based: 0 would read as none
        return None

    def nodes(self):
        r = self.ctl("-o", "json", "nodes", timeout=10)
        return json.loads(r.stdout) if r.returncode == 0 else []

    def status(self, job_id):
        r = self.ctl("-o", "json", "status", job_id, timeout=10)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def tail(self):
        out = []
        for path in sorted(glob.glob(os.path.join(self.dir, "*.log"))):
            with open(path, errors="replace") as f:
                out.append(f"--- {os.path.basename(path)}\n" + "".join(f.readlines()[-12:]))
        return "\n".join(out)

    def close(self):
        procs = [p for p in self.managers if p] + list(self.agents.values())
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.etcd("stop")
        if os.environ.get("VARUNA_KEEP_TMP"):
            print(f"kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def rank0_losses(root, job_id):
    """step -> [loss] from every generation's rank-0 progress file of the job under the
    agents' work directories."""
    seen = {}
    for path in glob.glob(os.path.join(root, "node*", "jobs", job_id, "gen*", "progress.rank0")):
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    step = json.loads(line).get("step")
                except ValueError:
                    continue
                if isinstance(step, dict):
                    seen.setdefault(int(step["step"]), []).append(step["loss"])
    return seen


def write_job(c, name, steps, replicas=2, step_min_ms=None):
    """`step_min_ms`: each step lasts at least that long (VARUNA_STEP_MIN_MS), so the job
    outlasts the events a test stages on any machine and leaves CPU to the managers."""
    data = os.path.join(c.dir, "corpus.txt")
    if not os.path.exists(data):
        harness.write_text_corpus(data)
    path = os.path.join(c.dir, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"name: {name}\nmodel: {{kind: gpt, layers: 4, d_model: 32, heads: 4, "
                "seq_len: 16, vocab: 256}\n"
                f"data: {{kind: text, path: {data}}}\n"
                f"train: {{global_batch: 8, steps: {steps}, lr: 0.001, schedule: constant, "
                "seed: 7}\n"
                f"parallel: {{stages: 1, replicas: {replicas or 'auto'}, micro_batch: 2, timeout_s: 60}}\n"
                f"checkpoint: {{dir: {os.path.join(c.dir, name + '-ckpt')}}}\n"
                "stragglers: {policy: report}\n"
                + (f"env: {{VARUNA_STEP_MIN_MS: '{step_min_ms}'}}\n" if step_min_ms else ""))
    return path


class Fixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not shutil.which("etcd"):
            raise unittest.SkipTest("etcd-server is not installed")

    def setUp(self):
        self.c = HaCluster()

    def tearDown(self):
        self.c.close()

    def assert_running(self, job_id, after):
        """The job outlasted the events staged on it (else they tested an idle cluster)."""
        st = self.c.status(job_id)
        self.assertNotIn(st.get("state"), ("SUCCEEDED", "FAILED"),
                         f"the job ended (step {st.get('step')}) before {after}")

    def check_losses(self, job, job_id, steps, once=True):
        ref = harness.run_workers(1, ["--job", job, "--stage_to_rank_map", "0;"], timeout=600)
        self.assertTrue(ref.ok, ref.outputs[0][-2000:])
        want = ref.losses()
        seen = rank0_losses(self.c.dir, job_id)
        self.assertEqual(sorted(seen), list(range(1, steps + 1)), "every step")
        for step, losses in seen.items():
            if once:
                self.assertEqual(len(losses), 1, f"step {step} ran {len(losses)} times")
            for loss in losses:  # a morph may redo the step in flight: with the same loss
                self.assertLessEqual(abs(loss - want[step - 1]), 1e-4 * abs(want[step - 1]),
                                     f"step {step}")


class TakeoverTest(Fixture):
    KILLS = int(os.environ.get("VARUNA_HA_KILLS", "10"))

    def test_leader_killed_again_and_again_job_loses_nothing(self):
        c = self.c
        # At least 40 ms a step: 96 s, past the ten kills and the stopped leader (about 70 s).
        steps = 2400
        job = write_job(c, "ha", steps, step_min_ms=40)
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id).get("step", 0) >= 20, 120, "the job to train")
        takeovers = []
        late_jobs = []
        for k in range(self.KILLS):
            old = wait_for(c.leader, 30, "the leader")
            if k % 3 == 1:  # a submit acknowledged just before the kill
                small = write_job(c, f"late{k}", 5)
                r = c.ctl("-o", "json", "submit", small, check=0)
                late_jobs.append(json.loads(r.stdout)["id"])
            during = None
            if k % 3 == 2:  # a submit in flight when the leader dies: it follows the next one
                small = write_job(c, f"during{k}", 5)
                during = subprocess.Popen(c.ctl_argv("-o", "json", "submit", small),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)
                time.sleep(0.02 * k)  # from before its first call to after its answer
            c.managers[old - 1].kill()
            t0 = time.time()
            if during:
                out, err = during.communicate(timeout=60)
                self.assertEqual(during.returncode, 0, f"{out}\n{err}\n{c.tail()}")
                late_jobs.append(json.loads(out)["id"])
                print(f"kill {k + 1}: a submit in flight got job {late_jobs[-1]}"
                      f"{' after retrying' if 'retry' in err or err.strip() else ''}",
                      file=sys.stderr)
            new = wait_for(lambda: (lambda n: n if n and n != old else None)(c.leader()), 30,
                           "a new leader")
            takeovers.append(time.time() - t0)
            print(f"kill {k + 1}: leader {c.addresses[old - 1]} -> {c.addresses[new - 1]} "
                  f"in {takeovers[-1]:.2f} s (step {c.status(job_id).get('step')})",
                  file=sys.stderr)
            c.managers[old - 1].wait()
            c.start_manager(old - 1)
            time.sleep(1)
        print(f"takeover times (s): {[round(t, 2) for t in takeovers]}; median "
              f"{statistics.median(takeovers):.2f}", file=sys.stderr)
        self.assertLess(statistics.median(takeovers), 5.0, takeovers)
        # A stopped leader (a long GC pause, a frozen VM) comes back deposed and exits.
        old = wait_for(c.leader, 30, "the leader")
        c.managers[old - 1].send_signal(signal.SIGSTOP)
        c.stopped.add(old - 1)
        wait_for(lambda: (lambda n: n if n and n != old else None)(c.leader()), 30,
                 "a leader instead of the stopped one")
        c.managers[old - 1].send_signal(signal.SIGCONT)
        c.stopped.discard(old - 1)
        rc = c.managers[old - 1].wait(timeout=30)
        self.assertEqual(rc, EXIT_DEPOSED, c.tail())
        c.start_manager(old - 1)
        self.assert_running(job_id, "the last kill")

        st = wait_for(lambda: (lambda s: s if s.get("state") in ("SUCCEEDED", "FAILED")
                               else None)(c.status(job_id)), 900, "the job to end", period=1)
        self.assertEqual(st["state"], "SUCCEEDED", st.get("message"))
        self.assertFalse(st.get("morphs"), "no morph: the workers never noticed")
        for late in late_jobs:
            s = wait_for(lambda: (lambda s: s if s.get("state") in ("SUCCEEDED", "FAILED")
                                  else None)(c.status(late)), 300, f"job {late}", period=1)
            self.assertEqual(s["state"], "SUCCEEDED", s)
        ids = [j["id"] for j in json.loads(c.ctl("-o", "json", "list", check=0).stdout)]
        self.assertEqual(len(ids), len(set(ids)), "no job twice")
        self.assertEqual(sorted(ids), sorted([job_id] + late_jobs))
        # Every step's record survived the kills (Note [Durable step records] in
        # agent/heartbeat_report.cc): a killed leader's last seconds of records, acknowledged
        # but not yet in etcd, came again from the agents to the next leader.
        metrics = json.loads(c.ctl("-o", "json", "metrics", job_id, check=0).stdout)
        got = [int(m["step"]) for m in metrics]
        missing = sorted(set(range(1, steps + 1)) - set(got))
        self.assertEqual(missing, [], f"{len(missing)} step records lost at the takeovers")
        self.check_losses(job, job_id, steps)


class MorphTakeoverTest(Fixture):
    def setUp(self):
        self.c = HaCluster(tls=True)

    def test_leader_killed_mid_morph_the_new_leader_finishes_it(self):
        c = self.c
        steps = 1500  # at least 60 s; the morph, takeover and growth take about 25
        job = write_job(c, "morph", steps, replicas=0, step_min_ms=40)
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id).get("step", 0) >= 50 and
                 c.status(job_id).get("slots") == 2, 120, "the job on two nodes")
        old = wait_for(c.leader, 30, "the leader")
        c.ctl("drain", "node1", check=0)  # a morph off node1 begins ...
        c.managers[old - 1].kill()  # ... and its leader dies with it in flight
        t0 = time.time()
        wait_for(lambda: (lambda n: n if n and n != old else None)(c.leader()), 30,
                 "a new leader")
        print(f"takeover mid-morph in {time.time() - t0:.2f} s", file=sys.stderr)
        c.managers[old - 1].wait()
        c.start_manager(old - 1)
        def drained():
            s = c.status(job_id)
            done = [m for m in s.get("morphs", []) if "node1 drained" in m.get("reason", "")
                    and "total" in m.get("phases", {})]
            return done[-1] if done and s.get("slots") == 1 else None
        morph = wait_for(drained, 120, "the new leader to finish the morph")
        self.assertEqual(int(morph.get("steps_lost", 0)), 0, morph)
        c.ctl("drain", "node1", "--undo", check=0)
        wait_for(lambda: c.status(job_id).get("slots") == 2, 120, "the job to grow back")
        self.assert_running(job_id, "it grew back")
        st = wait_for(lambda: (lambda s: s if s.get("state") in ("SUCCEEDED", "FAILED")
                               else None)(c.status(job_id)), 900, "the job to end", period=1)
        self.assertEqual(st["state"], "SUCCEEDED", st.get("message"))
        self.check_losses(job, job_id, steps, once=False)


def log_time(path, pattern):
    """The time (seconds since midnight, glog's clock) of the last line of a manager's log
    with `pattern`, or None."""
    found = None
    with open(path, errors="replace") as f:
        for line in f:
            if pattern in line:
                hms = line.split()[1]
                h, m, sec = hms.split(":")
                found = int(h) * 3600 + int(m) * 60 + float(sec)
    return found


class PartitionTest(Fixture):
    def setUp(self):
        if os.geteuid() != 0 or shutil.which("ip") is None:
            self.skipTest("network namespaces need root and iproute2")
        try:
            self.hosts = Hosts(["m0"])
        except OSError as e:
            self.skipTest(f"cannot make a network namespace here: {e}")
        # etcd's address as the namespace sees it: a second one on the bridge, so that cutting
        # the route to it leaves the route to the agents (the bridge's first address) alone.
        self.hosts.bridge_ip = f"{self.hosts.subnet}.1"
        self.hosts.etcd_ip = f"{self.hosts.subnet}.2"
        Hosts._ip("addr", "add", f"{self.hosts.etcd_ip}/24", "dev", self.hosts.bridge)
        self.c = None
        try:
            self.c = HaCluster(hosts=self.hosts)
        except Exception:
            self.hosts.close()
            raise

    def tearDown(self):
        if self.c:
            self.c.close()
        self.hosts.close()

    def test_partitioned_leader_stops_before_another_is_elected(self):
        c, h = self.c, self.hosts
        steps = 1000  # at least 40 s; the partition and the rejoin take about 15
        job = write_job(c, "split", steps, step_min_ms=40)
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id).get("step", 0) >= 20, 120, "the job to train")
        self.assertEqual(c.leader(), 1, "the manager in the namespace leads")
        ns, _ = h.agent_host("m0")
        cut = ns + ["ip", "route", "add", "blackhole", f"{h.etcd_ip}/32"]
        subprocess.run(cut, check=True)
        t0 = time.time()
        rc = c.managers[0].wait(timeout=30)
        stopped_after = time.time() - t0
        self.assertEqual(rc, EXIT_DEPOSED, c.tail())
        new = wait_for(lambda: (lambda n: n if n and n != 1 else None)(c.leader()), 30,
                       "a new leader")
        deposed_at = log_time(os.path.join(c.dir, "manager0.log"), "manager deposed")
        elected_at = log_time(os.path.join(c.dir, f"manager{new - 1}.log"), "elected leader")
        self.assertIsNotNone(deposed_at, c.tail())
        self.assertIsNotNone(elected_at, c.tail())
        print(f"partitioned leader stopped {stopped_after:.2f} s after the cut, "
              f"{elected_at - deposed_at:.2f} s before {c.addresses[new - 1]} was elected",
              file=sys.stderr)
        self.assertLess(deposed_at, elected_at, "the old leader stopped first")
        # Its links back, it rejoins as a standby; the job never noticed.
        subprocess.run(ns + ["ip", "route", "del", "blackhole", f"{h.etcd_ip}/32"], check=True)
        c.start_manager(0)
        wait_for(lambda: c.managers_view(c.addresses[0]).get("leader") == c.addresses[new - 1],
                 30, "the old leader to follow the new one")
        self.assert_running(job_id, "the old leader rejoined")
        st = wait_for(lambda: (lambda s: s if s.get("state") in ("SUCCEEDED", "FAILED")
                               else None)(c.status(job_id)), 900, "the job to end", period=1)
        self.assertEqual(st["state"], "SUCCEEDED", st.get("message"))
        self.assertFalse(st.get("morphs"), "no morph: the workers never noticed")
        self.check_losses(job, job_id, steps)


class EtcdTroubleTest(Fixture):
    def test_member_loss_is_unnoticed_quorum_loss_pauses_the_managers_only(self):
        c = self.c
        steps = 1200  # at least 48 s; the losses and returns of members take about 30
        job = write_job(c, "trouble", steps, step_min_ms=40)
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id).get("step", 0) >= 20, 120, "the job to train")
        leader = c.leader()
        # One member of three, a raft follower, is lost: nothing noticed. (Losing etcd's own
        # leader stalls its writes for its election, a second or two, which a 3 s lease
        # may not ride out: then the managers fail over, and the jobs still notice nothing.)
        lost = etcd_follower(c.endpoints)
        c.etcd("kill", str(lost))
        time.sleep(2 * LEASE_S)
        self.assertEqual(c.leader(), leader)
        self.assertTrue(all(p.poll() is None for p in c.managers), c.tail())
        second = 1 if lost != 1 else 2
        c.etcd("kill", str(second))  # no quorum: the leader cannot renew its lease and stops
        step_then = c.status(job_id).get("step", 0)
        wait_for(lambda: c.managers[leader - 1].poll() is not None, 30, "the leader to stop")
        self.assertEqual(c.managers[leader - 1].returncode, EXIT_DEPOSED)
        c.revive_exited()
        view = wait_for(lambda: (lambda v: v if v and not v.get("leader") else None)(
            c.managers_view(c.addresses[leader % 3])), 30, "a standby's view")
        self.assertIn("no leader", c.ctl("managers", manager=c.addresses[leader % 3]).stdout)
        self.assertTrue(view.get("note"), view)
        # The workers train on: their progress files grow while no manager leads.
        before = max(rank0_losses(c.dir, job_id) or [0])
        time.sleep(3)
        self.assertGreater(max(rank0_losses(c.dir, job_id) or [0]), max(before, step_then))
        for k in (lost, second):
            c.etcd("revive", str(k))
        wait_for(c.leader, 60, "a leader after quorum returns")
        self.assert_running(job_id, "quorum returned")
        st = wait_for(lambda: (lambda s: s if s.get("state") in ("SUCCEEDED", "FAILED")
                               else None)(c.status(job_id)), 900, "the job to end", period=1)
        self.assertEqual(st["state"], "SUCCEEDED", st.get("message"))
        self.check_losses(job, job_id, steps)


if __name__ == "__main__":
    main()
