#!/usr/bin/env python3
"""Heterogeneous pipelines vs P x D (docs/benchmarks.md (h)): for 5, 7 and 9 slots, the best
heterogeneous plan and the best P x D plan that AutoConfig finds with a profile of this
machine, each run for real (varuna-worker ranks on loopback, OMP_NUM_THREADS=1 per rank) and
compared with the simulator's prediction.

Slots are emulated devices: every rank runs in a cgroup capped at --cpu_per_rank of a core
(0.2 by default, enforced per --cfs_period_us, 100 ms by default), so 9 ranks fit on a 2-core VM without
contending and each slot has the same fixed speed, as one GPU per slot would. The profile is measured under the same cap. Without
write access to the cgroup cpu controller the cap is skipped and the output says so.

Rounds alternate the two plans of each slot count. Each round's rate is the median samples/s
of its steps after WARMUP. The measured value is the median of the rounds. Every round is
printed, with samples per CPU-second of the whole run (user + system time of the ranks, from
the kernel's child accounting) beside the wall-clock rate.

usage: bench/hetero.py [--build DIR] [--rounds N] [--steps N] [--warmup N] [--slots 5,7,9]
                       [--cpu_per_rank F] [--cfs_period_us N]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile

from common import ROOT, corpus, harness

MODEL = {"layers": 6, "d_model": 96, "heads": 4, "seq_len": 48}
GLOBAL_BATCH = 24
CGROUP = "/sys/fs/cgroup/cpu/varuna-bench"
# The cap's CFS period (--cfs_period_us). With the kernel's default 100 ms, a rank that spends
# its quota sleeps up to 80 ms, so the profiler records some stalls as compute (a 2.5 ms
# block timed at 80 ms) and peers stall on receives. 1 ms (the minimum) spreads the cap, but
# then the ranks' rates stop scaling with their number (docs/benchmarks.md (h)).


def capped_launcher(tmp, cpu_per_rank, period_us):
    """A wrapper that puts the rank (RANK) in its own cgroup capped at cpu_per_rank cores."""
    try:
        os.makedirs(CGROUP, exist_ok=True)
        with open(os.path.join(CGROUP, "cpu.cfs_period_us")) as f:
            f.read()
    except OSError as e:
        print(f"no cgroup cpu controller ({e}): ranks are NOT capped", flush=True)
        return []
    path = os.path.join(tmp, "capped.sh")
    with open(path, "w") as f:
        f.write(f"""#!/bin/sh
