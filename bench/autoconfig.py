#!/usr/bin/env python3
"""AutoConfig accuracy (docs/benchmarks.md (g)): profile two GPT sizes on this machine with
varuna-worker --profile_out (2 ranks), predict the step time of a sweep of shapes with
`varunactl plan --profile`, run each shape for real (OMP_NUM_THREADS=1 per rank) and compare.
Rounds alternate over the shapes; each round's value is the median step time of its run (first
WARMUP steps skipped), every round is printed, and the measured value is the median of the
round medians (a slow spell of this shared machine spoils one run, not the result). Also runs the planner's own pick (every field
auto) and compares it with the best measured shape.

usage: bench/autoconfig.py [--build DIR] [--rounds N] [--steps N] [--warmup N] [--quick]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import ROOT, corpus, harness, read_metrics

MODELS = {
    "gpt-4x128": {"layers": 4, "d_model": 128, "heads": 4, "seq_len": 64},
    "gpt-8x96": {"layers": 8, "d_model": 96, "heads": 4, "seq_len": 64},
}
GLOBAL_BATCH = 16
SHAPES = [  # (stages, replicas, micro_batch, schedule) on 2 slots
    (1, 1, 4, "varuna"), (1, 2, 4, "varuna"), (1, 2, 8, "varuna"), (2, 1, 1, "1f1b"),
    (2, 1, 2, "varuna"), (2, 1, 4, "varuna"), (2, 1, 4, "gpipe"), (2, 1, 4, "1f1b"),
    (2, 1, 8, "gpipe"),
]


def cpu_seconds(pids):
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


def job(tmp, data, name, model, shape=None, steps=10):
    parallel = {"stages": "auto", "replicas": "auto", "micro_batch": "auto", "schedule": "auto"}
    if shape:
        P, D, mb, sched = shape
        parallel = {"stages": P, "replicas": D, "micro_batch": mb, "schedule": sched}
    return harness.job_yaml(os.path.join(tmp, f"{name}.yaml"), data, model=model,
                            train={"global_batch": GLOBAL_BATCH, "steps": steps,
                                   "schedule": "constant"},
                            parallel=parallel)


def predict(bin_dir, job_path, profile, extra=()):
    out = subprocess.run([os.path.join(bin_dir, "varunactl"), "plan", job_path, "--slots", "2",
                          "--profile", profile, "-o", "json", *extra],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["plans"][0]


def measure(bin_dir, job_path, P, D, steps, warmup):
    res = harness.run_workers(P * D, ["--job", job_path, "--stage_to_rank_map",
                                      harness.stage_map(P, D)],
                              cmd=[os.path.join(bin_dir, "varuna-worker")],
                              env_extra={"OMP_NUM_THREADS": "1"}, timeout=600)
    assert res.ok, res.outputs[0][-2000:]
    times = [r["step_time_s"] for r in res.metrics[warmup:steps]]
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one model, 4 shapes, 1 round")
    ap.add_argument("--models", help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--shapes", help="P,D,MB,SCHEDULE;... instead of the default sweep")
    args = ap.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    data = corpus(args.build)
    tmp = tempfile.mkdtemp(prefix="varuna-autoconfig-")
    models = dict(list(MODELS.items())[:1]) if args.quick else MODELS
    shapes = SHAPES[:4] if args.quick else SHAPES
    if args.models:
        models = {k: MODELS[k] for k in args.models.split(",")}
    if args.shapes:
        shapes = [tuple(int(x) if i < 3 else x for i, x in enumerate(sh.split(",")))
                  for sh in args.shapes.split(";")]
    rounds = 1 if args.quick else args.rounds

    profiles, picks, rows = {}, {}, {}
    for name, model in models.items():
        path = os.path.join(tmp, f"{name}.profile.json")
        j = job(tmp, data, name, model)
        res = harness.run_workers(2, ["--job", j, "--profile_out", path],
                                  cmd=[os.path.join(bin_dir, "varuna-worker")],
                                  env_extra={"OMP_NUM_THREADS": "1"}, timeout=900)
        assert res.ok, res.outputs[0][-2000:]
        profiles[name] = path
        print(f"{name}: profiled in {res.elapsed:.1f} s -> {path}", flush=True)
        pick = predict(bin_dir, j, path)
        picks[name] = (pick["stages"], pick["replicas"], pick["micro_batch"], pick["schedule"])
        for shape in shapes + [picks[name]]:
            if (name, shape) in rows:
                continue
            P, D, mb, sched = shape
            jp = job(tmp, data, f"{name}-{P}x{D}-{mb}-{sched}", model, shape, args.steps)
            pred = predict(bin_dir, jp, path)
            rows[(name, shape)] = {"job": jp, "pred": pred["step_s"], "rounds": []}

    for rnd in range(rounds):
        for key, row in rows.items():
            name, (P, D, mb, sched) = key
            row["rounds"].append(
                statistics.median(measure(bin_dir, row["job"], P, D, args.steps, args.warmup)))
            print(f"round {rnd + 1}: {name} P={P} D={D} mb={mb} {sched}: "
                  f"{row['rounds'][-1]:.4f} s", flush=True)

    print()
    print(f"global batch {GLOBAL_BATCH}, 2 slots, OMP_NUM_THREADS=1 per rank, {rounds} rounds x "
          f"{args.steps - args.warmup} steps per shape (median)")
    print("| model | P | D | micro-batch | schedule | predicted s | rounds s | measured s | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    errors = []
    for (name, shape), row in rows.items():
        meas = statistics.median(row["rounds"])
        err = (row["pred"] - meas) / meas
        row["meas"] = meas
        if shape in shapes:
            errors.append(abs(err))
        P, D, mb, sched = shape
        tag = " (pick)" if picks[name] == shape else ""
        rounds_text = " ".join(f"{x:.3f}" for x in row["rounds"])
        print(f"| {name} | {P} | {D} | {mb} | {sched}{tag} | {row['pred']:.4f} | {rounds_text} | "
              f"{meas:.4f} | {100 * err:+.1f}% |")
    print()
    print(f"sweep error: median {100 * statistics.median(errors):.1f}%, "
          f"worst {100 * max(errors):.1f}% over {len(errors)} shapes")
    for name in models:
        best = min((row["meas"], shape) for (n, shape), row in rows.items()
                   if n == name and shape in shapes)
        pick_meas = rows[(name, picks[name])]["meas"]
        print(f"{name}: planner pick {picks[name]} measured {pick_meas:.4f} s; best of the sweep "
              f"{best[1]} {best[0]:.4f} s; pick/best = {pick_meas / best[0]:.3f}")


if __name__ == "__main__":
    main()
