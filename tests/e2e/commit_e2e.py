"""Every step is a commit (docs/morphing.md "Committed steps"): a 2 x 2 job on two agents is
interrupted by VARUNA_FAULT at points of one step (Note [Faults] in worker/engine/fault.cc), and must
end SUCCEEDED with at most one step lost, every step's loss equal to an uninterrupted
one-process run (1e-4 relative), the morph record naming the committed step and what each
survivor saved, and no worker left behind.

Every point x action is tested with ranks as threads in seconds (ctest fault_matrix_test,
tests/worker/engine/fault_matrix_test.cc); here real processes, agents and the manager's record run
the two hardest cells on each path: the split whose stage has no other survivor, and the split
on heterogeneous pipelines. scripts/chaos.sh --matrix runs every cell here too."""

import json
import random
import re
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.harness import write_text_corpus, job_yaml  # noqa: E402
from lib.jobs import cached_reference_losses, MORPH_CONFIG  # noqa: E402
from lib.main import main  # noqa: E402

STEPS = 40
FAULT_STEP = 20

# Heterogeneous pipelines (docs/heterogeneous.md): a 2-stage and a 1-stage pipeline on 3 ranks.
HETERO = ("[{stages: [[embed, blocks.0, blocks.1], [blocks.2, blocks.3, head]], microbatches: 4},"
          " {stages: [[embed, blocks.0, blocks.1, blocks.2, blocks.3, head]], microbatches: 2}]")


def write_job(c, name, fault, steps=STEPS, timeout_s=30, every_steps=0, hetero=False):
    data = os.path.join(c.dir, "corpus.txt")
    if not os.path.exists(data):
        write_text_corpus(data)
    extra = (f"checkpoint: {{dir: {os.path.join(c.dir, 'ckpt-' + name)}, "
             f"every_steps: {every_steps}}}\n")
    if fault:
        extra += f"env: {{VARUNA_FAULT: '{fault}'}}\n"
    parallel = {"stages": 2, "micro_batch": 2, "timeout_s": timeout_s}
    if hetero:
        parallel = {"micro_batch": 2, "timeout_s": timeout_s, "pipelines": HETERO}
    return job_yaml(os.path.join(c.dir, name), data,
                    train={"steps": steps, "global_batch": 12 if hetero else 24},
                    parallel=parallel, extra=extra)


def reference_losses(c, global_batch=24, steps=STEPS):
    """The one-process losses of this job shape (cached: lib.jobs.cached_reference_losses)."""
    path = job_yaml(os.path.join(c.dir, f"reference{global_batch}-{steps}.yaml"),
                    os.path.join(c.dir, "corpus.txt"),
                    train={"steps": steps, "global_batch": global_batch},
                    parallel={"stages": 1, "micro_batch": 2})
    return cached_reference_losses(c, path)


# The two morph paths (docs/morphing.md): the relaunch path's record names what each survivor
# saved (saved_steps) and the committed step; the in-place path's survivors save nothing.
RELAUNCH = MORPH_CONFIG + "morph_in_place: false\n"
IN_PLACE = MORPH_CONFIG + "morph_in_place: true\n"


