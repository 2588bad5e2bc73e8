#!/usr/bin/env python3
"""tests/gpu/device_check.sh's bookkeeping (standard library only): after each phase,
`record OUT PHASE RC SECONDS [key=value ...]` adds the phase's rc, seconds, status and a short
summary read from its artifacts under OUT to OUT/.phases.json and rewrites OUT/results.json
whole (written to a temporary name, then renamed, so a run cut off at any point leaves a
readable file); `final OUT` marks the run finished and prints the summary table.

Statuses: ok (rc 0), failed, timeout (rc 124 or 137: the phase ran out of budget), skipped (with
why). Keys: mode, device, budget_s, started, elapsed_s, finished, ok, phases{name: {...}}.
"""

import json
import os
import re
import sys
import time


def load(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def env_summary(out, _):
    s = {}
    for line in read(f"{out}/env.log").splitlines():
        m = re.match(r"^([a-z_]+)=(.*)$", line)
        if m:
            s[m.group(1)] = m.group(2).strip()
    return s


def build_summary(out, kv):
    log = read(f"{out}/build.log")
    s = {"worker": kv.get("worker", "?"),
         "worker_exists": os.path.exists(kv.get("worker", "")) if "worker" in kv else None}
    m = re.findall(r"varuna: LibTorch [^\n]*", log)
    if m:
        s["configure"] = m[-1]
    errors = [l.strip() for l in log.splitlines() if "error:" in l or "FAILED:" in l
              or "CMake Error" in l]
    s["error_lines"] = len(errors)
    if errors:
        s["first_errors"] = errors[:5]
    if kv.get("rc", "0") != "0":
        s["log_tail"] = log.strip().splitlines()[-5:]
    return s


def parity_summary(out, _):
    p = load(f"{out}/parity.json", None)
    if p is None:
        tail = read(f"{out}/parity.log").strip().splitlines()[-3:]
        return {"note": "no parity.json (the phase was cut off or did not start its checks)",
                "log_tail": tail}
    checks = {}
    for name, c in p["checks"].items():
        e = {"status": c["status"]}
        if "max_rel" in c:
            e["max_rel"] = float(f"{c['max_rel']:.3g}")
        if "first_loss" in c and c["first_loss"] is not None:
            e["loss"] = f"{c['first_loss']:.4f} -> {c['last_loss']:.4f}"
            if c.get("overflow_steps"):
                e["overflow_steps"] = c["overflow_steps"]
        if "why" in c:
            e["why"] = c["why"]
        checks[name] = e
    return {"device": p["device"], "shape": p["shape"], "steps": p["steps"],
            "bound": "1e-4 relative at every step vs the one-process CPU run",
            "checks": checks}


def bench_summary(out, kv):
    rows = [json.loads(l) for l in read(f"{out}/bench.jsonl").splitlines() if l.strip()]
    peak = float(kv.get("peak_tflops", 0) or 0) * 1e12
    loop_n = {r["model"]: r["params"] for r in rows if r.get("system") != "varuna-worker"}
    res = []
    for r in rows:
        n = loop_n.get(r["model"], r.get("params"))
        e = {"system": r["system"], "model": r["model"], "round": r["round"],
             "step_s": round(r["step_s"], 5), "samples_per_s": round(r["samples_per_s"], 3),
             "tokens_per_s": round(r["tokens_per_s"], 1), "params": n}
        if peak > 0 and n:
            attn = 12 * r["layers"] * r["seq_len"] * r["d_model"]
            e["mfu_6n"] = round(6 * n * r["tokens_per_s"] / peak, 4)
            e["mfu_6n_attn"] = round((6 * n + attn) * r["tokens_per_s"] / peak, 4)
        else:
            e["mfu_6n"] = e["mfu_6n_attn"] = "n/a"
        res.append(e)
    s = {"rows": res}
    for k in ("note", "peak_tflops", "models", "rounds", "steps"):
        if k in kv:
            s[k] = kv[k]
    return s


def timeline_summary(out, kv):
    lines = [json.loads(l) for l in read(f"{out}/timeline.jsonl").splitlines() if l.strip()]
    steps = [x for x in lines if "step" in x]
    # The steady state: past the first step, and not under the profiler.
    plain = [x for x in steps if x["step"] > 1 and not x["traced"]] or steps
    s = {"steps": len(steps), "clock": steps[0]["clock"] if steps else None}
    if plain:
        def med(k):
            v = sorted(x[k] for x in plain)
            return round(v[len(v) // 2], 6)
        s["median_s"] = {k: med(k + "_s") for k in ("step", "forward", "backward", "norm",
                                                     "optimizer", "comm")}
        s["host_syncs"] = sorted({x["host_syncs"] for x in plain})
    traces = [x["trace"] for x in lines if "trace" in x]
    if traces:
        t = traces[0]
        s["trace"] = {"where": t["where"], "steps": t["steps"], "total_s": round(t["total_s"], 6),
                      "categories": {c["name"]: [round(c["time_s"], 6), c["count"]]
                                     for c in t["categories"]},
                      "top": [c["name"][:80] for c in t["top"][:5]],
                      "copies": t["copies"], "syncs": t["syncs"]}
    return s


def carry_summary(_, kv):
    return {"note": kv.get("note", "")}


def multi_summary(out, _):
    m = load(f"{out}/multi.json", None)
    if m is None:
        return {"note": "no multi.json"}
    s = {k: m[k] for k in ("model", "shape", "steps", "skip", "rounds", "ok") if k in m}
    s["commit"] = {name: {k: v for k, v in e.items() if k != "log_tail"}
                   for name, e in m.get("commit", {}).items()}
    s["rescue"] = {k: v for k, v in m.get("rescue", {}).items() if k != "log_tail"}
    return s


def matrix_summary(out, kv):
    m = load(f"{out}/matrix.json", None)  # GoogleTest's --gtest_output=json
    if m is None:
        return {"note": "no matrix.json (the phase was cut off or the binary did not start)"}
    failed = [f"{s['name']}.{t['name']}" for s in m.get("testsuites", [])
              for t in s.get("testsuite", []) if t.get("failures")]
    return {"device": kv.get("device", ""), "tests": m.get("tests", 0),
            "failures": m.get("failures", 0), "seconds": m.get("time", ""),
            "failed": failed[:20]}


SUMMARIES = {"env": env_summary, "build": build_summary, "parity": parity_summary,
             "matrix": matrix_summary,
             "timeline": timeline_summary, "bench": bench_summary, "multi": multi_summary,
             "carry": carry_summary}


def write(out, state):
    tmp = f"{out}/.results.json.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
        f.write("\n")
    os.replace(tmp, f"{out}/results.json")


def state_of(out):
    return load(f"{out}/.phases.json", None)


def main():
    cmd, out = sys.argv[1], sys.argv[2]
    if cmd == "start":  # start OUT mode device budget_s
        mode, device, budget = sys.argv[3:6]
        state = {"mode": mode, "device": device, "budget_s": int(budget),
                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "t0": time.time(),
                 "elapsed_s": 0, "finished": False, "ok": True, "phases": {}}
    elif cmd == "record":  # record OUT phase rc seconds [key=value ...]
        state = state_of(out)
        name, rc, secs = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        kv = dict(a.split("=", 1) for a in sys.argv[6:])
        kv["rc"] = str(rc)
        if "skipped" in kv:
            status = "skipped"
        elif rc == 0:
            status = "ok"
        elif rc in (124, 137):
            status = "timeout"
        else:
            status = "failed"
        p = {"rc": None if status == "skipped" else rc, "seconds": secs, "status": status}
        if status == "skipped":
            p["why"] = kv["skipped"]
        try:
            p["summary"] = (SUMMARIES[name](out, kv) if name in SUMMARIES and
                            status != "skipped" else {})
        except Exception as e:  # the record must be written whatever the artifacts hold
            p["summary"] = {"note": f"summary unreadable: {type(e).__name__}: {e}"}
        state["phases"][name] = p
        # A build skipped on purpose (BUILD=0, the worker there) is not a failure; "carry" is
        # what the run needs besides its phases (.gpudeps, an OUT a device can return).
        if name in ("build", "parity", "matrix", "carry") and status not in ("ok", "skipped"):
            state["ok"] = False
    elif cmd == "final":
        state = state_of(out)
        state["finished"] = True
    else:
        sys.exit(f"device_check_report: unknown command {cmd}")
    state["elapsed_s"] = round(time.time() - state["t0"], 1)
    with open(f"{out}/.phases.json", "w") as f:
        json.dump(state, f)
    write(out, {k: v for k, v in state.items() if k != "t0"})
    if cmd == "final":
        print_summary(state)


def print_summary(state):
    print(f"\n== device_check summary ({state['mode']}, device {state['device']}, "
          f"{state['elapsed_s']:.0f} s of a {state['budget_s']} s budget) ==")
    print("| phase | status | rc | seconds |")
    print("|---|---|---|---|")
    for name, p in state["phases"].items():
        print(f"| {name} | {p['status']}{' (' + p['why'] + ')' if 'why' in p else ''} | "
              f"{'-' if p['rc'] is None else p['rc']} | {p['seconds']} |")
    env = state["phases"].get("env", {}).get("summary", {})
    if env:
        print("machine: " + "; ".join(f"{k} {v}" for k, v in env.items()))
    par = state["phases"].get("parity", {}).get("summary", {})
    for name, c in par.get("checks", {}).items():
        extra = (f"max rel {c['max_rel']:.2e}" if "max_rel" in c else c.get("loss", ""))
        why = f"({c['why']})" if "why" in c else ""
        print(f"parity {name}: " + " ".join(x for x in (c["status"], extra, why) if x))
    if "note" in par:
        print(f"parity: {par['note']}")
    mx = state["phases"].get("matrix", {}).get("summary", {})
    if "tests" in mx:
        print(f"matrix on {mx['device']}: {mx['tests']} cells, {mx['failures']} failed" +
              (f" ({', '.join(mx['failed'])})" if mx["failed"] else ""))
    tl = state["phases"].get("timeline", {}).get("summary", {})
    if "median_s" in tl:
        m = tl["median_s"]
        print(f"timeline ({tl['clock']}, median of {tl['steps']} steps' untraced ones): step "
              f"{m['step']:.4f} s = forward {m['forward']:.4f} + backward {m['backward']:.4f} + "
              f"norm {m['norm']:.4f} + optimizer {m['optimizer']:.4f} + comm {m['comm']:.4f} "
              f"(+ the rest); host_syncs {tl['host_syncs']}")
    if "trace" in tl:
        t = tl["trace"]
        cats = ", ".join(f"{k} {100 * v[0] / t['total_s']:.0f}%" for k, v in
                         t["categories"].items()) if t["total_s"] else ""
        print(f"trace ({t['where']}, {t['steps']} steps): {cats}; copies {t['copies']['count']}, "
              f"syncs {t['syncs']}")
    bench = state["phases"].get("bench", {})
    for r in bench.get("summary", {}).get("rows", []):
        m6, ma = r["mfu_6n"], r["mfu_6n_attn"]
        fmt = (lambda x: x if isinstance(x, str) else f"{100 * x:.1f}%")
        print(f"bench {r['model']} round {r['round']} {r['system']}: step {r['step_s']:.4f} s, "
              f"{r['samples_per_s']:.2f} samples/s, MFU {fmt(m6)} (6N), {fmt(ma)} (6N + attn)")
    if bench.get("summary", {}).get("note"):
        print(f"bench: {bench['summary']['note']}")
    multi = state["phases"].get("multi", {}).get("summary", {})
    for name, e in multi.get("commit", {}).items():
        cost = (f", {100 * e['cost_vs_off']:+.1f}% vs off" if "cost_vs_off" in e else "")
        step = f"step {e['step_s']:.4f} s" if "step_s" in e else f"rc {e.get('rc')}"
        print(f"multi {multi.get('model')} D=2 (gloo, one device) commit {name}: {step}{cost}")
    r = multi.get("rescue", {})
    if r:
        print(f"multi rescue after killing rank 1 in step {r.get('kill_at')}: " +
              (f"saved step {r['saved_step']} in {r['rescue_s']} s, rank 0 out "
               f"{r['exit_after_kill_s']} s after rank 1 died" if "rescue_s" in r
               else f"failed (rc {r.get('rc')})"))
    carry = state["phases"].get("carry", {})
    if carry.get("status") == "failed":
        print(f"carry: {carry.get('summary', {}).get('note', '')}")
    print(f"device_check: {'OK' if state['ok'] else 'FAILED'} (build, parity, matrix and carry "
          f"{'passed' if state['ok'] else 'did not all pass'}); results.json and logs.tgz in OUT")


if __name__ == "__main__":
    main()
