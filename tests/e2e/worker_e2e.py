"""End-to-end tests of varuna-worker: real processes, gloo over loopback.

Run from the build directory: python3 ../tests/e2e/worker_e2e.py [TestClass]
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from lib import harness  # noqa: E402
from lib.worker import Fixture  # noqa: E402
from lib.main import main  # noqa: E402

CONFIGS = [(2, 1), (4, 1), (1, 2), (2, 2)]


class ParityTest(Fixture):
    """Every (P, D) under every schedule computes the 1x1 training (fp32, dropout 0)."""

    def test_all_configs_and_schedules_match_single_process(self):
        base_run = self.run_config(self.job("base"), 1, 1)
        base = base_run.losses()
        (base_eval,) = self.eval_loss(base_run)
        self.assertEqual(len(base), 4)
        for schedule in ["varuna", "gpipe", "1f1b", "zb-h1"]:
            job = self.job("p_" + schedule, parallel={"schedule": schedule})
            for p, d in CONFIGS:
                run = self.run_config(job, p, d)
                self.assertClose(run.losses(), base, 1e-4, f"{schedule} P={p} D={d}")
                # evaluate(): every rank reports the same held-out loss, equal to 1x1's.
                evals = self.eval_loss(run)
                self.assertEqual(len(evals), 1, f"ranks disagree on eval_loss: {evals}")
                self.assertClose(list(evals), [base_eval], 1e-4, f"eval {schedule} P={p} D={d}")
        # The run must actually train, or equal losses would prove nothing.
        self.assertLess(base[-1], base[0])

    def test_uneven_last_micro_batch(self):
        job = self.job("uneven", train={"global_batch": 10}, parallel={"micro_batch": 3})
        base = self.run_config(job, 1, 1).losses()
        self.assertClose(self.run_config(job, 2, 2).losses(), base, 1e-4, "P=2 D=2 mb=3")


class ModelsAndDataTest(Fixture):
    """The MLP model, SGD with momentum, warm-up + cosine LR, and flat token files."""

    def test_mlp_with_sgd_matches_across_configs(self):
        job = self.job("mlp", model={"kind": "mlp", "layers": 3},
                       train={"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "warmup": 2,
                              "schedule": "cosine", "steps": 5})
        base = self.run_config(job, 1, 1).losses()
        self.assertLess(base[-1], base[0])
        self.assertClose(self.run_config(job, 2, 2).losses(), base, 1e-4, "mlp P=2 D=2")

    def write_tokens(self, name, dtype, values):
        import array
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            array.array({"uint16": "H", "uint32": "I"}[dtype], values).tofile(f)
        return path

    @staticmethod
    def as_tokens(job, dtype):
        with open(job) as f:
            text = f.read().replace("{kind: text,", f"{{kind: tokens, dtype: {dtype},")
        with open(job, "w") as f:
            f.write(text)
        return job

    def test_token_files(self):
        # A repeating 50-token pattern with ids above the byte range: quick to learn.
        values = [500 + (i % 50) for i in range(20000)]
        for dtype in ["uint16", "uint32"]:
            path = self.write_tokens(f"tokens_{dtype}.bin", dtype, values)
            job = harness.job_yaml(os.path.join(self.tmp, f"tok_{dtype}.yaml"), path,
                                   model={"vocab": 1000},
                                   train={"steps": 20, "lr": 1e-2})
            self.as_tokens(job, dtype)
            losses = self.run_config(job, 2, 1).losses()
            self.assertGreater(losses[0], 6.0)  # ~ln(1000) = 6.9
            self.assertLess(losses[-1], 0.8 * losses[0])
        # A token id >= vocab is refused before anything starts, naming the id.
        bad = self.write_tokens("bad.bin", "uint16", [1, 2, 3000] * 100)
        job = harness.job_yaml(os.path.join(self.tmp, "bad_tok.yaml"), bad, model={"vocab": 1000})
        self.as_tokens(job, "uint16")
        res = harness.run_workers(1, ["--job", job])
        self.assertFalse(res.ok)
        self.assertIn("token id 3000", res.outputs[0])
        # A file too short for one sample.
        short = self.write_tokens("short.bin", "uint16", [1, 2, 3])
        job = harness.job_yaml(os.path.join(self.tmp, "short.yaml"), short, model={"vocab": 1000})
        self.as_tokens(job, "uint16")
        res = harness.run_workers(1, ["--job", job])
        self.assertFalse(res.ok)
        self.assertIn("needs at least 17", res.outputs[0])


class ExampleProgramTest(Fixture):
    """examples/train_custom.cc, a program written on the libvaruna API, trains as 2 stages."""

    def test_example_trains_in_two_stages(self):
        example = os.path.join(harness.BIN_DIR, "train_custom")
        res = harness.run_workers(2, ["--stage_to_rank_map=0;1;"], cmd=[example])
        self.assertTrue(res.ok, "\n".join(o[-2000:] for o in res.outputs))
        losses = [float(line.split()[-1]) for line in res.outputs[1].splitlines()
                  if line.startswith("step ")]
        self.assertGreaterEqual(len(losses), 5)
        self.assertLess(losses[-1], 0.5 * losses[0])


class RecomputeTest(Fixture):
    """With dropout on, recomputed forwards must reproduce the original activations: the
    varuna schedule (recompute on stage 0) then gives bit-identical training to 1F1B and GPipe,
    which keep the original graphs, because forwards consume the RNG stream in the same order."""

    def test_recompute_with_dropout_matches_stored_activations(self):
        runs = {}
        for schedule in ["varuna", "1f1b", "gpipe"]:
            job = self.job("drop_" + schedule, model={"dropout": 0.3},
                           parallel={"schedule": schedule})
            runs[schedule] = self.run_config(job, 2, 1).losses()
        self.assertEqual(runs["varuna"], runs["1f1b"])
        self.assertEqual(runs["varuna"], runs["gpipe"])


class PrecisionTest(Fixture):
    def test_bf16_trains_close_to_fp32(self):
        fp32 = self.run_config(self.job("fp32"), 2, 1).losses()
        bf16 = self.run_config(self.job("bf16", train={"precision": "bf16"}), 2, 1).losses()
        self.assertClose(bf16, fp32, 0.05, "bf16 vs fp32")

    def test_fp16_overflow_skips_step_and_halves_scale(self):
        init = 3.0e38  # the scaled loss overflows to inf at once
        job = self.job("fp16", train={"precision": "fp16", "init_loss_scale": init,
                                      "loss_scale_window": 2, "steps": 8})
        rows = self.run_config(job, 2, 1).metrics
        self.assertTrue(rows[0]["overflow"])
        self.assertTrue(any(not r["overflow"] for r in rows), "never a clean step")
        # The reported scale follows the rule: halve on overflow, double after 2 clean steps.
        scale, clean = init, 0
        for r in rows:
            if r["overflow"]:
                scale, clean = scale / 2, 0
            else:
                clean += 1
                if clean == 2:
                    scale, clean = scale * 2, 0
            self.assertAlmostEqual(r["loss_scale"] / scale, 1.0, places=9, msg=str(r))
            self.assertLess(r["loss"], 100)  # the reported loss is unscaled

    def test_timeline_and_trace(self):
        # --timeline_out: a line per step per process, split into phases (Note [Step
        # timeline]); --trace_steps 2: a profiler summary of steps 2-3 in each file.
        path = os.path.join(self.tmp, "timeline.jsonl")
        job = self.job("timeline", train={"precision": "bf16"})
        self.run_config(job, 2, 1, extra=["--timeline_out", path, "--trace_steps", "2"])
        for rank, f in [(0, path), (1, path + ".rank1")]:
            with open(f) as fh:
                lines = [json.loads(line) for line in fh]
            steps = [x for x in lines if "step" in x]
            self.assertEqual([x["step"] for x in steps], [1, 2, 3, 4], f)
            for x in steps:
                self.assertEqual(x["rank"], rank)
                self.assertEqual(x["clock"], "host")
                self.assertEqual(x["host_syncs"], 1)
                self.assertEqual(x["traced"], x["step"] in (2, 3), x)
                phases = [x[k + "_s"] for k in ("forward", "backward", "norm", "optimizer",
                                                "comm")]
                self.assertTrue(all(v > 0 for v in phases), x)
                self.assertLessEqual(sum(phases), x["step_s"], x)
            traces = [x["trace"] for x in lines if "trace" in x]
            self.assertEqual(len(traces), 1, f)  # every process traces its own steps
            t = traces[0]
            self.assertEqual((t["first_step"], t["steps"], t["asked"], t["where"]),
                             (2, 2, 2, "host"), t)
            cats = {c["name"]: c for c in t["categories"]}
            # A GPT's matrix products, each forward's and backward's (at this size the
            # framework's own overhead, "other", costs about as much).
            self.assertGreater(cats["gemm"]["count"], 0, t)
            self.assertGreater(cats["gemm"]["time_s"], 0, t)
            self.assertAlmostEqual(sum(c["time_s"] for c in t["categories"]), t["total_s"],
                                   delta=1e-3 * t["total_s"] + 1e-6)

    def test_skipped_step_leaves_the_weights_alone(self):
        # One fp16 step that overflows is skipped, so the held-out loss afterwards must equal
        # that of the untrained model (--steps 0).
        job = self.job("fp16skip", train={"precision": "fp16", "init_loss_scale": 3.0e38})
        skipped = self.run_config(job, 2, 1, extra=["--steps", "1"])
        self.assertTrue(skipped.metrics[0]["overflow"])
        untrained = self.run_config(job, 2, 1, extra=["--steps", "0"])
        self.assertEqual(self.eval_loss(skipped), self.eval_loss(untrained))
        trained = self.run_config(self.job("fp32one"), 2, 1, extra=["--steps", "1"])
        self.assertNotEqual(self.eval_loss(trained), self.eval_loss(untrained))


class BadInputTest(Fixture):
    """Bad input exits non-zero within seconds, naming the problem, before any rendezvous."""

    def expect_error(self, args, needle, world=2, env=None, code=None):
        t0 = time.time()
        port = harness.free_port()
        env = dict(os.environ, RANK="1", WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), **(env or {}))
        # Rank 1 of a 2-rank world: if it reached the rendezvous it would wait for rank 0.
        p = subprocess.run([harness.WORKER] + args, env=env, capture_output=True, text=True,
                           timeout=60)
        self.assertNotEqual(p.returncode, 0)
        if code is not None:
            self.assertEqual(p.returncode, code, p.stderr[-1000:])
        self.assertLess(time.time() - t0, 20)
        last = p.stderr.strip().splitlines()[-1]
        self.assertIn("error", last)
        self.assertIn(needle, last)

    def test_bad_inputs(self):
        good = self.job("good")
        self.expect_error(["--job", good, "--stage_to_rank_map", "0,2;1,3;"], "WORLD_SIZE is 2")
        self.expect_error(["--job", good, "--stage_to_rank_map", "0;x;"], "0;x;")
        self.expect_error(["--job", good, "--stage_to_rank_map", "0;1"], "';'")
        unknown = self.job("unknown", extra="bogus_key: 1\n")
        self.expect_error(["--job", unknown], "unknown key 'bogus_key'")
        sched = self.job("sched", parallel={"schedule": "zigzag"})
        self.expect_error(["--job", sched], "zigzag")
        self.expect_error(["--job", os.path.join(self.tmp, "missing.yaml")], "missing.yaml")
        nodata = harness.job_yaml(os.path.join(self.tmp, "nodata.yaml"), "/nonexistent/corpus")
        self.expect_error(["--job", nodata], "/nonexistent/corpus")
        self.expect_error(["--job", good, "--stage_to_rank_map", "0;1;", "--bogus"], "--bogus")
        self.expect_error(["--job", good, "--resume_step", "latest"], "checkpoint.dir")
        self.expect_error(["--job", good, "--trace_steps", "2"], "--timeline_out")
        self.expect_error(["--job", good, "--timeline_out", "/nonexistent/dir/t.jsonl"],
                          "/nonexistent/dir/t.jsonl")
        mism = self.job("mism", parallel={"stages": 4})
        self.expect_error(["--job", mism, "--stage_to_rank_map", "0;1;"], "disagrees")
        # A GPU asked for on this CPU-only build (or a machine without one) is named.
        gpu = self.job("gpu", train={"device": "cuda"})
        self.expect_error(["--job", gpu, "--stage_to_rank_map", "0;1;"], "train.device 'cuda'")
        # Issue 47's lows: the worker's own variables, malformed, are bad input (exit 3).
        for name, value in (("VARUNA_FAULT", "nowhere@x"), ("VARUNA_STEP_MIN_MS", "fast"),
                            ("VARUNA_TP_SIZE", "0")):
            self.expect_error(["--job", good, "--stage_to_rank_map", "0;1;"], name,
                              env={name: value}, code=3)

    def test_dead_peer_is_an_error_not_a_hang(self):
        # Rank 1 never starts: rank 0 must give up after the configured timeout.
        job = self.job("lonely", parallel={"timeout_s": 3})
        port = harness.free_port()
        env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        t0 = time.time()
        p = subprocess.run([harness.WORKER, "--job", job, "--stage_to_rank_map", "0;1;"],
                           env=env, capture_output=True, text=True, timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertLess(time.time() - t0, 60)
        self.assertIn("error", p.stderr.strip().splitlines()[-1])


class LearningTest(Fixture):
    def test_two_stage_run_on_english_text_learns(self):
        job = self.job("learn", model={"layers": 2, "d_model": 64, "seq_len": 32},
                       train={"global_batch": 16, "steps": 60, "lr": 3e-3, "warmup": 5,
                              "schedule": "cosine"},
                       parallel={"micro_batch": 4})
        losses = self.run_config(job, 2, 1).losses()
        self.assertGreater(losses[0], 5.0)  # ~ln(256) at the start
        self.assertLess(losses[-1], 0.6 * losses[0])


class TorchrunTest(Fixture):
    def test_under_torchrun_no_python(self):
        torchrun = harness.TORCHRUN
        if not os.path.exists(torchrun):
            self.skipTest(f"{torchrun} is not installed")
        job = self.job("torchrun")
        metrics = os.path.join(self.tmp, "torchrun.jsonl")
        p = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "--redirects", "1",
                            "--tee", "1", "--log_dir", os.path.join(self.tmp, "torchrun-logs"),
                            "--no_python",
                            harness.WORKER, "--job", job, "--stage_to_rank_map", "0;1;",
                            "--metrics_out", metrics],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-3000:])
        base = self.run_config(job, 1, 1).losses()
        import json
        got = [json.loads(l)["loss"] for l in open(metrics)]
        self.assertClose(got, base, 1e-4, "torchrun 2x1")


if __name__ == "__main__":
    main()
