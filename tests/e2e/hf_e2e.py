"""Hugging Face models in and out (docs/models.md), with real binaries.

ImportExportTest: small Llama and GPT-2 directories made by transformers itself
(LlamaForCausalLM / GPT2LMHeadModel from a config, seeded random weights, save_pretrained)
start a job (model.init_from); the first step's loss on a one-sample data file equals
transformers' forward of that directory (1e-5); `varuna-ckpt export` after N steps, loaded with
from_pretrained, computes the loss the system reports at step N+1, and its tokenizer (made with
the tokenizers library) loads with AutoTokenizer; an export with the weights untouched (lr 0)
is byte-identical per tensor (read with safetensors) to what came in.
LlamaParityTest: llama on P x D and on a heterogeneous mix equals 1 x 1 (1e-4).
LlamaMorphTest: a llama job submitted with varunactl (which fills the architecture in from
config.json) loses a node and still computes the one-process losses.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import harness  # noqa: E402
from lib import hf_models  # noqa: E402
from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.main import main  # noqa: E402

CKPT = os.path.join(harness.BIN_DIR, "varuna-ckpt")
SEQ = 16
LLAMA = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
         "max_position_embeddings": 64}
GPT2 = {"n_embd": 48, "n_layer": 3, "n_head": 4, "n_positions": 32, "vocab_size": 300}


def make_tokenizer(out):
    """A word-level tokenizer over the test vocabulary ("w0" .. "w299"), saved the way
    transformers saves one (tokenizer.json, tokenizer_config.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(300)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(out, "tokenizer.json"))
    PreTrainedTokenizerFast(tokenizer_file=os.path.join(out, "tokenizer.json")).save_pretrained(out)


def flow(d):
    return "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"


def write_job(path, model, data, train=None, parallel=None, extra=""):
    train = {"global_batch": 4, "steps": 3, "optimizer": "adamw", "lr": 1e-3,
             "schedule": "constant", "clip_grad_norm": 0, "precision": "fp32", "seed": 3,
             **(train or {})}
    parallel = {"micro_batch": 1, "timeout_s": 60, **(parallel or {})}
    with open(path, "w") as f:
        f.write(f"name: hf\nmodel: {flow(model)}\ndata: {data}\ntrain: {flow(train)}\n"
                f"parallel: {flow(parallel)}\n{extra}")
    return path


class Fixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="varuna-hf-")
        rnd = random.Random(5)
        cls.one = os.path.join(cls.tmp, "one.bin")
        hf_models.write_tokens(cls.one, [rnd.randrange(300) for _ in range(SEQ + 1)])
        cls.corpus = harness.write_text_corpus(os.path.join(cls.tmp, "corpus.txt"))

    @classmethod
    def tearDownClass(cls):
        if not os.environ.get("VARUNA_KEEP_TMP"):
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def make(self, name, kind, cfg, **kw):
        out = os.path.join(self.tmp, name)
        if not os.path.exists(out):
            hf_models.write_hf_dir(out, kind, cfg, **kw)
        return out

    def run_job(self, job, stages=1, replicas=1, extra=()):
        res = harness.run_workers(stages * replicas,
                                  ["--job", job, "--stage_to_rank_map",
                                   harness.stage_map(stages, replicas), *extra])
        self.assertTrue(res.ok, f"{job} P={stages} D={replicas}: {res.returncodes}\n" +
                        "\n".join(o[-3000:] for o in res.outputs))
        return res

    def export(self, ckpt, step, out, *extra, ok=True):
        r = subprocess.run([CKPT, "export", ckpt, str(step), "--format", "hf", "--out", out,
                            *extra], capture_output=True, text=True, timeout=120)
        if ok:
            self.assertEqual(r.returncode, 0, r.stderr)
            return r.stdout
        return r

    def export_refuses_what_the_job_planted(self, ckpt, tok):
        """Hostile cases of issue 47 (an admin exports a tenant's checkpoint): the checkpoint
        names a tokenizer directory the job controls, whose file now links to a secret of
        the admin's; a link waits at the export's temporary name for a file of the admin's."""
        secret = os.path.join(self.tmp, "admin-secret")
        with open(secret, "w") as f:
            f.write("SECRET-MARKER\n")
        os.chmod(secret, 0o600)
        out = os.path.join(self.tmp, "export-planted-" + os.path.basename(tok))
        os.makedirs(out, exist_ok=True)
        victim = os.path.join(self.tmp, "admin-file")
        with open(victim, "w") as f:
            f.write("untouched\n")
        os.symlink(victim, os.path.join(out, "config.json.tmp.0"))
        good = os.path.join(tok, "tokenizer.json")
        os.rename(good, good + ".real")
        os.symlink(secret, good)
        try:
            r = self.export(ckpt, 2, out, ok=False)
        finally:
            os.unlink(good)
            os.rename(good + ".real", good)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"tokenizer file 'tokenizer.json' of {tok} links outside", r.stderr)
        self.assertNotIn("SECRET-MARKER", r.stdout + r.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "tokenizer.json")))
        with open(victim) as f:
            self.assertEqual(f.read(), "untouched\n", "the planted temporary was replaced")
        self.assertTrue(os.path.exists(os.path.join(out, "config.json")))
        # A good export says where the tokenizer came from: the checkpoint's word.
        r = self.export(ckpt, 2, out, ok=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"the tokenizer files came from {tok}, the directory the checkpoint names",
                      r.stderr)


    def export_refuses_a_rolled_checkpoint(self, ckpt, step):
        """A checkpoint complete only through a rolled rescue (Note [Rolled rescue] in
        common/checkpoint/checkpoint_store.cc): its last layer is held as the step before with
        the step's gradients. varuna-ckpt verify accepts it (a resume rolls it forward); an
        export, which cannot, names the layer and refuses."""
        dst = os.path.join(self.tmp, f"rolled-{os.path.basename(ckpt)}")
        path = os.path.join(dst, f"varuna_ckpt_{step}")
        shutil.copytree(os.path.join(ckpt, f"varuna_ckpt_{step}"), path)
        with open(os.path.join(path, "common.json")) as f:
            common = json.load(f)
        files = []
        for name in sorted(os.listdir(path)):
            if name.startswith("manifest."):
                with open(os.path.join(path, name)) as f:
                    files += [e for e in json.load(f)["files"] if e["path"] != "common.json"]
            if name.startswith(("manifest.", "complete.")) or name == "common.json":
                os.remove(os.path.join(path, name))
        layer = common["layers"][-1]
        rel = f"pending/{layer}.safetensors"
        os.makedirs(os.path.join(path, "pending"))
        os.rename(os.path.join(path, "layers", f"{layer}.safetensors"), os.path.join(path, rel))
        files = [e for e in files if e["path"] != f"layers/{layer}.safetensors"]
        with open(os.path.join(path, rel), "rb") as f:
            data = f.read()
        pending = {"step": step, "global_batch": common["global_batch"], "generation": 0,
                   "layers": [layer],
                   "files": [{"path": rel, "size": len(data), "crc32": zlib.crc32(data)}]}
        with open(os.path.join(path, "pending.rank1.json"), "w") as f:
            json.dump(pending, f)
        with open(os.path.join(path, "rescue.rank0.json"), "w") as f:
            json.dump(dict(common, files=files, update_skipped="0", update_grad_norm="0.5"), f)
        open(os.path.join(path, "rescued.rank0"), "w").close()
        r = subprocess.run([CKPT, "verify", dst, str(step)], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = self.export(dst, step, os.path.join(self.tmp, "export-rolled"), ok=False)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn(f"holds layer {layer} only as step {step - 1}", r.stderr)
        self.assertIn("rolled rescue", r.stderr)


class ImportExportTest(Fixture):
    def check_kind(self, kind, src, one_sample_model):
        ids, labels = hf_models.tokens_sample(self.one, SEQ)
        want = hf_models.reference_loss(src, ids, labels)
        ckpt = os.path.join(self.tmp, f"ckpt-{kind}-{os.path.basename(src)}")
        # The tokenizer the tokens came from travels with the export (data.tokenizer_dir).
        tok = os.path.join(self.tmp, "tokenizer-" + kind)
        make_tokenizer(tok)
        job = write_job(os.path.join(self.tmp, f"{kind}.yaml"), one_sample_model,
                        f"{{kind: tokens, path: {self.one}, tokenizer_dir: {tok}}}",
                        extra=f"checkpoint: {{dir: {ckpt}, every_steps: 1}}\n")
        res = self.run_job(job, stages=2)
        losses = res.losses()
        self.assertEqual(len(losses), 3)
        self.assertLessEqual(abs(losses[0] - want), 1e-5 * abs(want),
                             f"{kind}: step 1 {losses[0]} vs reference {want}")
        self.assertLess(losses[2], losses[0], "it trains")
        # Export after 2 steps: the reference on the export computes step 3's loss.
        out = os.path.join(self.tmp, f"export-{kind}-{os.path.basename(src)}")
        os.chmod(os.path.join(tok, "tokenizer.json"), 0o640)
        self.export(ckpt, 2, out)
        self.assertEqual(os.stat(os.path.join(out, "tokenizer.json")).st_mode & 0o777, 0o640,
                         "a copied tokenizer file keeps its mode")
        self.export_refuses_what_the_job_planted(ckpt, tok)
        self.export_refuses_a_rolled_checkpoint(ckpt, 2)
        got = hf_models.reference_loss(out, ids, labels)
        self.assertLessEqual(abs(got - losses[2]), 1e-5 * abs(got),
                             f"{kind}: export reloads at {got}, the system said {losses[2]}")
        with open(os.path.join(out, "config.json")) as f:
            self.assertEqual(json.load(f)["model_type"], kind)
        from transformers import AutoTokenizer
        self.assertEqual(AutoTokenizer.from_pretrained(out)("w5 w7 w299")["input_ids"],
                         [5, 7, 299])

    def test_llama_import_matches_reference_and_export_reloads(self):
        src = self.make("llama", "llama", LLAMA, seed=1)
        self.check_kind("llama", src, {"kind": "llama", "init_from": src, "seq_len": SEQ})

    def test_gpt2_sharded_bf16_import_and_export(self):
        # bf16 weights in shards: upcast to fp32 masters, the reference upcasts the same way.
        src = self.make("gpt2-bf16", "gpt2", GPT2, seed=2, dtype="bfloat16", shard_bytes=60000)
        self.assertTrue(os.path.exists(os.path.join(src, "model.safetensors.index.json")))
        self.check_kind("gpt2", src, {"kind": "gpt2", "init_from": src, "seq_len": SEQ})

    def test_round_trip_is_byte_identical(self):
        for name, kind, cfg, dtype, flag in [
                ("llama-tied", "llama", dict(LLAMA, tie_word_embeddings=True), "float32", "fp32"),
                ("gpt2-rt", "gpt2", GPT2, "bfloat16", "bf16")]:
            src = self.make(name, kind, cfg, seed=4, dtype=dtype)
            ckpt = os.path.join(self.tmp, "ckpt-rt-" + name)
            # lr 0 (and no weight decay): the step leaves every weight as it came in.
            job = write_job(os.path.join(self.tmp, f"rt-{name}.yaml"),
                            {"kind": kind, "init_from": src, "seq_len": SEQ},
                            f"{{kind: tokens, path: {self.one}}}", train={"lr": 0, "steps": 1},
                            extra=f"checkpoint: {{dir: {ckpt}, every_steps: 1}}\n")
            self.run_job(job, stages=2)
            out = os.path.join(self.tmp, "rt-out-" + name)
            # Small shards on the way out too: sharding does not change a byte of any tensor.
            self.export(ckpt, 1, out, "--dtype", flag, "--max_shard_size", "50000")
            self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors.index.json")))
            self.assertIsNone(hf_models.compare_dirs(src, out), name)

    def test_bad_input_is_named(self):
        src = self.make("llama", "llama", LLAMA, seed=1)
        # A given field that disagrees with config.json names both values.
        job = write_job(os.path.join(self.tmp, "mismatch.yaml"),
                        {"kind": "llama", "init_from": src, "seq_len": SEQ, "hidden_size": 32},
                        f"{{kind: tokens, path: {self.one}}}")
        res = harness.run_workers(1, ["--job", job, "--stage_to_rank_map", "0;"])
        self.assertFalse(res.ok)
        self.assertIn("model.hidden_size is 32 in the job spec but 64 in", res.outputs[0])
        # A tensor of the wrong shape names the tensor and both shapes.
        bad = os.path.join(self.tmp, "llama-bad")
        shutil.copytree(src, bad)
        with open(os.path.join(bad, "config.json")) as f:
            cfg = json.load(f)
        cfg["intermediate_size"] = 128
        with open(os.path.join(bad, "config.json"), "w") as f:
            json.dump(cfg, f)
        job = write_job(os.path.join(self.tmp, "badshape.yaml"),
                        {"kind": "llama", "init_from": bad, "seq_len": SEQ},
                        f"{{kind: tokens, path: {self.one}}}")
        res = harness.run_workers(1, ["--job", job, "--stage_to_rank_map", "0;"])
        self.assertFalse(res.ok)
        self.assertIn("has shape [96, 64] but the model's", res.outputs[0])
        # A truncated safetensors file is refused with its name, not a crash.
        trunc = os.path.join(self.tmp, "llama-trunc")
        shutil.copytree(src, trunc)
        with open(os.path.join(trunc, "model.safetensors"), "r+b") as f:
            f.truncate(1000)
        job = write_job(os.path.join(self.tmp, "trunc.yaml"),
                        {"kind": "llama", "init_from": trunc, "seq_len": SEQ},
                        f"{{kind: tokens, path: {self.one}}}")
        res = harness.run_workers(1, ["--job", job, "--stage_to_rank_map", "0;"])
        self.assertFalse(res.ok)
        self.assertIn("model.safetensors", res.outputs[0])
        self.assertNotIn("Segmentation", res.outputs[0])
        # Export of a checkpoint of our own gpt kind: a clear refusal.
        r = subprocess.run([CKPT, "export", self.tmp, "--format", "hf", "--out", "/tmp/x"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no complete checkpoint", r.stderr)


class LlamaParityTest(Fixture):
    """llama on P x D and a heterogeneous mix computes the 1 x 1 training (1e-4)."""

    MODEL = {"kind": "llama", "num_hidden_layers": 4, "hidden_size": 32,
             "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 256, "seq_len": SEQ, "tie_word_embeddings": True}

    def test_shapes_and_mix(self):
        data = f"{{kind: text, path: {self.corpus}}}"
        train = {"global_batch": 8, "steps": 4}
        base = self.run_job(write_job(os.path.join(self.tmp, "base.yaml"), self.MODEL, data,
                                      train)).losses()
        self.assertEqual(len(base), 4)
        self.assertLess(base[-1], base[0])
        job = write_job(os.path.join(self.tmp, "pd.yaml"), self.MODEL, data, train,
                        {"micro_batch": 2})
        for p, d in [(2, 1), (1, 2), (2, 2), (3, 1)]:
            got = self.run_job(job, p, d).losses()
            for i, (g, w) in enumerate(zip(got, base)):
                self.assertLessEqual(abs(g - w), 1e-4 * abs(w), f"P={p} D={d} step {i + 1}")
        # A 2-stage pipeline beside a 1-stage one, cut by Hugging Face module names.
        first = ["model.embed_tokens", "model.layers.0", "model.layers.1"]
        second = ["model.layers.2", "model.layers.3", "model.norm", "lm_head"]
        pipes = ("[{stages: [[" + ", ".join(first) + "], [" + ", ".join(second) +
                 "]], count: 1, microbatches: 2}, {stages: [[" + ", ".join(first + second) +
                 "]], count: 1, microbatches: 2}]")
        mix = write_job(os.path.join(self.tmp, "mix.yaml"), self.MODEL, data, train,
                        {"micro_batch": 2, "pipelines": pipes})
        res = harness.run_workers(3, ["--job", mix])
        self.assertTrue(res.ok, "\n".join(o[-3000:] for o in res.outputs))
        for i, (g, w) in enumerate(zip(res.losses(), base)):
            self.assertLessEqual(abs(g - w), 1e-4 * abs(w), f"mix step {i + 1}")
        # A stage may not end between model.norm and lm_head (one segment).
        bad = ("[{stages: [[" + ", ".join(first + second[:3]) + "], [lm_head]], count: 1, "
               "microbatches: 4}]")
        badjob = write_job(os.path.join(self.tmp, "badmix.yaml"), self.MODEL, data, train,
                           {"micro_batch": 2, "pipelines": bad})
        res = harness.run_workers(2, ["--job", badjob])
        self.assertFalse(res.ok)
        self.assertIn("not a cut point", res.outputs[0])


    def test_example_job_trains(self):
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        with open(os.path.join(root, "examples", "jobs", "llama_fortunes.yaml")) as f:
            text = f.read()
        # Its corpus as scripts/demo.sh makes it: a tokenizer trained on the text, then the
        # Megatron dataset (docs/data.md).
        tool = os.path.join(root, "scripts", "varuna-data")
        tok, prefix = os.path.join(self.tmp, "example-tok"), os.path.join(self.tmp, "example-data")
        for args in (["tokenizer", "--input", self.corpus, "--vocab", "512", "--out", tok],
                     ["prepare", "--tokenizer", tok, "--input", self.corpus, "--out", prefix,
                      "--workers", "1"]):
            r = subprocess.run([tool, *args], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
        text = (text.replace("@CORPUS@", prefix).replace("@TOKENIZER@", tok)
                .replace("@CHECKPOINTS@", os.path.join(self.tmp, "example-ckpt"))
                .replace("steps: 200", "steps: 6").replace("every_steps: 50", "every_steps: 3"))
        job = os.path.join(self.tmp, "example.yaml")
        with open(job, "w") as f:
            f.write(text)
        res = self.run_job(job, stages=2)
        self.assertEqual(len(res.losses()), 6)
        self.assertLess(res.losses()[-1], res.losses()[0])
        out = os.path.join(self.tmp, "example-hf")
        self.export(os.path.join(self.tmp, "example-ckpt"), 6, out)
        self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors")))


class LlamaMorphTest(Fixture):
    """A llama job from a Hugging Face directory survives losing a node (docs/morphing.md)."""

    def test_node_loss(self):
        src = self.make("llama-morph", "llama", LLAMA, seed=6)
        c = Cluster(agents=3, slots=1, manager_config="scale_up_delay_s: 2\nmorph_coalesce_s: 0.3\n")
        try:
            steps = 150
            data = f"{{kind: text, path: {self.corpus}}}"
            model = {"kind": "llama", "init_from": src, "seq_len": SEQ}
            ref_job = write_job(os.path.join(c.dir, "ref.yaml"), model, data,
                                {"steps": steps, "global_batch": 6})
            ref = harness.run_workers(1, ["--job", ref_job, "--stage_to_rank_map", "0;"])
            self.assertTrue(ref.ok, ref.outputs[0][-3000:])
            job = write_job(os.path.join(c.dir, "job.yaml"), model, data,
                            {"steps": steps, "global_batch": 6},
                            {"stages": 1, "micro_batch": 1, "timeout_s": 30},
                            extra=f"checkpoint: {{dir: {os.path.join(c.dir, 'ckpt')}}}\n")
            job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
            # varunactl filled the architecture in from config.json: the manager plans
            # for the real model (the describe's plan names it), not the defaults.
            self.assertIn("d_model=64 heads=4 kv_heads=2 ffn=96",
                          c.ctl("describe", job_id, check=0).stdout)
            wait_for(lambda: (lambda s: s["state"] == "RUNNING" and s["step"] >= 5 and s)(
                c.status(job_id)), 180, "step 5")
            c.agents["node2"].send_signal(signal.SIGKILL)
            c.agents["node2"].wait()
            st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
                c.status(job_id)), 300, "the job to finish")
            self.assertEqual(st["state"], "SUCCEEDED", c.tail())
            self.assertGreaterEqual(len(st["morphs"]), 1, st)
            metrics = json.loads(c.ctl("-o", "json", "metrics", job_id, check=0).stdout)
            self.assertEqual([int(m["step"]) for m in metrics], list(range(1, steps + 1)))
            for m, want in zip(metrics, ref.losses()):
                self.assertLessEqual(abs(m["loss"] - want), 1e-4 * abs(want), m)
        finally:
            c.close()


if __name__ == "__main__":
    main()
