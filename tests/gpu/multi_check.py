#!/usr/bin/env python3
"""The device check's multi-rank phase (docs/gpu.md "The device check", issue R4 4/10): two
ranks of one job, D=2 over gloo sharing the one GPU (NCCL refuses two ranks on one device),
on the GPT of bench (i) at ~350M (two 1.3B states do not fit one GPU beside each other):

  commit   the same run in three modes, one after the other: checkpoint.commit false (off),
           true with --in_place (the default path: nothing copied per step, Note [Roll
           forward]) and true on the relaunch path (nothing copied either: Note [Rolled
           rescue]; until 2026-11-30 a pre-update copy every step); the
           median step time past the first SKIP steps, and each mode's cost against off;
  rescue   the relaunch mode with rank 1 killing itself in step KILL_AT's forward
           (VARUNA_FAULT): rank 0's step fails, it rescues and exits 75; the seconds from
           rank 1's death to rank 0's exit, and the rescue's own seconds from its log.

Writes OUT/multi.json (and each run's log under OUT/multi/). On the CPU (--device cpu) the
same runs on the tiny GPT: what tests/gpu/device_check.sh --dry-run rehearses. Standard
library only. Usage:
  multi_check.py --worker W --out DIR [--device cuda] [--model 350m] [--steps 8] [--skip 3]
"""

import argparse
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = {  # name -> (layers, d_model, heads, seq_len, global batch, micro-batch)
    "350m": (24, 1024, 16, 1024, 8, 4),
    "tiny": (2, 64, 4, 64, 8, 4),
}
MODES = [("off", False, []), ("in_place", True, ["--in_place"]), ("relaunch", True, [])]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_job(path, args, data, ckpt, commit):
    layers, d, heads, seq, batch, micro = SHAPES[args.model]
    with open(path, "w") as f:
        f.write(f"name: multi-check\n"
                f"model: {{kind: gpt, layers: {layers}, d_model: {d}, heads: {heads}, "
                f"seq_len: {seq}, vocab: 256, dropout: 0.0}}\n"
                f"data: {{kind: text, path: \"{data}\"}}\n"
                f"train: {{global_batch: {batch}, steps: {args.steps}, optimizer: adamw, "
                f"lr: 1.0e-4, warmup: 0, schedule: constant, clip_grad_norm: 1.0, "
                f"precision: bf16, device: {args.device}, seed: 7}}\n"
                f"parallel: {{stages: 1, replicas: 2, micro_batch: {micro}, schedule: varuna, "
                f"timeout_s: {args.timeout_s}}}\n"
                f"checkpoint: {{dir: \"{ckpt}\", commit: {'true' if commit else 'false'}}}\n")


def run(args, name, job, extra, env_extra=None):
    """Two ranks; returns (return codes, exit times, metrics rows, logs)."""
    port = free_port()
    logdir = os.path.join(args.out, "multi")
    os.makedirs(logdir, exist_ok=True)
    metrics = os.path.join(logdir, f"{name}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    procs, logs = [], []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   **(env_extra or {}))
        if args.device == "cpu":
            env.setdefault("OMP_NUM_THREADS", "1")
        log = open(os.path.join(logdir, f"{name}.rank{r}.log"), "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [args.worker, "--job", job, "--stage_to_rank_map", "0,1;", "--metrics_out", metrics,
             *extra], env=env, stdout=log, stderr=subprocess.STDOUT))
    ended = [None, None]
    deadline = time.time() + args.timeout_s + 120
    while any(e is None for e in ended) and time.time() < deadline:
        for r, p in enumerate(procs):
            if ended[r] is None and p.poll() is not None:
                ended[r] = time.time()
        time.sleep(0.01)
    for r, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
            p.wait()
            ended[r] = time.time()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    rows = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return [p.returncode for p in procs], ended, rows, outputs


