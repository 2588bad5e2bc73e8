#!/usr/bin/env python3
"""Benchmark (a): engine overhead. varuna-worker at P=1 D=1 vs bench_plain_loop (the plainest
LibTorch loop over the same model, data, optimizer and batch), alternated round by round in
one run. Prints a markdown table; the ratio is plain_time / varuna_time per step (>= 0.95
means varuna costs at most ~5% more).

Usage: bench/engine_overhead.py [--build build] [--rounds 3] [--steps 15]   (~8 min on 2 cores)
"""

import argparse
import os
import tempfile

from common import ROOT, corpus, harness, median, median_rate, read_metrics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    tmp = tempfile.mkdtemp(prefix="varuna-bench-")
    data = corpus(args.build)
    configs = {
        "mb=B (1 micro-batch)": {"micro_batch": 32},
        "mb=B/4 (4 micro-batches)": {"micro_batch": 8},
    }
    model = {"layers": 4, "d_model": 128, "heads": 4, "seq_len": 64}
    train = {"global_batch": 32, "steps": args.steps, "lr": 1e-3, "schedule": "constant"}
    print(f"GPT {model}, global batch 32, {args.steps} steps, first {args.warmup} skipped, "
          f"{args.rounds} alternating rounds, medians")
    print("| config | plain LibTorch samples/s | varuna-worker P=1 D=1 samples/s | ratio "
          "varuna/plain | first-step loss plain / varuna |")
    print("|---|---|---|---|---|")
    for name, par in configs.items():
        job = harness.job_yaml(os.path.join(tmp, "job.yaml"), data, model=model, train=train,
                               parallel=par)
        plain, var, losses = [], [], None
        for _ in range(args.rounds):
            out = os.path.join(tmp, "plain.jsonl")
            harness.subprocess.run([os.path.join(bin_dir, "bench_plain_loop"), "--job", job,
                                    "--metrics_out", out], check=True,
                                   stderr=harness.subprocess.DEVNULL)
            p_rows = read_metrics(out)
            plain.append(median_rate(p_rows, args.warmup))
            os.environ["VARUNA_BIN_DIR"] = bin_dir
            res = harness.run_workers(1, ["--job", job],
                                      cmd=[os.path.join(bin_dir, "varuna-worker")])
            assert res.ok, res.outputs[0][-2000:]
            var.append(median_rate(res.metrics, args.warmup))
            losses = (p_rows[0]["loss"], res.metrics[0]["loss"])
        p, v = median(plain), median(var)
        print(f"| {name} | {p:.1f} | {v:.1f} | {v / p:.3f} | {losses[0]:.5f} / {losses[1]:.5f} |")


if __name__ == "__main__":
    main()
