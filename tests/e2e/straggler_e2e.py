"""Stragglers (Note [Straggler ladder] in manager/stragglers/straggler_controller.cc), end to end.

Three agents with one slot each run in their own cgroup (cpu controller), each capped at the
same share of a core, so every node is as fast as the others, as identical VMs are. A 1 x 3
data-parallel job starts; mid-run one node's cap drops to a quarter (its workers and its
agent's speed probe slow down, the others do not). The manager must detect it, act as the
simulator decides (rebalance: a smaller batch share; or evict), finish with every step's loss
equal to a one-process run (5e-4, LOSS_RTOL), and re-admit the node once the cap is lifted (a
morph of kind "recovered"). Without write access to the cgroup cpu controller the class skips
(77).
"""

import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import harness  # noqa: E402
from lib.cgroups import (CGROUP_ROOT, SHARE, CappedCluster, cgroup_available,  # noqa: E402
                         remove_cgroup_tree, set_share)
from lib.cluster import wait_for  # noqa: E402
from lib.main import main  # noqa: E402

STEPS = 300
# Steps long against the CFS period's throttling (a 0.5-core cap runs a node in bursts): with
# LibTorch 2.11's kernels d_model 48 stepped in ~15 ms, where that jitter alone read as 0.6x.
MODEL = {"layers": 4, "d_model": 128, "heads": 4, "seq_len": 32}
# Losses against a one-process run: this model's fp32 noise floor is above the 1e-4 of the
# smaller models' tests. The same one-process run with 1 and with 2 OpenMP threads differs by
# 1.96e-4 (relative) at step 19 and by at most 1e-4 at the other 299 steps (2026-11-28); a
# morph's new batch shares reorder the sums the same way. 5e-4: 2.5x that floor.
LOSS_RTOL = 5e-4


