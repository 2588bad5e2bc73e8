"""Stragglers (docs/benchmarks.md (k)): one node of three slowed to 1/2, 1/4 and 1/10 of its
speed; the job's samples/s with `stragglers: {policy: off}` and `{policy: auto}`, and with the
best plan that knows the speeds up front, 5 rounds with the three alternating (the order
rotates each round). Every round is printed, with samples per CPU-second beside the
wall-clock rate, and the time from the slowdown to the ladder's action.

Nodes are emulated as in tests/e2e/straggler_e2e.py (tests/e2e/lib/cgroups.py): three agents
with one slot each, each in its own cgroup capped at --share of a core (0.5: three fit on a 2-core machine without
contention), the job 1 stage x 3 replicas. `off` and `auto` run under the manager: training
starts at full speed, after step --slow_after the bench cuts node2's cap to share x factor.
Their rate counts every step after the slowdown, detection and morph included, from the
workers' step records (`at`, the time each step ended): samples / (end of the last step -
the slowdown). `known` runs the plan the planner picks with the speeds given
(`varunactl plan --nodes 1,1,1 --speeds 1,1,F`, or the best plan on the two fast nodes when
its predicted step is shorter: the ladder's two rungs) as varuna-worker ranks capped the
same way, slow from the start; its rate counts the steps after --slow_after. CPU time is the
kernel's child accounting (user + system) of everything the run started (manager, agents,
workers). The machine must be otherwise idle (the caps assume free cores).

`off` runs --off_steps steps (its rate does not change after the slowdown), `auto` and
`known` --steps. With --modes ...,drained: node2 is drained before the submit, so the manager
runs the eviction known up front (the same plan as `known` when that is the eviction, with
the manager's and agents' overhead).

usage: bench/stragglers.py [--rounds 5] [--factors 0.5,0.25,0.1] [--steps 300]
                           [--off_steps 80] [--slow_after 5] [--share 0.5]
"""

import argparse
import glob
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
os.environ.setdefault("VARUNA_BIN_DIR", os.path.join(HERE, "..", "build", "bin"))

from lib import harness  # noqa: E402
from lib import cgroups as se  # noqa: E402
from lib.cluster import CTL, wait_for  # noqa: E402

MODEL = {"layers": 4, "d_model": 64, "heads": 4, "seq_len": 32}
BATCH = 12
PERIOD_US = 20000  # the CFS period: 1/10 of half a core is its 1 ms minimum quota


def job(dirname, data, steps, policy):
    extra = f"checkpoint: {{dir: {os.path.join(dirname, 'ckpt')}}}\n"
    if policy:
        extra += f"stragglers: {{policy: {policy}}}\n"
    return harness.job_yaml(os.path.join(dirname, "job.yaml"), data, model=MODEL,
                            train={"steps": steps, "global_batch": BATCH},
                            parallel={"stages": 1, "replicas": "auto", "micro_batch": 1,
                                      "timeout_s": 120},
                            extra=extra)


def cpu_now():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def step_ends(root):
    """Step -> the earliest time any rank reported it ended, from the agents' progress files."""
    ends = {}
    for path in glob.glob(os.path.join(root, "node*", "jobs", "*", "gen*", "progress.rank*")):
        with open(path) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                s = e.get("step")
                if isinstance(s, dict) and "at" in s:
                    k = int(s["step"])
                    ends[k] = min(ends.get(k, float("inf")), float(s["at"]))
    return ends


