"""Users' corpora on real processes (docs/data.md):
  - Megatron indexed datasets (uint16 and int32 tokens, several shards and documents) and
    llm.c token files of both headers (20240520 v1 uint16, 20240801 v7 uint32), written here by
    an independent writer that follows the published formats, read by `varunactl data`: every
    sample's tokens are the windows of the sources laid end to end, the sources follow
    Megatron's blending, and an epoch covers every sample once;
  - bad input, each a clear error naming the file: an index that lies about its sizes, a
    missing .idx, a token beyond the vocabulary, a manifest from another tokenizer, weights
    that sum to zero;
  - `varuna-data prepare` with a tokenizer trained here by `tokenizers`: its ids equal
    `tokenizers`' own encoding of the documents plus the end-of-document token, in both
    formats; its tokens per second;
  - training over one epoch of a two-shard corpus on three agents of two slots with two
    morphs in place, then a resume from the checkpoint on another P x D: the sample log
    holds every step's samples exactly as an uninterrupted run's, no sample twice in the
    epoch, and the losses equal the uninterrupted run's (1e-4)."""

import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.harness import BIN_DIR, run_workers, start_workers, wait_workers  # noqa: E402
from lib.main import main  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CTL = os.path.join(BIN_DIR, "varunactl")
PYTHON = os.path.join(REPO, "scripts", "python")


# ---- an independent writer of the formats --------------------------------------------------

def write_megatron(prefix, docs, code):
    """Megatron's MMapIndexedDataset v1: PREFIX.idx + PREFIX.bin, one sequence per document."""
    fmt = {8: "H", 4: "i"}[code]
    with open(prefix + ".bin", "wb") as b:
        pointers, offset = [], 0
        for d in docs:
            pointers.append(offset)
            b.write(struct.pack(f"<{len(d)}{fmt}", *d))
            offset += len(d) * struct.calcsize(fmt)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(docs), len(docs) + 1))
        f.write(struct.pack(f"<{len(docs)}i", *[len(d) for d in docs]))
        f.write(struct.pack(f"<{len(docs)}q", *pointers))
        f.write(struct.pack(f"<{len(docs) + 1}q", *range(len(docs) + 1)))
    return prefix


