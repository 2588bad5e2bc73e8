"""End-to-end tests of TorchScript models: segments exported from Python by
scripts/export_torchscript.py (the project's Python and its torch, the LibTorch the worker is
built against), trained by real varuna-worker processes over loopback gloo.

Run from the build directory:
    VARUNA_BIN_DIR=bin ../scripts/python ../tests/e2e/torchscript_e2e.py -v
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from lib import harness  # noqa: E402
from lib.worker import Fixture  # noqa: E402
from lib.main import main  # noqa: E402

PYTHON = sys.executable  # the project's environment (scripts/python), as ctest runs it
EXPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "export_torchscript.py")
# Tiny: 4 segments (embedding, 2 blocks, head) of 8.7k, 12.7k, 12.7k, 8.5k parameters.
SHAPE = {"layers": 2, "d_model": 32, "heads": 4, "seq_len": 16, "vocab": 256}


def torch_importable():
    try:
        return subprocess.run([PYTHON, "-c", "import torch"], capture_output=True,
                              timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class TorchScriptTest(Fixture):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="varuna-ts-test-")
        cls.data = harness.write_text_corpus(os.path.join(cls.tmp, "corpus.txt"))
        cls.exports = {}
        cls.has_torch = None

    def export(self, dropout=0.0):
        """Exports the tiny model once per dropout value; returns its directory."""
        if self.has_torch is None:
            type(self).has_torch = torch_importable()
        if not self.has_torch:
            self.skipTest(f"{PYTHON} cannot import torch (run scripts/install_deps.sh)")
        if dropout not in self.exports:
            out = os.path.join(self.tmp, f"gpt_ts_drop{dropout}")
            args = [PYTHON, EXPORT, "--out", out, "--dropout", str(dropout), "--seed", "3"]
            for k, v in SHAPE.items():
                args += [f"--{k}", str(v)]
            p = subprocess.run(args, capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            for i in range(SHAPE["layers"] + 2):
                path = os.path.join(out, f"segment_{i}.pt")
                self.assertTrue(os.path.isfile(path), path)
                self.assertIn(path, p.stdout)
            self.exports[dropout] = out
        return self.exports[dropout]

    def job(self, name, model_dir, **kw):
        model = {"kind": "torchscript", "path": model_dir, "seq_len": SHAPE["seq_len"],
                 "vocab": SHAPE["vocab"]}
        return harness.job_yaml(os.path.join(self.tmp, name + ".yaml"), self.data, model=model,
                                **kw)

    def test_exported_model_trains(self):
        job = self.job("learn", self.export(), train={"steps": 30, "lr": 3e-3})
        res = self.run_config(job, 1, 1)
        self.assertIn("layers=segment_0,segment_1,segment_2,segment_3", res.outputs[0])
        losses = res.losses()
        self.assertEqual(len(losses), 30)
        self.assertGreater(losses[0], 5.0)  # ~ln(256) at the start
        self.assertLess(losses[-1], 0.8 * losses[0])

    def test_pipeline_and_data_parallel_match_single_process(self):
        job = self.job("parity", self.export())
        base = self.run_config(job, 1, 1).losses()
        self.assertEqual(len(base), 4)
        self.assertLess(base[-1], base[0])  # it trains, so equal losses mean something
        for p, d in [(2, 1), (2, 2), (4, 1)]:
            res = self.run_config(job, p, d)
            self.assertClose(res.losses(), base, 1e-4, f"P={p} D={d}")
            # Each stage loads only its own segments (balanced by parameter count).
            if p == 2:
                self.assertIn("layers=segment_0,segment_1\n", res.outputs[0])
                self.assertIn("layers=segment_2,segment_3\n", res.outputs[1])

    def test_dropout_is_on_in_training_and_recompute_reproduces_it(self):
        # The worker switches segments to train mode: dropout changes the losses. The varuna
        # schedule recomputes stage 0's forward; the script module's dropout must draw the same
        # masks again, giving losses identical to 1F1B, which keeps the original graphs.
        drop = self.export(dropout=0.3)
        runs = {s: self.run_config(self.job("drop_" + s, drop, parallel={"schedule": s}),
                                   2, 1).losses()
                for s in ["varuna", "1f1b"]}
        self.assertEqual(runs["varuna"], runs["1f1b"])
        clean = self.run_config(self.job("nodrop", self.export()), 2, 1).losses()
        self.assertNotEqual(runs["varuna"][0], clean[0])

    def test_one_stage_failing_at_start_up_stops_every_rank_quickly(self):
        # The last segment is corrupt: only stage 1 can notice, when it builds its layers.
        good = self.export()
        bad = os.path.join(self.tmp, "gpt_ts_corrupt")
        shutil.copytree(good, bad, dirs_exist_ok=True)
        last = os.path.join(bad, f"segment_{SHAPE['layers'] + 1}.pt")
        with open(last, "wb") as f:
            f.write(b"not a torchscript archive")
        job = self.job("corrupt", bad, parallel={"timeout_s": 120})
        t0 = time.time()
        res = harness.run_workers(2, ["--job", job, "--stage_to_rank_map", "0;1;"], timeout=100)
        self.assertLess(time.time() - t0, 30, "ranks waited for the timeout")
        self.assertTrue(all(rc not in (0, -9) for rc in res.returncodes), res.returncodes)
        self.assertIn(last, res.outputs[1].strip().splitlines()[-1])
        self.assertIn("another rank failed", res.outputs[0].strip().splitlines()[-1])

    def test_missing_segment_0_is_an_error_naming_the_path(self):
        empty = os.path.join(self.tmp, "empty_model")
        os.makedirs(empty, exist_ok=True)
        for model_dir in [empty, os.path.join(self.tmp, "no_such_dir")]:
            job = self.job("missing", model_dir)
            env = dict(os.environ, RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(harness.free_port()))
            # Rank 1 of a 2-rank world: if it reached the rendezvous it would wait for rank 0.
            t0 = time.time()
            p = subprocess.run([harness.WORKER, "--job", job, "--stage_to_rank_map", "0;1;"],
                               env=env, capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0)
            self.assertLess(time.time() - t0, 20)
            last = p.stderr.strip().splitlines()[-1]
            self.assertIn("error", last)
            self.assertIn(model_dir, last)
            self.assertIn("segment_0.pt", last)

    def test_export_rejects_bad_arguments_in_one_line(self):
        self.export()  # skips without torch
        blocker = os.path.join(self.tmp, "a_file")
        open(blocker, "w").close()
        good = {**SHAPE, "out": os.path.join(self.tmp, "bad_export")}
        for change, needle in [({"heads": 5}, "--heads (5) must divide --d_model (32)"),
                               ({"out": os.path.join(blocker, "sub")}, blocker)]:
            args = [PYTHON, EXPORT]
            for k, v in {**good, **change}.items():
                args += [f"--{k}", str(v)]
            p = subprocess.run(args, capture_output=True, text=True, timeout=300)
            self.assertNotEqual(p.returncode, 0)
            lines = p.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, p.stderr)
            self.assertIn("error", lines[0])
            self.assertIn(needle, lines[0])


if __name__ == "__main__":
    main()
