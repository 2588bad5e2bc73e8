#!/usr/bin/env python3
"""Are two varuna-worker builds bit-identical in training? Runs the same jobs with both and
compares every step's loss exactly (the float printed in the metrics file), on the shapes a
refactor of the engine must not change: P x D with Varuna's schedule, 1F1B and ZB-H1, a
heterogeneous mix of pipelines, and tensor parallelism (alone and with P x D).

Usage: scripts/compare_losses.py OLD_BIN_DIR NEW_BIN_DIR [--steps N]
Exit 0 when every shape's losses are equal, 1 (naming the shape and step) when not."""

import argparse
import os
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
from lib import harness  # noqa: E402

# name, world, parallel block, extra worker arguments
SHAPES = [
    ("P2xD2 varuna", 4, {"schedule": "varuna"}, ["--stage_to_rank_map", "0,2;1,3;"]),
    ("P2xD2 1f1b", 4, {"schedule": "1f1b"}, ["--stage_to_rank_map", "0,2;1,3;"]),
    ("P2xD1 zb-h1", 2, {"schedule": "zb-h1"}, ["--stage_to_rank_map", "0;1;"]),
    # a 2-stage pipeline (3 + 3 modules, 4 micro-batches) beside a 1-stage one (2)
    ("hetero 2+1", 3, {"pipelines": "[{stages: [[embed, blocks.0, blocks.1], [blocks.2, "
                                    "blocks.3, head]], microbatches: 2, count: 1}, {stages: "
                                    "[[embed, blocks.0, blocks.1, blocks.2, blocks.3, head]], "
                                    "microbatches: 2, count: 1}]"}, []),
    ("tp2", 2, {"tp_size": 2}, ["--stage_to_rank_map", "0;"]),
    ("tp2 x P2 x D2 zb-h1", 8, {"tp_size": 2, "schedule": "zb-h1"},
     ["--stage_to_rank_map", "0,2;1,3;"]),
]


def run(bin_dir, job, world, extra):
    harness.WORKER = os.path.join(bin_dir, "varuna-worker")
    res = harness.run_workers(world, ["--job", job, *extra], timeout=600)
    if not res.ok:
        raise SystemExit(f"{bin_dir}: {job} failed: {res.returncodes}\n" +
                         "\n".join(o[-1500:] for o in res.outputs))
    return res.losses()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old_bin")
    ap.add_argument("new_bin")
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="varuna-compare-")
    data = harness.write_text_corpus(os.path.join(tmp, "corpus.txt"))
    bad = 0
    for name, world, parallel, extra in SHAPES:
        job = harness.job_yaml(os.path.join(tmp, name.replace(" ", "_") + ".yaml"), data,
                               train={"global_batch": 8, "steps": a.steps},
                               parallel={"micro_batch": 2, **parallel})
        old = run(a.old_bin, job, world, extra)
        new = run(a.new_bin, job, world, extra)
        same = old == new and len(old) == a.steps
        print(f"{name:22s} {'identical' if same else 'DIFFERENT'}: "
              f"{len(new)} steps, last loss {new[-1] if new else None!r}")
        if not same:
            bad += 1
            for i, (x, y) in enumerate(zip(old, new)):
                if x != y:
                    print(f"  first difference at step {i + 1}: {x!r} vs {y!r}")
                    break
    print(f"compare_losses: {len(SHAPES) - bad} of {len(SHAPES)} shapes bit-identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
