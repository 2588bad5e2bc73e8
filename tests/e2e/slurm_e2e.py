"""Slurm on a real test cluster (docs/operations.md "Slurm").

scripts/slurm_test_cluster.sh starts Debian's slurmctld and munged and 3 slurmd, each in its
own network and UTS namespace, with a preemptible partition (requeue, GraceTime) and a
high-priority one. Without root, namespaces or slurm-wlm every class skips (exit 77).

SrunTest: `srun -n 4 varuna-worker` on 2 nodes (no torchrun: Slurm's variables) computes the
losses of the same job under torchrun (4 processes), 1e-4.
SbatchTest: deploy/slurm/varuna.sbatch trains a job to SUCCEEDED in one allocation; then a
high-priority job preempts the allocation mid-run: the agents take SIGTERM as a notice, the
job is checkpointed at a step boundary, Slurm requeues the script, and the requeued
allocation resumes the same job from that checkpoint: no step lost, none run twice, every
loss equal to an uninterrupted run (1e-4).
"""

import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import harness  # noqa: E402
from lib.slurm import (ENV, SBATCH, Fixture, job_state, rank0_losses, read,  # noqa: E402
                       generations, resumed_by_generation, slurm, stop_cluster,
                       wait_for, write_job)
from lib.main import main  # noqa: E402

class SrunTest(Fixture):
    def test_srun_workers_match_torchrun(self):
        job = write_job(os.path.join(self.tmp, "srun.yaml"), self.data, steps=5, stages=2)
        smap = harness.stage_map(2, 2)
        metrics = os.path.join(self.tmp, "srun.jsonl")
        # sbatch --wait: the steps run inside an allocation, where srun's tasks reach back.
        out = os.path.join(self.tmp, "srun.out")
        slurm("sbatch", "--wait", "-N", "2", "-n", "4", "-o", out, "--wrap",
              f"srun -n 4 {harness.WORKER} --job {job} --stage_to_rank_map '{smap}' "
              f"--metrics_out {metrics}", timeout=300)
        with open(out) as f:
            log = f.read()
        with open(metrics) as f:
            got = [json.loads(line)["loss"] for line in f if line.strip()]
        # The same job under torchrun (the environment's torch), 4 processes on this machine.
        torchrun = harness.TORCHRUN
        if not os.path.exists(torchrun):
            self.skipTest(f"{torchrun} is not installed")
        ref_metrics = os.path.join(self.tmp, "torchrun.jsonl")
        p = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "4", "--redirects", "1",
                            "--tee", "1", "--log_dir", os.path.join(self.tmp, "torchrun-logs"),
                            "--no_python", harness.WORKER, "--job", job,
                            "--stage_to_rank_map", smap, "--metrics_out", ref_metrics],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        with open(ref_metrics) as f:
            ref = [json.loads(line)["loss"] for line in f if line.strip()]
        self.assertEqual(len(got), 5, log[-3000:])
        self.assertEqual(len(ref), 5)
        for i, (g, w) in enumerate(zip(got, ref)):
            self.assertLessEqual(abs(g - w), 1e-4 * abs(w), f"step {i + 1}")
        self.assertIn("rank=3 world=4", log, "ranks and world from Slurm's variables")


