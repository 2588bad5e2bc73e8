"""Morph in place (Note [Morph in place] in worker/engine/regroup.cc).

InPlaceTest, the worker's half without a manager: four varuna-worker processes train a 2 x 2
job with --in_place; ranks are killed; the test writes each survivor the agent's
ReconfigureCommand. The survivors keep their processes, move the layers a rank lacks over the
new groups (or read them from the checkpoint when no survivor holds them), lose at most one
step and match a one-process run (1e-4) at every step.
ClusterTest, the whole path (manager with morph_in_place, agents): SIGKILL, SIGSTOP and a
notice on a 2 x 2 job, a join, and joiners that are warm standbys dropping to the workers'
user. HeteroClusterTest: the loss cases on a 2-stage + 1-stage job."""

import glob
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import harness  # noqa: E402
from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.jobs import (MORPH_CONFIG, STEPS as STEPS_MORPH, cut, morph_driver,  # noqa: E402
                      pipelines, write_morph_job)
from lib.main import main  # noqa: E402

STEPS = 30
MODEL = {"layers": 4, "d_model": 32, "heads": 4, "seq_len": 16}
# A 2-stage pipeline (ranks 0, 1) and a 1-stage one (rank 2), 12 samples each.
NEW_TOPOLOGY = "0,3,6:12;0,6:12"


