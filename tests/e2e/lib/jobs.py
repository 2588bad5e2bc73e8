"""Jobs the e2e scripts share: the morph job (2 stages, checkpointed) and its one-process
reference losses (cached under build/artifacts), the checks of a morphed run (MorphChecks),
and heterogeneous pipelines written as YAML (pipelines, cut)."""

import hashlib
import json
import os
import unittest

from lib.cluster import wait_for
from lib.harness import BIN_DIR, WORKER, job_yaml, run_workers, write_text_corpus

STEPS = 150  # the morph job's
MORPH_CONFIG = "scale_up_delay_s: 2\nmorph_coalesce_s: 0.3\n"


def write_morph_job(c, name="job.yaml", steps=STEPS, stages=2, extra_parallel=None,
                    ckpt=True, extra=""):
    data = os.path.join(c.dir, "corpus.txt")
    if not os.path.exists(data):
        write_text_corpus(data)
    ckpt_text = f"checkpoint: {{dir: {os.path.join(c.dir, 'ckpt-' + name)}}}\n" if ckpt else ""
    return job_yaml(os.path.join(c.dir, name), data,
                    train={"steps": steps, "global_batch": 24},
                    parallel={"stages": stages, "micro_batch": 2, "timeout_s": 30,
                              **(extra_parallel or {})},
                    extra=ckpt_text + extra)


_reference = {}


def cached_reference_losses(c, path):
    """The losses of job file `path` run as one process, kept under build/artifacts keyed by
    the job, the corpus and the worker binary, so repeated runs (ctest --repeat) do not
    recompute them."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read().replace(c.dir.encode(), b"@DIR@"))
    with open(os.path.join(c.dir, "corpus.txt"), "rb") as f:
        h.update(f.read())
    st = os.stat(WORKER)
    h.update(f"{st.st_size} {st.st_mtime_ns}".encode())
    cache = os.path.join(BIN_DIR, "..", "artifacts", f"reference-{h.hexdigest()[:16]}.json")
    if os.path.exists(cache):
        with open(cache) as f:
            return json.load(f)
    r = run_workers(1, ["--job", path], timeout=900)
    assert r.ok, r.outputs
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    with open(cache + ".tmp", "w") as f:
        json.dump(r.losses(), f)
    os.replace(cache + ".tmp", cache)
    return r.losses()


def reference_losses(c):
    """The same job as one process (1 stage, 1 replica), once per test run."""
    if "losses" not in _reference:
        _reference["losses"] = cached_reference_losses(
            c, write_morph_job(c, "reference.yaml", stages=1, ckpt=False))
    return _reference["losses"]


class MorphChecks:
    """Submitting a morph job to self.c (a Cluster), waiting for its steps, and checking a
    finished run against the one-process reference; mixed into TestCases."""

    def submit(self, job):
        return json.loads(self.c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]

    def running_at(self, job_id, step, generation=1):
        return wait_for(lambda: (lambda s: s["state"] == "RUNNING" and
                                 s["generation"] == generation and s["step"] >= step and s)(
            self.c.status(job_id)), 180, f"step {step} of generation {generation}")

    def finish(self, job_id):
        st, metrics = self.finish_without_worker_check(job_id)
        wait_for(lambda: self.c.workers() == [], 20, "no worker left")
        return st, metrics

    def finish_without_worker_check(self, job_id):
        c = self.c
        st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") and
                               s)(c.status(job_id)), 300, "the job to finish")
        self.assertEqual(st["state"], "SUCCEEDED", f"{st}\n{c.tail()}")
        metrics = json.loads(c.ctl("-o", "json", "metrics", job_id, check=0).stdout)
        self.assertEqual([int(m["step"]) for m in metrics], list(range(1, STEPS + 1)),
                         "every step once, oldest first")
        ref = reference_losses(c)
        for m, want in zip(metrics, ref):
            self.assertLess(abs(m["loss"] - want) / abs(want), 1e-4,
                            f"step {m['step']} gen {m['generation']}: {m['loss']} vs {want}")
        return st, metrics


def morph_driver(cluster):
    """MorphChecks on `cluster` for a test of another class (in_place_e2e drives jobs so)."""

    class Driver(MorphChecks, unittest.TestCase):
        def runTest(self):
            pass

    d = Driver()
    d.c = cluster
    return d


MODULES = ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]


def pipelines(*entries):
    """YAML flow text for parallel.pipelines from (stage module lists, microbatches, count)."""
    out = []
    for stages, microbatches, count in entries:
        st = ", ".join("[" + ", ".join(s) + "]" for s in stages)
        out.append(f"{{stages: [{st}], microbatches: {microbatches}, count: {count}}}")
    return "[" + ", ".join(out) + "]"


def cut(*sizes):
    """MODULES split into stages of the given sizes."""
    stages, i = [], 0
    for n in sizes:
        stages.append(MODULES[i:i + n])
        i += n
    assert i == len(MODULES)
    return stages


# The shapes: (name, ranks, parallel.pipelines).
