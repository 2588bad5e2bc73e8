"""Shared helpers for the benchmark scripts (standard library only)."""

import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from lib import harness  # noqa: E402,F401


def corpus(build_dir):
    path = os.path.join(build_dir, "demo", "fortunes.txt")
    if not os.path.exists(path):
        subprocess.run([os.path.join(ROOT, "scripts", "prepare_corpus.sh"), path], check=True,
                       stdout=subprocess.DEVNULL)
    return path


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def median_rate(rows, warmup, key="samples_per_s"):
    return statistics.median(r[key] for r in rows[warmup:])


def median(xs):
    return statistics.median(xs)


def proc_cpu_s(pid="self", children=False):
    """CPU seconds billed to a process (/proc/PID/stat utime + stime), or to its waited-for
    children (cutime + cstime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    first = 13 if children else 11
    return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")


def project_python():
    """The project's Python environment (torch 2.11, the wheel varuna-worker is built against)."""
    out = subprocess.run([os.path.join(ROOT, "scripts", "python_env.sh"), "--path"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("the project's Python environment is missing: run scripts/install_deps.sh")
    return out.stdout.strip()
