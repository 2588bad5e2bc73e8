"""Heterogeneous pipelines with real binaries (docs/heterogeneous.md).

WorkerTest: [2-stage, 1-stage] on 3 ranks, [3-stage, 2-stage] on 5 and [2, 2, 1] train the
same model as one process (every step's loss and the held-out loss within 1e-4, fp32, dropout
0), also under torchrun; checkpoints move between heterogeneous and uniform shapes both ways;
--list_modules; every template error from the worker.
ClusterTest: the same under the manager (parallel.pipelines), the template errors at
`varunactl submit`, and a morph from 6 slots to 5 that continues on a heterogeneous mix using
all 5 (AutoConfig with a stored profile)."""

import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import harness  # noqa: E402
from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.jobs import cut, MODULES, pipelines  # noqa: E402
from lib.worker import Fixture as WorkerFixture  # noqa: E402
from lib.main import main  # noqa: E402

BATCH = 12  # micro-batches of 2

SHAPES = [
    ("2+1", 3, pipelines((cut(3, 3), 4, 1), (cut(6), 2, 1))),
    ("3+2", 5, pipelines((cut(2, 2, 2), 4, 1), (cut(3, 3), 2, 1))),
    ("2+2+1", 5, pipelines((cut(1, 5), 2, 1), (cut(4, 2), 2, 1), (cut(6), 2, 1))),
]


class Fixture(WorkerFixture):
    """worker_e2e's corpus, eval_loss and assertClose; jobs with parallel.pipelines."""

    def job(self, name, pipes=None, train=None, extra=""):
        parallel = {"micro_batch": 2}
        if pipes:
            parallel["pipelines"] = pipes
        return harness.job_yaml(os.path.join(self.tmp, name + ".yaml"), self.data,
                                train={"global_batch": BATCH, **(train or {})},
                                parallel=parallel, extra=extra)

    def run_ok(self, world, args, what):
        res = harness.run_workers(world, args)
        self.assertTrue(res.ok, f"{what} failed: {res.returncodes}\n" +
                        "\n".join(o[-2500:] for o in res.outputs))
        return res


