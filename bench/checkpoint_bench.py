#!/usr/bin/env python3
"""Checkpoint benchmark (docs/benchmarks.md (d)): synchronous write speed against the disk's
own (dd with conv=fsync, same size, same directory), alternated over --rounds rounds; then
step time while a checkpoint uploads in the background.

A GPT of ~25M parameters (8 layers, d_model 512): with AdamW state a checkpoint is ~300 MB.
One process.
  (1) synchronous, each round: dd writes three files the size of a checkpoint, one step
      time apart, keeping them (as checkpoints are kept), and a 3-step run saves after every
      step (checkpoint.dir only); the log line "blocked training for X s (cpu Y s)" is one
      whole save (Y: the process's CPU time, helper threads included) (snapshot, format, write, checksums, fsync, rename, manifest). Save i is
      compared with dd's file i: a shared VM disk takes a first burst much faster than the
      writes that follow it. dd and the run swap order every round.
  (2) background (--background): checkpoint.tempdir on the same disk, saves at steps 3 and 6
      of 8; training blocks only for the snapshot, steps 4-5 and 7-8 overlap the upload.
Usage: bench/checkpoint_bench.py [--build build] [--dir DIR] [--rounds 5] [--background]
       [--worker OTHER_BUILD/bin/varuna-worker]
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

from common import ROOT, corpus, harness

MODEL = {"layers": 8, "d_model": 512, "heads": 8, "seq_len": 64}


def dir_mb(path):
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total / 1e6


def dd_mbs(base, mb, files, pause):
    """dd's speed writing `files` files of `mb` MiB with conv=fsync, `pause` s apart, each kept
    until all are written (as a run's checkpoints are): per file, MB/s."""
    paths, speeds = [], []
    for i in range(files):
        paths.append(os.path.join(base, f"dd{i}.bin"))
        out = subprocess.run(["dd", "if=/dev/zero", f"of={paths[-1]}", "bs=1M", f"count={mb}",
                              "conv=fsync"], capture_output=True, text=True).stderr
        m = re.search(r"copied, ([\d.]+) s", out)
        speeds.append(mb * 1048576 / 1e6 / float(m.group(1)))
        time.sleep(pause)
    for p in paths:
        os.remove(p)
    return speeds


def run(args, base, data, name, train, ckpt):
    ck = os.path.join(base, "ck_" + name)
    shutil.rmtree(ck, ignore_errors=True)
    job = harness.job_yaml(os.path.join(base, name + ".yaml"), data, model=MODEL, train=train,
                           parallel={"micro_batch": 2}, extra=f"checkpoint: {{dir: {ck}{ckpt}}}\n")
    res = harness.run_workers(1, ["--job", job],
                              cmd=[args.worker or os.path.join(args.build, "bin", "varuna-worker")],
                              timeout=900)
    assert res.ok, res.outputs[0][-3000:]
    saves = [(float(w), float(c)) for w, c in re.findall(
        r"blocked training for ([\d.]+) s \((?:thread )?cpu ([\d.]+) s\)", res.outputs[0])]
    last = max(int(d.split("_")[-1]) for d in os.listdir(ck) if d.startswith("varuna_ckpt_"))
    size = dir_mb(os.path.join(ck, f"varuna_ckpt_{last}"))
    shutil.rmtree(ck, ignore_errors=True)
    return size, saves, {r["step"]: r["step_time_s"] for r in res.metrics}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--background", action="store_true")
    ap.add_argument("--worker", default=None, help="another varuna-worker binary (a 'before')")
    args = ap.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="ckbench-", dir=args.build)
    os.makedirs(base, exist_ok=True)
    data = corpus(args.build)
    train = {"global_batch": 2, "steps": 3, "schedule": "constant"}

    print("| round | order | dd MB/s (3 files) | save s (3 saves) | save MB/s (3 saves) | "
          "save / dd, each | MB per CPU-s (median) |")
    print("|---|---|---|---|---|---|---|")
    first, later, size, pause = [], [], 306, 0.35
    for r in range(args.rounds):
        order = ["dd", "save"] if r % 2 == 0 else ["save", "dd"]
        for what in order:
            if what == "dd":
                dd = dd_mbs(base, int(round(size * 1e6 / 1048576)), 3, pause)
            else:
                size, saves, times = run(args, base, data, "sync", train, ", every_steps: 1")
                pause = statistics.median(times.values())
        rates = [size / w for w, _ in saves]
        ratios = [s / d for s, d in zip(rates, dd)]
        first.append(ratios[0])
        later.extend(ratios[1:])
        cpu = statistics.median(c for _, c in saves)
        print(f"| {r + 1} | {' then '.join(order)} | {', '.join(f'{d:.0f}' for d in dd)} | "
              f"{', '.join(f'{w:.3f}' for w, _ in saves)} | "
              f"{', '.join(f'{x:.0f}' for x in rates)} | "
              f"{', '.join(f'{x:.2f}' for x in ratios)} | {size / cpu:.0f} |", flush=True)
    print(f"checkpoint {size:.0f} MB; median save/dd over {args.rounds} rounds: first file "
          f"{statistics.median(first):.2f}, second and third {statistics.median(later):.2f}")

    if args.background:
        size, blocked, bt = run(args, base, data, "background",
                                {"global_batch": 2, "steps": 8, "schedule": "constant"},
                                f", every_steps: 3, tempdir: {os.path.join(base, 'local')}")
        normal = statistics.median([bt[s] for s in (2, 3, 6)])
        during = statistics.median([bt[s] for s in (4, 5, 7, 8)])
        print(f"background: training blocked {statistics.mean(w for w, _ in blocked):.3f} s per "
              f"checkpoint; median step time {normal:.3f} s without upload, {during:.3f} s "
              f"while uploading (x{during / normal:.2f})")


if __name__ == "__main__":
    main()
