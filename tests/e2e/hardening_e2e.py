"""Hardening with real binaries: hostile input through every public surface (varunactl,
the Submit RPC via `varunactl submit --raw`, varuna-worker, varuna-ckpt) while a job runs,
and a cluster with mutual TLS and tokens. None of it may disturb the running job: it keeps
RUNNING in its first generation and keeps making steps."""

import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.cluster import Cluster, CTL, wait_for, write_job  # noqa: E402
from lib.harness import BIN_DIR, free_port  # noqa: E402
from lib.main import main  # noqa: E402

WORKER = os.path.join(BIN_DIR, "varuna-worker")
CKPT = os.path.join(BIN_DIR, "varuna-ckpt")

HOSTILE_SPECS = {
    "nonscalar_key": ("? [a, b]\n: 1\n", "not a plain name"),
    "env_list": ("env: {A: [1, 2, 3]}\n", "'env.A' must be a single value"),
    "env_bad_key": ("env: {'A=B': 1}\n", "env.A=B"),
    "duplicate_key": ("train: {lr: 0.1, lr: 0.2}\n", "given twice"),
    "inf_lr": ("train: {lr: .inf}\n", "train.lr"),
    "inf_timeout": ("parallel: {timeout_s: .inf}\n", "parallel.timeout_s"),
    "huge_steps": ("train: {steps: 99999999999}\n", "train.steps"),
    "huge_seq_len": ("model: {seq_len: 2147483647}\n", "model.seq_len"),
    "huge_layers": ("model: {layers: 100000}\n", "model.layers"),
    "big_micro_batch": ("train: {global_batch: 8}\nparallel: {micro_batch: 16}\n",
                        "parallel.micro_batch"),
}


