#!/usr/bin/env python3
"""Benchmark (q): pipeline schedules side by side with PyTorch's torch.distributed.pipelining.

The same GPT (bench/ddp_gpt.py's twin of worker/models/gpt.cc: identical initial weights and
samples, checked by the first step's loss) cut into P stages, the same micro-batch count m and
size, trained by varuna-worker's schedules (gpipe, 1f1b, zb-h1, varuna) and by
bench/pipelining_gpt.py with pipelining's (ScheduleGPipe, Schedule1F1B,
ScheduleInterleavedZeroBubble with one stage per rank, ScheduleZBVZeroBubble with two stages
per rank and the same blocks per rank, ScheduleInterleaved1F1B likewise).

Bench (c)'s protocol: one process per rank, one compute thread each; P=2 on the 2 cores, P=4
with every rank in its own cgroup capped at half a core (10 ms period), so a stage computes at
its own rate whether its peers are busy or idle, as on its own device. Rounds alternate every
system and schedule (the order rotates each round); every round is printed.

Per run: the median step time over the steps after warm-up (wall clock, the last rank's) and
the median measured bubble, 1 - sum(busy) / (P * max(pipeline_s)) with busy = pipeline_s -
recv_wait_s per rank (time in the schedule not waiting on a receive), the same definition for
both systems; and samples per CPU-second of the measured steps: the ranks' CPU seconds
(/proc/PID/stat, sampled every 20 ms) from the end of the last warm-up step to the end of the
run (each system's metrics carry the wall time of every step's end), beside the whole run's
(start-up included: Python's imports weigh there).

Usage: bench/pipelining_vs_varuna.py [--build build] [--rounds 5] [--steps 10] [--warmup 4]
       [--stages 2,4] [--micro_batches 8] [--ours gpipe,1f1b,zb-h1,varuna]
       [--theirs gpipe,1f1b,zb,zbv,i1f1b]
"""

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

from common import ROOT, corpus, harness, proc_cpu_s, project_python, read_metrics
from hetero import capped_launcher

MODEL = {"layers": 8, "d_model": 128, "heads": 4, "seq_len": 64}
BATCH = 32
TWIN = os.path.join(ROOT, "bench", "pipelining_gpt.py")




def bubble_and_time(rows, warmup, steps):
    """rows[r] = rank r's metric lines; medians over the steps after warm-up."""
    P = len(rows)
    bubbles, times = [], []
    for s in range(warmup, steps):
        pipe = [rows[r][s]["pipeline_s"] for r in range(P)]
        busy = [rows[r][s]["pipeline_s"] - rows[r][s]["recv_wait_s"] for r in range(P)]
        bubbles.append(1 - sum(busy) / (P * max(pipe)))
        times.append(max(rows[r][s]["step_time_s"] for r in range(P)))
    return statistics.median(bubbles), statistics.median(times)


class CpuSampler:
    """The ranks' CPU seconds (/proc/PID/stat), sampled every 20 ms with the wall time, so the
    CPU of the measured steps can be told from start-up's."""

    def __init__(self, procs):
        self.procs, self.samples = procs, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        last = [0.0] * len(self.procs)
        while not self.done.is_set():
            for i, p in enumerate(self.procs):
                try:
                    last[i] = proc_cpu_s(p.pid)
                except (OSError, IndexError):
                    pass  # exited (or a zombie): its last sample stands
            self.samples.append((time.time(), sum(last)))
            time.sleep(0.02)

    def at(self, t):
        """CPU seconds of all ranks at wall time t (the last sample before it)."""
        before = [c for tt, c in self.samples if tt <= t]
        return before[-1] if before else 0.0

    def stop(self):
        self.done.set()
        self.thread.join()


def run_ranks(P, flags, cmd, env):
    t0 = time.time()
    procs, logs, metrics = harness.start_workers(P, flags, env, cmd)
    cpu = CpuSampler(procs)
    try:
        res = harness.wait_workers(procs, logs, metrics, 900, t0)
    finally:
        cpu.stop()
    return res, cpu


