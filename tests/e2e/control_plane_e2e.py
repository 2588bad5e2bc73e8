"""The control plane with real binaries on loopback: varuna-manager, two varuna-agents with
two slots each, varunactl, and real varuna-worker processes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.cluster import Cluster, CTL, Hosts, wait_for, write_job  # noqa: E402
from lib.harness import free_port  # noqa: E402
from lib.main import main  # noqa: E402

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
    main()
