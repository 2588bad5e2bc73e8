"""Helpers for tests that run real varuna-worker processes on loopback."""

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

BIN_DIR = os.environ.get("VARUNA_BIN_DIR", os.path.join(os.getcwd(), "bin"))
# torchrun of the torch these tests run under (the project's environment, scripts/python).
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
WORKER = os.path.join(BIN_DIR, "varuna-worker")


_issued_ports = set()


def free_port():
    """A loopback port nobody holds, below Linux's ephemeral range (32768-60999): the
    processes a test starts bind port 0 (agents' --listen, masters' ports, gRPC clients), and
    a port from that range could be taken by one of them between this call and the bind it is
    meant for. Never the same port twice in one test process."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, 32000)
        if port in _issued_ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _issued_ports.add(port)
        return port
    raise RuntimeError("no free loopback port in 20000-31999")


def write_text_corpus(path, size=200_000, seed=0):
    """English-like bytes: the fortunes corpus if installed, else a fixed synthetic text."""
    src = "/usr/share/games/fortunes/fortunes"
    if os.path.exists(src):
        with open(src, "rb") as f:
            data = f.read()
        data = (data * (size // max(1, len(data)) + 1))[:size]
    else:
        rnd = random.Random(seed)
        words = [b"the", b"pipeline", b"stage", b"gradient", b"of", b"a", b"model", b"runs"]
        data = b" ".join(rnd.choice(words) for _ in range(size // 5))[:size]
    with open(path, "wb") as f:
        f.write(data)
    return path


def job_yaml(path, data_path, model=None, train=None, parallel=None, extra=""):
    model = {"kind": "gpt", "layers": 4, "d_model": 32, "heads": 4, "seq_len": 16,
             "vocab": 256, "dropout": 0.0, **(model or {})}
    train = {"global_batch": 8, "steps": 4, "optimizer": "adamw", "lr": 1e-3, "warmup": 0,
             "schedule": "constant", "clip_grad_norm": 1.0, "precision": "fp32", "seed": 7,
             **(train or {})}
    parallel = {"micro_batch": 2, "schedule": "varuna", "timeout_s": 60, **(parallel or {})}

    def flow(d):
        return "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"

    text = (f"name: test\nmodel: {flow(model)}\ndata: {{kind: text, path: {data_path}}}\n"
            f"train: {flow(train)}\nparallel: {flow(parallel)}\n{extra}")
    with open(path, "w") as f:
        f.write(text)
    return path


class RunResult:
    def __init__(self, returncodes, outputs, metrics, elapsed, metrics_path=None):
        self.metrics_path = metrics_path
        self.returncodes = returncodes
        self.outputs = outputs
        self.metrics = metrics
        self.elapsed = elapsed

    @property
    def ok(self):
        return all(rc == 0 for rc in self.returncodes)

    def losses(self):
        return [m["loss"] for m in self.metrics]


def start_workers(world, args, env_extra=None, cmd=None):
    """Starts `world` ranks with the torchrun environment; returns (procs, logs, metrics).
    One OpenMP thread each unless env_extra says otherwise, as the agent launches workers: a
    rank's idle OpenMP threads spin, and beside other ranks (or other tests) on two cores
    that made runs several times slower (2 ranks, 500 paced steps: 70 s against 21)."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="varuna-e2e-")
    metrics = os.path.join(tmp, "metrics.jsonl")
    procs, logs = [], []
    for r in range(world):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **(env_extra or {}))
        log = open(os.path.join(tmp, f"rank{r}.log"), "w+")
        logs.append(log)
        full = (cmd or [WORKER]) + list(args) + ["--metrics_out", metrics]
        procs.append(subprocess.Popen(full, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs, logs, metrics


def wait_workers(procs, logs, metrics, timeout, t0):
    """Waits for all ranks (killing every rank after `timeout` s); returns a RunResult."""
    deadline = t0 + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            codes.append(-9)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    rows = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return RunResult(codes, outputs, rows, time.time() - t0, metrics)


def run_workers(world, args, timeout=300, env_extra=None, cmd=None):
    """Runs `world` ranks to completion; returns a RunResult."""
    t0 = time.time()
    procs, logs, metrics = start_workers(world, args, env_extra, cmd)
    return wait_workers(procs, logs, metrics, timeout, t0)


def stage_map(stages, replicas):
    return "".join(",".join(str(s + d * stages) for d in range(replicas)) + ";"
                   for s in range(stages))
