#!/usr/bin/env python3
"""Benchmark (c): measured pipeline bubble vs the (p-1)/(m+p-1) bound.

P=2 stages of the GPT (FLOP-balanced by the partitioner), one process per core
(OMP_NUM_THREADS=1), every rank writing its own metrics. Per step and stage,
busy = pipeline_s - recv_wait_s (time not blocked on a receive); the measured bubble is
1 - sum(busy) / (P * max(pipeline_s)), median over steps after warm-up. The varuna schedule
also recomputes on stage 0, which counts as busy time, not bubble.

Usage: bench/pipeline_bubble.py [--build build] [--steps 20]
"""

import argparse
import os
import statistics
import tempfile

from common import ROOT, corpus, harness, read_metrics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    args = ap.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    tmp = tempfile.mkdtemp(prefix="varuna-bubble-")
    data = corpus(args.build)
    P, B = 2, 32
    model = {"layers": 4, "d_model": 128, "heads": 4, "seq_len": 64}
    print(f"GPT {model}, P={P}, global batch {B}, {args.steps} steps (first {args.warmup} "
          "skipped), OMP_NUM_THREADS=1 per rank")
    print("| schedule | micro-batches m | bound (p-1)/(m+p-1) | measured bubble | step time s |")
    print("|---|---|---|---|---|")
    for schedule in ["gpipe", "1f1b", "varuna"]:
        for m in [2, 4, 8]:
            job = harness.job_yaml(os.path.join(tmp, "job.yaml"), data, model=model,
                                   train={"global_batch": B, "steps": args.steps,
                                          "schedule": "constant"},
                                   parallel={"micro_batch": B // m, "schedule": schedule})
            res = harness.run_workers(P, ["--job", job, "--stage_to_rank_map",
                                          harness.stage_map(P, 1), "--metrics_all_ranks"],
                                      cmd=[os.path.join(bin_dir, "varuna-worker")],
                                      env_extra={"OMP_NUM_THREADS": "1"})
            assert res.ok, res.outputs[0][-2000:]
            # The last stage writes the main file; the other ranks write .rank<R>.
            rows = [res.metrics] + [read_metrics(f"{res.metrics_path}.rank{r}")
                                    for r in range(P - 1)]
            bubbles, times = [], []
            for s in range(args.warmup, args.steps):
                pipe = [rows[r][s]["pipeline_s"] for r in range(P)]
                busy = [rows[r][s]["pipeline_s"] - rows[r][s]["recv_wait_s"] for r in range(P)]
                bubbles.append(1 - sum(busy) / (P * max(pipe)))
                times.append(rows[0][s]["step_time_s"])
            bound = (P - 1) / (m + P - 1)
            print(f"| {schedule} | {m} | {bound:.3f} | {statistics.median(bubbles):.3f} | "
                  f"{statistics.median(times):.3f} |")


if __name__ == "__main__":
    main()
