#!/usr/bin/env python3
"""Benchmark (r): surviving failures side by side with TorchFT.

The same GPT (bench (b)'s: 4 layers, d_model 128, seq_len 64; the same initial weights and
samples) trained with three data-parallel replicas, one process each, by:
  * TorchFT 0.2.0 as its train_ddp.py example sets it up (bench/torchft_gpt.py): a lighthouse,
    one replica group per `torchrun --nproc_per_node 1 --max-restarts N` (torchrun restarts a
    killed process, which rejoins and recovers the weights from a live peer), Manager,
    ProcessGroupGloo, PGTransport, torchft.DistributedDataParallel, torchft.Optimizer;
  * this system: varuna-manager and three varuna-agents of one slot each on loopback, the job
    at P=1 and D=3 (stages 1, replicas auto: the free slots), morphing in place (the default).
Global batch 24 (8 a replica). Both paced at --step_ms per step (VARUNA_STEP_MIN_MS; the
twin's --step_min_ms), so the three processes are not CPU-bound on two cores and a stall is
a stall, not contention.

Events, one every --period seconds (120) after --lead seconds (30), in this order, on replica 2
(node2) unless said: SIGKILL of its training process (its host stays: torchrun, the agent,
restart it); SIGSTOP of replica 1's process for --stop_s seconds (past the timeouts), then
SIGCONT; the whole of replica 2 leaving (torchrun / the agent and its workers SIGKILLed) and
coming back --rejoin_s later (a new torchrun / agent). The run ends --period after the last.

Measured from a timeline of committed steps (TorchFT: each replica's per-step log; this
system: the manager's job record polled every 0.1 s over HTTP), per event:
  stall    the longest gap between two committed steps from the last commit before the event
           to 100 s after it: the time the survivors did not step;
  full     time from the event (the rejoin: from the replica's return) to the first committed
           step at full width (3 replicas) after the width dropped;
  redone   steps trained twice (this system: the step counter going back) or computed and
           not committed (TorchFT);
and over the window from the first event to the end: goodput = samples in committed steps per
second (TorchFT counts the participants of each step: a missing replica's share is not
trained; this system keeps the global batch whatever the width), steps/s, and samples per
CPU-second of every process of the system (those the driver waits for, and their children;
a SIGKILLed torchrun's or agent's children are not billed).

Modes (--modes defaults,tuned): defaults = each system as documented (TorchFT: its README's
lighthouse flags, --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000, and
train_ddp.py's timeouts, ProcessGroupGloo 5 s and Manager 30 s, the lighthouse's heartbeat
timeout 5 s; this system: the manager's and agents' defaults, warm standbys included, the
job's timeout_s 300); tuned = detection tightened as each documents (TorchFT:
join_timeout_ms 1000, heartbeat_timeout_ms 2000, Manager timeout and quorum_timeout 10 s;
this system: heartbeat_period_s 1, suspect_after_missed 2, dead_after_missed 3,
scale_up_delay_s 2, the job's timeout_s 10). Rounds alternate the systems and modes.

Usage: scripts/python bench/torchft_vs_varuna.py [--rounds 3] [--modes defaults,tuned]
       [--systems torchft,varuna] [--period 120] [--events sigkill,sigstop,rejoin]
"""

import argparse
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("VARUNA_BIN_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "bin"))
from common import ROOT, corpus, proc_cpu_s, project_python  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.harness import free_port, job_yaml  # noqa: E402

MODEL = {"layers": 4, "d_model": 128, "heads": 4, "seq_len": 64}
BATCH, REPLICAS = 24, 3
TWIN = os.path.join(ROOT, "bench", "torchft_gpt.py")
FRESH_S = 5.0
# TorchFT as its README and train_ddp.py example run it (defaults), and tightened (tuned).
FT = {"defaults": {"lighthouse": ["--quorum_tick_ms", "100", "--join_timeout_ms", "10000"],
                   "twin": ["--pg_timeout_s", "5", "--timeout_s", "30"]},
      "tuned": {"lighthouse": ["--quorum_tick_ms", "100", "--join_timeout_ms", "1000",
                               "--heartbeat_timeout_ms", "2000"],
                "twin": ["--pg_timeout_s", "5", "--timeout_s", "10", "--quorum_timeout_s", "10"]}}
TUNED_VARUNA = ("heartbeat_period_s: 1\nsuspect_after_missed: 2\ndead_after_missed: 3\n"
                "scale_up_delay_s: 2\n")




def children_of(pid):
    r = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()]