def run(args, tmp, data, system, schedule, P, m, launcher):
    cpu0 = proc_cpu_s(children=True)
    t0 = time.time()
    env = {"OMP_NUM_THREADS": "1"}
    if system == "varuna":
        job = harness.job_yaml(os.path.join(tmp, "job.yaml"), data, model=MODEL,
                               train={"global_batch": BATCH, "steps": args.steps},
                               parallel={"micro_batch": BATCH // m, "schedule": schedule,
                                         "timeout_s": 300})
        res, cpu = run_ranks(P, ["--job", job, "--stage_to_rank_map", harness.stage_map(P, 1),
                                 "--metrics_all_ranks"],
                             launcher + [os.path.join(args.build, "bin", "varuna-worker")], env)
        assert res.ok, res.outputs[-1][-3000:]
        # The last stage writes the main file; the other ranks write .rank<R>.
        rows = [read_metrics(f"{res.metrics_path}.rank{r}") for r in range(P - 1)]
        rows.append(res.metrics)
    else:
        flags = [TWIN, "--data", data, "--schedule", schedule, "--micro_batches", str(m),
                 "--global_batch", str(BATCH), "--steps", str(args.steps)]
        for k, v in MODEL.items():
            flags += [f"--{k}", str(v)]
        res, cpu = run_ranks(P, flags, launcher + [args.python], env)
        assert res.ok, res.outputs[-1][-3000:]
        rows = [read_metrics(f"{res.metrics_path}.rank{r}") for r in range(P)]
    wall = time.time() - t0
    run_cpu = proc_cpu_s(children=True) - cpu0
    bubble, step = bubble_and_time(rows, args.warmup, args.steps)
    # The measured steps' CPU: from the end of the last warm-up step to the end of the run.
    steady = cpu.at(rows[-1][-1]["at"]) - cpu.at(rows[-1][args.warmup - 1]["at"])
    return {"bubble": bubble, "step_s": step, "loss1": rows[-1][0]["loss"],
            "per_cpu_s": BATCH * (args.steps - args.warmup) / max(steady, 1e-9),
            "run_per_cpu_s": BATCH * args.steps / run_cpu, "wall_s": wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--stages", default="2,4")
    ap.add_argument("--micro_batches", default="8")
    ap.add_argument("--ours", default="gpipe,1f1b,zb-h1,varuna")
    ap.add_argument("--theirs", default="gpipe,1f1b,zb,zbv,i1f1b")
    args = ap.parse_args()
    args.python = project_python()
    if args.steps <= args.warmup:
        sys.exit(f"--steps {args.steps} leaves nothing after --warmup {args.warmup}")
    tmp = tempfile.mkdtemp(prefix="varuna-pp-")
    data = corpus(args.build)
    entries = [("varuna", s) for s in args.ours.split(",") if s] + \
        [("pipelining", s) for s in args.theirs.split(",") if s]
    print(f"GPT {MODEL}, global batch {BATCH}, {args.steps} steps (first {args.warmup} "
          f"skipped), one thread per rank; P=4 ranks capped at 0.5 core; {args.rounds} rounds",
          flush=True)
    results = {}
    for P in [int(p) for p in args.stages.split(",")]:
        launcher = capped_launcher(tmp, 0.5, 10000) if P > 2 else []
        for m in [int(x) for x in args.micro_batches.split(",")]:
            for rnd in range(args.rounds):
                k = rnd % len(entries)
                for system, schedule in entries[k:] + entries[:k]:
                    r = run(args, tmp, data, system, schedule, P, m, launcher)
                    results.setdefault((P, m, system, schedule), []).append(r)
                    print(f"round {rnd + 1}: P={P} m={m} {system} {schedule}: step "
                          f"{r['step_s']:.3f} s, bubble {r['bubble']:.3f}, "
                          f"{r['per_cpu_s']:.2f} samples/CPU-s, loss@1 {r['loss1']:.6f}, "
                          f"run {r['wall_s']:.1f} s", flush=True)
    report(args, results)


def report(args, results):
    med = statistics.median
    print("\n| P | m | system | schedule | step s, each round | step s (median) | bubble, each "
          "round | bubble (median) | samples/CPU-s, measured steps (median) | samples/CPU-s, whole "
          "run (median) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    def each(rs, key):
        return ", ".join(f"{r[key]:.3f}" for r in rs)

    for (P, m, system, schedule), rs in results.items():
        print(f"| {P} | {m} | {system} | {schedule} | {each(rs, 'step_s')} | "
              f"{med(r['step_s'] for r in rs):.3f} | {each(rs, 'bubble')} | "
              f"{med(r['bubble'] for r in rs):.3f} | {med(r['per_cpu_s'] for r in rs):.2f} | "
              f"{med(r['run_per_cpu_s'] for r in rs):.2f} |")
    # Per round: this system's best schedule over pipelining's best, wall clock and per CPU-s.
    print("\n| P | m | round | varuna best (s) | pipelining best (s) | varuna / pipelining step "
          "time | samples/CPU-s ratio |")
    print("|---|---|---|---|---|---|---|")
    for P, m in sorted({(k[0], k[1]) for k in results}):
        ours = {k[3]: v for k, v in results.items() if k[:3] == (P, m, "varuna")}
        theirs = {k[3]: v for k, v in results.items() if k[:3] == (P, m, "pipelining")}
        if not ours or not theirs:
            continue
        ratios = []
        for i in range(args.rounds):
            o = min(ours.items(), key=lambda kv: kv[1][i]["step_s"])
            t = min(theirs.items(), key=lambda kv: kv[1][i]["step_s"])
            ratio = o[1][i]["step_s"] / t[1][i]["step_s"]
            ratios.append(ratio)
            print(f"| {P} | {m} | {i + 1} | {o[1][i]['step_s']:.3f} ({o[0]}) | "
                  f"{t[1][i]['step_s']:.3f} ({t[0]}) | {ratio:.3f} | "
                  f"{o[1][i]['per_cpu_s'] / t[1][i]['per_cpu_s']:.3f} |")
        print(f"| {P} | {m} | median | | | **{med(ratios):.3f}** | |")
    losses = {k: v[0]["loss1"] for k, v in results.items()}
    spread = max(losses.values()) - min(losses.values())
    print(f"\nfirst-step loss, all runs: {min(losses.values()):.6f} .. "
          f"{max(losses.values()):.6f} (spread {spread:.2e})")


if __name__ == "__main__":
    main()
