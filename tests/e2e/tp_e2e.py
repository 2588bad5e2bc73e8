"""End-to-end tests of tensor parallelism (Note [Tensor parallelism] in worker/models/tensor_parallel.cc):
real varuna-worker processes, WORLD_SIZE = (ranks of the stage map or pipelines) x tp_size.

Run from the build directory: python3 ../tests/e2e/tp_e2e.py [TestClass]
"""

import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from lib import harness  # noqa: E402
from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.worker import CheckpointFixture  # noqa: E402
from lib.main import main  # noqa: E402

MODEL = {"heads": 4}
# Dropout on where one position runs: every tp rank must draw the masks the unsplit model
# draws. (Several positions draw from their own streams, with or without tp: dropout 0.)
DROPOUT = {"heads": 4, "dropout": 0.1}


class ParityTest(CheckpointFixture):
    """tp 2 and 4 alone, tp 2 x P 2 x D 2 under 1f1b and zb-h1, tp 2 in a heterogeneous mix:
    every step's loss equals the one-process run's (1e-4)."""

    def tp_job(self, name, tp, **kw):
        parallel = {"tp_size": tp, **kw.pop("parallel", {})}
        return self.job(name, model=MODEL, parallel=parallel, **kw)

    def run_tp(self, job, tp, stages, replicas, extra=()):
        res = harness.run_workers(stages * replicas * tp,
                                  ["--job", job, "--stage_to_rank_map",
                                   harness.stage_map(stages, replicas), *extra])
        self.assertTrue(res.ok, f"tp={tp} P={stages} D={replicas} failed: {res.returncodes}\n" +
                        "\n".join(o[-2000:] for o in res.outputs))
        return res

    def test_tp_alone_and_with_pipelines_and_replicas(self):
        base = self.run_config(self.job("base", model=MODEL), 1, 1).losses()
        dropped = self.run_config(self.job("dbase", model=DROPOUT), 1, 1).losses()
        self.assertEqual(len(base), 4)
        self.assertLess(base[-1], base[0])
        self.assertNotEqual(base, dropped)
        for tp, p, d, schedule in [(2, 1, 1, "varuna"), (4, 1, 1, "1f1b"), (2, 2, 2, "1f1b"),
                                   (2, 2, 2, "zb-h1")]:
            model = DROPOUT if p * d == 1 else MODEL
            job = self.job(f"tp{tp}_{p}x{d}_{schedule}", model=model,
                           parallel={"tp_size": tp, "schedule": schedule})
            res = self.run_tp(job, tp, p, d)
            want = dropped if p * d == 1 else base
            self.assertClose(res.losses(), want, 1e-4, f"tp={tp} P={p} D={d} {schedule}")
            # One process per position writes the metrics and logs the loss.
            logged = [o for o in res.outputs if " step=4 loss=" in o]
            self.assertEqual(len(logged), 2 if p > 1 else 1, "loss lines")

    def test_tp_in_a_heterogeneous_mix(self):
        base = self.run_config(self.job("hbase", model=MODEL), 1, 1).losses()
        # A 2-stage pipeline reading 6 samples beside a 1-stage one reading 2, tp 2 each:
        # 3 positions, 6 processes.
        job = self.tp_job("het", 2)
        res = harness.run_workers(6, ["--job", job, "--pipelines", "0,3,6:6;0,6:2"])
        self.assertTrue(res.ok, "\n".join(o[-2000:] for o in res.outputs))
        self.assertClose(res.losses(), base, 1e-4, "tp 2 in 0,3,6:6;0,6:2")


