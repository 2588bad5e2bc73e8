"""The control plane with real binaries on loopback: varuna-manager, two varuna-agents with
two slots each, varunactl, and real varuna-worker processes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN_DIR, free_port, job_yaml, write_text_corpus  # noqa: E402

MANAGER = os.path.join(BIN_DIR, "varuna-manager")
AGENT = os.path.join(BIN_DIR, "varuna-agent")
CTL = os.path.join(BIN_DIR, "varunactl")
MAKE_CERTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                          "make_certs.sh")


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Cluster:
    """A manager and agents as separate processes; logs under one temp dir."""

    def __init__(self, agents=2, slots=2, manager_host="127.0.0.1", agent_host=None,
                 secure=False, manager_config="", agent_args=None, worker_user=None,
                 tokens=None, port=None):
        """agent_host(name) -> (argv prefix, listen host) places agents elsewhere (NetnsTest).
        secure: mutual TLS (certificates from scripts/make_certs.sh) and a tokens file; ctl()
        then sends the CA and `self.token`. worker_user: the agents' --worker_user (default:
        workers run as the agent, --allow_root_workers). tokens: extra tokens-file lines."""
        self.worker_user = worker_user
        self.dir = tempfile.mkdtemp(prefix="varuna-cp-")
        self.certs = os.path.join(self.dir, "certs") if secure else None
        self.token = "alice-token-0123456789" if secure else None
        if secure:
            subprocess.run([MAKE_CERTS, self.certs, "varuna-manager=127.0.0.1"] +
                           [f"node{i}=127.0.0.1" for i in range(agents)], check=True,
                           stdout=subprocess.DEVNULL)
            with open(os.path.join(self.dir, "tokens"), "w") as f:
                f.write(f"alice {self.token}\n" + "".join(t + "\n" for t in tokens or []))
        self.port = port or free_port()
        self.address = f"{manager_host}:{self.port}"
        self.agent_host = agent_host or (lambda name: ([], "127.0.0.1"))
        self.agent_args = agent_args or {}
        self.config = os.path.join(self.dir, "manager.yaml")
        with open(self.config, "w") as f:
            # Stragglers are reported, not acted on, unless a test asks: tests run side by side
            # on two cores, and a rank that shares its core looks slow to the detector.
            f.write("heartbeat_period_s: 1\nsuspect_after_missed: 2\ndead_after_missed: 4\n"
                    "stop_grace_s: 3\n" + manager_config +
                    ("" if "stragglers" in manager_config else "stragglers: {policy: report}\n"))
        self.manager = None
        self.agents = {}
        try:
            self.start_manager()
            for i in range(agents):
                self.start_agent(f"node{i}", slots)
            wait_for(lambda: len([n for n in self.nodes() if n["state"] == "ALIVE"]) == agents,
                     20, "agents to register")
        except BaseException:
            self.close()  # no processes or temp dir left behind by a failed start
            raise

    def start_manager(self):
        with open(os.path.join(self.dir, "manager.log"), "a") as log:  # the child keeps it
            self.manager = subprocess.Popen(
                [MANAGER, "--listen", self.address, "--state_dir",
                 os.path.join(self.dir, "state"), "--config", self.config]
                + self.insecure(self.address.rsplit(":", 1)[0])
                + (self.tls_flags("varuna-manager") +
                   ["--tokens_file", os.path.join(self.dir, "tokens")] if self.certs else []),
                stdout=log, stderr=subprocess.STDOUT)

    def start_agent(self, name, slots):
        prefix, host = self.agent_host(name)
        with open(os.path.join(self.dir, f"{name}.log"), "a") as log:
            self.agents[name] = subprocess.Popen(
                prefix + [AGENT, "--manager", self.address, "--listen", f"{host}:0", "--slots",
                          str(slots), "--name", name, "--work_dir", os.path.join(self.dir, name)]
                + self.insecure(host) + (self.tls_flags(name) if self.certs else [])
                + self.worker_user_flags() + self.standby_flags(name)
                + self.agent_args.get(name, []),
                stdout=log, stderr=subprocess.STDOUT)

    def standby_flags(self, name):
        """No warm standby workers unless a test asks (agent_args): they cost CPU here."""
        args = self.agent_args.get(name, [])
        given = any(a.startswith("--standby_workers") for a in args)
        probe = any(a.startswith("--startup_probe_ms") for a in args)
        # Nor a startup speed probe (half a second of CPU per agent) unless a test asks.
        return ([] if given else ["--standby_workers=0"]) + ([] if probe else
                                                              ["--startup_probe_ms=0"])

    def worker_user_flags(self):
        """The harness's temp dirs are root's (0700): workers run as the agent, asked for
        explicitly (tests/hostile runs them as the unprivileged user)."""
        if self.worker_user is not None:
            return ["--worker_user", self.worker_user]
        return ["--allow_root_workers"] if os.geteuid() == 0 else []

    def insecure(self, host):
        """Plaintext beyond loopback (the network-namespace hosts) must be asked for."""
        return [] if host.startswith("127.") or self.certs else ["--allow_insecure"]

    def tls_flags(self, name):
        return ["--tls_ca", os.path.join(self.certs, "ca.pem"),
                "--tls_cert", os.path.join(self.certs, name + ".pem"),
                "--tls_key", os.path.join(self.certs, name + ".key")]

    def ctl(self, *args, check=None, timeout=300, auth=True):
        extra = []
        if self.certs and auth:
            extra = ["--tls_ca", os.path.join(self.certs, "ca.pem"), "--token", self.token]
        try:
            r = subprocess.run([CTL, "--manager", self.address, *extra, *args],
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"varunactl {' '.join(args)} timed out:\n{e.stdout}\n"
                                 f"{e.stderr}\n{self.tail()}")
        if check is not None and r.returncode != check:
            raise AssertionError(f"varunactl {' '.join(args)} exited {r.returncode}:\n"
                                 f"{r.stdout}\n{r.stderr}\n{self.tail()}")
        return r

    def status(self, job_id):
        return json.loads(self.ctl("-o", "json", "status", job_id, check=0).stdout)

    def nodes(self):
        r = self.ctl("-o", "json", "nodes")
        return json.loads(r.stdout) if r.returncode == 0 else []

    def workers(self):
        """pids of worker processes this cluster started (their argv names our work dirs)."""
        r = subprocess.run(["pgrep", "-f", self.dir + r"/node[0-9]+/jobs/"], capture_output=True,
                           text=True)
        return [int(p) for p in r.stdout.split()]

    def tail(self):
        out = []
        for name in ["manager"] + list(self.agents):
            path = os.path.join(self.dir, f"{name}.log")
            if os.path.exists(path):
                with open(path) as f:
                    out.append(f"--- {name}.log\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def close(self):
        for p in list(self.agents.values()) + [self.manager]:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in list(self.agents.values()) + [self.manager]:
            if p is not None:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
        if os.environ.get("VARUNA_KEEP_TMP"):
            print(f"kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def write_job(cluster, name="job.yaml", steps=6, extra="", parallel=None):
    data = os.path.join(cluster.dir, "corpus.txt")
    if not os.path.exists(data):
        write_text_corpus(data)
    return job_yaml(os.path.join(cluster.dir, name), data, train={"steps": steps},
                    parallel={"stages": 2, **(parallel or {})}, extra=extra)


class ControlPlaneTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Cluster()

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def test_1_submit_follow_runs_2x2_job_to_succeeded(self):
        c = self.c
        job = write_job(c)
        r = c.ctl("submit", job, "--follow", check=0)
        self.assertIn("SUCCEEDED", r.stdout)
        self.assertIn("step 6/6", r.stdout)
        jobs = json.loads(c.ctl("-o", "json", "list", check=0).stdout)
        st = c.status(jobs[-1]["id"])
        self.assertEqual(st["state"], "SUCCEEDED")
        self.assertEqual((st["stages"], st["replicas"]), (2, 2))
        self.assertEqual(st["stage_to_rank_map"], "0,2;1,3;")
        self.assertEqual(st["step"], 6)
        self.assertEqual({p["node"] for p in st["placement"]}, {"node0", "node1"})
        logs = c.ctl("logs", st["id"], "--rank", "0", check=0).stdout
        self.assertIn("varuna-agent", logs)
        self.assertIn("rank=0", logs)
        self.assertIn("exited with code 0", logs)
        self.assertEqual(c.workers(), [], "no worker may outlive its job")
        nodes = c.nodes()
        self.assertEqual(sorted(n["state"] for n in nodes), ["ALIVE", "ALIVE"])
        self.assertEqual({n["slots"] for n in nodes}, {2})

    def test_2_cancel_stops_a_running_job(self):
        c = self.c
        job = write_job(c, "long.yaml", steps=100000)
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id)["step"] >= 1, 120, "the job to make progress")
        self.assertEqual(len(c.workers()), 4)
        t0 = time.time()
        c.ctl("cancel", job_id, check=0)
        wait_for(lambda: c.status(job_id)["state"] == "CANCELLED", 15, "CANCELLED")
        self.assertLess(time.time() - t0, 15)
        wait_for(lambda: c.workers() == [], 5, "workers to be gone")
        self.assertEqual(c.ctl("cancel", job_id).returncode, 0)  # repeat is harmless
        # --follow on a cancelled job reports the outcome with exit code 1.
        r = c.ctl("logs", job_id, "--rank", "3", check=0)
        self.assertIn("signal 15", r.stdout)

    def test_3_bad_specs_are_refused_and_nothing_is_queued(self):
        c = self.c
        before = len(json.loads(c.ctl("-o", "json", "list", check=0).stdout))
        good = write_job(c, "good.yaml")
        cases = {
            "unknown key": ("train.lrr=1", "unknown key 'train.lrr'"),
            "negative lr": ("train.lr=-0.1", "train.lr"),
            "missing file": ("data.path=/nonexistent/corpus.txt", "/nonexistent/corpus.txt"),
        }
        for what, (override, needle) in cases.items():
            r = c.ctl("submit", good, "--set", override)
            self.assertEqual(r.returncode, 2, what)
            self.assertIn(needle, r.stderr, what)
            self.assertIn("nothing queued", r.stderr, what)
        broken = os.path.join(c.dir, "broken.yaml")
        with open(broken, "w") as f:
            f.write("name: [unclosed\n")
        r = c.ctl("submit", broken)
        self.assertEqual(r.returncode, 2)
        self.assertIn("malformed YAML", r.stderr)
        r = c.ctl("submit", os.path.join(c.dir, "absent.yaml"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("absent.yaml", r.stderr)
        after = len(json.loads(c.ctl("-o", "json", "list", check=0).stdout))
        self.assertEqual(before, after)
        r = c.ctl("status", "999")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no job with id '999'", r.stderr)
        r = subprocess.run([CTL, "--manager", f"127.0.0.1:{free_port()}", "list"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 3)
        self.assertIn("cannot reach manager", r.stderr)

    def test_4_configs_file_and_env_file_reach_every_worker(self):
        c = self.c
        env_file = os.path.join(c.dir, "cluster.env")
        with open(env_file, "w") as f:
            f.write("# cluster\nFIRST_LINE=one\nexport SECOND_LINE=two\n")
        configs = os.path.join(c.dir, "experiments.txt")
        with open(configs, "w") as f:
            f.write("# one job per command\n"
                    "/bin/sh -c 'echo run=A first=$FIRST_LINE second=$SECOND_LINE "
                    "spec=$SPEC_VAR rank=$RANK world=$WORLD_SIZE args=\"$*\"' sh\n"
                    "/bin/sh -c \\\n  'echo run=B rank=$RANK' sh\n")
        job = write_job(c, "tiny.yaml", extra="env: {SPEC_VAR: from_spec}\n")
        r = c.ctl("-o", "json", "submit", job, "--configs", configs, "--env_file", env_file,
                  "--stages", "1", "--replicas", "2", "--follow", timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr + c.ctl("list").stdout + c.tail())
        results = json.loads(r.stdout)
        self.assertEqual(len(results), 2)
        self.assertEqual({j["state"] for j in results}, {"SUCCEEDED"})
        log_a = c.ctl("logs", results[0]["id"], "--rank", "1", check=0).stdout
        self.assertIn("run=A first=one second=two spec=from_spec rank=1 world=2", log_a)
        self.assertIn("--stage_to_rank_map=0,1;", log_a)
        self.assertIn("--batch-size=4", log_a)
        log_b = c.ctl("logs", results[1]["id"], "--rank", "0", check=0).stdout
        self.assertIn("run=B rank=0", log_b)

    def test_5_workers_stopped_by_sigusr1_checkpoint_and_the_job_says_so(self):
        # Without morphing, an operator's SIGUSR1 makes every rank finish its step,
        # checkpoint and exit 0. That is not success: the job ends FAILED, naming the step
        # and where its checkpoint is. (With morphing the job relaunches: morph_e2e.py.)
        c = self.c
        ck = os.path.join(c.dir, "ck_sig")
        job = write_job(c, "sig.yaml", steps=100000,
                        extra=f"checkpoint: {{dir: {ck}}}\nmorphing: false\n")
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id)["step"] >= 2, 120, "the job to make progress")
        for pid in c.workers():
            os.kill(pid, signal.SIGUSR1)
        st = wait_for(lambda: c.status(job_id)["state"] == "FAILED" and c.status(job_id), 60,
                      "the job to stop")
        self.assertIn("stopped on request (SIGUSR1) after step", st["reason"])
        stopped = st["step"]
        self.assertIn(f"of 100000; checkpoint of step {stopped} in {ck}", st["reason"])
        self.assertIn("--set checkpoint.resume=latest", st["reason"])
        self.assertEqual(os.listdir(ck), [f"varuna_ckpt_{stopped}"])
        wait_for(lambda: c.workers() == [], 10, "workers to be gone")
        # Resubmitted as the reason says, it goes on from that step.
        r = c.ctl("-o", "json", "submit", job, "--set", "checkpoint.resume=latest", "--set",
                  f"train.steps={stopped + 2}", "--follow", timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr + c.tail())
        again = json.loads(r.stdout)
        self.assertEqual(c.status(again["id"])["step"], stopped + 2)
        log = c.ctl("logs", again["id"], "--rank", "0", check=0).stdout
        self.assertIn(f"loaded {os.path.join(ck, f'varuna_ckpt_{stopped}')}", log)
        self.assertNotIn(" step=1 ", log)


class FailureTest(unittest.TestCase):
    def setUp(self):
        self.c = Cluster()

    def tearDown(self):
        self.c.close()

    def test_manager_killed_mid_job_restarts_and_job_succeeds(self):
        c = self.c
        job = write_job(c, steps=80)
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id)["step"] >= 2, 120, "progress")
        c.manager.send_signal(signal.SIGKILL)
        c.manager.wait()
        self.assertEqual(len(c.workers()), 4, "workers keep running without the manager")
        c.start_manager()
        st = wait_for(lambda: c.ctl("-o", "json", "status", job_id).returncode == 0 and
                      c.status(job_id), 30, "the restarted manager")
        self.assertIn(st["state"], ("RUNNING", "SUCCEEDED"))
        self.assertEqual(st["generation"], 1)
        r = c.ctl("submit", "--follow", job, "--request_id", "x")  # a new job also runs
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        wait_for(lambda: c.status(job_id)["state"] == "SUCCEEDED", 120, "the job to succeed")
        self.assertEqual(c.status(job_id)["step"], 80)
        self.assertEqual(c.workers(), [])

    def test_agent_killed_is_no_longer_alive_within_the_timeout(self):
        c = self.c
        job = write_job(c, "long.yaml", steps=100000)
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id)["step"] >= 1, 120, "progress")
        t0 = time.time()
        c.agents["node1"].send_signal(signal.SIGKILL)
        c.agents["node1"].wait()

        def node1_state():
            return {n["name"]: n["state"] for n in c.nodes()}["node1"]

        wait_for(lambda: node1_state() != "ALIVE", 5, "node1 to leave ALIVE")
        wait_for(lambda: node1_state() == "DEAD", 10, "node1 DEAD")
        self.assertLess(time.time() - t0, 10)
        st = wait_for(lambda: c.status(job_id)["state"] == "FAILED" and c.status(job_id), 15,
                      "the job to fail")
        self.assertIn("node node1 lost", st["reason"])  # not the survivor whose gloo call failed
        wait_for(lambda: c.workers() == [], 15, "every worker to be gone")

    def test_agent_restarted_at_once_fails_the_job_naming_the_lost_rank(self):
        # The agent comes back before its node could be declared dead; its workers died
        # with it (PR_SET_PDEATHSIG), so the job must not wait for them forever.
        c = self.c
        job = write_job(c, "long.yaml", steps=100000)
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id)["step"] >= 1, 120, "progress")
        c.agents["node1"].send_signal(signal.SIGKILL)
        c.agents["node1"].wait()
        c.start_agent("node1", 2)
        st = wait_for(lambda: c.status(job_id)["state"] == "FAILED" and c.status(job_id), 20,
                      "the job to fail")
        self.assertIn("on node node1 is no longer known to its agent", st["reason"])
        wait_for(lambda: c.workers() == [], 15, "every worker to be gone")
        self.assertEqual({n["name"]: n["state"] for n in c.nodes()}["node1"], "ALIVE")


class Hosts:
    """Separate 'machines' on this one: one network namespace per host, each with its own
    eth0 on a bridge in the root namespace, where the manager listens on the bridge address.
    Hosts reach each other only over that bridge, so nothing works by way of loopback."""

    _count = 0

    def __init__(self, names):
        # Names unique per instance: a namespace deleted by an earlier test takes its veth
        # pair down asynchronously, so reusing that name can still find it there.
        Hosts._count += 1
        tag = f"{os.getpid() % 100000}{chr(ord('a') + Hosts._count % 26)}"
        self.subnet = f"10.213.{(os.getpid() + Hosts._count) % 250}"
        self.bridge = f"vbr{tag}"
        self.ns, self.veth, self.ip = {}, {}, {}
        self.forward_rule = None
        try:
            self._ip("link", "add", self.bridge, "type", "bridge")
            self._ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            # With br_netfilter loaded, bridged frames pass iptables' FORWARD chain, whose
            # policy may be DROP (Docker sets that): let this bridge's own traffic through.
            if shutil.which("iptables"):
                rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
                if subprocess.run(["iptables", "-I", *rule], capture_output=True).returncode == 0:
                    self.forward_rule = rule
            for i, name in enumerate(names, start=1):
                ns, veth = f"vns{tag}_{i}", f"vh{tag}_{i}"
                self._ip("netns", "add", ns)
                self.ns[name], self.veth[name], self.ip[name] = ns, veth, f"{self.subnet}.{10 + i}"
                self._ip("link", "add", veth, "type", "veth", "peer", "name", f"vn{tag}_{i}")
                self._ip("link", "set", f"vn{tag}_{i}", "netns", ns)
                self._ip("-n", ns, "link", "set", f"vn{tag}_{i}", "name", "eth0")
                self._ip("-n", ns, "addr", "add", f"{self.ip[name]}/24", "dev", "eth0")
                self._ip("-n", ns, "link", "set", "eth0", "up")
                self._ip("-n", ns, "link", "set", "lo", "up")
                self._ip("link", "set", veth, "master", self.bridge)
                self._ip("link", "set", veth, "up")
        except Exception:
            self.close()
            raise

    @staticmethod
    def _ip(*args):
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise OSError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def agent_host(self, name):
        return ["ip", "netns", "exec", self.ns[name]], self.ip[name]

    def cut(self, name, up=False):
        """Pulls (or plugs back) the host's cable: its processes live on, unreachable."""
        self._ip("link", "set", self.veth[name], "up" if up else "down")

    def close(self):
        if self.forward_rule:
            subprocess.run(["iptables", "-D", *self.forward_rule], capture_output=True)
            self.forward_rule = None
        # Deleting the host end removes the pair at once; the namespace goes after it.
        for veth in self.veth.values():
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