class StragglerTest(unittest.TestCase):
    def setUp(self):
        if not cgroup_available():
            self.skipTest(f"no write access to the cgroup cpu controller ({CGROUP_ROOT})")
        self.root = os.path.join(CGROUP_ROOT, f"varuna-e2e-{os.getpid()}-{time.time_ns()}")
        os.makedirs(self.root, exist_ok=True)
        self.addCleanup(remove_cgroup_tree, self.root)

    def cluster(self, agents, slots):
        self.c = CappedCluster(self.root, agents=agents, slots=slots,
                               manager_config="scale_up_delay_s: 2\nmorph_coalesce_s: 0.3\n",
                               agent_args={f"node{i}": ["--startup_probe_ms=500"]
                                           for i in range(agents)})
        self.addCleanup(self.c.close)
        return self.c

    def job(self, name, replicas, ckpt, stages=1, step_min_ms=None):
        data = os.path.join(self.c.dir, "corpus.txt")
        if not os.path.exists(data):
            harness.write_text_corpus(data)
        extra = (f"checkpoint: {{dir: {os.path.join(self.c.dir, 'ckpt')}}}\n"
                 "stragglers: {policy: auto, probation_s: 2}\n") if ckpt else ""
        if step_min_ms:  # paced (VARUNA_STEP_MIN_MS): the job outlasts its events
            extra += f"env: {{VARUNA_STEP_MIN_MS: '{step_min_ms}'}}\n"
        return harness.job_yaml(os.path.join(self.c.dir, name), data, model=MODEL,
                                train={"steps": STEPS, "global_batch": 12},
                                parallel={"stages": stages, "replicas": replicas or "auto",
                                          "micro_batch": 1, "timeout_s": 60},
                                extra=extra)

    def status(self, job_id):
        return self.c.status(job_id)

    def test_detect_act_and_readmit(self):
        """1 x 3 data parallel, node2 at a quarter: the simulator picks eviction here (two
        replicas beat three with one at a quarter); the node is probed and re-admitted."""
        c = self.cluster(3, 1)
        # Paced to at least 45 s (300 steps of 150 ms): unpaced, a faster engine once finished
        # the job before the probe re-admitted the node. The sleep comes after each step's
        # agreement, so the busy times the detector reads are unchanged.
        job_id = json.loads(c.ctl("-o", "json", "submit",
                                  self.job("job.yaml", 0, True, step_min_ms=150),
                                  check=0).stdout)["id"]
        st = wait_for(lambda: (lambda s: s["state"] == "RUNNING" and s["step"] >= 6 and s)(
            self.status(job_id)), 180, "step 6")
        self.assertEqual(st["slots"], 3, st)
        slow = "node2"
        slowed_at = time.time()
        set_share(os.path.join(self.root, slow), SHARE / 4)
        # The ladder acts: a morph of kind straggler, with the measured speeds in its record.
        st = wait_for(lambda: (lambda s: any(m.get("kind") == "straggler"
                                             for m in s.get("morphs", [])) and s)(
            self.status(job_id)), 120, "a straggler morph")
        acted_at = time.time()
        m = next(m for m in st["morphs"] if m.get("kind") == "straggler")
        speeds = {s["node"]: s["speed"] for s in m.get("speeds", [])}
        self.assertLess(speeds.get(slow, 1), 0.8, m)
        self.assertTrue(m["graceful"], m)
        evicted = "evict" in m["reason"]
        print(f"straggler morph after {acted_at - slowed_at:.1f} s: {json.dumps(m)}",
              file=sys.stderr)
        events = c.ctl("events", job_id, check=0).stdout
        self.assertIn("straggler", events)
        nodes = c.ctl("nodes", check=0).stdout
        self.assertIn("SPEED", nodes)
        # Lift the cap: the node comes back (probe after probation, or measured fast again).
        st = wait_for(lambda: (lambda s: s["generation"] >= 2 and s["state"] == "RUNNING" and s)(
            self.status(job_id)), 120, "the new generation running")
        if evicted:
            self.assertNotIn(slow, {p["node"] for p in st["placement"]}, st)
        set_share(os.path.join(self.root, slow), SHARE)
        # Under load another node may be measured slow and recover on its own; the morph that
        # matters is the one back at full width (three slots).
        def full_width(m):
            to = m["to"]
            return sum(to.get("depths", [])) or to["stages"] * to["replicas"]

        def readmitted(s):
            return next((m for m in s.get("morphs", [])
                         if m.get("kind") == "recovered" and full_width(m) == 3), None)

        st = wait_for(lambda: (lambda s: (readmitted(s) or s["state"] != "RUNNING") and s)(
            self.status(job_id)), 180, "the node re-admitted")
        final = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")
                                  and s)(self.status(job_id)), 600, "the job to finish")
        self.assertEqual(final["state"], "SUCCEEDED", f"{final}\n{c.tail()}")
        self.assertTrue(readmitted(final), json.dumps(final["morphs"]))
        print(f"morphs: {json.dumps(final['morphs'])}", file=sys.stderr)
        # Every step once, each loss as in one process.
        metrics = json.loads(c.ctl("-o", "json", "metrics", job_id, check=0).stdout)
        self.assertEqual([int(x["step"]) for x in metrics], list(range(1, STEPS + 1)))
        r = harness.run_workers(1, ["--job", self.job("reference.yaml", 1, False)], timeout=900)
        self.assertTrue(r.ok, r.outputs)
        for x, want in zip(metrics, r.losses()):
            self.assertLess(abs(x["loss"] - want) / abs(want), LOSS_RTOL,
                            f"step {x['step']} gen {x['generation']}: {x['loss']} vs {want}")

    def test_rebalance_and_recover(self):
        """2 x 2 pipelines on two 2-slot nodes, node1 at a third: no plan without node1
        fits as well, so the simulator gives node1's pipeline a smaller batch share; when
        the cap is lifted node1 measures fast again and the job goes back (kind recovered).
        Every step's loss as in one process."""
        c = self.cluster(2, 2)
        job = self.job("job.yaml", 2, True, stages=2)
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: (lambda s: s["state"] == "RUNNING" and s["step"] >= 6 and s)(
            self.status(job_id)), 180, "step 6")
        set_share(os.path.join(self.root, "node1"), SHARE / 3)
        st = wait_for(lambda: (lambda s: any(m.get("kind") == "straggler"
                                             for m in s.get("morphs", [])) and s)(
            self.status(job_id)), 120, "a straggler morph")
        m = next(m for m in st["morphs"] if m.get("kind") == "straggler")
        print(f"straggler morph: {json.dumps(m)}", file=sys.stderr)
        self.assertIn("rebalance", m["reason"], m)
        self.assertEqual(len(m["to"]["depths"]), 2, m)  # two pipelines, their own shares
        wait_for(lambda: (lambda s: s["generation"] >= 2 and s["state"] == "RUNNING" and s)(
            self.status(job_id)), 120, "the rebalanced generation running")
        # varunactl nodes: node1's speed, and why it is marked.
        n1 = wait_for(lambda: next((n for n in c.nodes() if n["name"] == "node1" and
                                    0 < n.get("relative_speed", 0) < 0.7), None), 60,
                      "node1's speed in varunactl nodes")
        self.assertIn("slow in job", n1.get("speed_note", ""), n1)
        set_share(os.path.join(self.root, "node1"), SHARE)
        final = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")
                                  and s)(self.status(job_id)), 600, "the job to finish")
        self.assertEqual(final["state"], "SUCCEEDED", f"{final}\n{c.tail()}")
        print(f"morphs: {json.dumps(final['morphs'])}", file=sys.stderr)
        kinds = [m.get("kind") for m in final["morphs"]]
        self.assertIn("recovered", kinds, json.dumps(final["morphs"]))
        # No flapping: node1 is planned around at most twice (the rebalance, and one re-plan
        # if its speed moved past 2x of the planned one). Under a loaded machine (CI runs tests
        # side by side) the other node may read slow on its own after node1 recovered: a real
        # reading the ladder acts on once, not a flap.
        node1 = [m for m in final["morphs"]
                 if m.get("kind") == "straggler" and "node node1 " in m.get("reason", "")]
        self.assertLessEqual(len(node1), 2, json.dumps(final["morphs"]))
        self.assertLessEqual(kinds.count("straggler"), 3, kinds)
        metrics = json.loads(c.ctl("-o", "json", "metrics", job_id, check=0).stdout)
        self.assertEqual([int(x["step"]) for x in metrics], list(range(1, STEPS + 1)))
        r = harness.run_workers(1, ["--job", self.job("reference.yaml", 1, False)], timeout=900)
        self.assertTrue(r.ok, r.outputs)
        for x, want in zip(metrics, r.losses()):
            self.assertLess(abs(x["loss"] - want) / abs(want), LOSS_RTOL,
                            f"step {x['step']} gen {x['generation']}: {x['loss']} vs {want}")


if __name__ == "__main__":
    main()