class CommitTest(unittest.TestCase):
    """The relaunch path: survivors save (rescue) and the job is relaunched."""
    CONFIG = RELAUNCH

    def setUp(self):
        self.c = Cluster(agents=2, slots=2, manager_config=self.CONFIG)
        self.addCleanup(self.c.close)

    def in_place(self):
        return self.CONFIG == IN_PLACE

    def rank_logs(self):
        """The last lines of every rank's log of every job (for a failure's message)."""
        out = []
        for root, _, files in os.walk(self.c.dir):
            for f in sorted(files):
                if f.startswith("rank") and f.endswith(".log"):
                    with open(os.path.join(root, f), errors="replace") as fh:
                        out.append(f"--- {os.path.join(root, f)}\n" + "".join(fh.readlines()[-12:]))
        return "\n".join(out)

    def run_cell(self, *args, **kwargs):
        try:
            return self.run_cell_checked(*args, **kwargs)
        except AssertionError:
            print(self.rank_logs(), file=sys.stderr)
            raise

    def run_cell_checked(self, fault, timeout_s=30, every_steps=0, stage_lost=False,
                         hetero=False):
        c = self.c
        name = re.sub(r"[^A-Za-z0-9_]+", "-", fault) + ".yaml"
        job = write_job(c, name, fault, timeout_s=timeout_s, every_steps=every_steps,
                        hetero=hetero)
        job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") and
                               s)(c.status(job_id)), 400, "the job to finish")
        self.assertEqual(st["state"], "SUCCEEDED", f"{st}\n{c.tail()}")
        self.assertEqual(len(st["morphs"]), 1, st["morphs"])
        m = st["morphs"][0]
        self.assertLessEqual(int(m["steps_lost"]), 1, m)
        self.assertEqual(bool(m.get("in_place")), self.in_place(), m)
        if self.in_place():
            self.assertGreaterEqual(int(m["resumed_from"]), FAULT_STEP - 2, m)
            # "relaunch": lost only on the relaunch path (a fault in the rescue; in place the
            # survivor regroups without one).
            if stage_lost is True:  # the hand-over reads the lost stage from the checkpoint
                self.assertGreater(int(m.get("checkpoint_bytes_read", 0)), 0, m)
        else:
            self.assertGreaterEqual(int(m.get("committed_step", 0)), FAULT_STEP - 2, m)
            self.assertTrue(m.get("saved_steps"), m)
            if stage_lost:  # the record says so; the periodic checkpoint keeps the loss at one
                self.assertIn("no rank of stage", m.get("note", ""), m)
            else:
                self.assertEqual(m.get("note", ""), "", m)
        metrics = json.loads(c.ctl("-o", "json", "metrics", job_id, check=0).stdout)
        self.assertEqual([int(x["step"]) for x in metrics], list(range(1, STEPS + 1)))
        for x, want in zip(metrics, reference_losses(c, 12 if hetero else 24)):
            self.assertLess(abs(x["loss"] - want) / abs(want), 1e-4,
                            f"step {x['step']} gen {x['generation']}: {x['loss']} vs {want}")
        wait_for(lambda: c.workers() == [], 30, "no worker left")
        print(f"{fault}: resumed_from {m['resumed_from']}, steps_lost {m['steps_lost']}, "
              f"committed {m.get('committed_step')}: {m.get('resume_reason', '')}",
              file=sys.stderr)
        return m

    def test_split_with_the_other_replica_lost(self):
        # The morph_link_cut failure: rank 0 applies step 20, rank 1 (the other stage) does
        # not, and pipeline 1 (ranks 2, 3) dies in the same step. No rank has step 20 of
        # stage 1, but rank 1 has its gradients: its rescue writes them with its layers into
        # step 20's checkpoint, rank 0's records step 20's update, and the relaunch's loader
        # rolls stage 1 forward (Note [Rolled rescue]). Nothing is copied per step for it.
        m = self.run_cell(f"agreement@{FAULT_STEP}:1:split,after_agreement@{FAULT_STEP}:2:kill,"
                          f"after_agreement@{FAULT_STEP}:3:kill")
        saved = {(int(s["rank"]), int(s["step"])) for s in m["saved_steps"]}
        # Rank 0 wrote step 20; rank 1 its 19 and its pending layers of 20.
        self.assertTrue({(0, FAULT_STEP), (1, FAULT_STEP - 1), (1, FAULT_STEP)} <= saved, m)
        self.assertNotIn((0, FAULT_STEP - 1), saved, m)
        self.assertEqual(int(m["resumed_from"]), FAULT_STEP, m)

    def test_split_heterogeneous(self):
        # 2-stage + 1-stage pipelines: rank 1 (blocks.2-head of the first) misses step 20;
        # rank 2 (the whole model) has it, so every segment is covered at 20.
        m = self.run_cell(f"agreement@{FAULT_STEP}:1:split", hetero=True)
        saved = {(int(s["rank"]), int(s["step"])) for s in m["saved_steps"]}
        self.assertIn((2, FAULT_STEP), saved, m)
        self.assertEqual(int(m["resumed_from"]), FAULT_STEP, m)


