#!/usr/bin/env python3
"""Benchmark (c): measured pipeline bubble vs each schedule's bound.

The GPT cut into P stages (FLOP-balanced by the partitioner), every rank writing its own
metrics. Per step and stage, busy = pipeline_s - recv_wait_s (time not blocked on a receive);
the measured bubble is 1 - sum(busy) / (P * max(pipeline_s)), median over the steps after
warm-up. The varuna schedule also recomputes on its non-last stages, which counts as busy.

P=2 runs one process per core (OMP_NUM_THREADS=1). P=4 on 2 cores runs every rank in its own
cgroup capped at half a core (bench/hetero.py's launcher), so each stage computes at the same
rate whether its peers are busy or idle, as a stage on its own device would.

Bounds: gpipe and 1f1b (p-1)/(m+p-1); zb-h1 (p-1)/(3(m+p-1)), a third of it (the issue's
figure); with F = B = W its exact ideal is (p-1)/(3m+p-1), printed beside it.
Rounds alternate the schedules (the order rotates each round); every round is printed.

Usage: bench/pipeline_bubble.py [--build build] [--steps 16] [--rounds 1]
"""

import argparse
import os
import statistics
import tempfile

from common import ROOT, corpus, harness, read_metrics
from hetero import capped_launcher

SCHEDULES = ["gpipe", "1f1b", "varuna", "zb-h1"]


def bound(schedule, P, m):
    if schedule == "zb-h1":
        return (P - 1) / (3 * (m + P - 1)), (P - 1) / (3 * m + P - 1)
    return (P - 1) / (m + P - 1), None


def run_one(args, bin_dir, tmp, data, P, m, schedule, launcher):
    B = 32
    model = {"layers": 8, "d_model": 128, "heads": 4, "seq_len": 64}
    job = harness.job_yaml(os.path.join(tmp, "job.yaml"), data, model=model,
                           train={"global_batch": B, "steps": args.steps,
                                  "schedule": "constant"},
                           parallel={"micro_batch": B // m, "schedule": schedule})
    res = harness.run_workers(P, ["--job", job, "--stage_to_rank_map", harness.stage_map(P, 1),
                                  "--metrics_all_ranks"],
                              cmd=launcher + [os.path.join(bin_dir, "varuna-worker")],
                              env_extra={"OMP_NUM_THREADS": "1"}, timeout=900)
    assert res.ok, res.outputs[0][-2000:]
    # The last stage writes the main file; the other ranks write .rank<R>.
    rows = [read_metrics(f"{res.metrics_path}.rank{r}") for r in range(P - 1)] + [res.metrics]
    bubbles, times = [], []
    for s in range(args.warmup, args.steps):
        pipe = [rows[r][s]["pipeline_s"] for r in range(P)]
        busy = [rows[r][s]["pipeline_s"] - rows[r][s]["recv_wait_s"] for r in range(P)]
        bubbles.append(1 - sum(busy) / (P * max(pipe)))
        times.append(rows[-1][s]["step_time_s"])
    return statistics.median(bubbles), statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--stages", default="2,4")
    ap.add_argument("--micro_batches", default="8,16")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    args = ap.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    tmp = tempfile.mkdtemp(prefix="varuna-bubble-")
    data = corpus(args.build)
    schedules = args.schedules.split(",")
    print(f"GPT 8 layers d_model 128, global batch 32, {args.steps} steps (first {args.warmup} "
          "skipped), OMP_NUM_THREADS=1 per rank; P=4 ranks capped at 0.5 core")
    results = {}
    for P in [int(p) for p in args.stages.split(",")]:
        launcher = capped_launcher(tmp, 0.5, 10000) if P > 2 else []
        for m in [int(x) for x in args.micro_batches.split(",")]:
            for rnd in range(args.rounds):
                order = schedules[rnd % len(schedules):] + schedules[:rnd % len(schedules)]
                for schedule in order:
                    b, t = run_one(args, bin_dir, tmp, data, P, m, schedule, launcher)
                    results.setdefault((P, m, schedule), []).append((b, t))
                    print(f"round {rnd + 1}: P={P} m={m} {schedule}: bubble {b:.3f}, "
                          f"step {t:.3f} s", flush=True)
    print("\n| P | m | schedule | bound | measured bubble (median) | rounds | step time s "
          "(median) | step time / 1f1b |")
    print("|---|---|---|---|---|---|---|---|")
    for (P, m, schedule), rs in results.items():
        lo, exact = bound(schedule, P, m)
        bs = statistics.median(r[0] for r in rs)
        ts = statistics.median(r[1] for r in rs)
        ref = results.get((P, m, "1f1b"))
        ratio = f"{ts / statistics.median(r[1] for r in ref):.2f}" if ref else "-"
        bound_s = f"{lo:.3f}" + (f" (exact {exact:.3f})" if exact else "")
        each = ", ".join(f"{r[0]:.3f}" for r in rs)
        print(f"| {P} | {m} | {schedule} | {bound_s} | {bs:.3f} | {each} | {ts:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