def wait_until(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def read_metrics(path):
    """Step -> loss, the last record of each step (a regrouped job may re-run one)."""
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    m = json.loads(line)
                    out[int(m["step"])] = m["loss"]
    return out


class InPlaceTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="varuna-inplace-")
        self.data = harness.write_text_corpus(os.path.join(self.dir, "corpus.txt"))
        self.procs = []
        self.addCleanup(self.cleanup)

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def job(self, name, parallel, every_steps=0):
        extra = (f"checkpoint: {{dir: {os.path.join(self.dir, 'ckpt-' + name)}, "
                 f"every_steps: {every_steps}}}\n")
        return harness.job_yaml(os.path.join(self.dir, name + ".yaml"), self.data, model=MODEL,
                                train={"global_batch": 24, "steps": STEPS}, parallel=parallel,
                                extra=extra)

    def reference(self):
        job = self.job("reference", {"stages": 1, "micro_batch": 2})
        r = harness.run_workers(1, ["--job", job], timeout=300)
        self.assertTrue(r.ok, r.outputs)
        return {int(m["step"]): m["loss"] for m in r.metrics}

    def start(self, job, world):
        port = harness.free_port()
        self.metrics = os.path.join(self.dir, "metrics.jsonl")
        self.fifos, self.logs = [], []
        for r in range(world):
            fifo = os.path.join(self.dir, f"control.rank{r}")
            os.mkfifo(fifo)
            self.fifos.append(fifo)
            log = os.path.join(self.dir, f"rank{r}.log")
            self.logs.append(log)
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), VARUNA_GENERATION="1",
                       VARUNA_CONTROL_FIFO=fifo,
                       VARUNA_PROGRESS_FILE=os.path.join(self.dir, f"progress.rank{r}"))
            with open(log, "w") as out:
                self.procs.append(subprocess.Popen(
                    [harness.WORKER, "--job", job, "--in_place", "--park_timeout_s", "60",
                     "--metrics_out", self.metrics], env=env, stdout=out,
                    stderr=subprocess.STDOUT))

    def reconfigure(self, old_rank, new_rank, port, generation=2, topology=NEW_TOPOLOGY):
        line = json.dumps({"generation": generation - 1, "reconfigure": {
            "generation": generation, "pipelines": topology, "rank": new_rank,
            "micro_batch": 2, "master_addr": "127.0.0.1", "master_port": port}})
        fd = os.open(self.fifos[old_rank], os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def log(self, r):
        with open(self.logs[r], errors="replace") as f:
            return f.read()

    def finish(self, ranks, want):
        for r in ranks:
            try:
                rc = self.procs[r].wait(timeout=240)
            except subprocess.TimeoutExpired:
                self.fail(f"rank {r} did not finish:\n{self.log(r)[-3000:]}")
            self.assertEqual(rc, 0, f"rank {r}:\n{self.log(r)[-3000:]}")
        got = read_metrics(self.metrics)
        self.assertEqual(sorted(got), list(range(1, STEPS + 1)))
        for step in range(1, STEPS + 1):
            self.assertLess(abs(got[step] - want[step]) / abs(want[step]), 1e-4,
                            f"step {step}: {got[step]} vs {want[step]}")
        return [line for r in ranks for line in self.log(r).splitlines()
                if "regrouped in place" in line]

    def test_a_stage_every_holder_of_which_died_comes_from_the_checkpoint(self):
        want = self.reference()
        self.start(self.job("job", {"stages": 2, "micro_batch": 2, "timeout_s": 30},
                            every_steps=1), 4)
        wait_until(lambda: max(read_metrics(self.metrics), default=0) >= 10, 120, "step 10")
        self.procs[3].send_signal(signal.SIGKILL)
        self.procs[1].send_signal(signal.SIGKILL)  # stage 1 has no live holder now
        port = harness.free_port()
        # The metrics rank is gone with rank 1: the new last stage of pipeline 0 appends.
        for old, new in ((0, 0), (2, 1)):
            self.reconfigure(old, new, port, topology="0,6:12;0,6:12")
        regrouped = self.finish((0, 2), want)
        self.assertEqual(len(regrouped), 2, regrouped)
        for line in regrouped:
            self.assertRegex(line, r"[1-9][0-9]* from the checkpoint", line)
        print("\n".join(regrouped), file=sys.stderr)

    def test_kill_one_rank_survivors_regroup_and_move_layers(self):
        want = self.reference()
        self.start(self.job("job", {"stages": 2, "micro_batch": 2, "timeout_s": 30}), 4)
        pids = [p.pid for p in self.procs]
        wait_until(lambda: max(read_metrics(self.metrics), default=0) >= 10, 120, "step 10")
        self.procs[3].send_signal(signal.SIGKILL)
        t0 = time.time()
        port = harness.free_port()
        # Old rank 0 and 1 stay pipeline 0; old rank 2 (stage 0) becomes the 1-stage pipeline
        # and needs stage 1's layers from a live rank.
        for old, new in ((0, 0), (1, 1), (2, 2)):
            self.reconfigure(old, new, port)
        for r in (0, 1, 2):
            try:
                rc = self.procs[r].wait(timeout=240)
            except subprocess.TimeoutExpired:
                self.fail(f"rank {r} did not finish:\n{self.log(r)[-3000:]}")
            self.assertEqual(rc, 0, f"rank {r}:\n{self.log(r)[-3000:]}")
        self.assertEqual([p.pid for p in self.procs[:3]], pids[:3])  # the same processes
        regrouped = [line for r in (0, 1, 2) for line in self.log(r).splitlines()
                     if "regrouped in place" in line]
        self.assertEqual(len(regrouped), 3, regrouped)
        moved = sum(int(line.split(" bytes from live ranks")[0].split()[-1])
                    for line in regrouped)
        self.assertGreater(moved, 0, regrouped)  # rank 2 received stage 1's layers
        got = read_metrics(self.metrics)
        self.assertEqual(sorted(got), list(range(1, STEPS + 1)))
        for step in range(1, STEPS + 1):
            self.assertLess(abs(got[step] - want[step]) / abs(want[step]), 1e-4,
                            f"step {step}: {got[step]} vs {want[step]}")
        print(f"regrouped {time.time() - t0:.2f} s after the kill (to the end); "
              f"{moved} bytes moved:\n" + "\n".join(regrouped), file=sys.stderr)


class ClusterTest(unittest.TestCase):
    """The whole path: a manager with morph_in_place, two agents, a 2 x 2 job; a worker is
    SIGKILLed. The survivors must keep their processes (same PIDs in the next generation),
    the killed rank's slot gets a fresh worker that joins by hand-over, and the record says
    in_place with the bytes moved."""

    def setUp(self):
        self.c = Cluster(agents=2, slots=2,
                         manager_config=MORPH_CONFIG + "morph_in_place: true\n")
        self.addCleanup(self.c.close)

    def rank_pids(self):
        r = subprocess.run(["pgrep", "-af", self.c.dir + r"/node[0-9]+/jobs/"],
                           capture_output=True, text=True)
        out = {}
        for line in r.stdout.splitlines():
            pid, _, cmd = line.partition(" ")
            for arg in cmd.split():
                if arg.startswith("--rank="):
                    out.setdefault(int(arg[7:]), []).append(int(pid))
        return out

    def test_worker_sigkill_survivors_keep_their_processes(self):
        self.run_loss(signal.SIGKILL, "killed by SIGKILL")

    def test_worker_freeze_survivors_keep_their_processes(self):
        # SIGSTOP: no exit, the peers only see silence; the agent reports the stopped process.
        self.run_loss(signal.SIGSTOP, "stopped (frozen)")

    def test_notice_survivors_checkpoint_and_regroup(self):
        # A preemption notice for node1: every rank checkpoints at a step boundary, node1's
        # ranks exit, node0's park and regroup into a 2 x 1 job; their layers of the leaving
        # stage... none: node0 holds ranks 0 and 1, a whole pipeline, so nothing moves.
        c = self.c
        t = morph_driver(c)
        job_id = t.submit(write_morph_job(c))
        t.running_at(job_id, 8)
        before = self.rank_pids()
        c.ctl("preempt", "node1", "--in", "30s", check=0)
        st, _ = t.finish(job_id)
        m = st["morphs"][0]
        self.assertTrue(m.get("in_place"), m)
        self.assertTrue(m["graceful"], m)
        self.assertEqual(int(m["steps_lost"]), 0, m)
        self.assertEqual(m["to"]["replicas"], 1, m)
        self.assertNotIn("node1", {p["node"] for p in st["placement"]})
        log = c.tail()
        print(f"notice in place: {json.dumps(m)}", file=sys.stderr)
        self.assertTrue(before, log)

    def test_join_grows_in_place_and_the_joiners_get_layers_from_live_ranks(self):
        c = self.c
        t = morph_driver(c)
        job_id = t.submit(write_morph_job(c))
        t.running_at(job_id, 4)
        before = self.rank_pids()
        c.start_agent("node2", 2)
        st = wait_for(lambda: (lambda s: s["generation"] == 2 and s["state"] == "RUNNING" and
                               s)(c.status(job_id)), 120, "generation 2 running")
        alive = {pid for pids in self.rank_pids().values() for pid in pids}
        for r in range(4):
            self.assertIn(before[r][0], alive, f"rank {r}'s process was replaced\n{c.tail()}")
        st, _ = t.finish(job_id)
        m = st["morphs"][0]
        self.assertTrue(m.get("in_place"), m)
        self.assertIn("joined", m["reason"], m)
        self.assertEqual((m["from"]["replicas"], m["to"]["replicas"]), (2, 3), m)
        self.assertEqual(int(m["steps_lost"]), 0, m)
        self.assertGreater(int(m.get("moved_bytes", 0)), 0, m)  # the new pipeline's layers
        self.assertEqual(int(m.get("checkpoint_bytes_read", 0)), 0, m)
        print(f"join in place: {json.dumps(m)}", file=sys.stderr)

    def test_joiners_are_warm_standby_workers(self):
        # A new machine's agent keeps a warm varuna-worker per free slot (Note [Standby
        # workers]); when the job grows onto it, the joiners are those processes. The agents
        # run workers as the unprivileged user `varuna`: the standbys wait as root and drop to
        # it when they take a rank.
        try:
            varuna = pwd.getpwnam("varuna")
        except KeyError:
            self.skipTest("no user 'varuna' (scripts/install_deps.sh makes it)")
        self.c.close()
        self.c = Cluster(agents=2, slots=2, manager_config="scale_up_delay_s: 5\n"
                         "morph_coalesce_s: 0.3\nmorph_in_place: true\n", worker_user="varuna",
                         agent_args={"node2": ["--standby_workers=-1"]})
        self.addCleanup(self.c.close)
        c = self.c
        os.chmod(c.dir, 0o755)  # the workers read the corpus and the spec here
        ckpt = os.path.join(c.dir, "ckpt-job.yaml")
        os.makedirs(ckpt)
        os.chown(ckpt, varuna.pw_uid, varuna.pw_gid)
        t = morph_driver(c)
        job_id = t.submit(write_morph_job(c, steps=400))  # long enough to be there to grow
        t.running_at(job_id, 4)
        gen1 = self.workers_of(1)
        self.assertEqual({self.uid(p) for p in gen1.values()}, {varuna.pw_uid}, gen1)
        c.start_agent("node2", 2)
        idle = wait_for(lambda: len(self.ready_standbys()) == 2 and self.ready_standbys(), 60,
                        "node2's two standbys")
        self.assertEqual({self.uid(p) for p in idle}, {0}, "standbys wait as root")
        rss = [self.rss_kib(p) for p in idle]
        st = wait_for(lambda: (lambda s: s["generation"] == 2 and s["state"] == "RUNNING" and
                               s)(c.status(job_id)), 120, "generation 2 running")
        gen2 = self.workers_of(2)
        self.assertEqual(sorted(gen2), list(range(6)), gen2)
        self.assertEqual(set(gen1.values()) | set(idle), set(gen2.values()),
                         f"{gen1} + standbys {idle} -> {gen2}\n{c.tail()}")
        uids = {p: self.uid(p) for p in idle}
        self.assertEqual(set(uids.values()), {varuna.pw_uid}, f"the joiners' uids: {uids}")
        st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
            c.status(job_id)), 300, "the job to finish")
        self.assertEqual(st["state"], "SUCCEEDED", f"{st}\n{c.tail()}")
        m = st["morphs"][0]
        self.assertTrue(m.get("in_place"), m)
        self.assertEqual(int(m["steps_lost"]), 0, m)
        print(f"join onto standbys: ready standbys' (resident, proportional, private) KiB "
              f"{rss}; "
              f"{json.dumps(m['phases'])}", file=sys.stderr)

    @staticmethod
    def uid(pid):
        """The real uid of a live process (None once it is gone)."""
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def agent_logs(self):
        text = ""
        for name in self.c.agents:
            with open(os.path.join(self.c.dir, f"{name}.log"), errors="replace") as f:
                text += f.read()
        return text

    def workers_of(self, gen):
        """rank -> pid of generation `gen` (launched, taken from a standby, or adopted)."""
        out = {}
        for line in self.agent_logs().splitlines():
            m = re.search(rf"gen={gen} rank=(\d+) started pid=(\d+)", line)
            if m:
                out[int(m.group(1))] = int(m.group(2))
            m = re.search(rf"standby pid (\d+) takes rank (\d+) \(.*/gen{gen}\)", line)
            if m:
                out[int(m.group(2))] = int(m.group(1))
            m = re.search(rf"gen={gen} adopted pid=(\d+) .* as rank (\d+)", line)
            if m:
                out[int(m.group(2))] = int(m.group(1))
        return out

    def standby_started(self, gen):
        return re.search(rf"standby pid \d+ takes rank \d+ \(.*/gen{gen}\)", self.agent_logs())

    def idle_standbys(self):
        r = subprocess.run(["pgrep", "-f", "varuna-worker --standby"], capture_output=True,
                           text=True)
        mine = []
        for pid in r.stdout.split():
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if cwd.startswith(self.c.dir) and cwd.endswith("/standby"):
                mine.append(int(pid))
        return mine

    def ready_standbys(self):
        """Idle standbys that finished loading (their log says so)."""
        text = ""
        for log in glob.glob(os.path.join(self.c.dir, "node*", "standby", "*.log")):
            with open(log, errors="replace") as f:
                text += f.read()
        return [p for p in self.idle_standbys() if f"standby worker ready (pid {p})" in text]

    @staticmethod
    def rss_kib(pid):
        """(resident, proportional, private) KiB: LibTorch's pages are shared between
        processes, so what a standby adds to a machine is its private part."""
        got = {}
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
                    got[key] = int(rest.split()[0])
        return got["Rss"], got["Pss"], got["Private_Clean"] + got["Private_Dirty"]

    def run_loss(self, sig, reason, job=None, victim=3, survivors=(0, 1, 2)):
        c = self.c
        t = morph_driver(c)
        job_id = t.submit(job or write_morph_job(c))
        st = t.running_at(job_id, 8)
        before = self.rank_pids()
        self.assertEqual(sorted(before), sorted(survivors + (victim,)), before)
        t0 = time.time()
        os.kill(before[victim][0], sig)
        st = wait_for(lambda: (lambda s: s["generation"] == 2 and s["state"] == "RUNNING" and
                               s)(c.status(job_id)), 120, "generation 2 running")
        regrouped_s = time.time() - t0
        alive = {pid for pids in self.rank_pids().values() for pid in pids}
        for r in survivors:
            self.assertIn(before[r][0], alive, f"rank {r}'s process was replaced\n{st}\n{c.tail()}")
        st, _ = t.finish(job_id)  # every step once, each loss the one-process run's (1e-4)
        self.assertEqual(len(st["morphs"]), 1, st["morphs"])
        m = st["morphs"][0]
        self.assertTrue(m.get("in_place"), m)
        self.assertIn(reason, m["reason"], m)
        self.assertIn("in place", m.get("path", ""), m)
        self.assertLessEqual(int(m["steps_lost"]), 1, m)
        self.assertGreater(int(m.get("moved_bytes", 0)), 0, m)  # the new rank's layers
        for phase in ("regroup", "agree", "transfer", "first_step", "total"):
            self.assertIn(phase, m["phases"], m)
        print(f"in place ({regrouped_s:.2f} s to generation 2 seen running): {json.dumps(m)}",
              file=sys.stderr)
        return st


