"""Validation loss and TensorBoard (docs/job_spec.md "eval", docs/observability.md
"TensorBoard").

ShapesTest: the same job with an eval section run by varuna-worker as 1 x 1, 1 x 2 and 2 x 2:
the validation loss at each eval step is the same on every shape (1e-5; its samples split
unevenly over the replicas), it is in the step's metrics line only on those steps, and the
2 x 2 run's TensorBoard files, read by TensorBoard's own EventAccumulator, hold every tag at
the expected steps, with the generation as a text event. Bad eval and TensorBoard input is a
start-up error naming the key.
ClusterTest: the job through the manager as 2 x 2 on two agents, morphed in place by a
preemption notice: `varunactl metrics` shows the validation loss at every eval step, equal to
a one-process run of the same job (1e-4) on both sides of the morph; /metrics has
varuna_job_eval_loss; TensorBoard's steps are 1..N once each, increasing across the morph, with
a text event per generation naming why the second exists."""

import json
import os
import shutil
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import harness  # noqa: E402
from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.harness import free_port  # noqa: E402
from lib.jobs import MORPH_CONFIG, STEPS, morph_driver, write_morph_job  # noqa: E402
from lib.main import main  # noqa: E402

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

TAGS = {"train/loss", "eval/loss", "train/lr", "train/grad_norm", "train/tokens_per_s",
        "train/samples_per_s"}


def write_heldout(path, size=40_000):
    """Held-out text: the end of the fortunes file (the training corpus is its start)."""
    src = "/usr/share/games/fortunes/fortunes"
    if os.path.exists(src):
        with open(src, "rb") as f:
            data = f.read()[-size:]
        with open(path, "wb") as f:
            f.write(data)
        return path
    return harness.write_text_corpus(path, size=size, seed=1)


def read_tensorboard(directory):
    acc = EventAccumulator(directory, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags["scalars"]}
    texts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors("generation")] \
        if "generation" in tags["tensors"] else []
    return scalars, texts


def evals(rows):
    return {int(r["step"]): r["eval_loss"] for r in rows if "eval_loss" in r}


class ShapesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="varuna-val-")
        cls.data = harness.write_text_corpus(os.path.join(cls.tmp, "corpus.txt"))
        cls.val = write_heldout(os.path.join(cls.tmp, "val.txt"))

    @classmethod
    def tearDownClass(cls):
        if not os.environ.get("VARUNA_KEEP_TMP"):
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def job(self, name, extra):
        return harness.job_yaml(os.path.join(self.tmp, name + ".yaml"), self.data,
                                train={"steps": 8, "global_batch": 8}, extra=extra)

    def eval_section(self):
        # 10 samples: 5 per replica at D=2, in rounds of 4 and 1 (micro-batches of 2 and 1).
        return f"eval: {{data: {{kind: text, path: {self.val}}}, every_steps: 3, samples: 10}}\n"

    def test_equal_across_shapes_and_tensorboard_reads_back(self):
        tb = os.path.join(self.tmp, "tb")
        job = self.job("val", self.eval_section() + f"observability: {{tensorboard_dir: {tb}}}\n")
        runs = {}
        for stages, replicas in ((1, 1), (1, 2), (2, 2)):
            res = harness.run_workers(stages * replicas,
                                      ["--job", job, "--stage_to_rank_map",
                                       harness.stage_map(stages, replicas)])
            self.assertTrue(res.ok, "\n".join(o[-2000:] for o in res.outputs))
            runs[(stages, replicas)] = res
        base = evals(runs[(1, 1)].metrics)
        self.assertEqual(sorted(base), [3, 6, 8], "every 3 steps and after the last")
        for shape, res in runs.items():
            got = evals(res.metrics)
            self.assertEqual(sorted(got), sorted(base), shape)
            for step, want in base.items():
                self.assertLessEqual(abs(got[step] - want), 1e-5 * abs(want),
                                     f"{shape} step {step}: {got[step]} vs {want}")
        # The validation loss falls as the model trains (it is not the training batch's).
        self.assertLess(base[8], base[3])
        self.assertNotAlmostEqual(base[8], runs[(1, 1)].metrics[7]["loss"], places=6)
        # Three runs wrote into one directory, each starting at step 1: TensorBoard keeps the
        # last run's steps (its session start drops the earlier files' steps from 1 on).
        scalars, texts = read_tensorboard(tb)
        self.assertTrue(TAGS <= set(scalars), sorted(scalars))
        self.assertEqual([s for s, _ in scalars["train/loss"]], list(range(1, 9)))
        self.assertEqual([s for s, _ in scalars["eval/loss"]], [3, 6, 8])
        for (s, v), want in zip(scalars["train/loss"], runs[(2, 2)].losses()):
            self.assertAlmostEqual(v, want, delta=1e-5 * abs(want), msg=f"step {s}")
        for s, v in scalars["eval/loss"]:
            self.assertAlmostEqual(v, base[s], delta=1e-5 * abs(base[s]), msg=f"eval step {s}")
        self.assertTrue(texts, "no generation text event")
        self.assertIn("first", texts[-1][1])

    def test_tensorboard_steps_stay_increasing_across_a_resume(self):
        # 8 steps, then the same job resumed from its step-4 checkpoint: TensorBoard shows
        # steps 1..8 once each, 5..8 from the resumed run (its session start drops the first
        # run's).
        tb = os.path.join(self.tmp, "tb-resume")
        ckpt = os.path.join(self.tmp, "ckpt-resume")
        job = self.job("resume", self.eval_section() +
                       f"observability: {{tensorboard_dir: {tb}}}\n"
                       f"checkpoint: {{dir: {ckpt}, every_steps: 4}}\n")
        first = harness.run_workers(1, ["--job", job])
        self.assertTrue(first.ok, first.outputs[0][-2000:])
        # The resumed run trains at another learning rate, so its values are told apart, and
        # saves every step: its step-5 checkpoint, before it validates, carries the step-3
        # validation it resumed with.
        with open(job) as f:
            text = f.read().replace("lr: 0.001", "lr: 0.01").replace(
                f"dir: {ckpt}, every_steps: 4", f"dir: {ckpt}, every_steps: 1")
        with open(job, "w") as f:
            f.write(text)
        second = harness.run_workers(1, ["--job", job, "--resume_step", "4"])
        self.assertTrue(second.ok, second.outputs[0][-2000:])
        self.assertEqual([int(m["step"]) for m in second.metrics], [5, 6, 7, 8])
        scalars, _ = read_tensorboard(tb)
        self.assertEqual([s for s, _ in scalars["train/loss"]], list(range(1, 9)))
        got = dict(scalars["train/loss"])
        for m in first.metrics[:4]:
            self.assertAlmostEqual(got[int(m["step"])], m["loss"], delta=1e-5 * abs(m["loss"]))
        for m in second.metrics:
            self.assertAlmostEqual(got[int(m["step"])], m["loss"], delta=1e-5 * abs(m["loss"]))
        self.assertAlmostEqual(dict(scalars["train/lr"])[8], 0.01, places=6)
        # The checkpoint records the newest validation loss (steps 3 and 6 validate).
        with open(os.path.join(ckpt, "varuna_ckpt_4", "common.json")) as f:
            common = json.load(f)
        self.assertEqual(common["eval_step"], "3")
        self.assertAlmostEqual(float(common["eval_loss"]), evals(first.metrics)[3], places=6)
        with open(os.path.join(ckpt, "varuna_ckpt_5", "common.json")) as f:
            resumed = json.load(f)
        self.assertEqual((resumed.get("eval_step"), resumed.get("eval_loss")),
                         (common["eval_step"], common["eval_loss"]))

    def test_bad_eval_and_tensorboard_input_is_named(self):
        plain = os.path.join(self.tmp, "plain")
        with open(plain, "w") as f:
            f.write("x")
        cases = [
            (f"eval: {{data: {{kind: text, path: {self.tmp}/missing.txt}}}}\n", "missing.txt"),
            ("eval: {every_steps: 2}\n", "'eval.data' is required"),
            (f"observability: {{tensorboard_dir: {plain}/tb}}\n", "observability.tensorboard_dir"),
        ]
        for i, (extra, want) in enumerate(cases):
            job = self.job(f"bad{i}", extra)
            res = harness.run_workers(1, ["--job", job], timeout=60)
            self.assertEqual(res.returncodes, [3], f"{extra}: {res.outputs[0][-1500:]}")
            self.assertIn(want, res.outputs[0], extra)