class HostileInputTest(unittest.TestCase):
    def test_hostile_input_everywhere_while_a_job_runs(self):
        c = Cluster(slots=3)
        try:
            data = os.path.join(c.dir, "corpus.txt")
            job = write_job(c, "long.yaml", steps=100000, parallel={"replicas": 2})
            job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
            wait_for(lambda: c.status(job_id)["step"] >= 1, 120, "the job to make progress")
            step_before = c.status(job_id)["step"]

            # A job that puts a FIFO where its agent reads its progress: the agent must keep
            # heartbeating (a stalled agent would go DEAD after 4 s and fail the long job).
            script = ('rm -f "$VARUNA_PROGRESS_FILE"; mkfifo "$VARUNA_PROGRESS_FILE"; '
                      'sleep 60')
            fifo_job = write_job(c, "fifo_job.yaml", steps=1,
                                 parallel={"stages": 1, "replicas": 1},
                                 extra="entrypoint: [/bin/sh, -c, '%s', fifo-job]\n" % script)
            fifo_id = json.loads(c.ctl("-o", "json", "submit", fifo_job, check=0).stdout)["id"]
            wait_for(lambda: c.status(fifo_id)["state"] == "RUNNING", 60, "the FIFO job to run")
            time.sleep(6)
            self.assertEqual(sorted(n["state"] for n in c.nodes()), ["ALIVE", "ALIVE"])
            self.assertEqual(c.status(job_id)["state"], "RUNNING")
            c.ctl("cancel", fifo_id, check=0)

            fifo = os.path.join(c.dir, "fifo")
            os.mkfifo(fifo)
            for name, (body, needle) in HOSTILE_SPECS.items():
                path = os.path.join(c.dir, name + ".yaml")
                with open(path, "w") as f:
                    f.write(f"data: {{path: {data}}}\n" + body if name != "nonscalar_key"
                            else body)
                for raw in ([], ["--raw"]):  # varunactl's checks, then the manager's
                    t0 = time.time()
                    r = c.ctl("submit", *raw, path)
                    self.assertEqual(r.returncode, 2, f"{name} {raw}: {r.stdout}{r.stderr}")
                    self.assertIn(needle, r.stderr, f"{name} {raw}")
                    self.assertLess(time.time() - t0, 10)
            # A FIFO as data.path or env_file: refused at once by varunactl (the manager opens
            # no tenant's file; the worker checks it again: docs/operations.md "Submit").
            with open(os.path.join(c.dir, "fifo.yaml"), "w") as f:
                f.write(f"data: {{path: {fifo}}}\n")
            r = c.ctl("submit", os.path.join(c.dir, "fifo.yaml"), timeout=20)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("not a regular file", r.stderr)
            r = c.ctl("submit", job, "--env_file", "/dev/zero", timeout=20)
            self.assertEqual(r.returncode, 2)
            self.assertIn("not a regular file", r.stderr)
            # The worker refuses the same specs and a zero world, naming the problem.
            for name in ("nonscalar_key", "env_list", "huge_steps"):
                w = subprocess.run([WORKER, "--job", os.path.join(c.dir, name + ".yaml")],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(w.returncode, 3, name)  # bad input (common/launch/exit_codes.h)
                self.assertIn(HOSTILE_SPECS[name][1], w.stderr, name)
            env = dict(os.environ, WORLD_SIZE="0")
            w = subprocess.run([WORKER, "--job", job], capture_output=True, text=True,
                               timeout=60, env=env)
            self.assertEqual(w.returncode, 3)
            self.assertIn("WORLD_SIZE=0", w.stderr)
            # varuna-ckpt on a checkpoint whose metadata lies: reported, never hangs.
            ck = os.path.join(c.dir, "ck", "varuna_ckpt_3")
            os.makedirs(os.path.join(ck, "layers"))
            with open(os.path.join(ck, "common.json"), "w") as f:
                f.write('{"step": 3, "global_batch": "x", "writers": [], "layers": []}')
            ck2 = os.path.join(c.dir, "ck", "varuna_ckpt_2")
            os.makedirs(os.path.join(ck2, "layers"))
            with open(os.path.join(ck2, "common.json"), "w") as f:
                f.write('{"step": 2, "global_batch": 8, "stages": 1, "replicas": 1, '
                        '"loss_scale": 1, "clean_steps": 0, "writers": [0], "layers": ["a"]}')
            with open(os.path.join(ck2, "manifest.rank0.json"), "w") as f:
                f.write('{"files": [{"path": "../../../../dev/zero", "size": 1, "crc32": 0}]}')
            open(os.path.join(ck2, "complete.rank0"), "w").close()
            os.mkfifo(os.path.join(ck2, "layers", "a.pt"))
            r = subprocess.run([CKPT, "list", os.path.join(c.dir, "ck")], capture_output=True,
                               text=True, timeout=20)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("global_batch", r.stdout)
            self.assertIn("'..'", r.stdout)
            # All of the above happened while the job ran; the nodes stayed healthy.
            self.assertEqual(c.status(job_id)["state"], "RUNNING")
            nodes = c.nodes()
            self.assertEqual(sorted(n["name"] for n in nodes), ["node0", "node1"])
            self.assertEqual(sorted(n["state"] for n in nodes), ["ALIVE", "ALIVE"])

            # ... and the job kept training through all of it.
            wait_for(lambda: c.status(job_id)["step"] > step_before + 5, 60, "more steps")
            st = c.status(job_id)
            self.assertEqual(st["state"], "RUNNING", st.get("reason"))
            self.assertEqual(st["generation"], 1)
            c.ctl("cancel", job_id, check=0)
            wait_for(lambda: c.status(job_id)["state"] == "CANCELLED", 30, "CANCELLED")
            wait_for(lambda: c.workers() == [], 10, "no worker left")
        except BaseException:
            print(c.tail())
            raise
        finally:
            c.close()


class TlsClusterTest(unittest.TestCase):
    def test_mutual_tls_and_tokens_end_to_end(self):
        c = Cluster(secure=True)
        try:
            job = write_job(c)
            r = c.ctl("submit", job, "--follow", check=0)
            self.assertIn("SUCCEEDED", r.stdout)
            jobs = json.loads(c.ctl("-o", "json", "list", check=0).stdout)
            self.assertEqual(jobs[-1]["submitted_by"], "alice")
            ca = os.path.join(c.certs, "ca.pem")
            # No token, a wrong token: refused (exit 1) saying why.
            r = subprocess.run([CTL, "--manager", c.address, "--tls_ca", ca, "list"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1)
            self.assertIn("no token", r.stderr)
            r = subprocess.run([CTL, "--manager", c.address, "--tls_ca", ca, "--token",
                                "mallory-token-0123456789", "list"], capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 1)
            self.assertIn("not in the manager's tokens file", r.stderr)
            # Plaintext client: cannot talk to it, and is told about --tls_ca (exit 3).
            env = dict(os.environ, VARUNA_TOKEN=c.token)
            r = subprocess.run([CTL, "--manager", c.address, "list"], capture_output=True,
                               text=True, timeout=60, env=env)
            self.assertEqual(r.returncode, 3)
            self.assertIn("--tls_ca", r.stderr)
            # The environment variables work like the flags.
            env["VARUNA_TLS_CA"] = ca
            r = subprocess.run([CTL, "--manager", c.address, "nodes"], capture_output=True,
                               text=True, timeout=60, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            # A daemon on a non-loopback address without TLS refuses to start.
            r = subprocess.run([os.path.join(BIN_DIR, "varuna-manager"), "--listen",
                                f"0.0.0.0:{free_port()}", "--state_dir",
                                os.path.join(c.dir, "insecure")], capture_output=True,
                               text=True, timeout=30)
            self.assertEqual(r.returncode, 2)
            self.assertIn("without TLS", r.stderr)
        except BaseException:
            print(c.tail())
            raise
        finally:
            c.close()


if __name__ == "__main__":
    main()