class ManagerTest(CheckpointFixture):
    """The manager plans a tp job in tp groups (a node's slots in whole groups), places each
    group's ranks on one node, and launches them; losing a node morphs the job to fewer
    groups by a relaunch from its checkpoint. Every step's loss equals the one-process run's
    (1e-4), through the morph."""

    def test_plan_place_and_morph(self):
        steps = 150
        train = {"steps": steps, "global_batch": 6}
        ref = self.run_config(self.job("mref", model=MODEL, train=train,
                                       parallel={"micro_batch": 1}), 1, 1).losses()
        c = Cluster(agents=3, slots=3,
                    manager_config="scale_up_delay_s: 2\nmorph_coalesce_s: 0.3\n")
        try:
            ckpt = os.path.join(c.dir, "ckpt")
            job = self.job("mtp", model=MODEL, train=train,
                           parallel={"tp_size": 2, "stages": 1, "micro_batch": 1,
                                     "timeout_s": 30},
                           extra=f"checkpoint: {{dir: {ckpt}, every_steps: 1}}\n")
            # The plan counts groups: three nodes of 3 slots hold 3 groups of two, not 4.
            plan = json.loads(c.ctl("-o", "json", "plan", job, "--nodes", "3,3,3",
                                    check=0).stdout)
            self.assertEqual({(p["stages"], p["replicas"], p["tp_size"], p["slots"])
                              for p in plan["plans"]}, {(1, 3, 2, 6)}, plan)
            job_id = json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
            st = wait_for(lambda: (lambda s: s["state"] == "RUNNING" and s["step"] >= 5 and s)(
                c.status(job_id)), 180, "step 5")
            self.assertEqual((st["stages"], st["replicas"], st["tp_size"], st["slots"]),
                             (1, 3, 2, 6), st)
            # Each group's two ranks on one node, with consecutive local ranks.
            group_node = {}
            for p in st["placement"]:
                g = p["rank"] // 2
                self.assertEqual(group_node.setdefault(g, p["node"]), p["node"], st["placement"])
                self.assertEqual(p.get("local_rank", 0) % 2, p["rank"] % 2, p)
            self.assertEqual(len(set(group_node.values())), 3, st["placement"])
            self.assertIn("1x3 tp2 mb1", c.ctl("list", check=0).stdout)
            victim = group_node[2]
            c.agents[victim].send_signal(signal.SIGKILL)
            c.agents[victim].wait()
            st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
                c.status(job_id)), 400, "the job to finish")
            self.assertEqual(st["state"], "SUCCEEDED", c.tail())
            self.assertGreaterEqual(len(st["morphs"]), 1, st)
            m = st["morphs"][0]
            self.assertEqual((m["to"]["replicas"], m["to"]["tp_size"]), (2, 2), m)
            self.assertIn("tensor-parallel job resumes from its checkpoint", m["path"])
            self.assertIn("tp2", c.ctl("status", job_id, check=0).stdout)
            metrics = json.loads(c.ctl("-o", "json", "metrics", job_id, check=0).stdout)
            self.assertEqual([int(x["step"]) for x in metrics], list(range(1, steps + 1)))
            for x, want in zip(metrics, ref):
                self.assertLessEqual(abs(x["loss"] - want), 1e-4 * abs(want), x)
        finally:
            c.close()


