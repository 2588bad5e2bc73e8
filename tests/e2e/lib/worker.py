"""The worker tests' fixtures: a corpus in a temp directory, job files, running a P x D
configuration, the held-out loss, closeness (Fixture); checkpoint directories
(CheckpointFixture)."""

import os
import shutil
import tempfile
import unittest

from lib import harness


class Fixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="varuna-test-")
        cls.data = harness.write_text_corpus(os.path.join(cls.tmp, "corpus.txt"))

    def job(self, name, **kw):
        return harness.job_yaml(os.path.join(self.tmp, name + ".yaml"), self.data, **kw)

    def run_config(self, job, stages, replicas, extra=(), **kw):
        res = harness.run_workers(stages * replicas,
                                  ["--job", job, "--stage_to_rank_map",
                                   harness.stage_map(stages, replicas), *extra], **kw)
        self.assertTrue(res.ok, f"P={stages} D={replicas} failed: {res.returncodes}\n" +
                        "\n".join(o[-2000:] for o in res.outputs))
        return res

    @staticmethod
    def eval_loss(res):
        """The held-out loss every rank logs at the end (must agree on all ranks)."""
        found = set()
        for out in res.outputs:
            for line in out.splitlines():
                if "eval_loss=" in line:
                    found.add(float(line.rsplit("eval_loss=", 1)[1].split()[0]))
        assert len(found) >= 1, "no eval_loss logged"
        return found

    def assertClose(self, got, want, rel, what):
        self.assertEqual(len(got), len(want), what)
        for i, (g, w) in enumerate(zip(got, want)):
            self.assertLessEqual(abs(g - w), rel * abs(w), f"{what}: step {i + 1}: {g} vs {w}")


class CheckpointFixture(Fixture):
    def ckpt_job(self, name, ckpt_dir, every, steps, model=None, train=None):
        extra = f"checkpoint: {{dir: {ckpt_dir}, every_steps: {every}}}\n"
        return self.job(name, model=model, train={"steps": steps, **(train or {})}, extra=extra)

    def copy_ckpt(self, src_dir, step, name):
        dst = os.path.join(self.tmp, name)
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(dst)
        for s in ([step] if isinstance(step, int) else step):
            shutil.copytree(os.path.join(src_dir, f"varuna_ckpt_{s}"),
                            os.path.join(dst, f"varuna_ckpt_{s}"))
        return dst
