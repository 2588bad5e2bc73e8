#!/usr/bin/env python3
"""Fails on an #include that points up or sideways against the rooms' arrows.

The arrows (docs/architecture.md, "Rooms"): a file may include its own room and the rooms
listed for it below, never anything else of the project. LibTorch stays inside worker/.
Usage: layering.py [REPO_ROOT]  (exit 1 and one line per bad include)
"""
import os
import re
import sys

# room -> rooms it may include (besides itself). Paths are relative to the repository root.
ALLOWED = {
    "common/base": set(),
    "common/net": {"common/base"},
    "common/data": {"common/base"},
    "common/pipeline": {"common/base"},
    "common/checkpoint": {"common/base"},
    "common/spec": {"common/base", "common/pipeline", "common/checkpoint", "common/data"},
    "common/planner": {"common/base", "common/pipeline", "common/checkpoint", "common/data",
                       "common/spec"},
    "common/launch": {"common/base", "common/pipeline", "common/checkpoint", "common/data",
                      "common/spec"},
}
COMMON = set(ALLOWED)
# The manager's rooms (each a folder and a library, manager/CMakeLists.txt): the lower rooms
# know nothing of the ones above; jobs/ reaches morphing only through the JobMorphing
# interface it declares; manager.{h,cc} (room "manager") wires the rooms' events together;
# api/ (gRPC, HTTP, tokens) is the face over all of it.
MANAGER = {
    "manager/state": set(),
    "manager/nodes": {"manager/state"},
    "manager/jobs": {"manager/state", "manager/nodes"},
    "manager/morph": {"manager/state", "manager/nodes", "manager/jobs"},
    "manager/stragglers": {"manager/state", "manager/nodes", "manager/jobs"},
    "manager/sharing": {"manager/state", "manager/nodes", "manager/jobs"},
    "manager/sources": set(),
    "manager/ha": {"manager/state"},
}
MANAGER["manager"] = set(MANAGER)
MANAGER["manager/api"] = set(MANAGER) | {"manager"}
MANAGER["manager/main"] = set(MANAGER)  # main.cc, the program: everything above
for room, arrows in MANAGER.items():
    ALLOWED[room] = set(COMMON) | arrows
# The worker's rooms (worker/CMakeLists.txt): dist (process groups, collectives, devices)
# knows neither models nor the engine; models know dist; the engine (libvaruna, what
# examples/ link) knows no program; runtime is varuna-worker's program.
WORKER = {
    "worker/dist": set(),
    "worker/models": {"worker/dist"},
    "worker/engine": {"worker/dist", "worker/models"},
    "worker/runtime": {"worker/dist", "worker/models", "worker/engine"},
}
for room, arrows in WORKER.items():
    ALLOWED[room] = set(COMMON) | arrows
# The other programs: each may use all of common/ and its own folder only (no program
# includes another's code; the manager and the agent share only common/ and proto/).
for prog in ("agent", "ctl"):
    ALLOWED[prog] = set(COMMON)
TORCH_FREE = set(COMMON) | set(MANAGER) | {"agent", "ctl"}
SUBROOMS = {"common", "manager", "worker"}  # programs whose subfolders are rooms

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')


def room_of(path):
    """The room a repository path belongs to, or None for tests, bench, examples..."""
    parts = path.split("/")
    if parts[0] in SUBROOMS and len(parts) >= 3:
        return "/".join(parts[:2])
    if parts[0] == "manager" and len(parts) == 2:
        return "manager/main" if parts[1] == "main.cc" else "manager"
    if parts[0] in ("agent", "ctl") and len(parts) >= 2:
        return parts[0]
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    root = os.path.abspath(root)
    bad = []
    checked = 0
    for top in ("common", "manager", "agent", "worker", "ctl"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith((".h", ".cc")):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                room = room_of(rel)
                if room is None:
                    bad.append(f"{rel}: a source file outside every room (put it in one)")
                    continue
                checked += 1
                with open(full, encoding="utf-8") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        inc = m.group(1)
                        if room in TORCH_FREE and (inc.startswith("torch/") or
                                                   inc.startswith("ATen/") or
                                                   inc.startswith("c10/")):
                            bad.append(f"{rel}:{lineno}: LibTorch ({inc}) outside worker/")
                            continue
                        target = room_of(inc)
                        if inc.startswith("common/") and target is None:
                            bad.append(f"{rel}:{lineno}: {inc} is not in a room of common/")
                            continue
                        if target is None or target == room:
                            continue
                        if target not in ALLOWED[room]:
                            bad.append(f"{rel}:{lineno}: {room} may not include {inc} "
                                       f"({target}); allowed: {sorted(ALLOWED[room]) or 'none'}")
    for b in bad:
        print(b)
    print(f"layering: {checked} files, {len(bad)} bad includes")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
