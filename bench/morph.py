"""Morph timing (docs/benchmarks.md "Morphing"): for each event kind, ROUNDS runs of a 2-stage
job on three 2-slot agents on loopback (the demo model size); each run waits until
training is under way, causes the event, and reads the morph record the manager keeps
(varunactl status -o json): time per phase, total (detection -> first step on the new
shape) and steps lost. Prints every round and the median per kind as a Markdown table.

Kinds: notice (varunactl preempt), sigkill (an agent and its workers SIGKILLed), join (a
fourth agent), freeze (an agent and its workers SIGSTOPped: no reset reaches the peers, as
with a cut link; detection is the heartbeat timeout).

Goodput (bench/morph.py [--paths P] goodput [SECONDS] [PERIOD] [PAIRS]): PAIRS pairs of
runs of the same job for SECONDS of wall time, one undisturbed and one with a preemption
notice every PERIOD seconds (the noticed machine goes away once its job moved off and a
replacement registers PERIOD/4 later, as a cloud would bring one), which of the two goes
first alternating pair by pair; goodput = steps trained with preemptions / without, per
pair. With several paths, each pair runs once per path.

Paths (--paths relaunch,in_place; default in_place): each kind runs once per path per round,
alternated; the in-place path is the manager's default (survivors keep their processes and
regroup: docs/morphing.md "Morph in place") with warm standby workers on every agent, and
records regroup, agree and transfer in place of most of rendezvous; the relaunch path runs
with `morph_in_place: false` and no standbys.

usage: bench/morph.py [--paths P,...] [ROUNDS] [KIND...]   (build/bin must hold the binaries)"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
os.environ.setdefault("VARUNA_BIN_DIR", os.path.join(HERE, "..", "build", "bin"))

from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.harness import job_yaml, write_text_corpus  # noqa: E402

PHASES = ["detect", "save", "stop", "coalesce", "plan", "launch", "rendezvous", "regroup", "agree",
          "transfer", "first_step", "total"]
# scale_up_delay_s 4 (the default is 10): a joining agent's warm standbys are ready by then
# (its free slots stay free 2 s, then LibTorch loads in about 1 s).
CONFIG = "scale_up_delay_s: 4\nmorph_coalesce_s: 0.2\n"


def demo_job(c):
    data = os.path.join(c.dir, "corpus.txt")
    write_text_corpus(data)
    return job_yaml(os.path.join(c.dir, "job.yaml"), data,
                    model={"layers": 4, "d_model": 64, "heads": 4, "seq_len": 32},
                    train={"steps": 100000, "global_batch": 24},
                    parallel={"stages": 2, "micro_batch": 2, "timeout_s": 60},
                    extra=f"checkpoint: {{dir: {os.path.join(c.dir, 'ckpt')}}}\n")


def one(kind, path="relaunch"):
    c = cluster(path)
    try:
        job_id = json.loads(c.ctl("-o", "json", "submit", demo_job(c), check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id)["step"] >= 10, 180, "training")
        if kind == "notice":
            c.ctl("preempt", "node2", "--in", "30s", check=0)
        elif kind == "sigkill":
            c.agents["node2"].send_signal(signal.SIGKILL)
        elif kind == "join":
            c.start_agent("node3", 2)
        elif kind == "freeze":
            r = subprocess.run(["pgrep", "-f", os.path.join(c.dir, "node2") + "/jobs/"],
                               capture_output=True, text=True)
            for p in [c.agents["node2"].pid] + [int(x) for x in r.stdout.split()]:
                os.kill(p, signal.SIGSTOP)
        st = wait_for(lambda: (lambda s: s["morphs"] and s)(c.status(job_id)), 180,
                      "the morph record")
        return st["morphs"][0]
    finally:
        if kind == "freeze":
            subprocess.run(["pkill", "-CONT", "-f", c.dir], check=False)
        c.close()


def cluster(path):
    config = CONFIG + f"morph_in_place: {'true' if path == 'in_place' else 'false'}\n"
    # The in-place path with its warm standbys (one per free slot); the relaunch path as
    # it was built, without them.
    standbys = {f"node{i}": ["--standby_workers=-1"] for i in range(4)} if path == "in_place" \
        else {}
    return Cluster(agents=3, slots=2, manager_config=config, agent_args=standbys)


def goodput_run(seconds, period, path):
    c = cluster(path)
    try:
        job_id = json.loads(c.ctl("-o", "json", "submit", demo_job(c), check=0).stdout)["id"]
        wait_for(lambda: c.status(job_id)["step"] >= 1, 180, "training")
        t0 = time.time()
        step0 = c.status(job_id)["step"]
        victims = ["node2", "node1"]
        n = 0
        while time.time() - t0 < seconds:
            if period and time.time() - t0 >= period * (n + 1):
                victim = victims[n % 2]
                gen = c.status(job_id)["generation"]
                c.ctl("preempt", victim, "--in", "30s", check=0)
                wait_for(lambda: c.status(job_id)["generation"] > gen, 120, "the move")
                c.agents[victim].send_signal(signal.SIGTERM)
                c.agents[victim].wait()
                time.sleep(period / 4)
                c.start_agent(victim, 2)  # the replacement machine
                n += 1
            time.sleep(0.5)
        st = c.status(job_id)
        morphs = st.get("morphs", [])
        return st["step"] - step0, len(morphs), sum(int(m["steps_lost"]) for m in morphs)
    finally:
        c.close()


def goodput(seconds, period, pairs, paths):
    rows = []
    for i in range(pairs):
        for path in paths:
            order = [0, period] if i % 2 == 0 else [period, 0]
            got = {p: goodput_run(seconds, p, path) for p in order}
            (base, _, _), (hit, morphs, lost) = got[0], got[period]
            rows.append((i + 1, path, "undisturbed first" if order[0] == 0 else "notices first",
                         base, hit, morphs, lost, hit / base))
            print(f"pair {i + 1} {path}: {rows[-1][2]}: {base} vs {hit} steps, {morphs} morphs, "
                  f"{lost} steps lost, goodput {hit / base:.4f}", flush=True)
    print(f"\n{seconds} s each, a notice every {period} s:\n")
    print("| pair | path | order | steps, no preemption | steps, notices | morphs | steps lost "
          "| goodput |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r[:7]) + f" | {r[7]:.4f} |")
    for path in paths:
        g = [r[7] for r in rows if r[1] == path]
        print(f"\n{path}: median goodput {statistics.median(g):.4f} over {len(g)} pairs")


def main():
    args = sys.argv[1:]
    paths = ["in_place"]
    if args and args[0].startswith("--paths"):
        value = args[0].split("=", 1)[1] if "=" in args[0] else args[1]
        args = args[1:] if "=" in args[0] else args[2:]
        paths = value.split(",")
    if args and args[0] == "goodput":
        seconds = int(args[1]) if len(args) > 1 else 360
        period = int(args[2]) if len(args) > 2 else 120
        pairs = int(args[3]) if len(args) > 3 else 3
        goodput(seconds, period, pairs, paths)
        return
    rounds = int(args[0]) if args else 5
    kinds = args[1:] or ["notice", "sigkill", "freeze", "join"]
    results = {(k, p): [] for k in kinds for p in paths}
    # Alternate kinds and paths round by round, so machine noise spreads over all of them.
    for r in range(rounds):
        for k in kinds:
            for path in paths:
                m = one(k, path)
                results[(k, path)].append(m)
                ph = m["phases"]
                print(f"round {r + 1} {k:8s} {path:8s} in_place={m.get('in_place', False)} "
                      f"lost={m['steps_lost']} " +
                      " ".join(f"{p}={ph.get(p, 0):.2f}" for p in PHASES), flush=True)
    print("\n| event | path | " + " | ".join(PHASES) + " | steps lost |")
    print("|---|---|" + "---|" * (len(PHASES) + 1))
    for k in kinds:
        for path in paths:
            rs = results[(k, path)]
            med = [statistics.median(m["phases"].get(p, 0) for m in rs) for p in PHASES]
            lost = max(int(m["steps_lost"]) for m in rs)
            print(f"| {k} | {path} | " + " | ".join(f"{v:.2f}" for v in med) +
                  f" | max {lost} |")


if __name__ == "__main__":
    main()