class InPlaceCommitTest(CommitTest):
    """The in-place path (the default): the survivors keep their processes and agree in the
    hand-over on the newest step every layer has (Note [Handover]); same guarantees."""
    CONFIG = IN_PLACE

    def test_split_with_the_other_replica_lost(self):
        # Stage 1's only survivor (rank 1) lacks step 20; rank 0 saw the agreement complete,
        # so rank 1 applies step 20 with rank 0's vector and the hand-over agrees on 20.
        m = self.run_cell(f"agreement@{FAULT_STEP}:1:split,after_agreement@{FAULT_STEP}:2:kill,"
                          f"after_agreement@{FAULT_STEP}:3:kill")
        self.assertEqual(int(m["resumed_from"]), FAULT_STEP, m)

    def test_split_heterogeneous(self):
        m = self.run_cell(f"agreement@{FAULT_STEP}:1:split", hetero=True)
        self.assertEqual(int(m["resumed_from"]), FAULT_STEP, m)


# The whole matrix (scripts/chaos.sh --matrix), fault at step 20 of a 40-step job:
# - every point x {kill, freeze} on rank 1 (stage 1, with a live replica, rank 3) of the 2 x 2
#   job, plus the split. Freezes wait out the peers' timeout, so they run with 10 s;
# - every point x kill on rank 1 of the heterogeneous job (a 2-stage and a 1-stage pipeline:
#   rank 2 holds the whole model);
# - every point x kill on ranks 1 and 3 together: stage 1 lost whole, so those cells run with
#   every_steps: 1 and resume from the newest periodic checkpoint, with the note set;
# - rescue_save x {kill, freeze}: rank 3's death in the update causes a rescue, and rank 1 then
#   fails in it, so stage 1 has no survivor either.
# Link cuts (network namespaces) are morph_e2e.py's link-cut test (ctest morph_link_cut).
POINTS = ["forward", "pipeline", "backward", "dp_allreduce", "agreement", "after_agreement",
          "update"]


def add_matrix_cell(name, fault, **kwargs):
    def cell(self):
        self.run_cell(fault, **kwargs)
    setattr(CommitTest, f"test_matrix_{name}", cell)  # InPlaceCommitTest inherits it


if os.environ.get("VARUNA_COMMIT_MATRIX"):
    for point in POINTS:
        for action in ("kill", "freeze"):
            add_matrix_cell(f"{point}_{action}", f"{point}@{FAULT_STEP}:1:{action}",
                            timeout_s=10 if action == "freeze" else 30)
        add_matrix_cell(f"{point}_kill_heterogeneous", f"{point}@{FAULT_STEP}:1:kill",
                        hetero=True)
        add_matrix_cell(f"{point}_kill_stage_lost",
                        f"{point}@{FAULT_STEP}:1:kill,{point}@{FAULT_STEP}:3:kill",
                        every_steps=1, stage_lost=True)
    for action in ("kill", "freeze"):
        add_matrix_cell(f"rescue_save_{action}",
                        f"update@{FAULT_STEP}:3:kill,rescue_save@{FAULT_STEP}:1:{action}",
                        timeout_s=10 if action == "freeze" else 30, every_steps=1,
                        stage_lost="relaunch")