def commit_modes(args, tmp, data, result):
    modes = result.setdefault("commit", {})
    for name, commit, extra in MODES:
        ckpt = os.path.join(tmp, f"ckpt_{name}")
        job = os.path.join(tmp, f"{name}.yaml")
        write_job(job, args, data, ckpt, commit)
        t0 = time.time()
        codes, _, rows, outs = run(args, name, job, extra)
        times = [r["step_time_s"] for r in rows if r.get("step", 0) > args.skip]
        entry = {"rc": codes, "seconds": round(time.time() - t0, 1)}
        if codes == [0, 0] and times:
            step_s = statistics.median(times)
            batch = SHAPES[args.model][4]
            entry.update(step_s=step_s, samples_per_s=batch / step_s, steps_timed=len(times),
                         last_loss=rows[-1]["loss"])
        else:
            entry["log_tail"] = outs[0][-1500:] + outs[1][-1500:]
        modes[name] = entry
        print(f"multi_check: commit {name}: rc {codes}, "
              f"step {entry.get('step_s', float('nan')):.4f} s", flush=True)
        write(args, result)
    off = modes.get("off", {}).get("step_s")
    for name in ("in_place", "relaunch"):
        s = modes.get(name, {}).get("step_s")
        if off and s:
            modes[name]["cost_vs_off"] = s / off - 1


def rescue(args, tmp, data, result):
    ckpt = os.path.join(tmp, "ckpt_rescue")
    job = os.path.join(tmp, "rescue.yaml")
    write_job(job, args, data, ckpt, True)
    codes, ended, rows, outs = run(args, "rescue", job, [],
                                   {"VARUNA_FAULT": f"forward@{args.kill_at}:1:kill"})
    entry = {"rc": codes, "kill_at": args.kill_at}
    m = re.search(r"rescued step (\d+)(?: and its layers with step (\d+)'s gradients)? "
                  r"\(committed (\d+)\) in ([0-9.]+) s",
                  outs[0])
    if m and codes[0] == 75 and None not in ended:
        entry.update(saved_step=int(m.group(1)), rescue_s=float(m.group(4)),
                     exit_after_kill_s=round(ended[0] - ended[1], 3),
                     saved=sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else [])
        if m.group(2):
            entry["pending_for"] = int(m.group(2))
    else:
        entry["log_tail"] = outs[0][-2500:]
    result["rescue"] = entry
    print(f"multi_check: rescue: rc {codes}, {entry.get('rescue_s', 'no')} s to save, "
          f"rank 0 out {entry.get('exit_after_kill_s', '?')} s after rank 1 died", flush=True)
    write(args, result)


def write(args, result):
    path = os.path.join(args.out, "multi.json")
    with open(path + ".part", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".part", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default=None, choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--kill_at", type=int, default=4)
    ap.add_argument("--timeout_s", type=int, default=120)
    ap.add_argument("--corpus_bytes", type=int, default=None)
    args = ap.parse_args()
    args.model = args.model or ("350m" if args.device == "cuda" else "tiny")
    if not os.access(args.worker, os.X_OK):
        sys.exit(f"multi_check: {args.worker} is not an executable worker")
    if args.kill_at < 2 or args.kill_at > args.steps:
        sys.exit(f"multi_check: --kill_at {args.kill_at} must be in [2, --steps]")
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="multi-check-")
    data = os.path.join(tmp, "corpus.txt")
    rnd = random.Random(7)
    size = args.corpus_bytes or (16_000_000 if args.device == "cuda" else 1_000_000)
    with open(data, "wb") as f:
        f.write(rnd.randbytes(size))
    layers, d, heads, seq, batch, micro = SHAPES[args.model]
    result = {"model": args.model, "layers": layers, "d_model": d, "seq_len": seq,
              "global_batch": batch, "micro_batch": micro, "device": args.device,
              "shape": "P=1 D=2, two ranks over gloo on one device", "steps": args.steps,
              "skip": args.skip, "rounds": 1}
    write(args, result)
    commit_modes(args, tmp, data, result)
    rescue(args, tmp, data, result)
    ok = (all(m.get("step_s") for m in result["commit"].values())
          and "rescue_s" in result["rescue"])
    result["ok"] = ok
    write(args, result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