class WorkerTest(Fixture):
    def test_every_mix_trains_the_one_process_model(self):
        base_run = self.run_ok(1, ["--job", self.job("base")], "1x1")
        base = base_run.losses()
        self.assertLess(base[-1], base[0])
        (base_eval,) = self.eval_loss(base_run)
        for name, ranks, pipes in SHAPES:
            run = self.run_ok(ranks, ["--job", self.job("h" + name, pipes)], name)
            self.assertClose(run.losses(), base, 1e-4, name)
            evals = self.eval_loss(run)
            self.assertEqual(len(evals), 1, f"{name}: ranks disagree on eval_loss: {evals}")
            self.assertClose(list(evals), [base_eval], 1e-4, f"eval {name}")
            log = "\n".join(run.outputs)
            self.assertIn("pipeline=1", log)

    def test_under_torchrun(self):
        torchrun = harness.TORCHRUN
        if not os.path.exists(torchrun):
            self.skipTest(f"{torchrun} is not installed")
        base = self.run_ok(1, ["--job", self.job("tr_base")], "1x1").losses()
        for name, ranks, pipes in SHAPES:
            metrics = os.path.join(self.tmp, f"torchrun{name}.jsonl")
            p = subprocess.run([torchrun, "--standalone", "--nproc_per_node", str(ranks),
                                "--redirects", "1", "--tee", "1", "--log_dir",
                                os.path.join(self.tmp, "torchrun-logs" + name), "--no_python",
                                harness.WORKER, "--job", self.job("tr" + name, pipes),
                                "--metrics_out", metrics],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-3000:])
            with open(metrics) as f:
                got = [json.loads(line)["loss"] for line in f]
            self.assertClose(got, base, 1e-4, "torchrun " + name)

    def test_checkpoints_move_between_heterogeneous_and_uniform(self):
        full = self.run_ok(1, ["--job", self.job("ck_base", train={"steps": 6})], "1x1").losses()
        for name, first, second in [("het_to_uni", SHAPES[1], None), ("uni_to_het", None,
                                                                      SHAPES[0])]:
            ck = os.path.join(self.tmp, "ck_" + name)
            extra = f"checkpoint: {{dir: {ck}, every_steps: 3}}\n"

            def run(shape, steps, resume):
                pipes = shape[2] if shape else None
                ranks = shape[1] if shape else 2
                args = ["--job", self.job(f"{name}_{steps}", pipes, {"steps": steps}, extra)]
                if not shape:
                    args += ["--stage_to_rank_map", "0;1;"]
                if resume:
                    args += ["--resume_step", "latest"]
                return self.run_ok(ranks, args, f"{name} steps={steps}")

            head = run(first, 3, False)
            self.assertClose(head.losses(), full[:3], 1e-4, f"{name} first half")
            with open(os.path.join(ck, "varuna_ckpt_3", "common.json")) as f:
                common = json.load(f)
            if first:
                self.assertEqual(common["pipelines"].count(";"), 1, common)
            tail = run(second, 6, True)
            self.assertClose(tail.losses(), full[3:], 1e-4, f"{name} after resume")

    def test_libvaruna_program_takes_the_pipelines(self):
        """examples/train_custom.cc (seed-style Varuna::Create) on [2-stage, 1-stage]."""
        example = os.path.join(harness.BIN_DIR, "train_custom")

        def losses(world, flag):
            res = harness.run_workers(world, [flag], cmd=[example])
            self.assertTrue(res.ok, "\n".join(o[-2000:] for o in res.outputs))
            return [float(line.split()[-1]) for out in res.outputs for line in out.splitlines()
                    if line.startswith("step ")]

        base = losses(1, "--stage_to_rank_map=0;")
        # Only pipeline 0's last stage (rank 1) and the 1-stage pipeline (rank 2) print.
        got = losses(3, "--pipelines=0,1,3:24;0,3:8")
        self.assertEqual(len(got), 2 * len(base))
        self.assertClose(got[:len(base)], base, 1e-4, "train_custom 2+1")
        self.assertLess(base[-1], 0.5 * base[0])

    def test_list_modules(self):
        r = subprocess.run([harness.WORKER, "--job", self.job("mods"), "--list_modules"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), MODULES)

    def test_template_errors_from_the_worker(self):
        good = (cut(3, 3), 4, 1)
        cases = [
            ("order", pipelines(([["embed", "blocks.1", "blocks.0"], MODULES[3:]], 4, 1),
                                (cut(6), 2, 1)), 3,
             "Modules in the pipeline template do not match the modules in the model."),
            ("first", pipelines(([["blocks.0"], ["embed"] + MODULES[2:]], 4, 1),
                                (cut(6), 2, 1)), 3,
             "The first stage must contain the embedding module 'embed'."),
            ("last", pipelines(([MODULES[:4] + ["head"], ["blocks.3"]], 4, 1), (cut(6), 2, 1)), 3,
             "The last stage must contain the head module 'head'."),
            ("empty", pipelines(([MODULES[:5], ["head"], []], 4, 1), (cut(6), 2, 1)), 3,
             "is empty"),
            ("world", pipelines(good, (cut(6), 2, 1)), 4,
             "Number of ranks in pipeline templates (3) does not match world size (4)."),
            ("count", pipelines(good).replace(", microbatches: 4", "")[:-1] +
             ", " + pipelines((cut(6), 4, 1))[1:], 3,
             "All pipelines must have a corresponding number of microbatches."),
            ("same", pipelines(good, (cut(3, 3), 2, 1)), 4,
             "identical templates must have the same number of microbatches"),
        ]
        for name, pipes, world, needle in cases:
            res = harness.run_workers(world, ["--job", self.job("bad_" + name, pipes)],
                                      timeout=60)
            self.assertFalse(res.ok, name)
            self.assertIn(needle, res.outputs[0], f"{name}:\n{res.outputs[0][-1500:]}")