def run_managed(policy, factor, args, cgroot):
    steps = args.off_steps if policy == "off" else args.steps
    cpu0 = cpu_now()
    root = os.path.join(cgroot, f"{policy}-{os.getpid()}-{time.time_ns()}")
    os.makedirs(root)
    config = "scale_up_delay_s: 2\nmorph_coalesce_s: 0.3\n"
    if policy == "relaunch":  # auto, its morph on the relaunch path instead of in place
        config += "morph_in_place: false\n"
    c = se.CappedCluster(root, period_us=PERIOD_US, agents=3, slots=1, manager_config=config,
                         agent_args={f"node{i}": ["--startup_probe_ms=500"] for i in range(3)})
    try:
        data = os.path.join(c.dir, "corpus.txt")
        harness.write_text_corpus(data)
        if policy == "drained":  # the eviction known up front, run by the manager
            c.ctl("drain", "node2", check=0)
        job_id = json.loads(c.ctl("-o", "json", "submit",
                                  job(c.dir, data, steps, {"drained": "off", "relaunch": "auto"}
                                      .get(policy, policy)),
                                  check=0).stdout)["id"]
        wait_for(lambda: max(step_ends(c.dir), default=0) >= args.slow_after, 300, "training")
        t_slow = time.time()
        se.set_share(os.path.join(root, "node2"), args.share * factor, PERIOD_US)
        final = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")
                                  and s)(c.status(job_id)), 1800, "the job to finish")
        assert final["state"] == "SUCCEEDED", final
        events = [json.loads(line) for line in
                  c.ctl("-o", "json", "events", job_id, check=0).stdout.splitlines() if line]
        ends = step_ends(c.dir)
    finally:
        c.close()
        se.remove_cgroup_tree(root)
    after = [s for s, t in ends.items() if t > t_slow]
    rate = len(after) * BATCH / (max(ends.values()) - t_slow)
    cpu = cpu_now() - cpu0
    action = ""
    for e in events:
        if e.get("kind") == "straggler_action":
            at = time.mktime(time.strptime(e["at"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
            action = f"{at - t_slow:.1f} s: {'evict' if 'evict' in e['message'] else 'rebalance'}"
            break
    # auto after its action: the steady state it reached (the action's cost excluded).
    if action and policy in ("auto", "relaunch"):
        acted = t_slow + float(action.split(" s:")[0])
        later = sorted(t for t in ends.values() if t > acted + 3)
        if len(later) > 10:
            action += f"; after it {(len(later) - 1) * BATCH / (later[-1] - later[0]):.1f}/s"
    return rate, steps * BATCH / cpu, action


def run_known(factor, args, cgroot):
    """The best plan knowing node2 is slow, as varuna-worker ranks capped like the nodes."""
    tmp = tempfile.mkdtemp(prefix="varuna-bench-")
    data = os.path.join(tmp, "corpus.txt")
    harness.write_text_corpus(data)
    path = job(tmp, data, args.steps, None)

    def plan(nodes, speeds):
        out = subprocess.run([CTL, "plan", path, "--nodes", nodes, "--speeds", speeds, "-o",
                              "json"], check=True, capture_output=True, text=True).stdout
        return json.loads(out)["plans"][0]
    slow = plan("1,1,1", f"1,1,{factor}")
    fast = plan("1,1", "1,1")
    best, speeds = (slow, [1, 1, factor]) if slow["step_s"] <= fast["step_s"] else (fast, [1, 1])
    root = os.path.join(cgroot, f"known-{os.getpid()}-{time.time_ns()}")
    os.makedirs(root)
    wrapper = os.path.join(tmp, "capped.sh")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\ncg=%s/r$RANK\nmkdir -p $cg\necho %d > $cg/cpu.cfs_period_us\n"
                "echo $(cat %s/quota.$RANK) > $cg/cpu.cfs_quota_us\necho $$ > $cg/tasks\n"
                'exec "$@"\n' % (root, PERIOD_US, tmp))
    os.chmod(wrapper, 0o755)
    for r, s in enumerate(speeds):
        with open(os.path.join(tmp, f"quota.{r}"), "w") as f:
            f.write(str(int(args.share * s * PERIOD_US)))
    world = len(speeds)
    wargs = ["--job", path, "--chunk_size", "1"]
    if best.get("topology"):
        wargs += ["--pipelines", best["topology"]]
    else:
        wargs += ["--stage_to_rank_map", harness.stage_map(1, world)]
    cpu0 = cpu_now()
    try:
        res = harness.run_workers(world, wargs, cmd=[wrapper, harness.WORKER], timeout=1800)
    finally:
        se.remove_cgroup_tree(root)
    assert res.ok, res.outputs[0][-2000:]
    cpu = cpu_now() - cpu0
    at = {int(m["step"]): float(m["at"]) for m in res.metrics}
    k = args.slow_after
    rate = (args.steps - k) * BATCH / (at[args.steps] - at[k])
    shape = best.get("topology") or f"{best['stages']}x{best['replicas']}"
    return rate, args.steps * BATCH / cpu, f"plan {shape} on {world} slots"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--factors", default="0.5,0.25,0.1")
    ap.add_argument("--steps", type=int, default=300)
    # off runs at one rate from the slowdown on (nothing changes), so fewer steps measure it.
    ap.add_argument("--off_steps", type=int, default=80)
    ap.add_argument("--slow_after", type=int, default=5)
    ap.add_argument("--share", type=float, default=0.5)
    ap.add_argument("--modes", default="off,auto,known",
                    help="also: drained (node2 drained before the submit: the eviction known up "
                         "front, under the manager), relaunch (auto with morph_in_place: false)")
    args = ap.parse_args()
    if not se.cgroup_available():
        sys.exit(f"no write access to {se.CGROUP_ROOT}: the nodes cannot be capped")
    cgroot = os.path.join(se.CGROUP_ROOT, f"varuna-bench-{os.getpid()}")
    os.makedirs(cgroot, exist_ok=True)
    modes = args.modes.split(",")
    results = {}
    print(f"model {MODEL}, global batch {BATCH}, {args.steps} steps, 3 nodes x 1 slot at "
          f"{args.share} core each; node2 slowed after step {args.slow_after}", flush=True)
    print("| factor | round | mode | samples/s | samples/CPU-s | action |")
    print("|---|---|---|---|---|---|", flush=True)
    try:
        for factor in [float(x) for x in args.factors.split(",")]:
            for rnd in range(args.rounds):
                order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
                for mode in order:
                    if mode == "known":
                        rate, per_cpu, note = run_known(factor, args, cgroot)
                    else:
                        rate, per_cpu, note = run_managed(mode, factor, args, cgroot)
                    results.setdefault((factor, mode), []).append((rate, per_cpu))
                    print(f"| 1/{1 / factor:.0f} | {rnd + 1} | {mode} | {rate:.1f} | "
                          f"{per_cpu:.2f} | {note} |", flush=True)
    finally:
        se.remove_cgroup_tree(cgroot)
    print("\n| factor | " + " | ".join(f"{m} samples/s" for m in modes) +
          " | auto / known | auto / off | auto / known per CPU-s |")
    print("|---|" + "---|" * (len(modes) + 3))
    for factor in [float(x) for x in args.factors.split(",")]:
        med = {m: statistics.median(r for r, _ in results[(factor, m)]) for m in modes}
        cpu = {m: statistics.median(c for _, c in results[(factor, m)]) for m in modes}
        ratio = lambda a, b, d: f"{d[a] / d[b]:.2f}" if a in d and b in d else "-"  # noqa: E731
        print(f"| 1/{1 / factor:.0f} | " + " | ".join(f"{med[m]:.1f}" for m in modes) +
              f" | {ratio('auto', 'known', med)} | {ratio('auto', 'off', med)} | "
              f"{ratio('auto', 'known', cpu)} |")


if __name__ == "__main__":
    main()
