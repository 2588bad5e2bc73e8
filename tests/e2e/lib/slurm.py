"""The Slurm test cluster (scripts/slurm_test_cluster.sh: slurmctld, munged and 3 slurmd in
network namespaces), started once per process (cluster_up) and stopped by stop_cluster; the
commands against it; and what the tests read back from the agents' work directories."""

import glob
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from lib import harness

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CLUSTER = os.path.join(ROOT, "scripts", "slurm_test_cluster.sh")
SBATCH = os.path.join(ROOT, "deploy", "slurm", "varuna.sbatch")
# Its own cluster (directory, subnet), apart from one a person may run for a demo.
SLURM_DIR = os.environ.get("VARUNA_E2E_SLURM_DIR", "/tmp/varuna-slurm-e2e")
ENV = dict(os.environ, VARUNA_SLURM_DIR=SLURM_DIR,
           VARUNA_SLURM_SUBNET=os.environ.get("VARUNA_E2E_SLURM_SUBNET", "10.78.0"),
           VARUNA_SLURM_GRACE_S="30", SLURM_CONF=os.path.join(SLURM_DIR, "slurm.conf"))
_state = {}


def cluster_up():
    """Starts the test cluster once per process; returns None or why it cannot run."""
    if "why" in _state:
        return _state["why"]
    why = None
    if os.geteuid() != 0:
        why = "needs root (namespaces)"
    elif not shutil.which("slurmctld") or not shutil.which("munged"):
        why = "slurm-wlm and munge are not installed"
    else:
        r = subprocess.run([CLUSTER, "start", "3"], env=ENV, capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            why = f"the test cluster did not start: {r.stderr[-2000:]}"
    _state["why"] = why
    return why


def slurm(*args, check=True, timeout=60):
    r = subprocess.run(list(args), env=ENV, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: {r.stderr}")
    return r.stdout


def job_state(job_id):
    """The Slurm job's state and restart count (squeue's --json, not its human output)."""
    # Slurm 22.05's squeue --json ignores -j: pick the job out.
    out = json.loads(slurm("squeue", "--json", "-t", "all"))
    j = [x for x in out["jobs"] if str(x["job_id"]) == str(job_id)][0]
    state = j["job_state"]
    return (state[0] if isinstance(state, list) else state), j.get("restart_cnt", 0)


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def wait_for(fn, timeout, what):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = fn()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def write_job(path, data, steps, ckpt=None, stages=1, every=None, step_min_ms=None):
    """A small GPT job; `step_min_ms`: each step lasts at least that long (VARUNA_STEP_MIN_MS),
    so the job outlasts the events a test stages on a fast machine and leaves CPU to them."""
    ck = ""
    if ckpt:
        ck = f"checkpoint: {{dir: {ckpt}" + (f", every_steps: {every}" if every else "") + "}\n"
    with open(path, "w") as f:
        f.write("name: slurm\nmodel: {kind: gpt, layers: 4, d_model: 32, heads: 4, seq_len: 16,"
                " vocab: 256}\n"
                f"data: {{kind: text, path: {data}}}\n"
                f"train: {{global_batch: 12, steps: {steps}, lr: 0.001, schedule: constant, "
                "seed: 7}\n"
                f"parallel: {{stages: {stages}, micro_batch: 2, timeout_s: 60}}\n"
                # The three "nodes" share this machine's cores: their speeds say nothing.
                f"stragglers: {{policy: report}}\n{ck}"
                + (f"env: {{VARUNA_STEP_MIN_MS: '{step_min_ms}'}}\n" if step_min_ms else ""))
    return path


class Fixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = cluster_up()
        if why:
            raise unittest.SkipTest(why)
        cls.tmp = tempfile.mkdtemp(prefix="varuna-slurm-", dir="/tmp")
        cls.data = harness.write_text_corpus(os.path.join(cls.tmp, "corpus.txt"))


def stop_cluster():
    """Stops the cluster this process started (kept with VARUNA_KEEP_TMP=1)."""
    if "why" in _state and _state["why"] is None and not os.environ.get("VARUNA_KEEP_TMP"):
        subprocess.run([CLUSTER, "stop"], env=ENV, capture_output=True, timeout=60)


def rank0_losses(state_dir):
    """step -> [(loss, file)] from every generation's rank-0 progress file under the agents'
    work directories (the worker's per-step records, full precision)."""
    seen = {}
    pattern = os.path.join(state_dir, "agent-*", "jobs", "*", "gen*", "progress.rank0")
    for path in glob.glob(pattern):
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    step = json.loads(line).get("step")
                except ValueError:
                    continue  # a line being written
                if isinstance(step, dict):
                    seen.setdefault(int(step["step"]), []).append((step["loss"], path))
    return seen


def resumed_by_generation(state_dir):
    """{generation: the step its rank 0 resumed from} (its progress file's ready record)."""
    out = {}
    pattern = os.path.join(state_dir, "agent-*", "jobs", "*", "gen*", "progress.rank0")
    for path in glob.glob(pattern):
        gen = int(os.path.basename(os.path.dirname(path))[3:])
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    ready = json.loads(line).get("ready")
                except ValueError:
                    continue
                if isinstance(ready, dict):
                    out[gen] = int(ready.get("resumed_from", 0))
                    break
    return out


def generations(state_dir):
    """The generations any agent started so far (their directories)."""
    pattern = os.path.join(state_dir, "agent-*", "jobs", "*", "gen*")
    return {int(os.path.basename(p)[3:]) for p in glob.glob(pattern)}