class ClusterTest(Fixture):
    def setUp(self):
        self.c = None

    def tearDown(self):
        if self.c:
            self.c.close()

    def submit(self, job):
        return json.loads(self.c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]

    def finish(self, job_id):
        st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
            self.c.status(job_id)), 300, "the job to finish")
        self.assertEqual(st["state"], "SUCCEEDED", f"{st}\n{self.c.tail()}")
        return st, json.loads(self.c.ctl("-o", "json", "metrics", job_id, check=0).stdout)

    def test_fixed_pipelines_under_the_manager_and_errors_at_submit(self):
        self.c = Cluster(agents=3, slots=2)
        base = self.run_ok(1, ["--job", self.job("m_base")], "1x1").losses()
        for name, ranks, pipes in SHAPES:
            jid = self.submit(self.job("m" + name, pipes))
            st, metrics = self.finish(jid)
            self.assertEqual(st["slots"], ranks, name)
            self.assertEqual(len(st["pipelines"].split(";")), name.count("+") + 1, st)
            self.assertClose([m["loss"] for m in metrics], base, 1e-4, "manager " + name)
            logs = self.c.ctl("logs", jid, check=0).stdout
            self.assertIn("--pipelines=" + st["pipelines"], logs)
        self.assertEqual(self.c.status(jid)["pipelines"], "0,1,6:4;0,4,6:4;0,6:4")
        text = self.c.ctl("status", jid, check=0).stdout
        self.assertIn("pipeline 2:        1 stage, rank 4, segments 0,6, 4 samples/step", text)
        # Every template error is refused at submit with the Python Varuna API's text.
        bad = [
            (pipelines(([["embed", "blocks.1", "blocks.0"], MODULES[3:]], 4, 1), (cut(6), 2, 1)),
             "Modules in the pipeline template do not match the modules in the model."),
            (pipelines(([["blocks.0"], ["embed"] + MODULES[2:]], 4, 1), (cut(6), 2, 1)),
             "The first stage must contain the embedding module 'embed'."),
            (pipelines(([MODULES[:4] + ["head"], ["blocks.3"]], 4, 1), (cut(6), 2, 1)),
             "The last stage must contain the head module 'head'."),
            (pipelines(([MODULES[:5], ["head"], []], 4, 1), (cut(6), 2, 1)), "is empty"),
            (pipelines((cut(3, 3), 4, 1)).replace(", microbatches: 4", ""),
             "All pipelines must have a corresponding number of microbatches."),
            (pipelines((cut(3, 3), 4, 1), (cut(3, 3), 2, 1)),
             "identical templates must have the same number of microbatches"),
            (pipelines((cut(3, 3), 4, 1), (cut(6), 3, 1)), "inconsistent with the pipelines"),
        ]
        for i, (pipes, needle) in enumerate(bad):
            r = self.c.ctl("submit", self.job(f"bad{i}", pipes))
            self.assertNotEqual(r.returncode, 0, pipes)
            self.assertIn(needle, r.stderr + r.stdout, pipes)

    def test_morph_from_six_slots_to_five_runs_a_heterogeneous_mix(self):
        self.c = c = Cluster(agents=2, slots=2, manager_config="morph_coalesce_s: 0.3\n")
        c.start_agent("node2", 1)
        c.start_agent("node3", 1)
        wait_for(lambda: len([n for n in c.nodes() if n["state"] == "ALIVE"]) == 4, 20,
                 "four agents")
        # 24 micro-batches a step; at least 5 slots, so on 5 the planner weighs P x D shapes
        # that use all of them (5x1) against the mixes, and 4-slot shapes are out.
        steps, batch = 40, 48
        ck = os.path.join(c.dir, "ckpt")
        auto = {"stages": "auto", "replicas": "auto", "micro_batch": 2, "timeout_s": 30}
        job = harness.job_yaml(os.path.join(c.dir, "auto.yaml"), self.data,
                               train={"global_batch": batch, "steps": steps},
                               parallel=auto, extra=f"checkpoint: {{dir: {ck}}}\n"
                                                    "resources: {min_slots: 5}\n")
        # The profile is measured here, beside four agents on two cores: its all-reduce and
        # compute times move by tens of percent from one profile to the next. In a typical one
        # the best mix for 5 slots beats 5 x 1 by about 25%; in one of four it came out 1% behind
        # (2026-11-29). The morph under test needs a profile in which the mix wins, so a new
        # profile (which replaces the old) is taken up to three times.
        for attempt in range(3):
            prof = json.loads(c.ctl("-o", "json", "profile", job, check=0).stdout)["id"]
            st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
                c.status(prof)), 300, "the profile job")
            self.assertEqual(st["state"], "SUCCEEDED", f"{st}\n{c.tail()}")
            plan5 = json.loads(c.ctl("-o", "json", "plan", job, "--nodes", "2,2,1",
                                     check=0).stdout)
            best = plan5["plans"][0]
            if len(best.get("pipelines", [])) > 1:
                break
            print(f"profile {attempt + 1}: the best plan for 5 slots is {best['stages']} x "
                  f"{best['replicas']}, not a mix; profiling again", file=sys.stderr)
        self.assertGreater(len(best.get("pipelines", [])), 1,
                           f"the best plan for 5 slots is not heterogeneous: {best}")
        jid = self.submit(job)
        wait_for(lambda: (lambda s: s["state"] == "RUNNING" and s["step"] >= 5 and s)(
            c.status(jid)), 180, "step 5")
        self.assertEqual(c.status(jid)["slots"], 6)
        c.agents["node3"].send_signal(signal.SIGKILL)
        c.agents["node3"].wait()
        st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
            c.status(jid)), 400, "the job to finish")
        self.assertEqual(st["state"], "SUCCEEDED", f"{st}\n{c.tail()}")
        self.assertEqual(st["slots"], 5, st)
        self.assertTrue(st["pipelines"], f"not heterogeneous after the morph: {st}")
        self.assertEqual(len(st["morphs"]), 1, st["morphs"])
        self.assertGreater(len(st["morphs"][0]["to"]["depths"]), 1, st["morphs"][0])
        metrics = json.loads(c.ctl("-o", "json", "metrics", jid, check=0).stdout)
        self.assertEqual([int(m["step"]) for m in metrics], list(range(1, steps + 1)))
        ref = self.run_ok(1, ["--job", self.job("morph_ref", train={"steps": steps,
                                                                     "global_batch": batch})],
                          "1x1").losses()
        for m, want in zip(metrics, ref):
            self.assertLess(abs(m["loss"] - want) / abs(want), 1e-4,
                            f"step {m['step']} gen {m['generation']}: {m['loss']} vs {want}")


if __name__ == "__main__":
    main()
