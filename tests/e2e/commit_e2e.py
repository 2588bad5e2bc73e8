"""Every step is a commit (docs/morphing.md "Committed steps"): a 2 x 2 job on two agents is
interrupted by VARUNA_FAULT at points of one step (Note [Faults] in worker/fault.cc), and must
end SUCCEEDED with at most one step lost, every step's loss equal to an uninterrupted
one-process run (1e-4 relative), the morph record naming the committed step and what each
survivor saved, and no worker left behind.

The cells here are the fast ones for CI; scripts/chaos.sh --matrix runs them all."""

import json
import re
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from control_plane_e2e import Cluster, wait_for  # noqa: E402
from harness import job_yaml, run_workers, write_text_corpus  # noqa: E402
from morph_e2e import MORPH_CONFIG  # noqa: E402

STEPS = 40
FAULT_STEP = 20

_reference = {}


def write_job(c, name, fault, steps=STEPS, timeout_s=30):
    data = os.path.join(c.dir, "corpus.txt")
    if not os.path.exists(data):
        write_text_corpus(data)
    extra = f"checkpoint: {{dir: {os.path.join(c.dir, 'ckpt-' + name)}}}\n"
    if fault:
        extra += f"env: {{VARUNA_FAULT: '{fault}'}}\n"
    return job_yaml(os.path.join(c.dir, name), data, train={"steps": steps, "global_batch": 24},
                    parallel={"stages": 2, "micro_batch": 2, "timeout_s": timeout_s},
                    extra=extra)


def reference_losses(c):
    if "losses" not in _reference:
        path = job_yaml(os.path.join(c.dir, "reference.yaml"), os.path.join(c.dir, "corpus.txt"),
                        train={"steps": STEPS, "global_batch": 24},
                        parallel={"stages": 1, "micro_batch": 2})
        r = run_workers(1, ["--job", path], timeout=600)
        assert r.ok, r.outputs
        _reference["losses"] = r.losses()
    return _reference["losses"]


class CommitTest(unittest.TestCase):
    def setUp(self):
        self.c = Cluster(agents=2, slots=2, manager_config=MORPH_CONFIG)
        self.addCleanup(self.c.close)

    def run_cell(self, fault, timeout_s=30):
        c = self.c
        name = re.sub(r"[^A-Za-z0-9_]+", "-", fault) + ".yaml"
        job_id = json.loads(c.ctl("-o", "json", "submit", write_job(c, name, fault, timeout_s=timeout_s),
                                  check=0).stdout)["id"]
        st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") and
                               s)(c.status(job_id)), 400, "the job to finish")
        self.assertEqual(st["state"], "SUCCEEDED", f"{st}\n{c.tail()}")
        self.assertEqual(len(st["morphs"]), 1, st["morphs"])
        m = st["morphs"][0]
        self.assertLessEqual(int(m["steps_lost"]), 1, m)
        self.assertGreaterEqual(int(m.get("committed_step", 0)), FAULT_STEP - 2, m)
        self.assertTrue(m.get("saved_steps"), m)
        self.assertEqual(m.get("note", ""), "", m)
        metrics = json.loads(c.ctl("-o", "json", "metrics", job_id, check=0).stdout)
        self.assertEqual([int(x["step"]) for x in metrics], list(range(1, STEPS + 1)))
        for x, want in zip(metrics, reference_losses(c)):
            self.assertLess(abs(x["loss"] - want) / abs(want), 1e-4,
                            f"step {x['step']} gen {x['generation']}: {x['loss']} vs {want}")
        wait_for(lambda: c.workers() == [], 30, "no worker left")
        print(f"{fault}: resumed_from {m['resumed_from']}, steps_lost {m['steps_lost']}, "
              f"committed {m.get('committed_step')}: {m.get('resume_reason', '')}",
              file=sys.stderr)
        return m

    def test_split_at_the_agreement(self):
        # Rank 1 does not apply step 20; ranks 0, 2, 3 do: the split that once lost 18 steps.
        m = self.run_cell(f"agreement@{FAULT_STEP}:1:split")
        saved = {(int(s["rank"]), int(s["step"])) for s in m["saved_steps"]}
        self.assertIn((1, FAULT_STEP - 1), saved, m)
        self.assertNotIn((1, FAULT_STEP), saved, m)

    def test_split_with_the_other_replica_lost(self):
        # The morph_link_cut failure: rank 0 applies step 20, rank 1 (the other stage) does
        # not, and pipeline 1 (ranks 2, 3) dies in the same step. No rank has step 20 of
        # stage 1: the survivors must agree on step 19 (Note [Committed step]).
        m = self.run_cell(f"agreement@{FAULT_STEP}:1:split,after_agreement@{FAULT_STEP}:2:kill,"
                          f"after_agreement@{FAULT_STEP}:3:kill")
        saved = {(int(s["rank"]), int(s["step"])) for s in m["saved_steps"]}
        # Rank 0 wrote step 20 and the committed 19; rank 1 its 19 (and 18).
        self.assertTrue({(0, FAULT_STEP), (0, FAULT_STEP - 1), (1, FAULT_STEP - 1)} <= saved, m)
        self.assertNotIn((1, FAULT_STEP), saved, m)
        self.assertEqual(int(m["resumed_from"]), FAULT_STEP - 1, m)

    def test_kill_between_agreement_and_update(self):
        self.run_cell(f"after_agreement@{FAULT_STEP}:2:kill")

    def test_kill_in_the_update(self):
        self.run_cell(f"update@{FAULT_STEP}:3:kill")


# The whole matrix (scripts/chaos.sh --matrix): every point x {kill, freeze} on a rank with a
# live replica, plus the split. Freezes wait out the peers' timeout, so they run with 10 s.
POINTS = ["forward", "pipeline", "backward", "dp_allreduce", "agreement", "after_agreement",
          "update", "rescue_save"]
if os.environ.get("VARUNA_COMMIT_MATRIX"):
    for point in POINTS:
        for action in ("kill", "freeze"):
            def cell(self, point=point, action=action):
                self.run_cell(f"{point}@{FAULT_STEP}:1:{action}",
                              timeout_s=10 if action == "freeze" else 30)
            setattr(CommitTest, f"test_matrix_{point}_{action}", cell)


if __name__ == "__main__":
    unittest.main()
