"""BERT (model.kind bert: Hugging Face's BertForMaskedLM; docs/models.md "BERT").

ParityTest: a small BertForMaskedLM made and saved by transformers starts a job (init_from) on
an llm.c corpus, the [MASK] id taken from the tokenizer directory. On 1 x 1, 2 x 2 and a
heterogeneous mix (a 2-stage pipeline beside a 1-stage one) the sample log holds each step's
masked batch (input_ids, labels with -100), the same on every shape; the step-1 loss equals
transformers' loss of the init weights on that batch, and the step-2 loss equals its loss on
the step-2 batch of the step-1 checkpoint exported with `varuna-ckpt export --format hf` and
loaded with from_pretrained (1e-5): the loss is the mean over the global batch's masked
positions, whatever the shape. A run resumed from step 2 on another shape, and a run morphed
in place through the manager, compute the one-process losses (1e-5, 1e-4). Bad input: no
[MASK] anywhere, a config of another activation."""

import glob
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import harness  # noqa: E402
from lib.cluster import Cluster  # noqa: E402
from lib.jobs import MORPH_CONFIG, morph_driver  # noqa: E402
from lib.main import main  # noqa: E402

import torch  # noqa: E402

CKPT = os.path.join(harness.BIN_DIR, "varuna-ckpt")
SEQ = 16
VOCAB = 300
MASK = 1
CFG = {"vocab_size": VOCAB, "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4,
       "intermediate_size": 96, "max_position_embeddings": 32, "type_vocab_size": 2,
       "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
MODULES = ["bert.embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1",
           "bert.encoder.layer.2", "cls.predictions"]


def write_llmc(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, len(tokens)] + [0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    return path


def make_bert_dir(out, seed=0):
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(seed)
    model = BertForMaskedLM(BertConfig(**CFG))
    with torch.no_grad():  # norms that are not the identity, biases that are not zero
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    return out


def make_tokenizer(out):
    """A word-level tokenizer: [PAD] 0, [MASK] 1, w2 .. w299, saved as transformers saves one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    os.makedirs(out, exist_ok=True)
    vocab = {"[PAD]": 0, "[MASK]": MASK, **{f"w{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[PAD]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(out, "tokenizer.json"))
    PreTrainedTokenizerFast(tokenizer_file=os.path.join(out, "tokenizer.json"), mask_token="[MASK]",
                            pad_token="[PAD]").save_pretrained(out)
    return out


def flow(d):
    return "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"


def read_batches(log_dir):
    """step -> (input_ids, labels) of the whole global batch, ordered by (source, epoch, sample)
    from every rank's sample log (the newest generation's record of a step wins)."""
    steps = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "rank-*.gen-*.jsonl"))):
        gen = int(path.rsplit(".gen-", 1)[1].split(".")[0])
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if "input_ids" not in r:
                    continue
                key = (r["source"], r["epoch"], r["sample"])
                steps.setdefault(r["step"], {})[key] = (gen, r["input_ids"], r["labels"])
    out = {}
    for step, recs in steps.items():
        rows = [recs[k] for k in sorted(recs)]
        out[step] = (torch.tensor([r[1] for r in rows]), torch.tensor([r[2] for r in rows]))
    return out


def hf_loss(model_dir, ids, labels):
    from transformers import BertForMaskedLM
    model = BertForMaskedLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=ids, labels=labels).loss.item()


class Fixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="varuna-bert-")
        cls.init = make_bert_dir(os.path.join(cls.tmp, "init"))
        cls.tok = make_tokenizer(os.path.join(cls.tmp, "tok"))
        rnd = random.Random(3)
        cls.corpus = write_llmc(os.path.join(cls.tmp, "train.bin"),
                                [rnd.randrange(2, VOCAB) for _ in range(4000)])

    @classmethod
    def tearDownClass(cls):
        if not os.environ.get("VARUNA_KEEP_TMP"):
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def job(self, name, steps=2, parallel=None, extra="", tokenizer=True, model=None):
        log = os.path.join(self.tmp, "log-" + name)
        shutil.rmtree(log, ignore_errors=True)
        data = {"kind": "llmc", "sources": f"[{{shards: [{self.corpus}]}}]", "sample_log": log}
        if tokenizer:
            data["tokenizer_dir"] = self.tok
        model = {"kind": "bert", "init_from": self.init, "seq_len": SEQ, **(model or {})}
        train = {"global_batch": 4, "steps": steps, "optimizer": "adamw", "lr": 1e-3,
                 "schedule": "constant", "clip_grad_norm": 0, "precision": "fp32", "seed": 5}
        parallel = {"micro_batch": 1, "timeout_s": 60, **(parallel or {})}
        path = os.path.join(self.tmp, name + ".yaml")
        with open(path, "w") as f:
            f.write(f"name: bert\nmodel: {flow(model)}\ndata: {flow(data)}\n"
                    f"train: {flow(train)}\nparallel: {flow(parallel)}\n{extra}")
        return path, log

    def run_job(self, job, world, args=()):
        res = harness.run_workers(world, ["--job", job, *args])
        self.assertTrue(res.ok, f"{job}: {res.returncodes}\n" +
                        "\n".join(o[-3000:] for o in res.outputs))
        return res

    def export(self, ckpt, step, out):
        r = subprocess.run([CKPT, "export", ckpt, str(step), "--format", "hf", "--out", out],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return out


class ParityTest(Fixture):
    def test_shapes_match_transformers_and_export_reloads(self):
        ckpt = os.path.join(self.tmp, "ckpt-1x1")
        job, log = self.job("1x1", extra=f"checkpoint: {{dir: {ckpt}, every_steps: 1}}\n")
        base = self.run_job(job, 1).losses()
        batches = read_batches(log)
        self.assertEqual(sorted(batches), [1, 2])
        ids1, labels1 = batches[1]
        self.assertEqual(tuple(ids1.shape), (4, SEQ))
        masked = labels1 != -100
        self.assertTrue(0 < int(masked.sum()) < 4 * SEQ, labels1)
        # 80/10/10: most predicted positions hold [MASK]; the others are real tokens.
        self.assertGreater(int((ids1[masked] == MASK).sum()), int(masked.sum()) // 2)
        self.assertTrue(bool((ids1[~masked] != MASK).all()))
        want1 = hf_loss(self.init, ids1, labels1)
        self.assertLessEqual(abs(base[0] - want1), 1e-5 * abs(want1), (base[0], want1))
        exported = self.export(ckpt, 1, os.path.join(self.tmp, "export-1"))
        want2 = hf_loss(exported, *batches[2])
        self.assertLessEqual(abs(base[1] - want2), 1e-5 * abs(want2), (base[1], want2))
        # The same training on 2 x 2 and on a 2-stage pipeline beside a 1-stage one.
        pd, pd_log = self.job("2x2", parallel={"micro_batch": 1})
        got = self.run_job(pd, 4, ["--stage_to_rank_map", harness.stage_map(2, 2)]).losses()
        stages = "[[" + ", ".join(MODULES[:2]) + "], [" + ", ".join(MODULES[2:]) + "]]"
        pipes = (f"[{{stages: {stages}, count: 1, microbatches: 2}}, "
                 f"{{stages: [[{', '.join(MODULES)}]], count: 1, microbatches: 2}}]")
        mix, mix_log = self.job("mix", parallel={"micro_batch": 1, "pipelines": pipes})
        got_mix = self.run_job(mix, 3).losses()
        for name, losses, log_dir in (("2x2", got, pd_log), ("mix", got_mix, mix_log)):
            self.assertEqual(len(losses), 2, name)
            for i, (g, w) in enumerate(zip(losses, (want1, want2))):
                self.assertLessEqual(abs(g - w), 1e-5 * abs(w), f"{name} step {i + 1}: {g} vs {w}")
            other = read_batches(log_dir)
            for step in (1, 2):
                self.assertTrue(torch.equal(other[step][0], batches[step][0]), (name, step))
                self.assertTrue(torch.equal(other[step][1], batches[step][1]), (name, step))
        # The export's config loads as a BertForMaskedLM with the tied decoder.
        with open(os.path.join(exported, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["model_type"], "bert")
        self.assertEqual(cfg["architectures"], ["BertForMaskedLM"])

    def test_resume_on_another_shape(self):
        ckpt = os.path.join(self.tmp, "ckpt-resume")
        job, _ = self.job("four", steps=4, extra=f"checkpoint: {{dir: {ckpt}, every_steps: 2}}\n")
        base = self.run_job(job, 4, ["--stage_to_rank_map", harness.stage_map(2, 2)]).losses()
        self.assertEqual(len(base), 4)
        resumed = self.run_job(job, 2, ["--stage_to_rank_map", harness.stage_map(1, 2),
                                        "--resume_step", "2"]).losses()
        self.assertEqual(len(resumed), 2)
        for i, (g, w) in enumerate(zip(resumed, base[2:])):
            self.assertLessEqual(abs(g - w), 1e-5 * abs(w), f"step {i + 3}: {g} vs {w}")

    def test_bad_input_is_named(self):
        job, _ = self.job("no-mask", tokenizer=False)
        res = harness.run_workers(1, ["--job", job], timeout=60)
        self.assertEqual(res.returncodes, [3], res.outputs[0][-2000:])
        self.assertIn("model.mask_token_id", res.outputs[0])
        # A mask id outside the vocabulary.
        job, _ = self.job("bad-mask", tokenizer=False, model={"mask_token_id": VOCAB})
        res = harness.run_workers(1, ["--job", job], timeout=60)
        self.assertEqual(res.returncodes, [3], res.outputs[0][-2000:])
        self.assertIn("model.mask_token_id", res.outputs[0])
        # A BERT whose activation is not GELU.
        relu = os.path.join(self.tmp, "relu")
        shutil.copytree(self.init, relu, dirs_exist_ok=True)
        with open(os.path.join(relu, "config.json")) as f:
            cfg = json.load(f)
        cfg["hidden_act"] = "relu"
        with open(os.path.join(relu, "config.json"), "w") as f:
            json.dump(cfg, f)
        job, _ = self.job("relu", model={"init_from": relu})
        res = harness.run_workers(1, ["--job", job], timeout=60)
        self.assertEqual(res.returncodes, [3], res.outputs[0][-2000:])
        self.assertIn("hidden_act is 'relu'", res.outputs[0])


class MorphTest(Fixture):
    """A bert job through the manager, 2 x 2 on two agents, morphed in place by a preemption
    notice: every step's loss equals a one-process run's (1e-4)."""

    def test_morph_in_place_keeps_parity(self):
        c = Cluster(agents=2, slots=2, manager_config=MORPH_CONFIG + "morph_in_place: true\n")
        self.addCleanup(c.close)
        steps = 40
        ckpt = os.path.join(c.dir, "ckpt")
        # Paced (at least 100 ms a step), so the notice lands mid-run on a loaded machine too.
        job, _ = self.job("morph", steps=steps, parallel={"micro_batch": 1, "stages": 2},
                          extra=f"checkpoint: {{dir: {ckpt}}}\n"
                                "env: {VARUNA_STEP_MIN_MS: '100'}\n")
        ref_job, _ = self.job("morph-ref", steps=steps)
        ref = self.run_job(ref_job, 1).losses()
        t = morph_driver(c)
        job_id = t.submit(job)
        t.running_at(job_id, 10)
        c.ctl("preempt", "node1", "--in", "30s", check=0)
        st = harness_wait_done(c, job_id)
        self.assertEqual(st["state"], "SUCCEEDED", f"{st}\n{c.tail()}")
        self.assertTrue(st["morphs"] and st["morphs"][0].get("in_place"), st)
        metrics = json.loads(c.ctl("-o", "json", "metrics", job_id, check=0).stdout)
        self.assertEqual([int(m["step"]) for m in metrics], list(range(1, steps + 1)))
        for m, w in zip(metrics, ref):
            self.assertLess(abs(m["loss"] - w) / abs(w), 1e-4, f"step {m['step']}: {m} vs {w}")


def harness_wait_done(c, job_id):
    from lib.cluster import wait_for
    return wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") and s)(
        c.status(job_id)), 300, "the job to finish")


if __name__ == "__main__":
    main()
