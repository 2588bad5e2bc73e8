"""Morphing with real binaries on loopback (docs/morphing.md): a 2-stage job on three agents
of two slots (2 x 3) loses a machine without warning, gets a preemption notice, gains a
machine, and fails once on bad input. Every run must end SUCCEEDED with the loss of every
step equal to an uninterrupted one-process run (1e-4 relative), losing at most one step
without notice and none with it."""

import http.server
import shutil
import os
import signal
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.cluster import Cluster, Hosts, wait_for  # noqa: E402
from lib.jobs import MORPH_CONFIG, MorphChecks, write_morph_job  # noqa: E402
from lib.main import main  # noqa: E402

class MorphTest(MorphChecks, unittest.TestCase):
    def setUp(self):
        self.c = Cluster(agents=3, slots=2, manager_config=MORPH_CONFIG)

    def tearDown(self):
        self.c.close()

    def test_agent_sigkill_mid_run(self):
        c = self.c
        job_id = self.submit(write_morph_job(c))
        st = self.running_at(job_id, 8)
        self.assertEqual((st["stages"], st["replicas"]), (2, 3))
        c.agents["node2"].send_signal(signal.SIGKILL)
        c.agents["node2"].wait()
        st, metrics = self.finish(job_id)
        self.assertEqual(len(st["morphs"]), 1, st["morphs"])
        m = st["morphs"][0]
        self.assertEqual((m["from"]["replicas"], m["to"]["replicas"]), (3, 2), m)
        self.assertLessEqual(int(m["steps_lost"]), 1, m)
        self.assertIn("node2", m["reason"])
        self.assertGreater(max(r["generation"] for r in metrics), 1)
        events = c.ctl("events", job_id, check=0).stdout
        self.assertIn("morph_done", events)

    def test_preemption_notice_loses_nothing(self):
        c = self.c
        job_id = self.submit(write_morph_job(c))
        self.running_at(job_id, 8)
        r = c.ctl("preempt", "node1", "--in", "30s", check=0)
        self.assertIn("DRAINING", r.stdout)
        st, _ = self.finish(job_id)
        self.assertEqual(len(st["morphs"]), 1, st["morphs"])
        m = st["morphs"][0]
        self.assertEqual(int(m["steps_lost"]), 0, m)
        self.assertTrue(m["graceful"], m)
        self.assertEqual(m["to"]["replicas"], 2, m)
        self.assertNotIn("node1", {p["node"] for p in st["placement"]})
        self.assertIn("preemption notice", m["reason"])
        for phase in ("save", "plan", "launch", "rendezvous", "first_step", "total"):
            self.assertIn(phase, m["phases"], m)

    def test_new_agent_joins_and_job_grows(self):
        c = self.c
        job_id = self.submit(write_morph_job(c))
        self.running_at(job_id, 4)
        c.start_agent("node3", 2)
        st, _ = self.finish(job_id)
        self.assertEqual(len(st["morphs"]), 1, st["morphs"])
        m = st["morphs"][0]
        self.assertEqual((m["from"]["replicas"], m["to"]["replicas"]), (3, 4), m)
        self.assertEqual(int(m["steps_lost"]), 0, m)
        self.assertIn("joined", m["reason"])

    def test_bad_input_fails_once_without_morphing(self):
        c = self.c
        # Resuming from a step that has no checkpoint: only the workers can find out.
        job_id = self.submit(self.bad_job())
        st = wait_for(lambda: (lambda s: s["state"] in ("FAILED", "SUCCEEDED") and s)(
            c.status(job_id)), 120, "the job to fail")
        self.assertEqual(st["state"], "FAILED", st)
        self.assertIn("cannot run the job", st["reason"])
        self.assertIn("checkpoint", st["reason"])
        self.assertEqual(st["generation"], 1)
        self.assertEqual(st.get("morphs", []), [])
        wait_for(lambda: c.workers() == [], 20, "no worker left")

    def bad_job(self):
        c = self.c
        path = write_morph_job(c, "bad.yaml")
        ckpt = os.path.join(c.dir, "ckpt-bad.yaml")
        os.makedirs(os.path.join(ckpt, "varuna_ckpt_3"), exist_ok=True)  # incomplete
        with open(path) as f:
            text = f.read().replace(f"dir: {ckpt}}}", f"dir: {ckpt}, resume: latest}}")
        with open(path, "w") as f:
            f.write(text)
        return path