class TorchFT:
    """A lighthouse and three replica groups (torchrun + one training process each)."""

    def __init__(self, args, data, tmp, tuned):
        self.args, self.data, self.tmp, self.tuned = args, data, tmp, tuned
        self.bin = os.path.dirname(args.python)
        self.port = free_port()
        self.metrics = os.path.join(tmp, "ft")
        lh = [os.path.join(self.bin, "torchft_lighthouse"), "--min_replicas", "1", "--bind",
              f"127.0.0.1:{self.port}"] + FT["tuned" if tuned else "defaults"]["lighthouse"]
        self.lighthouse = subprocess.Popen(lh, stdout=self.log("lighthouse"),
                                           stderr=subprocess.STDOUT)
        self.groups = {}
        for r in range(REPLICAS):
            self.start(r)

    def log(self, name):
        return open(os.path.join(self.tmp, f"{name}.log"), "a")

    def start(self, r):
        env = dict(os.environ, REPLICA_GROUP_ID=str(r), NUM_REPLICA_GROUPS=str(REPLICAS),
                   TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{self.port}", OMP_NUM_THREADS="1")
        cmd = [os.path.join(self.bin, "torchrun"), "--nnodes", "1", "--nproc_per_node", "1",
               "--max-restarts", "100", "--master_port", str(free_port()), TWIN,
               "--data", self.data, "--global_batch", str(BATCH), "--metrics_out", self.metrics,
               "--step_min_ms", str(self.args.step_ms)]
        for k, v in MODEL.items():
            cmd += [f"--{k}", str(v)]
        cmd += FT["tuned" if self.tuned else "defaults"]["twin"]
        self.groups[r] = subprocess.Popen(cmd, env=env, stdout=self.log(f"replica{r}"),
                                          stderr=subprocess.STDOUT, start_new_session=True)

    def trainer(self, r):
        kids = children_of(self.groups[r].pid)
        return kids[0] if kids else None

    def ready(self):
        return all(self.trainer(r) for r in range(REPLICAS)) and self.width_now() == REPLICAS

    def width_now(self):
        rows = self.timeline()
        return rows[-1][2] if rows else 0

    def kill(self, r):
        os.kill(self.trainer(r), signal.SIGKILL)

    def stop(self, r, on):
        os.kill(self.trainer(r), signal.SIGSTOP if on else signal.SIGCONT)

    def leave(self, r):
        # torchrun starts its worker in a session of its own: both go.
        trainer = self.trainer(r)
        os.killpg(self.groups[r].pid, signal.SIGKILL)
        if trainer:
            try:
                os.kill(trainer, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.groups[r].wait()

    def records(self):
        """Every replica's step reports, [(t, replica, step, participants, committed)]."""
        recs = []
        for r in range(REPLICAS):
            try:
                with open(f"{self.metrics}.{r}") as f:
                    for line in f:
                        try:
                            x = json.loads(line)
                        except ValueError:
                            continue  # a line cut by a SIGKILL
                        recs.append((x["t"], r, x["step"], x["participants"], x["committed"]))
            except FileNotFoundError:
                pass
        return sorted(recs)

    def timeline(self):
        """[(t, step, width)]: the job's progress, the highest step any replica reported
        committed in the last FRESH_S seconds. A restarted replica that commits steps alone
        before it joins (min_replicas 1) does not move it; the counter goes back only when
        every live replica is on a lower step (all restarted: the state is gone)."""
        latest, rows = {}, []
        self.wasted = 0
        for t, r, step, width, committed in self.records():
            if not committed:
                continue
            latest[r] = (t, step, width)
            fresh = [v for v in latest.values() if t - v[0] <= FRESH_S]
            head = max(fresh, key=lambda v: v[1])
            self.wasted += step < head[1]
            if not rows or rows[-1][1] != head[1]:
                rows.append((t, head[1], head[2]))
            elif head[2] > rows[-1][2]:
                rows[-1] = (rows[-1][0], head[1], head[2])
        return rows

    def uncommitted(self, t0, t1):
        """Steps computed and not applied: reports not committed, and steps committed by a
        replica off the job's progress (alone, before it joined)."""
        n = sum(1 for t, _, _, _, c in self.records() if not c and t0 <= t <= t1)
        return n + getattr(self, "wasted", 0)

    def step_samples(self, width):
        return width * BATCH // REPLICAS

    def close(self):
        for r, p in self.groups.items():
            if p.poll() is None:
                trainer = self.trainer(r)
                os.killpg(p.pid, signal.SIGTERM)
                if trainer:
                    try:
                        os.kill(trainer, signal.SIGCONT)
                        os.kill(trainer, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
        for p in list(self.groups.values()) + [self.lighthouse]:
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Varuna:
    """varuna-manager and three one-slot agents; the job at P=1, D=3. Its timeline comes from
    the job's TensorBoard files (observability.tensorboard_dir): each step's loss with the
    wall time it was written, and each generation's shape."""

    def __init__(self, args, data, tmp, tuned):
        config = TUNED_VARUNA if tuned else ""
        self.c = Cluster(agents=REPLICAS, slots=1, manager_config=config, defaults=True)
        self.tb = os.path.join(tmp, "tb")
        # Morphing needs a checkpoint directory (without one a failed worker fails the job);
        # no periodic checkpoints: an in-place morph takes the state from the live replicas.
        extra = (f"env: {{VARUNA_STEP_MIN_MS: '{args.step_ms}'}}\n"
                 f"checkpoint: {{dir: {os.path.join(self.c.dir, 'ckpt')}}}\n"
                 f"observability: {{tensorboard_dir: {self.tb}}}\n")
        job = job_yaml(os.path.join(self.c.dir, "job.yaml"), data, model=MODEL,
                       train={"global_batch": BATCH, "steps": 1000000},
                       # replicas auto: as many as the free slots (3), fewer when a node is
                       # gone. Micro-batches of 4: 8 samples a replica at D=3, 12 at D=2 (8
                       # would leave D=2 no shape: 12 is not a multiple of 8).
                       parallel={"stages": 1, "replicas": "auto", "micro_batch": 4,
                                 "schedule": "1f1b", "timeout_s": 10 if tuned else 300},
                       extra=extra)
        self.job = json.loads(self.c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]

    def worker(self, r):
        """The job's worker on node r: a process started for it (`--job` under the node's job
        directory) or a warm standby that took it (started as `--standby`, it moves into the
        generation's directory when it takes a job)."""
        jobs = f"{self.c.dir}/node{r}/jobs/"
        real = os.path.join(os.path.realpath(self.c.dir), f"node{r}", "jobs") + "/"
        for pid in subprocess.run(["pgrep", "-f", "varuna-worker"], capture_output=True,
                                  text=True).stdout.split():
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if f"--job\0{jobs}" in cmd or cwd.startswith(real):
                return int(pid)
        return None

    def ready(self):
        rows = self.timeline()
        return len(rows) > 3 and rows[-1][2] == REPLICAS

    def pid(self, r):
        pid = self.worker(r)
        if pid is None:
            raise RuntimeError(f"node{r} runs no worker of job {self.job}: "
                               f"{self.c.ctl('status', self.job).stdout}\n{self.c.tail()}")
        return pid

    def kill(self, r):
        os.kill(self.pid(r), signal.SIGKILL)

    def stop(self, r, on):
        os.kill(self.pid(r), signal.SIGSTOP if on else signal.SIGCONT)

    def leave(self, r):
        pid = self.worker(r)
        self.c.agents[f"node{r}"].send_signal(signal.SIGKILL)
        self.c.agents[f"node{r}"].wait()
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def start(self, r):
        self.c.start_agent(f"node{r}", 1)

    def timeline(self):
        """[(t, step, width)] in the order the steps were written; a step redone after a
        morph appears again (the counter goes back)."""
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        steps, gens = [], []
        for path in glob.glob(os.path.join(self.tb, "*tfevents*")):
            for e in EventFileLoader(path).Load():
                for v in e.summary.value:
                    if v.tag == "train/loss":
                        steps.append((e.wall_time, e.step))
                    elif v.tag == "generation":
                        m = re.search(r"\((\d+) ranks", v.tensor.string_val[0].decode())
                        gens.append((e.wall_time, int(m.group(1)) if m else 0))
        gens.sort()
        rows = []
        for t, step in sorted(steps):
            width = [w for tg, w in gens if tg <= t + 0.1]  # written with its first step
            rows.append((t, step, width[-1] if width else 0))
        return rows

    def uncommitted(self, t0, t1):
        return 0  # a step is either committed by every replica or redone after a morph

    def step_samples(self, width):
        return BATCH  # the global batch, whatever the width

    def close(self):
        self.c.close()


def retained(sys_, rows, t):
    """By time t: the samples of the committed steps still part of the model (a step counter
    that goes back to s drops the steps from s on), the steps dropped, the steps trained.
    A poll that saw the counter jump by k counts k steps of that width."""
    stack, dropped, trained = [], 0, 0
    for tt, step, width in rows:
        if tt > t:
            break
        while stack and stack[-1][0] >= step:
            stack.pop()
            dropped += 1
        first = stack[-1][0] + 1 if stack else step
        for s in range(first, step + 1):
            stack.append((s, sys_.step_samples(width)))
            trained += 1
    return sum(x for _, x in stack), dropped, trained


def measure(sys_, rows, events, t_end):
    out = []
    for i, (kind, te, t_back) in enumerate(events):
        until = events[i + 1][1] if i + 1 < len(events) else t_end
        before = [t for t, _, _ in rows if t <= te]
        after = [t for t, _, _ in rows if te < t <= until]
        ts = before[-1:] + after
        gaps = [(b - a, b) for a, b in zip(ts, ts[1:])]
        stall, resumed = max(gaps, default=(float("nan"), te))
        ref = t_back or te
        narrow = [t for t, _, w in rows if te < t <= until and w < REPLICAS]
        # A job that never ran narrower (a warm standby took the lost rank) is back at full
        # width with its first step after the stall, not with a step in flight at the event.
        start = narrow[0] if narrow else (resumed - 1e-6 if t_back is None else ref)
        full = next((t - ref for t, _, w in rows if start < t <= until and w == REPLICAS),
                    None)
        out.append({"kind": kind, "stall": stall, "full": full})
    return out


def one_run(args, system, mode, data):
    tmp = tempfile.mkdtemp(prefix=f"varuna-ft-{system}-")
    cpu0 = proc_cpu_s(children=True)
    make = TorchFT if system == "torchft" else Varuna
    s = make(args, data, tmp, mode == "tuned")
    events = []
    try:
        wait_for(s.ready, 300, f"{system} at full width")
        time.sleep(args.lead)
        t_start = time.time()
        for i, kind in enumerate(args.events.split(",")):
            te = t_start + i * args.period
            time.sleep(max(0, te - time.time()))
            te = time.time()
            back = None
            if kind == "sigkill":
                s.kill(2)
            elif kind == "sigstop":
                s.stop(1, True)
                time.sleep(args.stop_s)
                s.stop(1, False)
            elif kind == "rejoin":
                s.leave(2)
                time.sleep(args.rejoin_s)
                back = time.time()
                s.start(2)
            events.append((kind, te, back))
            print(f"  {system} {mode}: {kind} at +{te - t_start:.0f} s", flush=True)
        t_end = t_start + len(events) * args.period
        time.sleep(max(0, t_end - time.time()))
        rows = s.timeline()
        (kept0, drop0, n0), (kept1, drop1, n1) = (retained(s, rows, t_start),
                                                  retained(s, rows, t_end))
        window = t_end - t_start
        result = {"events": measure(s, rows, events, t_end), "goodput": (kept1 - kept0) / window,
                  "steps_s": (n1 - n0) / window,
                  "redone": drop1 - drop0 + s.uncommitted(t_start, t_end)}
    finally:
        s.close()
        if os.environ.get("VARUNA_KEEP_TMP"):
            with open(os.path.join(tmp, "run.json"), "w") as f:
                json.dump({"events": events, "timeline": s.timeline()}, f)
            print(f"  kept {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result["per_cpu_s"] = result["goodput"] * (t_end - t_start) / max(
        1e-9, proc_cpu_s(children=True) - cpu0)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="defaults,tuned")
    ap.add_argument("--systems", default="torchft,varuna")
    ap.add_argument("--events", default="sigkill,sigstop,rejoin")
    ap.add_argument("--period", type=float, default=120)
    ap.add_argument("--lead", type=float, default=30)
    ap.add_argument("--stop_s", type=float, default=75)
    ap.add_argument("--rejoin_s", type=float, default=20)
    ap.add_argument("--step_ms", type=int, default=250)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = ap.parse_args()
    args.python = project_python()
    data = corpus(args.build)
    runs = [(s, m) for m in args.modes.split(",") for s in args.systems.split(",")]
    results = {}
    for rnd in range(args.rounds):
        k = rnd % len(runs)
        for system, mode in runs[k:] + runs[:k]:
            r = one_run(args, system, mode, data)
            results.setdefault((system, mode), []).append(r)
            ev = "; ".join(f"{e['kind']} stall {fmt(e['stall'])} s, full width {fmt(e['full'])} s"
                           for e in r["events"])
            print(f"round {rnd + 1}: {system} {mode}: goodput {r['goodput']:.1f} samples/s, "
                  f"{r['steps_s']:.2f} steps/s, redone {r['redone']}, "
                  f"{r['per_cpu_s']:.1f} samples/CPU-s; {ev}", flush=True)
    report(results)


def fmt(x):
    return "-" if x is None or x != x else f"{x:.1f}"


def report(results):
    print("\n| system | mode | round | event | stall s | to full width s | goodput samples/s | "
          "steps/s | redone | samples/CPU-s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (system, mode), rs in results.items():
        for i, r in enumerate(rs):
            for j, e in enumerate(r["events"]):
                tail = (f"{r['goodput']:.1f} | {r['steps_s']:.2f} | {r['redone']} | "
                        f"{r['per_cpu_s']:.1f}") if j == 0 else " | | |"
                print(f"| {system} | {mode} | {i + 1} | {e['kind']} | {fmt(e['stall'])} | "
                      f"{fmt(e['full'])} | {tail} |")
    print("\nmedians over rounds, varuna / torchft:")
    for mode in sorted({m for _, m in results}):
        ft, vr = results.get(("torchft", mode)), results.get(("varuna", mode))
        if not ft or not vr:
            continue
        for j, e in enumerate(ft[0]["events"]):
            for key in ("stall", "full"):
                a = [r["events"][j][key] for r in vr if r["events"][j][key] is not None]
                b = [r["events"][j][key] for r in ft if r["events"][j][key] is not None]
                if a and b:
                    print(f"  {mode} {e['kind']} {key}: varuna {statistics.median(a):.1f} s, "
                          f"torchft {statistics.median(b):.1f} s, ratio "
                          f"{statistics.median(a) / statistics.median(b):.2f}")
        g = statistics.median(r["goodput"] for r in vr) / statistics.median(
            r["goodput"] for r in ft)
        print(f"  {mode} goodput ratio {g:.2f}")


if __name__ == "__main__":
    main()