class SbatchTest(Fixture):
    def sbatch(self, name, steps, every=None, extra=(), step_min_ms=None):
        state = os.path.join(self.tmp, name)
        job = write_job(os.path.join(self.tmp, name + ".yaml"), self.data, steps,
                        ckpt=os.path.join(self.tmp, name + "-ckpt"), every=every,
                        step_min_ms=step_min_ms)
        env = dict(ENV, VARUNA_JOB=job, VARUNA_BIN=harness.BIN_DIR, VARUNA_STATE=state)
        r = subprocess.run(["sbatch", "--parsable", "-N", "3", "-o",
                            os.path.join(self.tmp, name + "-%j.out"), *extra, SBATCH],
                           env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.strip().split(";")[0], state, job

    def reference(self, job, steps):
        r = harness.run_workers(1, ["--job", job, "--stage_to_rank_map", "0;"], timeout=600)
        self.assertTrue(r.ok, r.outputs[0][-2000:])
        return r.losses()

    def check_losses(self, state, ref, steps, once=True):
        """Every step ran, each run's loss equals the uninterrupted run's (1e-4); with `once`,
        no step ran twice (a morph that grows the job may redo the step in flight)."""
        seen = rank0_losses(state)
        self.assertEqual(sorted(seen), list(range(1, steps + 1)), "every step")
        for step, runs in seen.items():
            if once:
                self.assertEqual(len(runs), 1, f"step {step} ran {len(runs)} times: {runs}")
            for loss, path in runs:
                self.assertLessEqual(abs(loss - ref[step - 1]), 1e-4 * abs(ref[step - 1]),
                                     f"step {step} ({path})")

    def test_one_allocation_trains_to_succeeded(self):
        job_id, state, job = self.sbatch("plain", steps=30)
        wait_for(lambda: job_state(job_id)[0] in ("COMPLETED", "FAILED", "CANCELLED"), 300,
                 "the allocation to end")
        out = read(glob.glob(os.path.join(self.tmp, f"plain-{job_id}.out"))[0])
        self.assertEqual(job_state(job_id)[0], "COMPLETED", out[-3000:])
        self.assertIn("SUCCEEDED", out)
        # The allocation's random token, readable by its owner alone; the manager took it.
        self.assertEqual(os.stat(state).st_mode & 0o777, 0o700)
        for name in ("token", "tokens"):
            self.assertEqual(os.stat(os.path.join(state, name)).st_mode & 0o777, 0o600, name)
        self.assertGreaterEqual(len(read(os.path.join(state, "token")).strip()), 48)
        self.assertIn("tokens from", read(os.path.join(state, "manager.log")))
        self.assertNotIn("0.0.0.0", out)
        self.check_losses(state, self.reference(job, 30), 30)

    def test_preempted_allocation_requeues_and_resumes(self):
        # 600 steps of at least 40 ms: the job outlasts the preemption on any machine.
        steps = 600
        job_id, state, job = self.sbatch("preempt", steps=steps, step_min_ms=40)
        # Mid-run: a high-priority job wants every node.
        wait_for(lambda: max(rank0_losses(state) or [0]) >= 100, 300, "step 100")
        hi = slurm("sbatch", "--parsable", "-p", "high", "-N", "3", "--wrap", "sleep 5").strip()
        wait_for(lambda: job_state(job_id)[1] >= 1, 120, "the requeue")
        before = max(rank0_losses(state))
        # The generations so far ran in the first allocation (the requeued one starts after
        # the high-priority job).
        first_run = max(generations(state))
        wait_for(lambda: job_state(hi)[0] == "COMPLETED", 120, "the high-priority job")
        wait_for(lambda: job_state(job_id)[0] in ("COMPLETED", "FAILED", "CANCELLED"), 900,
                 "the requeued allocation to end")
        out = read(glob.glob(os.path.join(self.tmp, f"preempt-{job_id}.out"))[0])
        self.assertEqual(job_state(job_id)[0], "COMPLETED", out[-3000:])
        self.assertIn("restart 1", out)
        self.assertGreater(steps, before, "preempted before the end (a machine so slow that "
                           "the preemption took longer than the job?)")
        # Nothing lost: the first generation after the requeue resumed from the last step run
        # before it (the agents' notice made the job checkpoint at that step boundary). Slurm
        # counts the requeue when it signals the agents, so the step in flight when `before`
        # was read may still complete and be the one saved: at least `before`, never older.
        resumed = resumed_by_generation(state)
        after = [g for g in sorted(resumed) if g > first_run]
        self.assertTrue(after, f"no generation after the requeue: {resumed}")
        self.assertGreaterEqual(resumed[after[0]], before,
                                f"last step seen before preemption {before}; resumed {resumed}")
        # After the requeue the job may start on the first agent back and grow in place as
        # the others register; growing may redo the step in flight, with the same loss.
        self.check_losses(state, self.reference(job, steps), steps, once=False)


if __name__ == "__main__":
    main(cleanup=stop_cluster)
