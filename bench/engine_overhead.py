#!/usr/bin/env python3
"""Benchmark (a): engine overhead. varuna-worker at P=1 D=1 vs bench_plain_loop (the plainest
LibTorch loop over the same model, data, optimizer and batch), alternated round by round in
one run. Prints a markdown table; the ratio is plain_time / varuna_time per step (>= 0.95
means varuna costs at most ~5% more).

Usage: bench/engine_overhead.py [--build build] [--rounds 5] [--steps 60] [--warmup 10]   (~3 min on 2 cores)
"""

import argparse
import os
import tempfile

from common import ROOT, corpus, harness, median, median_rate, proc_cpu_s, read_metrics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
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
          f"{args.rounds} alternating rounds; samples/s is the median over a run's steps "
          "(wall clock), samples/CPU-s is every sample of the run, start-up included, over the "
          "CPU seconds its process was billed (/proc/self/stat: cutime + cstime)")
    print("| config | round | plain LibTorch samples/s | varuna-worker P=1 D=1 samples/s | "
          "varuna / plain | plain samples/CPU-s | varuna samples/CPU-s | varuna / plain per CPU-s |")
    print("|---|---|---|---|---|---|---|---|")
    samples = 32 * args.steps
    for name, par in configs.items():
        job = harness.job_yaml(os.path.join(tmp, "job.yaml"), data, model=model, train=train,
                               parallel=par)
        ratios, cpu_ratios, losses = [], [], None
        for r in range(1, args.rounds + 1):
            rate, per_cpu = {}, {}
            # Alternate which system goes first, round by round.
            for system in (["plain", "varuna"] if r % 2 else ["varuna", "plain"]):
                c0 = proc_cpu_s(children=True)
                if system == "plain":
                    out = os.path.join(tmp, "plain.jsonl")
                    harness.subprocess.run([os.path.join(bin_dir, "bench_plain_loop"), "--job",
                                            job, "--metrics_out", out], check=True,
                                           stderr=harness.subprocess.DEVNULL)
                    rows = read_metrics(out)
                    plain_loss = rows[0]["loss"]
                else:
                    os.environ["VARUNA_BIN_DIR"] = bin_dir
                    res = harness.run_workers(1, ["--job", job],
                                              cmd=[os.path.join(bin_dir, "varuna-worker")])
                    assert res.ok, res.outputs[0][-2000:]
                    rows = res.metrics
                    varuna_loss = rows[0]["loss"]
                rate[system] = median_rate(rows, args.warmup)
                per_cpu[system] = samples / max(1e-9, proc_cpu_s(children=True) - c0)
            losses = (plain_loss, varuna_loss)
            ratios.append(rate["varuna"] / rate["plain"])
            cpu_ratios.append(per_cpu["varuna"] / per_cpu["plain"])
            print(f"| {name} | {r} | {rate['plain']:.1f} | {rate['varuna']:.1f} | "
                  f"{ratios[-1]:.3f} | {per_cpu['plain']:.2f} | {per_cpu['varuna']:.2f} | "
                  f"{cpu_ratios[-1]:.3f} |", flush=True)
        print(f"| {name} | median | | | **{median(ratios):.3f}** | | | "
              f"**{median(cpu_ratios):.3f}** |")
        print(f"first-step loss plain / varuna: {losses[0]:.5f} / {losses[1]:.5f}")


if __name__ == "__main__":
    main()
