#!/usr/bin/env python3
"""Benchmark (l): tensor parallelism on one host, tp 2 vs tp 1, for a GPT with wide layers.

One stage, one replica. Three configurations: "tp 1 x 2 threads" is one process with
OMP_NUM_THREADS=2 (both cores: LibTorch's intra-op threads split each matmul); "tp 2" is two
processes with OMP_NUM_THREADS=1 each, every block's heads and MLP units split between them
and summed with gloo all-reduces (Note [Tensor parallelism] in worker/models/tensor_parallel.cc);
"tp 1 x 1 thread" is one process on one core, the per-core reference. Rounds run all three
with the order rotating; every round is printed.

Reported per run: samples/s (global batch / median step time, steps after warm-up) and
samples per CPU-second (samples trained over the CPU time of every process of the run, user +
system from getrusage of the waited children, start-up included alike).

Then the planner's side (Note [Tensor-parallel plans]): the tp 1 model is profiled once
(varuna-worker --profile_out, 2 ranks, one thread each), `varunactl plan --profile` predicts
the step of tp 1 on one slot and of tp 2 on a node of two, and each prediction is printed
beside the measured median step of "tp 1 x 1 thread" and "tp 2" (--no_predict skips it).

Usage: bench/tensor_parallel.py [--build build] [--rounds 5] [--steps 12] [--no_predict]
"""

import argparse
import json
import os
import subprocess
import resource
import statistics
import tempfile

from common import ROOT, corpus, harness

MODEL = {"layers": 2, "d_model": 512, "heads": 8, "seq_len": 64}
BATCH = 8


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(bin_dir, tmp, data, tp, threads, steps, warmup):
    job = harness.job_yaml(os.path.join(tmp, f"tp{tp}.yaml"), data, model=MODEL,
                           train={"global_batch": BATCH, "steps": steps, "schedule": "constant"},
                           parallel={"micro_batch": BATCH, "schedule": "1f1b", "tp_size": tp,
                                     "timeout_s": 300})
    c0 = cpu_s()
    res = harness.run_workers(tp, ["--job", job, "--stage_to_rank_map", "0;"],
                              cmd=[os.path.join(bin_dir, "varuna-worker")],
                              env_extra={"OMP_NUM_THREADS": str(threads)}, timeout=900)
    cpu = cpu_s() - c0
    assert res.ok, res.outputs[0][-2000:]
    step = statistics.median(m["step_time_s"] for m in res.metrics[warmup:])
    return BATCH / step, BATCH * steps / cpu, res.losses()


CONFIGS = [("tp 1 x 2 threads", 1, 2), ("tp 2", 2, 1), ("tp 1 x 1 thread", 1, 1)]


def predictions(bin_dir, tmp, data, steps):
    """The planner's predicted step (s) for tp 1 on 1 slot and tp 2 on a node of 2."""
    base = {"global_batch": BATCH, "steps": steps, "schedule": "constant"}
    par = {"stages": 1, "replicas": 1, "micro_batch": BATCH, "schedule": "1f1b"}
    prof_job = harness.job_yaml(os.path.join(tmp, "profile.yaml"), data, model=MODEL, train=base,
                                parallel=dict(par, timeout_s=300))
    profile = os.path.join(tmp, "profile.json")
    res = harness.run_workers(2, ["--job", prof_job, "--profile_out", profile],
                              cmd=[os.path.join(bin_dir, "varuna-worker")],
                              env_extra={"OMP_NUM_THREADS": "1"}, timeout=900)
    assert res.ok, res.outputs[0][-2000:]
    out = {}
    for tp in (1, 2):
        job = harness.job_yaml(os.path.join(tmp, f"plan{tp}.yaml"), data, model=MODEL, train=base,
                               parallel=dict(par, tp_size=tp))
        plan = subprocess.run([os.path.join(bin_dir, "varunactl"), "plan", job, "--slots",
                               str(tp), "--profile", profile, "-o", "json"], check=True,
                              capture_output=True, text=True).stdout
        out[tp] = json.loads(plan)["plans"][0]["step_s"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no_predict", action="store_true")
    args = ap.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    tmp = tempfile.mkdtemp(prefix="varuna-tp-")
    data = corpus(args.build)
    print(f"GPT {MODEL}, global batch {BATCH} (one micro-batch), {args.steps} steps "
          f"(first {args.warmup} skipped); tp 1 = 1 process x 2 threads, tp 2 = 2 processes x "
          "1 thread")
    rows = {name: [] for name, _, _ in CONFIGS}
    losses = {}
    for rnd in range(args.rounds):
        order = CONFIGS[rnd % 3:] + CONFIGS[:rnd % 3]
        for name, tp, threads in order:
            rate, per_cpu, loss = run(bin_dir, tmp, data, tp, threads, args.steps, args.warmup)
            rows[name].append((rate, per_cpu))
            losses.setdefault(name, loss)
            print(f"round {rnd + 1}: {name}: {rate:.3f} samples/s, {per_cpu:.3f} samples per "
                  "CPU-s", flush=True)
    a, b = losses["tp 2"], losses["tp 1 x 2 threads"]
    print(f"\nlosses tp 2 vs tp 1: max relative difference "
          f"{max(abs(x - y) / abs(y) for x, y in zip(a, b)):.1e}")
    names = [n for n, _, _ in CONFIGS]
    print("\n| round | " + " | ".join(f"{n} samples/s" for n in names) +
          " | tp 2 / tp 1 x 2 | " + " | ".join(f"{n} per CPU-s" for n in names) +
          " | tp 2 / tp 1 x 2 per CPU-s |")
    print("|---" * (2 * len(names) + 3) + "|")
    ratios, cpu_ratios = [], []
    for i in range(args.rounds):
        r = [rows[n][i] for n in names]
        ratios.append(r[1][0] / r[0][0])
        cpu_ratios.append(r[1][1] / r[0][1])
        print(f"| {i + 1} | " + " | ".join(f"{x[0]:.3f}" for x in r) + f" | {ratios[-1]:.2f} | " +
              " | ".join(f"{x[1]:.3f}" for x in r) + f" | {cpu_ratios[-1]:.2f} |")
    med = [(statistics.median(x[0] for x in rows[n]), statistics.median(x[1] for x in rows[n]))
           for n in names]
    print("| median | " + " | ".join(f"{m[0]:.3f}" for m in med) +
          f" | {statistics.median(ratios):.2f} | " + " | ".join(f"{m[1]:.3f}" for m in med) +
          f" | {statistics.median(cpu_ratios):.2f} |")
    if args.no_predict:
        return
    predicted = predictions(bin_dir, tmp, data, args.steps)
    print("\n| run | predicted step s | measured step s (median of rounds) | predicted / measured |")
    print("|---|---|---|---|")
    for name, tp in (("tp 1 x 1 thread", 1), ("tp 2", 2)):
        measured = BATCH / statistics.median(x[0] for x in rows[name])
        print(f"| {name} | {predicted[tp]:.4f} | {measured:.4f} | {predicted[tp] / measured:.2f} |")


if __name__ == "__main__":
    main()