class HeteroClusterTest(ClusterTest):
    """The same on a heterogeneous job: a 2-stage pipeline and a 1-stage one (parallel.pipelines)
    on three 2-slot agents; ranks 0 and 1 (pipeline 0) share node0, rank 2 is node1's. A new
    rank takes its layers from live ranks of the other depth."""

    def setUp(self):
        self.c = Cluster(agents=3, slots=2,
                         manager_config=MORPH_CONFIG + "morph_in_place: true\n")
        self.addCleanup(self.c.close)

    def hetero_job(self):
        data = os.path.join(self.c.dir, "corpus.txt")
        if not os.path.exists(data):
            harness.write_text_corpus(data)
        # 24 samples a step in micro-batches of 2: 8 through the 2-stage pipeline, 4 through
        # the 1-stage one. The same model, data and steps as write_morph_job's.
        pipes = pipelines((cut(3, 3), 8, 1), (cut(6), 4, 1))
        return harness.job_yaml(
            os.path.join(self.c.dir, "hetero.yaml"), data,
            train={"steps": STEPS_MORPH, "global_batch": 24},
            parallel={"micro_batch": 2, "timeout_s": 30, "pipelines": pipes},
            extra=f"checkpoint: {{dir: {os.path.join(self.c.dir, 'ckpt-hetero')}}}\n")

    def test_worker_sigkill_survivors_keep_their_processes(self):
        # Rank 1 (stage 1 of the 2-stage pipeline) dies: its replacement gets stage 1's
        # layers from rank 2, which holds the whole model.
        st = self.run_loss(signal.SIGKILL, "killed by SIGKILL", self.hetero_job(), victim=1,
                           survivors=(0, 2))
        self.assertEqual(st["pipelines"].count(";"), 1, st)  # still two pipelines

    def test_worker_freeze_survivors_keep_their_processes(self):
        # Rank 2 (the 1-stage pipeline) stops: its replacement gets both stages from ranks 0, 1.
        self.run_loss(signal.SIGSTOP, "stopped (frozen)", self.hetero_job(), victim=2,
                      survivors=(0, 1))

    def test_notice_survivors_checkpoint_and_regroup(self):
        c = self.c
        t = morph_driver(c)
        job_id = t.submit(self.hetero_job())
        t.running_at(job_id, 8)
        before = self.rank_pids()
        node_of = {p.get("rank", 0): p["node"] for p in c.status(job_id)["placement"]}
        leaving = node_of[2]
        stay = [r for r in (0, 1) if node_of[r] != leaving]
        c.ctl("preempt", leaving, "--in", "30s", check=0)
        wait_for(lambda: (lambda s: s["generation"] == 2 and s["state"] == "RUNNING" and
                          s)(c.status(job_id)), 120, "generation 2 running")
        alive = {pid for pids in self.rank_pids().values() for pid in pids}
        for r in stay:
            self.assertIn(before[r][0], alive, f"rank {r}'s process was replaced\n{c.tail()}")
        st, _ = t.finish(job_id)
        m = st["morphs"][0]
        self.assertTrue(m.get("in_place"), m)
        self.assertTrue(m["graceful"], m)
        self.assertEqual(int(m["steps_lost"]), 0, m)
        self.assertGreater(int(m.get("moved_bytes", 0)), 0, m)
        self.assertNotIn(leaving, {p["node"] for p in st["placement"]})
        print(f"hetero notice in place: {json.dumps(m)}", file=sys.stderr)

    # Growing and standbys: ClusterTest's, on the P x D job.
    test_join_grows_in_place_and_the_joiners_get_layers_from_live_ranks = None
    test_joiners_are_warm_standby_workers = None


if __name__ == "__main__":
    main()