cg={CGROUP}/r$RANK
mkdir -p $cg
echo {period_us} > $cg/cpu.cfs_period_us
echo {int(cpu_per_rank * period_us)} > $cg/cpu.cfs_quota_us
echo $$ > $cg/tasks
exec "$@"
""")
    os.chmod(path, 0o755)
    return [path]


def job(tmp, data, name, steps, micro_batch="auto"):
    parallel = {"stages": "auto", "replicas": "auto", "micro_batch": micro_batch,
                "schedule": "auto", "timeout_s": 900}
    return harness.job_yaml(os.path.join(tmp, f"{name}.yaml"), data, model=MODEL,
                            train={"global_batch": GLOBAL_BATCH, "steps": steps,
                                   "schedule": "constant"},
                            parallel=parallel)


def plans(bin_dir, job_path, profile, slots):
    out = subprocess.run([os.path.join(bin_dir, "varunactl"), "plan", job_path, "--slots",
                          str(slots), "--profile", profile, "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    all_plans = json.loads(out)["plans"]
    het = next((p for p in all_plans if p.get("pipelines")), None)
    hom = next((p for p in all_plans if not p.get("pipelines")), None)
    return het, hom


def worker_args(plan):
    args = ["--chunk_size", str(plan["micro_batch"]), "--schedule", plan["schedule"]]
    if plan.get("pipelines"):
        return plan["slots"], args + ["--pipelines", plan["topology"]]
    P, D = plan["stages"], plan["replicas"]
    return P * D, args + ["--stage_to_rank_map", harness.stage_map(P, D), "--stage_boundaries",
                          ",".join(str(b) for b in plan["boundaries"])]


def shape_text(plan):
    if plan.get("pipelines"):
        return "+".join("+".join([str(p["stages"])] * p.get("count", 1))
                        for p in plan["pipelines"]) + " (het)"
    return f"{plan['stages']}x{plan['replicas']}"


def measure(bin_dir, launcher, job_path, plan, steps, warmup):
    world, args = worker_args(plan)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = harness.run_workers(world, ["--job", job_path, *args],
                              cmd=launcher + [os.path.join(bin_dir, "varuna-worker")],
                              env_extra={"OMP_NUM_THREADS": "1"}, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert res.ok, res.outputs[0][-2000:]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rate = statistics.median(r["samples_per_s"] for r in res.metrics[warmup:steps])
    return rate, GLOBAL_BATCH * steps / cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--slots", default="5,7,9")
    ap.add_argument("--cpu_per_rank", type=float, default=0.2)
    ap.add_argument("--cfs_period_us", type=int, default=100000)
    args = ap.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    data = corpus(args.build)
    tmp = tempfile.mkdtemp(prefix="varuna-hetero-bench-")
    launcher = capped_launcher(tmp, args.cpu_per_rank, args.cfs_period_us)
    profile = os.path.join(tmp, "profile.json")
    pj = job(tmp, data, "profile", args.steps)
    res = harness.run_workers(2, ["--job", pj, "--profile_out", profile],
                              cmd=launcher + [os.path.join(bin_dir, "varuna-worker")],
                              env_extra={"OMP_NUM_THREADS": "1"}, timeout=900)
    assert res.ok, res.outputs[0][-2000:]
    print(f"profiled in {res.elapsed:.1f} s -> {profile}", flush=True)

    rows = []
    for slots in [int(s) for s in args.slots.split(",")]:
        jp = job(tmp, data, f"run{slots}", args.steps)
        het, hom = plans(bin_dir, jp, profile, slots)
        for kind, plan in (("heterogeneous", het), ("P x D", hom)):
            if plan is None:
                print(f"{slots} slots: no {kind} plan", flush=True)
                continue
            rows.append({"slots": slots, "kind": kind, "plan": plan, "job": jp, "rounds": [],
                         "per_cpu": []})
            print(f"{slots} slots, {kind}: {shape_text(plan)} mb{plan['micro_batch']} "
                  f"{plan['schedule']} on {plan['slots']} slots, predicted "
                  f"{plan['samples_per_s']:.1f} samples/s", flush=True)

    for rnd in range(args.rounds):
        for row in rows:
            rate, per_cpu = measure(bin_dir, launcher, row["job"], row["plan"], args.steps,
                                    args.warmup)
            row["rounds"].append(rate)
            row["per_cpu"].append(per_cpu)
            print(f"round {rnd + 1}: {row['slots']} slots {row['kind']}: {rate:.1f} samples/s, "
                  f"{per_cpu:.1f} samples/CPU-s", flush=True)

    print()
    print(f"GPT {MODEL['layers']}x{MODEL['d_model']} seq {MODEL['seq_len']}, global batch "
          f"{GLOBAL_BATCH}, {args.rounds} rounds alternating, {args.steps - args.warmup} steps "
          f"per round after {args.warmup} warm-up, OMP_NUM_THREADS=1 per rank, "
          + (f"each rank capped at {args.cpu_per_rank} core per {args.cfs_period_us} us"
             if launcher else "NOT capped"))
    print("| slots | plan | shape | slots used | predicted samples/s | rounds samples/s | "
          "measured (median) | error | samples/CPU-s (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        meas = statistics.median(row["rounds"])
        pred = row["plan"]["samples_per_s"]
        rounds = " ".join(f"{x:.1f}" for x in row["rounds"])
        print(f"| {row['slots']} | {row['kind']} | {shape_text(row['plan'])} mb"
              f"{row['plan']['micro_batch']} | {row['plan']['slots']} | {pred:.1f} | {rounds} | "
              f"{meas:.1f} | {100 * (pred - meas) / meas:+.1f}% | "
              f"{statistics.median(row['per_cpu']):.1f} |")
    print()
    for slots in sorted({r["slots"] for r in rows}):
        pair = {r["kind"]: r for r in rows if r["slots"] == slots}
        if len(pair) == 2:
            h, p = pair["heterogeneous"], pair["P x D"]
            ratios = [a / b for a, b in zip(h["rounds"], p["rounds"])]
            print(f"{slots} slots: heterogeneous / P x D per round "
                  f"{' '.join(f'{x:.2f}' for x in ratios)}; median {statistics.median(ratios):.2f}"
                  f" (predicted {h['plan']['samples_per_s'] / p['plan']['samples_per_s']:.2f})")


if __name__ == "__main__":
    main()
