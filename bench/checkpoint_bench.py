#!/usr/bin/env python3
"""Checkpoint benchmark: write throughput vs the disk's own (dd with fsync), and step time
while a checkpoint uploads in the background vs normal steps.

A GPT of ~25M parameters (8 layers, d_model 512): with AdamW state a checkpoint is ~300 MB.
One process; checkpoints at steps 3 and 6 of 8 into --dir (default: under the build dir).
  (1) synchronous: checkpoint.dir only; the log line "blocked training for X s" is the write
      time of the whole checkpoint (serialize + write + fsync + rename + manifest).
  (2) background: with checkpoint.tempdir on the same disk; training blocks only for the
      local write, steps 4-5 and 7-8 overlap the upload.
Usage: bench/checkpoint_bench.py [--build build] [--dir DIR]
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile

from common import ROOT, corpus, harness


def dir_mb(path):
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="ckbench-", dir=args.build)
    os.makedirs(base, exist_ok=True)
    data = corpus(args.build)
    model = {"layers": 8, "d_model": 512, "heads": 8, "seq_len": 64}
    train = {"global_batch": 2, "steps": 8, "schedule": "constant"}

    dd_file = os.path.join(base, "dd.bin")
    dd = subprocess.run(["dd", "if=/dev/zero", f"of={dd_file}", "bs=1M", "count=300",
                         "conv=fsync"], capture_output=True, text=True)
    m = re.search(r"([\d.]+) ([MG])B/s", dd.stderr)
    dd_mbs = float(m.group(1)) * (1000 if m.group(2) == "G" else 1)
    os.remove(dd_file)

    results = {}
    for mode in ["sync", "background"]:
        ck = os.path.join(base, "ck_" + mode)
        local = os.path.join(base, "local_" + mode)
        shutil.rmtree(ck, ignore_errors=True)
        extra = f"checkpoint: {{dir: {ck}, every_steps: 3"
        extra += f", tempdir: {local}}}\n" if mode == "background" else "}\n"
        job = harness.job_yaml(os.path.join(base, mode + ".yaml"), data, model=model,
                               train=train, parallel={"micro_batch": 2}, extra=extra)
        res = harness.run_workers(1, ["--job", job],
                                  cmd=[os.path.join(args.build, "bin", "varuna-worker")],
                                  timeout=900)
        assert res.ok, res.outputs[0][-3000:]
        blocked = [float(x) for x in re.findall(r"blocked training for ([\d.]+) s",
                                                res.outputs[0])]
        times = {r["step"]: r["step_time_s"] for r in res.metrics}
        results[mode] = (dir_mb(os.path.join(ck, "varuna_ckpt_6")), blocked, times)

    size, blocked, times = results["sync"]
    print(f"checkpoint size {size:.0f} MB; disk (dd 300 MB, conv=fsync) {dd_mbs:.0f} MB/s")
    print("| mode | training blocked per checkpoint s | effective MB/s | vs dd |")
    print("|---|---|---|---|")
    for mode in ["sync", "background"]:
        size, blocked, _ = results[mode]
        b = statistics.mean(blocked)
        print(f"| {mode} | {b:.2f} | {size / b:.0f} | {size / b / dd_mbs:.2f} |")
    _, _, bt = results["background"]
    normal = statistics.median([bt[s] for s in (2, 3, 6)])
    during = statistics.median([bt[s] for s in (4, 5, 7, 8)])
    print(f"background mode: median step time {normal:.3f} s without upload, {during:.3f} s "
          f"while uploading (x{during / normal:.2f})")


if __name__ == "__main__":
    main()