class SpotMetadata(http.server.BaseHTTPRequestHandler):
    """AWS's spot/instance-action: 404 until `notice` is set."""
    notice = False

    def do_GET(self):  # noqa: N802 (http.server's name)
        if not SpotMetadata.notice:
            self.send_response(404)
            self.end_headers()
            return
        body = b'{"action": "terminate", "time": "2030-01-01T00:00:00Z"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class NoticeSourcesTest(unittest.TestCase):
    """The agent's own notices: a cloud metadata endpoint (AWS format, on loopback) and a
    file. Each moves the job off its node with nothing lost."""

    def setUp(self):
        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SpotMetadata)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{self.http.server_address[1]}/latest/meta-data/spot/instance-action"
        self.notice_file = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                        f"varuna-notice-{os.getpid()}")
        self.c = Cluster(agents=3, slots=2, manager_config=MORPH_CONFIG, agent_args={
            "node1": ["--preemption_notice_url", url],
            "node2": ["--preemption_notice_file", self.notice_file]})

    def tearDown(self):
        self.c.close()
        self.http.shutdown()
        if os.path.exists(self.notice_file):
            os.remove(self.notice_file)

    def test_cloud_then_file_notice(self):
        c = self.c
        t = MorphTest("test_agent_sigkill_mid_run")
        t.c = c
        job_id = t.submit(write_morph_job(c))
        t.running_at(job_id, 8)
        SpotMetadata.notice = True
        wait_for(lambda: c.status(job_id)["generation"] == 2 and
                 c.status(job_id)["state"] == "RUNNING", 120, "the move off node1")
        t.running_at(job_id, c.status(job_id)["step"] + 3, generation=2)
        with open(self.notice_file, "w") as f:
            f.write("30\n")
        st, _ = t.finish(job_id)
        self.assertEqual(len(st["morphs"]), 2, st["morphs"])
        for m, node in zip(st["morphs"], ("node1", "node2")):
            self.assertEqual(int(m["steps_lost"]), 0, m)
            self.assertIn(f"preemption notice for node {node}", m["reason"])
        self.assertIn("(aws)", st["morphs"][0]["reason"])
        self.assertIn("(file)", st["morphs"][1]["reason"])
        self.assertEqual({p["node"] for p in st["placement"]}, {"node0"})


class LinkCutTest(unittest.TestCase):
    """Two hosts in network namespaces (root and iproute2): the link of one is cut mid-run
    (no reset: its peers' sockets just go silent); the job carries on on the other host."""

    def setUp(self):
        if os.geteuid() != 0 or shutil.which("ip") is None:
            self.skipTest("network namespaces need root and iproute2")
        try:
            self.hosts = Hosts(["node0", "node1"])
        except OSError as e:
            if "Operation not permitted" in str(e) or "Permission denied" in str(e):
                self.skipTest(f"network namespaces not permitted here: {e}")
            raise
        self.addCleanup(self.hosts.close)
        self.c = Cluster(manager_host=f"{self.hosts.subnet}.1", agent_host=self.hosts.agent_host,
                         manager_config=MORPH_CONFIG)
        self.addCleanup(self.c.close)

    def test_link_cut_mid_run_continues_on_the_other_host(self):
        c = self.c
        t = MorphTest("test_agent_sigkill_mid_run")
        t.c = c
        job_id = t.submit(write_morph_job(c))
        st = t.running_at(job_id, 8)
        self.assertEqual({p["node"] for p in st["placement"]}, {"node0", "node1"})
        self.hosts.cut("node1")
        st, _ = t.finish_without_worker_check(job_id)
        m = st["morphs"][0]
        self.assertIn("node node1 lost", m["reason"])
        self.assertLessEqual(int(m["steps_lost"]), 1, m)
        self.assertEqual({p["node"] for p in st["placement"]}, {"node0"})
        self.hosts.cut("node1", up=True)  # its orphans are stopped once it is back
        wait_for(lambda: c.workers() == [], 60, "every worker to be gone")


if __name__ == "__main__":
    main()
