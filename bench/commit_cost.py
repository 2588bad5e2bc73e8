#!/usr/bin/env python3
"""Benchmark: the cost of committed steps (docs/morphing.md "Committed steps"): bench (b)'s
GPT and shape (P=1, D=2 on 2 local ranks, global batch 32, micro-batch 16) with checkpoint.dir
set, in three modes alternated round by round in one run: `checkpoint.commit: false`; `true`
on the relaunch path (a rescue rolls forward at resume, Note [Rolled rescue]; nothing copied
per step; until 2026-11-30 each rank copied its pre-update state every step); `true` with
--in_place, as the agent starts a job that morphs in place (nothing copied: a rank that misses
an agreement rolls forward, Note [Roll forward]). Per round: median samples/s over the steps
after the warm-up (wall clock) and samples per CPU-second of the whole run (user + system of
the ranks, from getrusage of the reaped children: VM steal is not billed). The modes' order
rotates each round. Prints a markdown table for docs/benchmarks.md; the ratios are each
commit mode / commit off (1.0 = free).

With --instructions, each rank runs under valgrind's callgrind instead, counting only the
instructions executed inside Varuna::step (the whole step, the copy included): a count that
VM steal and neighbours do not move, so 2-3 rounds show it (each round takes minutes; the
ranks' timeout_s is raised to 3000 s for the slowdown).

Usage: bench/commit_cost.py [--build build] [--rounds 5] [--steps 20] [--warmup 5]
       bench/commit_cost.py --instructions [--rounds 2] [--steps 3]
"""

import argparse
import glob
import os
import resource
import statistics
import tempfile

from common import ROOT, corpus, harness, median_rate


# Mode -> (checkpoint.commit, extra worker flags).
MODES = {"off": (False, []), "relaunch": (True, []), "in place": (True, ["--in_place"])}
MODES_LIST = list(MODES)


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--instructions", action="store_true")
    args = ap.parse_args()
    args.rounds = args.rounds or (2 if args.instructions else 5)
    args.steps = args.steps or (3 if args.instructions else 20)
    if args.instructions:
        return instructions(args)
    harness.WORKER = os.path.join(args.build, "bin", "varuna-worker")
    tmp = tempfile.mkdtemp(prefix="varuna-bench-commit-")
    data = corpus(args.build)
    model = {"layers": 4, "d_model": 128, "heads": 4, "seq_len": 64}
    train = {"global_batch": 32, "steps": args.steps, "lr": 1e-3, "schedule": "constant"}
    parallel = {"stages": 1, "replicas": 2, "micro_batch": 16}
    print(f"GPT {model}, P=1 D=2, global batch 32, micro-batch 16, {args.steps} steps "
          f"(first {args.warmup} skipped), {args.rounds} alternating rounds")
    print("| round | off samples/s | relaunch samples/s | in place samples/s | relaunch / off | "
          "in place / off | off samples/CPU-s | relaunch samples/CPU-s | in place samples/CPU-s |"
          " relaunch / off per CPU-s | in place / off per CPU-s |")
    print("|---" * 11 + "|")
    ratios = {m: [] for m in MODES_LIST[1:]}
    cpu_ratios = {m: [] for m in MODES_LIST[1:]}
    for rnd in range(1, args.rounds + 1):
        row = {}
        # The order rotates round by round: on this VM the first run of a round is often slower.
        k = (rnd - 1) % len(MODES_LIST)
        for mode in MODES_LIST[k:] + MODES_LIST[:k]:
            commit, flags = MODES[mode]
            ckpt = os.path.join(tmp, f"ckpt-{rnd}-{mode.replace(' ', '_')}")
            extra = (f"checkpoint: {{dir: {ckpt}, commit: {'true' if commit else 'false'}}}\n")
            job = harness.job_yaml(os.path.join(tmp, f"job-{mode.replace(' ', '_')}.yaml"), data,
                                   model=model, train=train, parallel=parallel, extra=extra)
            cpu0 = children_cpu()
            r = harness.run_workers(2, ["--job", job] + flags, timeout=1200)
            cpu = children_cpu() - cpu0
            if not r.ok:
                raise SystemExit(f"{mode} failed:\n" + "\n".join(r.outputs))
            rows = [m for m in r.metrics if m.get("rank", 0) == 0] or r.metrics
            rate = median_rate(rows, args.warmup)
            per_cpu = args.steps * 32 / cpu
            row[mode] = (rate, per_cpu)
        for m in MODES_LIST[1:]:
            ratios[m].append(row[m][0] / row["off"][0])
            cpu_ratios[m].append(row[m][1] / row["off"][1])
        rates = " | ".join(f"{row[m][0]:.2f}" for m in MODES)
        cpus = " | ".join(f"{row[m][1]:.2f}" for m in MODES)
        print(f"| {rnd} | {rates} | {ratios['relaunch'][-1]:.3f} | {ratios['in place'][-1]:.3f} "
              f"| {cpus} | {cpu_ratios['relaunch'][-1]:.3f} | {cpu_ratios['in place'][-1]:.3f} |",
              flush=True)
    med = {m: statistics.median(ratios[m]) for m in MODES_LIST[1:]}
    cmed = {m: statistics.median(cpu_ratios[m]) for m in MODES_LIST[1:]}
    print(f"| median of rounds | | | | **{med['relaunch']:.3f}** | **{med['in place']:.3f}** | | | | "
          f"**{cmed['relaunch']:.3f}** | **{cmed['in place']:.3f}** |")
    for m in MODES_LIST[1:]:
        print(f"spread {m}/off: {min(ratios[m]):.3f}-{max(ratios[m]):.3f} (wall), "
              f"{min(cpu_ratios[m]):.3f}-{max(cpu_ratios[m]):.3f} (per CPU-s)")


