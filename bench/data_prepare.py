"""varuna-data prepare's speed (docs/benchmarks.md (p)): tokens per second and per CPU-second.

A byte-level BPE tokenizer (vocab 8,000) is trained with `tokenizers` on the fortunes text;
the input is that text repeated to about MB megabytes as JSONL documents (one fortune each).
Rounds alternate --workers 1 and --workers N (default 2) and formats indexed and llmc; every
round is printed, then the medians. CPU-seconds are the children's user + system time
(getrusage, from the kernel's accounting).

usage: scripts/python bench/data_prepare.py [--rounds 5] [--mb 20] [--workers 2]"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "scripts", "varuna-data")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mb", type=float, default=20)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    src = "/usr/share/games/fortunes/fortunes"
    text = open(src, encoding="utf-8", errors="replace").read() if os.path.exists(src) else (
        "the pipeline stage runs a gradient of the model\n%\n" * 2000)
    docs = [d for d in text.split("\n%\n") if d.strip()]
    d = tempfile.mkdtemp(prefix="prepare-bench-")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=8000, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(os.path.join(d, "tok"))
    tok.save(os.path.join(d, "tok", "tokenizer.json"))
    inp = os.path.join(d, "docs.jsonl")
    size = 0
    with open(inp, "w") as f:
        while size < a.mb * 1e6:
            for doc in docs:
                line = json.dumps({"text": doc}) + "\n"
                f.write(line)
                size += len(line)
    print(f"input: {size / 1e6:.1f} MB of JSONL ({len(docs)} fortunes repeated), vocab 8000",
          flush=True)
    rows = []
    for r in range(a.rounds):
        for workers in ([1, a.workers] if r % 2 == 0 else [a.workers, 1]):
            fmt = "indexed" if r % 2 == 0 else "llmc"
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            out = subprocess.run([TOOL, "prepare", "--tokenizer", os.path.join(d, "tok"),
                                  "--input", inp, "--out", os.path.join(d, f"out-{workers}"),
                                  "--format", fmt, "--workers", str(workers)],
                                 capture_output=True, text=True)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if out.returncode != 0:
                sys.exit(out.stderr)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            m = json.load(open(os.path.join(d, f"out-{workers}.manifest.json")))
            rows.append((workers, m["tokens"] / wall, m["tokens"] / cpu))
            print(f"round {r + 1} workers={workers} format={fmt}: {m['tokens']} tokens, "
                  f"{wall:.2f} s wall ({m['tokens'] / wall:,.0f} tokens/s), {cpu:.2f} CPU-s "
                  f"({m['tokens'] / cpu:,.0f} tokens/CPU-s)", flush=True)
    for workers in (1, a.workers):
        w = [x[1] for x in rows if x[0] == workers]
        c = [x[2] for x in rows if x[0] == workers]
        print(f"| {workers} | {' '.join(f'{x:,.0f}' for x in w)} | **{statistics.median(w):,.0f}** "
              f"| {statistics.median(c):,.0f} |")


if __name__ == "__main__":
    main()