class SoakTest(unittest.TestCase):
    """VARUNA_COMMIT_SOAK=RUNS:FAULTS:SEED (scripts/chaos.sh --faults): RUNS jobs, each hit by
    FAULTS random faults, one per generation (fault i in generation i+1, at a step that
    generation reaches), at random points, ranks and actions. Every job must end SUCCEEDED in
    time (no hang), lose at most one step per morph, and match the one-process losses."""

    def test_random_faults(self):
        spec = os.environ.get("VARUNA_COMMIT_SOAK")
        if not spec:
            self.skipTest("set VARUNA_COMMIT_SOAK=RUNS:FAULTS:SEED (scripts/chaos.sh --faults)")
        parts = [int(x) for x in spec.split(":")]
        runs, faults, seed = parts[:3]
        first = parts[3] if len(parts) > 3 else 0  # RUNS:FAULTS:SEED:FIRST reruns from FIRST
        rnd = random.Random(seed)
        # VARUNA_COMMIT_SOAK_PATH=relaunch|in_place (default: the manager's default).
        path = os.environ.get("VARUNA_COMMIT_SOAK_PATH", "")
        config = {"relaunch": RELAUNCH, "in_place": IN_PLACE, "": MORPH_CONFIG}[path]
        steps = 12 * (faults + 1)
        total_lost, morphs, paths = [], 0, set()
        for run in range(runs):
            entries = []
            for i in range(faults):
                point = rnd.choice(POINTS)
                action = "freeze" if rnd.random() < 0.2 else "kill"
                if point == "agreement" and rnd.random() < 0.5:
                    action = "split"
                entries.append(f"{point}@{12 * (i + 1)}:{rnd.randrange(4)}:{action}:{i + 1}")
            fault = ",".join(entries)
            if run < first:
                continue
            c = self.c = Cluster(agents=2, slots=2, manager_config=config)
            try:
                job = write_job(c, f"soak{run}.yaml", fault, steps=steps, timeout_s=10)
                job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
                try:
                    st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
                        c.status(job_id)), 120 + 60 * faults, f"soak run {run} to finish")
                except AssertionError:
                    print(f"soak run {run} hung: {fault}\n{json.dumps(c.status(job_id))}\n"
                          f"{c.tail()}\n{CommitTest.rank_logs(self)}", file=sys.stderr)
                    raise
                self.assertEqual(st["state"], "SUCCEEDED", f"{fault}\n{st}\n{c.tail()}")
                for m in st["morphs"]:
                    self.assertLessEqual(int(m["steps_lost"]), 1, f"{fault}\n{m}")
                    self.assertEqual(m.get("note", ""), "", f"{fault}\n{m}")
                    paths.add(m.get("path", ""))
                    total_lost.append(int(m["steps_lost"]))
                morphs += len(st["morphs"])
                metrics = json.loads(c.ctl("-o", "json", "metrics", job_id, check=0).stdout)
                self.assertEqual([int(x["step"]) for x in metrics], list(range(1, steps + 1)))
                ref = reference_losses(c, 24, steps)
                for x, want in zip(metrics, ref):
                    self.assertLess(abs(x["loss"] - want) / abs(want), 1e-4, f"{fault}: {x}")
                try:
                    wait_for(lambda: c.workers() == [], 30, "no worker left")
                except AssertionError:
                    left = subprocess.run(["ps", "-o", "pid,stat,args", "-p",
                                           ",".join(str(p) for p in c.workers()) or "1"],
                                          capture_output=True, text=True).stdout
                    print(f"soak run {run}: workers left after the job ended: {fault}\n{left}\n"
                          f"{c.tail()}", file=sys.stderr)
                    raise
                print(f"soak run {run}: {len(st['morphs'])} morphs, steps lost "
                      f"{[int(m['steps_lost']) for m in st['morphs']]}: {fault}", file=sys.stderr)
            finally:
                c.close()
        print(f"soak: {runs} runs, {runs * faults} faults, {morphs} morphs, max steps lost "
              f"{max(total_lost, default=0)}; paths: {sorted(paths)}", file=sys.stderr)


if __name__ == "__main__":
    main()