def instructions(args):
    worker = os.path.join(args.build, "bin", "varuna-worker")
    tmp = tempfile.mkdtemp(prefix="varuna-bench-commit-ir-")
    data = corpus(args.build)
    model = {"layers": 4, "d_model": 128, "heads": 4, "seq_len": 64}
    train = {"global_batch": 32, "steps": args.steps, "lr": 1e-3, "schedule": "constant"}
    parallel = {"stages": 1, "replicas": 2, "micro_batch": 16, "timeout_s": 3000}
    print(f"GPT {model}, P=1 D=2, global batch 32, micro-batch 16, {args.steps} steps under "
          f"callgrind, instructions inside Varuna::step per step (mean of both ranks), "
          f"{args.rounds} alternating rounds")
    print("| round | commit off instructions/step | commit on instructions/step | on / off |")
    print("|---|---|---|---|")
    ratios = []
    for rnd in range(1, args.rounds + 1):
        row = {}
        for commit in (False, True):
            name = f"{rnd}-{'on' if commit else 'off'}"
            extra = (f"checkpoint: {{dir: {os.path.join(tmp, 'ckpt-' + name)}, "
                     f"commit: {'true' if commit else 'false'}}}\n")
            job = harness.job_yaml(os.path.join(tmp, f"job-{name}.yaml"), data, model=model,
                                   train=train, parallel=parallel, extra=extra)
            out = os.path.join(tmp, f"callgrind.{name}")
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p",
                   "--toggle-collect=varuna::Varuna::step(*", worker]
            r = harness.run_workers(2, ["--job", job], timeout=7200, cmd=cmd)
            if not r.ok:
                raise SystemExit(f"commit={commit} failed:\n" + "\n".join(r.outputs))
            counts = []
            for f in glob.glob(out + ".*"):
                with open(f) as fh:
                    counts += [int(line.split()[1]) for line in fh if line.startswith("totals:")]
            if len(counts) != 2:
                raise SystemExit(f"expected 2 callgrind outputs for {name}, got {counts}")
            row[commit] = sum(counts) / 2 / args.steps
        ratio = row[True] / row[False]
        ratios.append(ratio)
        print(f"| {rnd} | {row[False]:.4g} | {row[True]:.4g} | {ratio:.4f} |", flush=True)
    print(f"| median of rounds | | | **{statistics.median(ratios):.4f}** |")
    print(f"spread on/off: {min(ratios):.4f}-{max(ratios):.4f}")


if __name__ == "__main__":
    main()