class NetnsTest(unittest.TestCase):
    """Two hosts in their own network namespaces (needs root and iproute2)."""

    def setUp(self):
        if os.geteuid() != 0 or shutil.which("ip") is None:
            self.skipTest("network namespaces need root and iproute2")
        try:
            self.hosts = Hosts(["node0", "node1"])
        except OSError as e:
            # Only a missing permission skips (an unprivileged container); anything else is
            # a failure to look at.
            if "Operation not permitted" in str(e) or "Permission denied" in str(e):
                self.skipTest(f"network namespaces not permitted here: {e}")
            raise
        self.addCleanup(self.hosts.close)
        self.c = Cluster(manager_host=f"{self.hosts.subnet}.1",
                         agent_host=self.hosts.agent_host)
        self.addCleanup(self.c.close)

    def test_2x2_job_across_two_hosts_succeeds(self):
        c, h = self.c, self.hosts
        nodes = {n["name"]: n["address"] for n in c.nodes()}
        self.assertTrue(nodes["node0"].startswith(h.ip["node0"] + ":"), nodes)
        self.assertTrue(nodes["node1"].startswith(h.ip["node1"] + ":"), nodes)
        r = c.ctl("submit", write_job(c), "--follow", check=0)
        self.assertIn("SUCCEEDED", r.stdout)
        st = c.status(json.loads(c.ctl("-o", "json", "list", check=0).stdout)[-1]["id"])
        # Each replica's pipeline is on one host; the gradient all-reduce crosses hosts.
        self.assertEqual({p["node"] for p in st["placement"]}, {"node0", "node1"})
        self.assertTrue(st["master"].startswith(h.ip["node0"] + ":"), st["master"])
        self.assertEqual(c.workers(), [])

    def test_partitioned_host_goes_dead_and_its_orphans_stop_when_it_returns(self):
        c, h = self.c, self.hosts
        job = write_job(c, "long.yaml", steps=100000)
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id)["step"] >= 1, 120, "progress")
        h.cut("node1")

        def state(name):
            return {n["name"]: n["state"] for n in c.nodes()}[name]

        wait_for(lambda: state("node1") == "DEAD", 10, "node1 DEAD")
        st = wait_for(lambda: c.status(job_id)["state"] == "FAILED" and c.status(job_id), 10,
                      "the job to fail")
        self.assertIn("node node1 lost", st["reason"])
        self.assertEqual(c.agents["node1"].poll(), None, "the agent itself is alive, only cut off")
        h.cut("node1", up=True)
        wait_for(lambda: state("node1") == "ALIVE", 30, "node1 back")
        # Its workers ran on without the manager; the manager now tells the agent to stop them.
        wait_for(lambda: c.workers() == [], 20, "every worker to be gone")


if __name__ == "__main__":
    unittest.main()