class ClusterTest(unittest.TestCase):
    def setUp(self):
        self.http = free_port()
        self.c = Cluster(agents=2, slots=2, manager_config=MORPH_CONFIG +
                         f"morph_in_place: true\nhttp_listen: 127.0.0.1:{self.http}\n"
                         "http_open_metrics: true\n")
        self.addCleanup(self.c.close)

    def test_validation_and_tensorboard_survive_a_morph_in_place(self):
        c = self.c
        val = write_heldout(os.path.join(c.dir, "val.txt"))
        tb = os.path.join(c.dir, "tb")
        # Every step validates, so the step the morph stops at does too: a morph loses no
        # validation point (the stop saves first, then validates).
        extra = (f"eval: {{data: {{kind: text, path: {val}}}, every_steps: 1, samples: 12}}\n"
                 f"observability: {{tensorboard_dir: {tb}}}\n")
        # The reference: the same job as one process.
        ref = harness.run_workers(1, ["--job", write_morph_job(c, "ref.yaml", stages=1,
                                                               ckpt=False, extra=extra)],
                                  timeout=900)
        self.assertTrue(ref.ok, ref.outputs[0][-2000:])
        want = evals(ref.metrics)
        self.assertEqual(sorted(want), list(range(1, STEPS + 1)))
        os.rename(tb, tb + "-ref")
        t = morph_driver(c)
        job_id = t.submit(write_morph_job(c, extra=extra))
        t.running_at(job_id, 25)
        c.ctl("preempt", "node1", "--in", "30s", check=0)
        st, metrics = t.finish(job_id)  # every step once, losses as the reference's
        m = st["morphs"][0]
        self.assertTrue(m.get("in_place"), m)
        got = evals(metrics)
        self.assertEqual(sorted(got), sorted(want), metrics[-1])
        for step, w in want.items():
            self.assertLess(abs(got[step] - w) / abs(w), 1e-4, f"step {step}: {got[step]} vs {w}")
        before = [s for s in got if s <= 25]
        after = [s for s in got if s > int(m["resumed_from"])]
        self.assertTrue(before and after, (before, after, m))
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=10) as r:
            text = r.read().decode()
        line = [ln for ln in text.splitlines()
                if ln.startswith("varuna_job_eval_loss{") and job_id in ln]
        self.assertTrue(line, "no varuna_job_eval_loss series")
        self.assertAlmostEqual(float(line[0].rsplit(" ", 1)[1]), want[STEPS],
                               delta=1e-4 * abs(want[STEPS]))
        # TensorBoard: one file per reporting process; steps increasing across the morph.
        deadline = time.time() + 10
        while True:
            scalars, texts = read_tensorboard(tb)
            if [s for s, _ in scalars.get("train/loss", [])] == list(range(1, STEPS + 1)) \
                    or time.time() > deadline:
                break
            time.sleep(0.5)
        self.assertEqual([s for s, _ in scalars["train/loss"]], list(range(1, STEPS + 1)))
        self.assertEqual([s for s, _ in scalars["eval/loss"]], sorted(want))
        for s, v in scalars["eval/loss"]:
            self.assertAlmostEqual(v, want[s], delta=1e-4 * abs(want[s]))
        self.assertGreaterEqual(len(texts), 2, texts)
        self.assertIn("generation 2", texts[-1][1])
        self.assertIn("node1", texts[-1][1], texts)
        print(f"generations: {json.dumps(texts)}", file=sys.stderr)


if __name__ == "__main__":
    main()
