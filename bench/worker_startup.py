#!/usr/bin/env python3
"""Start-up time and memory of varuna-worker builds, side by side (docs/benchmarks.md (n)).

For each build given (NAME=PATH to a varuna-worker), alternately over ROUNDS rounds:
  * standby: `varuna-worker --standby` (what an agent keeps warm per free slot) from exec to
    its "standby worker ready" line and the CPU seconds it was billed (/proc/PID/stat utime +
    stime); then, with a second standby up beside it (as on a 2-slot agent), its
    /proc/PID/smaps_rollup: resident, proportional, and private (what each one more costs);
  * first step: a 1-process job (the tiny GPT, 2 steps) from exec to its first metrics line,
    and the whole run's wall time.
Prints every round and the medians as a markdown table. Standard library only (and the tests' harness).

Usage: bench/worker_startup.py [--rounds 5] NAME=WORKER [NAME=WORKER ...]
"""

import argparse
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time

from common import harness, proc_cpu_s

def rollup(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                out[parts[0][:-1]] = int(parts[1]) / 1024.0  # MiB
    return {"rss": out["Rss"], "pss": out["Pss"],
            "private": out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)}


def standby(worker, tmp):
    """Two standbys, as an agent keeps one per free slot: the first's start-up, and its memory
    while the second shares LibTorch's file pages with it (private = what one more costs)."""
    first = start_standby(worker, tmp)
    second = start_standby(worker, tmp)
    time.sleep(0.5)  # let the listener threads settle before reading memory
    mem = rollup(first["proc"].pid)
    cpu = proc_cpu_s(first["proc"].pid)
    for s in (first, second):
        s["proc"].kill()
        s["proc"].wait()
        os.close(s["pipe"])
    return {"ready_s": first["ready_s"], "cpu_s": cpu, **mem}


def start_standby(worker, tmp):
    # As the agent starts one: a control pipe's read end inherited (VARUNA_CONTROL_FD) and a
    # directory for its start file.
    r, w = os.pipe()
    env = dict(os.environ, VARUNA_CONTROL_FD=str(r), VARUNA_STANDBY_DIR=tmp,
               GLOG_logtostderr="1")
    t0 = time.monotonic()
    p = subprocess.Popen([worker, "--standby"], env=env, stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, pass_fds=(r,))
    os.close(r)
    buf, ready = b"", None
    deadline = t0 + 120
    while time.monotonic() < deadline:
        r, _, _ = select.select([p.stderr], [], [], 1.0)
        if not r:
            if p.poll() is not None:
                break
            continue
        chunk = os.read(p.stderr.fileno(), 65536)
        if not chunk:
            break
        buf += chunk
        if b"standby worker ready" in buf:
            ready = time.monotonic() - t0
            break
    if ready is None:
        p.kill()
        p.wait()
        os.close(w)
        raise RuntimeError(f"{worker} --standby never got ready:\n{buf.decode(errors='replace')}")
    return {"proc": p, "pipe": w, "ready_s": ready}


def first_step(worker, tmp, corpus):
    job = os.path.join(tmp, "job.yaml")
    with open(job, "w") as f:
        f.write("name: startup\n"
                "model: {kind: gpt, layers: 2, d_model: 32, heads: 4, seq_len: 16, vocab: 256}\n"
                f"data: {{kind: text, path: {corpus}}}\n"
                "train: {global_batch: 4, steps: 2, optimizer: adamw, lr: 1e-3, seed: 1}\n"
                "parallel: {micro_batch: 2, timeout_s: 60}\n")
    metrics = os.path.join(tmp, f"m-{time.monotonic_ns()}.jsonl")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(harness.free_port()),
               RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    t0 = time.monotonic()
    p = subprocess.Popen([worker, "--job", job, "--stage_to_rank_map", "0;", "--metrics_out",
                          metrics], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = None
    while p.poll() is None and time.monotonic() - t0 < 120:
        if first is None and os.path.exists(metrics) and os.path.getsize(metrics) > 0:
            first = time.monotonic() - t0
        time.sleep(0.005)
    err = p.stderr.read().decode(errors="replace")
    if p.wait() != 0:
        raise RuntimeError(f"{worker}: the job failed:\n{err[-3000:]}")
    total = time.monotonic() - t0
    return {"first_step_s": first if first is not None else total, "run_s": total}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("builds", nargs="+", help="NAME=PATH to a varuna-worker")
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.builds]
    tmp = tempfile.mkdtemp(prefix="worker-startup-")
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("the pipeline stage of a model runs a gradient step. " * 2000)
    keys = ["ready_s", "cpu_s", "rss", "pss", "private", "first_step_s", "run_s"]
    rows = {name: [] for name, _ in builds}
    print("| round | build | standby ready (s) | standby CPU (s) | RSS (MiB) | PSS (MiB) | "
          "private (MiB) | first step (s) | 2-step run (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in range(1, args.rounds + 1):
        order = builds if r % 2 else list(reversed(builds))
        for name, worker in order:
            row = {**standby(worker, tmp), **first_step(worker, tmp, corpus)}
            rows[name].append(row)
            print(f"| {r} | {name} | " + " | ".join(
                f"{row[k]:.2f}" if k.endswith("_s") else f"{row[k]:.0f}" for k in keys) + " |",
                flush=True)
    for name, _ in builds:
        med = {k: statistics.median(x[k] for x in rows[name]) for k in keys}
        print(f"| median | {name} | " + " | ".join(
            f"{med[k]:.2f}" if k.endswith("_s") else f"{med[k]:.0f}" for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