class ResumeTest(CheckpointFixture):
    """Checkpoints hold full tensors: a tp 2 run resumes at tp 1, on P x D, and at tp 4, and a
    tp 1 run resumes at tp 2, each continuing the uninterrupted run's losses."""

    def test_resume_across_tp_sizes(self):
        src = os.path.join(self.tmp, "ck_tp2")
        job = self.ckpt_job("tp2", src, 2, 4, model=MODEL)
        with open(job, "a") as f:
            f.write("")
        full = self.run_config(self.job("full", model=MODEL), 1, 1).losses()
        self.set_tp(job, 2)
        first = harness.run_workers(2, ["--job", job, "--stage_to_rank_map", "0;"])
        self.assertTrue(first.ok, "\n".join(o[-2000:] for o in first.outputs))
        self.assertClose(first.losses(), full, 1e-4, "tp 2 run")
        layer = os.path.join(src, "varuna_ckpt_2", "layers", "blocks.0.safetensors")
        self.assertTrue(os.path.exists(layer))
        for name, tp, p, d in [("tp1", 1, 1, 1), ("tp1_2x2", 1, 2, 2), ("tp4", 4, 1, 1)]:
            dst = self.copy_ckpt(src, 2, f"ck_{name}")
            res_job = self.ckpt_job(f"res_{name}", dst, 0, 4, model=MODEL)
            self.set_tp(res_job, tp)
            res = harness.run_workers(p * d * tp, ["--job", res_job, "--stage_to_rank_map",
                                                   harness.stage_map(p, d),
                                                   "--resume_step", "latest"])
            self.assertTrue(res.ok, "\n".join(o[-2000:] for o in res.outputs))
            self.assertEqual([m["step"] for m in res.metrics], [3, 4])
            self.assertClose(res.losses(), full[2:], 1e-4, f"tp 2 -> {name}")
        # And the other way: a tp 1 checkpoint resumed at tp 2.
        src1 = os.path.join(self.tmp, "ck_tp1")
        self.run_config(self.ckpt_job("tp1src", src1, 2, 4, model=MODEL), 1, 1)
        res_job = self.ckpt_job("res_up", src1, 0, 4, model=MODEL)
        self.set_tp(res_job, 2)
        res = harness.run_workers(2, ["--job", res_job, "--stage_to_rank_map", "0;",
                                      "--resume_step", "2"])
        self.assertTrue(res.ok, "\n".join(o[-2000:] for o in res.outputs))
        self.assertClose(res.losses(), full[2:], 1e-4, "tp 1 -> tp 2")

    @staticmethod
    def set_tp(job, tp):
        with open(job) as f:
            text = f.read()
        with open(job, "w") as f:
            f.write(text.replace("parallel: {", f"parallel: {{tp_size: {tp}, ", 1))


class BadInputTest(CheckpointFixture):
    """tp_size errors name the numbers and exit before any rendezvous."""

    def expect_error(self, job, needle, world=2):
        t0 = time.time()
        env = dict(os.environ, RANK="1", WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(harness.free_port()))
        p = subprocess.run([harness.WORKER, "--job", job], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertLess(time.time() - t0, 20)
        self.assertIn(needle, p.stderr.strip().splitlines()[-1])

    def test_bad_tp(self):
        self.expect_error(self.job("h3", model={"heads": 4}, parallel={"tp_size": 3}),
                          "parallel.tp_size = 3 does not divide model.heads = 4")
        kv = self.job("kv", parallel={"tp_size": 4})
        with open(kv) as f:
            text = f.read()
        llama = ("{kind: llama, num_hidden_layers: 2, hidden_size: 32, num_attention_heads: 4, "
                 "num_key_value_heads: 2, max_position_embeddings: 64, vocab_size: 256}")
        with open(kv, "w") as f:
            f.write("\n".join(llama.join(["model: ", ""]) if line.startswith("model:") else line
                              for line in text.splitlines()) + "\n")
        self.expect_error(kv,
                          "parallel.tp_size = 4 does not divide model.num_key_value_heads = 2")
        self.expect_error(self.job("w3", model={"heads": 4}, parallel={"tp_size": 2}),
                          "WORLD_SIZE=3 is not a multiple of parallel.tp_size=2", world=3)
        self.expect_error(self.job("t0", parallel={"tp_size": 0}), "parallel.tp_size")
        # A single process (no torchrun environment) cannot be tp_size processes.
        env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
        p = subprocess.run([harness.WORKER, "--job", self.job("solo", parallel={"tp_size": 2})],
                           env=env, capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("parallel.tp_size = 2 needs WORLD_SIZE", p.stderr.strip().splitlines()[-1])
        ts = self.job("ts", model={"kind": "torchscript", "path": self.tmp},
                      parallel={"tp_size": 2})
        self.expect_error(ts, "a TorchScript model cannot be split for tensor parallelism")


if __name__ == "__main__":
    main()
