"""AutoConfig with real binaries (docs/autoconfig.md).

ProfilerTest: varuna-worker --profile_out on 2 ranks writes a valid profile; `varunactl plan`
ranks shapes with it without a manager; the planner's pick trains; bad inputs (a damaged
profile, one of another model, too few slots, a batch no width divides) are clear errors.
The libvaruna example (Profiler + AutoConfig::GetMin) runs.
ClusterTest: `varunactl profile` on a local cluster stores the profile; `varunactl plan`
without --slots plans for the cluster with it; an all-auto job then runs AutoConfig's plan
(schedule and boundaries passed to the workers, predicted step time in status)."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import harness  # noqa: E402
from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.main import main  # noqa: E402

CTL = os.path.join(harness.BIN_DIR, "varunactl")
MODEL = {"layers": 4, "d_model": 32, "heads": 4, "seq_len": 16}


def plan(*args, check=0):
    r = subprocess.run([CTL, "plan", *args], capture_output=True, text=True, timeout=120)
    if check is not None and r.returncode != check:
        raise AssertionError(f"varunactl plan {' '.join(args)} exited {r.returncode}:\n"
                             f"{r.stdout}\n{r.stderr}")
    return r


class ProfilerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="varuna-autoconfig-e2e-")
        cls.data = os.path.join(cls.dir, "corpus.txt")
        harness.write_text_corpus(cls.data)
        cls.job = harness.job_yaml(os.path.join(cls.dir, "job.yaml"), cls.data, model=MODEL,
                                   train={"global_batch": 8, "steps": 6},
                                   parallel={"stages": "auto", "replicas": "auto",
                                             "micro_batch": "auto", "schedule": "auto"})
        cls.profile = os.path.join(cls.dir, "profile.json")
        r = harness.run_workers(2, ["--job", cls.job, "--profile_out", cls.profile],
                                env_extra={"OMP_NUM_THREADS": "1"}, timeout=600)
        assert r.ok, "\n".join(o[-2000:] for o in r.outputs)

    def test_profile_has_every_segment_size_and_link(self):
        with open(self.profile) as f:
            p = json.load(f)
        self.assertEqual(p["version"], 1)
        self.assertEqual(p["model_key"], "gpt layers=4 d_model=32 heads=4 seq_len=16 vocab=256")
        self.assertEqual(p["micro_batches"], [1, 2, 4, 8])
        self.assertEqual(len(p["segments"]), 6)  # embed, 4 blocks, head
        for seg in p["segments"]:
            self.assertEqual([c["micro_batch"] for c in seg["costs"]], [1, 2, 4, 8])
            for c in seg["costs"]:
                self.assertGreater(c["forward_s"], 0)
                self.assertGreater(c["backward_s"], 0)
                self.assertGreater(c["peak_bytes"], 0)  # measured by the tracking allocator
        block = p["segments"][1]["costs"]
        self.assertEqual(block[0]["activation_bytes"], 16 * 32 * 4)  # seq x d_model fp32
        self.assertGreater(block[3]["graph_bytes"], block[0]["graph_bytes"])
        self.assertEqual(len(p["p2p_same_host"]), 5)
        self.assertEqual(p["allreduce"][0]["group_size"], 2)
        self.assertGreaterEqual(p["compute_slowdown"], 1)
        self.assertEqual(p["slots_per_host"], 2)
        self.assertGreater(p["tied_bytes"], 0)

    def test_plan_without_a_manager_and_the_pick_trains(self):
        r = plan(self.job, "--slots", "2", "--profile", self.profile, "-o", "json")
        plans = json.loads(r.stdout)["plans"]
        self.assertGreater(len(plans), 4)
        steps = [p["step_s"] for p in plans if not p["lower_bound"]]
        self.assertEqual(steps, sorted(steps))
        best = plans[0]
        for key in ["stages", "replicas", "micro_batch", "schedule", "step_s", "samples_per_s",
                    "bubble", "peak_bytes"]:
            self.assertIn(key, best)
        self.assertEqual(len(best["peak_bytes"]), best["stages"])
        # The table names its cost source; --all lists rejected shapes with their reason.
        table = plan(self.job, "--nodes", "1,1", "--profile", self.profile, "--all").stdout
        self.assertIn("costs: profile of gpt layers=4", table)
        self.assertIn("STEP_S", table)
        # Without a profile or a manager: the built-in cost model, said so.
        builtin = plan(self.job, "--slots", "4").stdout
        self.assertIn("built-in cost model", builtin)

        # The pick runs as planned (its shape, schedule and boundaries as the manager passes them).
        P, D = best["stages"], best["replicas"]
        res = harness.run_workers(
            P * D, ["--job", self.job, "--stage_to_rank_map", harness.stage_map(P, D),
                    f"--chunk_size={best['micro_batch']}", f"--schedule={best['schedule']}",
                    "--stage_boundaries=" + ",".join(str(b) for b in best["boundaries"])],
            env_extra={"OMP_NUM_THREADS": "1"})
        self.assertTrue(res.ok, res.outputs[0][-2000:])
        self.assertEqual(len(res.losses()), 6)
        # A unit sanity check (a mistaken unit is off by 1000x), not an accuracy target (that is
        # bench/autoconfig.sh's job): within 10x either way, since ctest's parallel tests can
        # slow the measured steps 5x on a 2-core machine (0.20 seen in CI on 2026-11-30).
        measured = sorted(m["step_time_s"] for m in res.metrics[2:])[len(res.metrics[2:]) // 2]
        self.assertLess(best["step_s"] / measured, 10)
        self.assertGreater(best["step_s"] / measured, 0.1)

    def test_bad_inputs_are_clear_errors(self):
        damaged = os.path.join(self.dir, "damaged.json")
        with open(self.profile) as f, open(damaged, "w") as g:
            g.write(f.read()[:500])
        r = plan(self.job, "--slots", "2", "--profile", damaged, check=2)
        self.assertIn("not a valid profile JSON", r.stderr)
        negative = os.path.join(self.dir, "negative.json")
        with open(self.profile) as f:
            p = json.load(f)
        p["segments"][2]["costs"][1]["backward_s"] = -1
        with open(negative, "w") as g:
            json.dump(p, g)
        r = plan(self.job, "--slots", "2", "--profile", negative, check=2)
        self.assertIn("segments[2].costs[1].backward_s", r.stderr)
        other = harness.job_yaml(os.path.join(self.dir, "other.yaml"), self.data,
                                 model={**MODEL, "layers": 6})
        r = plan(other, "--slots", "2", "--profile", self.profile, check=1)
        self.assertIn("profile is for model 'gpt layers=4", r.stderr)
        r = plan(self.job, "--slots", "2", "--set", "resources.min_slots=4", check=1)
        self.assertIn("resources.min_slots = 4", r.stderr)
        # A global batch no width divides: refused with the spec when the width is fixed, and
        # by the planner (every width it tried, and why) when it is not.
        r = plan(self.job, "--slots", "4", "--global_batch", "7", "--replicas", "2", check=2)
        self.assertIn("is not divisible by parallel.replicas (2)", r.stderr)
        r = plan(self.job, "--slots", "4", "--global_batch", "7", "--stages", "1",
                 "--set", "resources.min_slots=2", check=1)
        self.assertIn("no shape fits 4 slots: global_batch 7 is not divisible by 4 replicas", r.stderr)
        r = plan(self.job, "--slots", "zero", check=2)
        self.assertIn("--slots needs a number", r.stderr)
        r = plan(self.job, "--slots", "2", "--profile", "/nonexistent/p.json", check=2)
        self.assertIn("/nonexistent/p.json", r.stderr)
        # The worker refuses boundaries that do not split the model.
        res = harness.run_workers(2, ["--job", self.job, "--stage_to_rank_map=0;1;",
                                      "--stage_boundaries=0,6"])
        self.assertFalse(res.ok)
        self.assertIn("--stage_boundaries has 2 indices for 2 stages", res.outputs[0])

    def test_libvaruna_example(self):
        out = os.path.join(self.dir, "example")
        os.makedirs(out, exist_ok=True)
        r = subprocess.run([os.path.join(harness.BIN_DIR, "autoconfig_example"), "8", "4", "64",
                            out], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertIn("AutoConfig for 8 slots (4 per node), global batch 64: stages=", r.stdout)
        with open(os.path.join(out, "profile.json")) as f:
            self.assertEqual(len(json.load(f)["segments"]), 8)


class ClusterTest(unittest.TestCase):
    def setUp(self):
        self.c = Cluster(agents=2, slots=1)

    def tearDown(self):
        self.c.close()

    def test_profile_job_then_auto_job_runs_the_plan(self):
        c = self.c
        data = os.path.join(c.dir, "corpus.txt")
        harness.write_text_corpus(data)
        job = harness.job_yaml(os.path.join(c.dir, "job.yaml"), data, model=MODEL,
                               train={"global_batch": 8, "steps": 8},
                               parallel={"stages": "auto", "replicas": "auto",
                                         "micro_batch": "auto", "schedule": "auto"})
        before = json.loads(c.ctl("-o", "json", "plan", job, check=0).stdout)
        self.assertIn("built-in", before["cost_source"])
        prof = json.loads(c.ctl("-o", "json", "profile", job, check=0).stdout)
        st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
            c.status(prof["id"])), 300, "the profile job")
        self.assertEqual(st["state"], "SUCCEEDED", f"{st}\n{c.tail()}")
        self.assertTrue(st["profile_job"])
        events = c.ctl("events", check=0).stdout
        self.assertIn("profile_stored", events)

        after = json.loads(c.ctl("-o", "json", "plan", job, check=0).stdout)
        self.assertIn("profile of gpt layers=4", after["cost_source"])
        self.assertNotIn("cross-host transfers were not measured", " ".join(after["notes"]))
        # Planning with --slots asks the reachable manager for its profile.
        r = c.ctl("plan", job, "--slots", "2", check=0)
        self.assertIn("profile from the manager", r.stdout)

        jid = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
            c.status(jid)), 300, "the auto job")
        self.assertEqual(st["state"], "SUCCEEDED", f"{st}\n{c.tail()}")
        self.assertIn("profile of gpt layers=4", st["plan_source"])
        self.assertGreater(st["predicted_step_s"], 0)
        self.assertEqual(len(st["boundaries"]), st["stages"] + 1)
        text = c.ctl("status", jid, check=0).stdout
        self.assertIn("predicted", text)
        logs = c.ctl("logs", jid, check=0).stdout
        self.assertIn(f"--schedule={st['schedule']}", logs)


if __name__ == "__main__":
    main()