def write_llmc(path, tokens, v7):
    header = [20240801, 7, len(tokens)] if v7 else [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *(header + [0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}{'I' if v7 else 'H'}", *tokens))
    return path


def random_docs(rnd, n, hi, lo_len=3, hi_len=40):
    return [[rnd.randrange(hi) for _ in range(rnd.randint(lo_len, hi_len))] for _ in range(n)]


def megatron_blend(weights, n):
    """Megatron's build_blending_indices: sample i from argmax(w * max(i, 1) - taken)."""
    total = sum(weights)
    w = [x / total for x in weights]
    taken, out = [0] * len(w), []
    for i in range(n):
        errors = [w[k] * max(i, 1) - taken[k] for k in range(len(w))]
        k = errors.index(max(errors))
        out.append(k)
        taken[k] += 1
    return out


def job_file(path, kind, sources, vocab=256, seq_len=16, batch=8, steps=4, stages=2,
             data_extra="", extra=""):
    src = ", ".join("{shards: [" + ", ".join(s) + f"], weight: {w}}}" for s, w in sources)
    with open(path, "w") as f:
        f.write(f"name: corpus\nmodel: {{kind: gpt, layers: 4, d_model: 32, heads: 4, "
                f"seq_len: {seq_len}, vocab: {vocab}, dropout: 0.0}}\n"
                f"data: {{kind: {kind}, sources: [{src}]{data_extra}}}\n"
                f"train: {{global_batch: {batch}, steps: {steps}, lr: 1.0e-3, warmup: 0, "
                f"schedule: constant, precision: fp32, seed: 7}}\n"
                f"parallel: {{stages: {stages}, micro_batch: 2, schedule: varuna, "
                f"timeout_s: 60}}\n" + extra)
    return path


def ctl(*args, check=True):
    r = subprocess.run([CTL, *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"varunactl {' '.join(args)}: {r.returncode}\n{r.stdout}{r.stderr}")
    return r


class FormatsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="corpus-")

    def check_stream(self, job, sources_tokens, weights, seq_len, steps, batch):
        rows = json.loads(ctl("data", job, "--steps", str(steps), "--tokens", "0", "-o",
                              "json").stdout)
        self.assertEqual(len(rows), steps * batch)
        self.assertEqual([r["source"] for r in rows], megatron_blend(weights, steps * batch))
        for r in rows:
            stream = sources_tokens[r["source"]]
            start = r["sample"] * seq_len
            self.assertEqual(r["tokens"], stream[start:start + seq_len + 1], r)
        for s, stream in enumerate(sources_tokens):
            n = (len(stream) - 1) // seq_len
            first = [r["sample"] for r in rows if r["source"] == s and r["epoch"] == 0]
            self.assertEqual(len(set(first)), len(first), "no sample twice in an epoch")
            if len([r for r in rows if r["source"] == s]) > n:
                self.assertEqual(sorted(first), list(range(n)), "an epoch is every sample once")
        return rows

    def test_megatron_and_llmc_files_read_as_written(self):
        rnd = random.Random(1)
        a1, a2 = random_docs(rnd, 5, 60000), random_docs(rnd, 4, 60000)
        b1 = random_docs(rnd, 7, 4_000_000)  # int32 tokens, below the vocab limit
        shards_a = [write_megatron(os.path.join(self.dir, "a1"), a1, 8),
                    write_megatron(os.path.join(self.dir, "a2"), a2, 8)]
        shard_b = write_megatron(os.path.join(self.dir, "b"), b1, 4)
        stream_a = [t for d in a1 + a2 for t in d]
        stream_b = [t for d in b1 for t in d]
        job = job_file(os.path.join(self.dir, "indexed.yaml"), "indexed",
                       [(shards_a, 0.6), ([shard_b], 0.4)], vocab=4_194_304, seq_len=8)
        rows = self.check_stream(job, [stream_a, stream_b], [0.6, 0.4], 8, 12, 8)
        print(f"indexed: {len(rows)} samples checked, sources {len(stream_a)} and "
              f"{len(stream_b)} tokens", file=sys.stderr)
        v1 = [rnd.randrange(65536) for _ in range(300)]
        v7 = [rnd.randrange(200000) for _ in range(250)]
        job = job_file(os.path.join(self.dir, "llmc.yaml"), "llmc",
                       [([write_llmc(os.path.join(self.dir, "v1.bin"), v1, False)], 1),
                        ([write_llmc(os.path.join(self.dir, "v7.bin"), v7, True)], 1)],
                       vocab=200000, seq_len=16)
        self.check_stream(job, [v1, v7], [1, 1], 16, 6, 8)

    def test_bad_input_is_named(self):
        rnd = random.Random(2)
        good = write_megatron(os.path.join(self.dir, "good"), random_docs(rnd, 4, 200), 8)
        # An index that lies about its sizes: the first sequence is 1000 tokens long.
        lying = os.path.join(self.dir, "lying")
        with open(good + ".idx", "rb") as f:
            idx = bytearray(f.read())
        idx[34:38] = struct.pack("<i", 1000)
        with open(lying + ".idx", "wb") as f:
            f.write(idx)
        with open(good + ".bin", "rb") as f, open(lying + ".bin", "wb") as g:
            g.write(f.read())
        cases = [
            ([([lying], 1)], 256, "lying.idx: sequence 0 (1000 tokens at byte 0) lies outside"),
            ([([os.path.join(self.dir, "gone")], 1)], 256, "gone.idx"),
            ([([good], 1)], 100, "good.bin: token"),
            ([([good], 0), ([good], 0)], 256, "weights sum to zero"),
        ]
        for sources, vocab, want in cases:
            job = job_file(os.path.join(self.dir, "bad.yaml"), "indexed", sources, vocab=vocab,
                           seq_len=4)
            r = ctl("data", job, "--steps", "20", check=False)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn(want, r.stderr, r.stderr)
            self.assertNotIn("Traceback", r.stderr)
        # A manifest from another tokenizer than the job's data.tokenizer_dir.
        tok = os.path.join(self.dir, "tok")
        os.makedirs(tok)
        with open(os.path.join(tok, "tokenizer.json"), "w") as f:
            f.write('{"model": "not the one"}')
        with open(good + ".manifest.json", "w") as f:
            json.dump({"tokens": 10, "documents": 4, "vocab_size": 200, "eod_token": 0,
                       "tokenizer_sha256": "0" * 64}, f)
        job = job_file(os.path.join(self.dir, "tok.yaml"), "indexed", [([good], 1)],
                       data_extra=f", tokenizer_dir: {tok}")
        r = ctl("data", job, check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("good.manifest.json: made with another tokenizer", r.stderr)


    def test_a_rescue_records_the_stream_and_the_validation(self):
        """A rescue (SIGUSR2, as the agent sends it) writes what a periodic checkpoint does
        besides the state: where the corpus's stream stood and the newest validation. So a
        resume from it on other data is refused by name, and one on the same data keeps the
        validation record."""
        rnd = random.Random(3)
        shard = write_megatron(os.path.join(self.dir, "r"), random_docs(rnd, 80, 256), 8)
        val = os.path.join(self.dir, "val.txt")
        with open(val, "wb") as f:
            f.write(bytes(rnd.randrange(256) for _ in range(4000)))
        ckpt = os.path.join(self.dir, "ck_rescue")
        extra = (f"eval: {{data: {{kind: text, path: {val}}}, every_steps: 2, samples: 4}}\n"
                 f"checkpoint: {{dir: {ckpt}}}\n")
        job = job_file(os.path.join(self.dir, "rescue.yaml"), "indexed", [([shard], 1)],
                       steps=400, stages=1, extra=extra)
        t0 = time.time()
        procs, logs, metrics = start_workers(1, ["--job", job],
                                             env_extra={"VARUNA_STEP_MIN_MS": "40"})
        deadline = time.time() + 120
        rows = []
        while time.time() < deadline and procs[0].poll() is None:
            if os.path.exists(metrics):
                with open(metrics) as f:
                    rows = [json.loads(line) for line in f if line.strip()]
            if any(r.get("step", 0) >= 5 for r in rows):
                break
            time.sleep(0.05)
        self.assertIsNone(procs[0].poll(), "the run ended before the rescue")
        procs[0].send_signal(signal.SIGUSR2)
        res = wait_workers(procs, logs, metrics, 60, t0)
        self.assertEqual(res.returncodes, [75], res.outputs[0][-2000:])  # kExitRescued
        saved = [int(d.split("_")[-1]) for d in os.listdir(ckpt)]
        self.assertEqual(len(saved), 1, saved)
        step = saved[0]
        with open(os.path.join(ckpt, f"varuna_ckpt_{step}", "rescue.rank0.json")) as f:
            record = json.load(f)
        position = json.loads(record["data_position"])
        self.assertEqual(position["samples"], step * 8)
        self.assertTrue(position["corpus"], record)
        # The newest validation when the rescue took the state: the step's own, or (when the
        # signal came between an even step's update and its validation) the one before.
        evals = {m["step"]: m["eval_loss"] for m in res.metrics if "eval_loss" in m}
        eval_step = int(record["eval_step"])
        self.assertIn(eval_step, evals)
        self.assertTrue(step - 2 <= eval_step <= step, (eval_step, step))
        self.assertAlmostEqual(float(record["eval_loss"]), evals[eval_step], places=5)
        # Other data: refused by name, as from a periodic checkpoint.
        other = write_megatron(os.path.join(self.dir, "other"), random_docs(rnd, 80, 256), 8)
        moved = job_file(os.path.join(self.dir, "moved.yaml"), "indexed", [([other], 1)],
                         steps=step + 2, stages=1,
                         extra=f"checkpoint: {{dir: {ckpt}, resume: latest}}\n")
        r = run_workers(1, ["--job", moved])
        self.assertFalse(r.ok)
        self.assertIn("trained on another corpus", r.outputs[0])
        # The same data: the run goes on from the rescue and carries its validation record
        # into the next checkpoint, written before it validates again (only at its end).
        same = job_file(os.path.join(self.dir, "same.yaml"), "indexed", [([shard], 1)],
                        steps=step + 2, stages=1,
                        extra=(f"eval: {{data: {{kind: text, path: {val}}}, every_steps: 1000, "
                               f"samples: 4}}\ncheckpoint: {{dir: {ckpt}, every_steps: 1, "
                               f"resume: latest}}\n"))
        r = run_workers(1, ["--job", same])
        self.assertTrue(r.ok, r.outputs[0][-2000:])
        self.assertEqual([m["step"] for m in r.metrics], [step + 1, step + 2])
        with open(os.path.join(ckpt, f"varuna_ckpt_{step + 1}", "common.json")) as f:
            common = json.load(f)
        self.assertEqual((common["eval_step"], common["eval_loss"]),
                         (record["eval_step"], record["eval_loss"]))


class PrepareTest(unittest.TestCase):
    def test_prepare_matches_tokenizers(self):
        d = tempfile.mkdtemp(prefix="prepare-")
        script = f"""
import json, os, random, struct, subprocess, sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
d = {d!r}
rnd = random.Random(3)
words = "the pipeline stage gradient of a model runs fast slow data token epoch".split()
docs = [" ".join(rnd.choice(words) for _ in range(rnd.randint(5, 60))) for _ in range(400)]
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
os.makedirs(d + "/tok")
tok.save(d + "/tok/tokenizer.json")
with open(d + "/docs.jsonl", "w") as f:
    for t in docs[:300]:
        f.write(json.dumps({{"text": t}}) + "\\n")
with open(d + "/more.txt", "w") as f:
    f.write("\\n%\\n".join(docs[300:]) + "\\n")
eod = tok.token_to_id("<|endoftext|>")
want = []
for i, t in enumerate(docs):  # a text block keeps its lines' newlines
    want += tok.encode(t if i < 300 else t + "\\n", add_special_tokens=False).ids + [eod]
for fmt in ("indexed", "llmc"):
    out = subprocess.run([{os.path.join(REPO, "scripts", "varuna-data")!r}, "prepare",
                          "--tokenizer", d + "/tok", "--input", d + "/docs.jsonl", d + "/more.txt",
                          "--delimiter", "%", "--out", d + "/" + fmt, "--format", fmt,
                          "--workers", "2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    print(out.stdout.strip())
    m = json.load(open(d + "/" + fmt + ".manifest.json"))
    assert m["eod_token"] == eod and m["documents"] == 400 and m["tokens"] == len(want), m
    raw = open(d + "/" + fmt + ".bin", "rb").read()
    if fmt == "indexed":
        got = list(struct.unpack("<%dH" % (len(raw) // 2), raw))
    else:
        got = list(struct.unpack("<%dH" % ((len(raw) - 1024) // 2), raw[1024:]))
    assert got == want, fmt
print("ids equal tokenizers' own encoding in both formats")
"""
        r = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        print(r.stdout, file=sys.stderr)
        # The corpus it wrote reads back through the job's checks (the manifest's tokenizer).
        job = job_file(os.path.join(d, "job.yaml"), "indexed", [([os.path.join(d, "indexed")], 1)],
                       vocab=300, seq_len=8, data_extra=f", tokenizer_dir: {os.path.join(d, 'tok')}")
        ctl("data", job)
        r = subprocess.run([os.path.join(REPO, "scripts", "varuna-data"), "prepare", "--tokenizer",
                            os.path.join(d, "missing"), "--input", job, "--out",
                            os.path.join(d, "x")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no tokenizer.json", r.stderr)
        # A bad line, met by the pool's feeder: named, nothing left behind.
        bad = os.path.join(d, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"text": "fine"}\nnot json\n')
        r = subprocess.run([os.path.join(REPO, "scripts", "varuna-data"), "prepare", "--tokenizer",
                            os.path.join(d, "tok"), "--input", bad, "--out",
                            os.path.join(d, "bad"), "--workers", "2"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("bad.jsonl:2: not JSON", r.stderr)
        self.assertFalse([f for f in os.listdir(d) if f.startswith("bad.") and f != "bad.jsonl"])


SEQ, BATCH = 16, 12


class TrainTest(unittest.TestCase):
    """One epoch of a two-shard corpus, trained with two morphs and a resume elsewhere."""

    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(agents=3, slots=2, manager_config="morph_coalesce_s: 0.3\n")
        d = cls.c.dir
        src = "/usr/share/games/fortunes/fortunes"
        if os.path.exists(src):
            with open(src, "rb") as f:
                text = f.read()
        else:
            text = b"\n%\n".join(bytes(range(i, i + 60)) for i in range(0, 190, 3))
        docs = [list(p) + [10] for p in text[:12000].split(b"\n%\n") if p]
        half = len(docs) // 2
        cls.shards = [write_megatron(os.path.join(d, "s0"), docs[:half], 8),
                      write_megatron(os.path.join(d, "s1"), docs[half:], 8)]
        tokens = sum(len(x) for x in docs)
        cls.steps = (tokens - 1) // SEQ // BATCH  # one epoch
        cls.samples = (tokens - 1) // SEQ

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def job(self, name, steps, stages, log_dir, extra=""):
        return job_file(os.path.join(self.c.dir, name), "indexed", [(self.shards, 1)],
                        steps=steps, batch=BATCH, seq_len=SEQ, stages=stages,
                        data_extra=f", sample_log: {log_dir}", extra=extra)

    def committed(self, log_dir):
        r = subprocess.run([os.path.join(REPO, "scripts", "varuna-data"), "seen", log_dir],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return [json.loads(x) for x in r.stdout.splitlines()]

    def test_one_epoch_with_two_morphs_and_a_resume_elsewhere(self):
        c, steps = self.c, self.steps
        first = steps * 2 // 3
        ref_log = os.path.join(c.dir, "ref-log")
        r = run_workers(1, ["--job", self.job("ref.yaml", steps, 1, ref_log)], timeout=600)
        self.assertTrue(r.ok, r.outputs)
        want = r.losses()
        self.assertEqual(len(want), steps)
        ckpt = os.path.join(c.dir, "ckpt")
        log_a, log_b = os.path.join(c.dir, "log-a"), os.path.join(c.dir, "log-b")
        pace = "env: {VARUNA_STEP_MIN_MS: '150'}\n"
        a = self.job("a.yaml", first, 2, log_a,
                     f"checkpoint: {{dir: {ckpt}, every_steps: {first}}}\n" + pace)
        job_a = json.loads(c.ctl("-o", "json", "submit", a, check=0).stdout)["id"]
        wait_for(lambda: c.status(job_a)["step"] >= 8, 180, "job a at step 8")
        c.ctl("drain", "node2", check=0)
        wait_for(lambda: c.status(job_a)["generation"] >= 2 and c.status(job_a)["step"] >=
                 first // 2, 180, "job a's second generation")
        c.ctl("preempt", "node1", "--in", "30s", check=0)
        st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
            c.status(job_a)), 300, "job a to end")
        self.assertEqual(st["state"], "SUCCEEDED", c.tail())
        self.assertGreaterEqual(len(st.get("morphs", [])), 2, st)
        # The rest of the epoch from the checkpoint, on another shape: 1 stage x 2 replicas.
        b = self.job("b.yaml", steps, 1, log_b, f"checkpoint: {{dir: {ckpt}, resume: latest}}\n")
        job_b = json.loads(c.ctl("-o", "json", "submit", b, check=0).stdout)["id"]
        st_b = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
            c.status(job_b)), 300, "job b to end")
        self.assertEqual(st_b["state"], "SUCCEEDED", c.tail())
        last = st["morphs"][-1]["to"]
        self.assertEqual(st_b["stages"], 1, st_b)  # another P x D than job a's last (2 x 1)
        self.assertNotEqual((last.get("stages"), last.get("replicas")),
                            (st_b["stages"], st_b["replicas"]))
        # The checkpoint b resumed from recorded where the stream stood.
        with open(os.path.join(ckpt, f"varuna_ckpt_{first}", "common.json")) as f:
            position = json.loads(json.load(f)["data_position"])
        self.assertEqual(position["samples"], first * BATCH, position)
        self.assertEqual(sum(position["taken"]), first * BATCH, position)
        # A resume on another corpus (the same shards as two sources) is refused by name.
        other = job_file(os.path.join(c.dir, "other.yaml"), "indexed",
                         [(self.shards[:1], 1), (self.shards[1:], 1)], steps=steps, batch=BATCH,
                         seq_len=SEQ, stages=1,
                         extra=f"checkpoint: {{dir: {ckpt}, resume: {first}}}\n")
        r = run_workers(1, ["--job", other], timeout=300)
        self.assertFalse(r.ok)
        self.assertIn("trained on another corpus", "".join(r.outputs))
        got = []
        for job_id in (job_a, job_b):
            got += json.loads(c.ctl("-o", "json", "metrics", job_id, check=0).stdout)
        self.assertEqual([int(m["step"]) for m in got], list(range(1, steps + 1)))
        for m, w in zip(got, want):
            self.assertLess(abs(m["loss"] - w) / abs(w), 1e-4, f"step {m['step']}")
        # What the model saw: the same samples at every step, none twice in the epoch.
        ref_rows = self.committed(ref_log)
        rows = self.committed(log_a) + self.committed(log_b)
        key = lambda r: (r["step"], r["source"], r["sample"], r["epoch"])  # noqa: E731
        self.assertEqual(sorted(map(key, rows)), sorted(map(key, ref_rows)))
        self.assertEqual(len(rows), steps * BATCH)
        samples = [r["sample"] for r in rows]
        self.assertEqual(len(set(samples)), len(samples), "a sample twice in the epoch")
        self.assertTrue(all(r["epoch"] == 0 for r in rows))
        print(f"{steps} steps ({len(rows)} of {self.samples} samples: one epoch), morphs "
              f"{[m.get('kind') for m in st['morphs']]} ({last.get('stages')} x "
              f"{last.get('replicas')} at the end), resumed at step {first} on "
              f"{st_b['stages']} x {st_b['replicas']}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
