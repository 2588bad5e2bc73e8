#!/usr/bin/env python3
"""No source file outside tests/ over MAX_LINES lines: a file that long holds two things.

Usage: sizes.py [REPO_ROOT]  (exit 1 and one line per file over the limit)
"""
import os
import sys

MAX_LINES = 800
DIRS = ("common", "manager", "agent", "worker", "ctl", "proto", "examples", "bench")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    root = os.path.abspath(root)
    bad = []
    count = 0
    for top in DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith((".h", ".cc", ".proto")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    n = sum(1 for _ in f)
                count += 1
                if n > MAX_LINES:
                    bad.append(f"{os.path.relpath(path, root)}: {n} lines (limit {MAX_LINES}): split it")
    for b in bad:
        print(b)
    print(f"sizes: {count} files, {len(bad)} over {MAX_LINES} lines")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
