#!/usr/bin/env python3
"""What a ctest run cost: the ten slowest tests and each label's total, from the JUnit file
scripts/test.sh has ctest write (BUILD_DIR/Testing/ctest-junit.xml) and the labels ctest
reports. With --update, rewrites tests/test_times.txt (each test's seconds, from which
tests/CMakeLists.txt sets its TIMEOUT to 3x) from this run.

Usage: scripts/ctest_report.py BUILD_DIR [--wall SECONDS] [--update]
(standard library only; exits 1 with one line if the run left no JUnit file)."""

import argparse
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TIMES = os.path.join(REPO, "tests", "test_times.txt")


def labels_of(build_dir):
    """test name -> its labels, as ctest --show-only=json-v1 gives them."""
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir, capture_output=True,
                         text=True, check=True).stdout
    labels = {}
    for t in json.loads(out).get("tests", []):
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels[t["name"]] = list(p.get("value", []))
        labels.setdefault(t["name"], [])
    return labels


def read_junit(path):
    """[(name, seconds, status)] of every test case in the JUnit file."""
    root = ET.parse(path).getroot()
    cases = []
    for c in root.iter("testcase"):
        status = c.get("status", "run")
        if c.find("failure") is not None:
            status = "fail"
        elif c.find("skipped") is not None:
            status = "skipped"
        cases.append((c.get("name"), float(c.get("time", "0") or 0), status))
    return cases


def update_times(cases):
    header = []
    with open(TIMES) as f:
        for line in f:
            if not line.startswith("#"):
                break
            header.append(line)
    old = {}
    with open(TIMES) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                name, secs = line.split()
                old[name] = secs
    for name, secs, status in cases:
        if status in ("run", "fail") and secs > 0:
            old[name] = f"{secs:.2f}"
    with open(TIMES + ".tmp", "w") as f:
        f.writelines(header)
        for name in sorted(old):
            f.write(f"{name} {old[name]}\n")
    os.replace(TIMES + ".tmp", TIMES)
    print(f"ctest_report: {TIMES} updated ({len(old)} tests)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_dir")
    ap.add_argument("--wall", type=float, default=None, help="the run's wall time, to print")
    ap.add_argument("--update", action="store_true", help="rewrite tests/test_times.txt")
    a = ap.parse_args()
    junit = os.path.join(a.build_dir, "Testing", "ctest-junit.xml")
    if not os.path.exists(junit):
        print(f"ctest_report: no {junit} (did ctest run with --output-junit?)", file=sys.stderr)
        return 1
    cases = read_junit(junit)
    labels = labels_of(a.build_dir)
    ran = [c for c in cases if c[2] in ("run", "fail")]
    print("ctest_report: the ten slowest tests")
    for name, secs, status in sorted(ran, key=lambda c: -c[1])[:10]:
        print(f"  {secs:8.1f} s  {name}  [{','.join(labels.get(name, []))}]"
              f"{'  FAILED' if status == 'fail' else ''}")
    totals = {}
    for name, secs, _ in ran:
        for lab in labels.get(name, []) or ["(none)"]:
            n, s = totals.get(lab, (0, 0.0))
            totals[lab] = (n + 1, s + secs)
    print("ctest_report: seconds per label (a test counts under each of its labels)")
    for lab, (n, s) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"  {lab:14s} {s:8.1f} s  ({n} tests)")
    busy = sum(c[1] for c in ran)
    skipped = [c[0] for c in cases if c[2] not in ("run", "fail")]
    wall = f", wall {a.wall:.0f} s" if a.wall is not None else ""
    print(f"ctest_report: {len(ran)} tests ran, {busy:.0f} test-seconds{wall}; "
          f"not run or skipped: {', '.join(skipped) or 'none'}")
    if a.update:
        update_times(cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
