"""Observability with real binaries on loopback (docs/observability.md): a manager with
--http_listen and two agents with their own /metrics, all with mutual TLS and a tokens file (so
every HTTP port speaks HTTPS and the manager's API needs the bearer token), run a 2 x 2 job that
loses a node to a drain mid-run (a morph) and finishes. Then:
  - every /api/v1 path, and /metrics, answer 401 without the token; /healthz and the
    dashboard's static files answer without it;
  - /metrics of the manager and of each agent pass `promtool check metrics` and, parsed by the
    Prometheus Python client's text-format parser, hold every metric with its labels;
  - /healthz answers; the JSON API returns what `varunactl -o json` prints;
  - the dashboard, in headless Chromium driven by playwright-core (tests/browser/dashboard.mjs),
    shows the job, one loss point per step, every rank in the stage map and the morph on the
    timeline; its screenshot is saved under $VARUNA_ARTIFACTS (default build/artifacts)."""

import json
import os
import shutil
import ssl
import subprocess
import sys
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.harness import BIN_DIR, free_port, write_text_corpus  # noqa: E402
from lib.jobs import MORPH_CONFIG, write_morph_job  # noqa: E402
from lib.main import main  # noqa: E402

BROWSER_MODULES = os.path.abspath(os.path.join(BIN_DIR, "..", "browser", "node_modules"))
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# Long enough that the drain, sent at step 5, lands while the job runs: LibTorch 2.11 runs this
# model's 2 x 2 step in about 30 ms on CI, so 40 steps ended before the drain took effect.
STEPS = 200
EVAL_EVERY = 50
PROMTOOL = shutil.which("promtool")


TLS = {"ca": None}  # the cluster CA the HTTPS clients check against (set by Scenario)


def get(url, timeout=10, token=None, headers=None):
    """GET url (with the bearer token, if given): (status, body, content type)."""
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"Bearer {token}"
    ctx = ssl.create_default_context(cafile=TLS["ca"]) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=h), timeout=timeout,
                                    context=ctx) as r:
            return r.status, r.read().decode(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers.get("Content-Type", "")


def samples(text):
    """sample name -> list of label dicts, via the Prometheus client's text-format parser."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def browser_missing():
    """Why the browser test cannot run here, or None."""
    if shutil.which("node") is None or not os.path.exists("/usr/bin/chromium"):
        return "node or /usr/bin/chromium missing (scripts/install_deps.sh installs them)"
    if not os.path.isdir(os.path.join(BROWSER_MODULES, "playwright-core")):
        return f"playwright-core not installed in {BROWSER_MODULES} (scripts/test.sh does it)"
    return None


class Scenario(unittest.TestCase):
    """The cluster run both test classes look at."""

    @classmethod
    def setUpClass(cls):
        cls.http = free_port()
        cls.agent_http = {f"node{i}": free_port() for i in range(2)}
        cls.c = Cluster(agents=2, slots=2, secure=True,
                        manager_config=MORPH_CONFIG + f"http_listen: 127.0.0.1:{cls.http}\n",
                        agent_args={n: ["--http_listen", f"127.0.0.1:{p}"]
                                    for n, p in cls.agent_http.items()})
        TLS["ca"] = os.path.join(cls.c.certs, "ca.pem")
        try:
            cls.base = f"https://127.0.0.1:{cls.http}"
            # A validation loss every EVAL_EVERY steps (on the dashboard's loss chart too).
            val = write_text_corpus(os.path.join(cls.c.dir, "val.txt"), size=20_000, seed=1)
            job = write_morph_job(cls.c, steps=STEPS, stages=2, extra=(
                f"eval: {{data: {{kind: text, path: {val}}}, every_steps: {EVAL_EVERY}, "
                "samples: 8}\n"))
            cls.job = json.loads(cls.c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
            wait_for(lambda: cls.c.status(cls.job)["step"] >= 5, 180, "step 5")
            cls.c.ctl("drain", "node1", check=0)
            at_drain = cls.c.status(cls.job)
            assert at_drain["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"), \
                f"the job ended before the drain: {at_drain}"
            wait_for(lambda: cls.c.status(cls.job)["state"] in ("SUCCEEDED", "FAILED"), 400,
                     "the job to end")
            cls.final = cls.c.status(cls.job)
        except BaseException:
            print(cls.c.tail(), file=sys.stderr)
            cls.c.close()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.c.close()


class ObservabilityTest(Scenario):
    def test_0_job_morphed_and_succeeded(self):
        self.assertEqual(self.final["state"], "SUCCEEDED", self.final)
        self.assertGreaterEqual(len(self.final["morphs"]), 1, self.final)

    def metrics_text(self):
        return get(self.base + "/metrics", token=self.c.token)[1]

    def api(self, path):
        """The JSON at /api/v1/PATH, with the token."""
        status, body, _ = get(f"{self.base}/api/v1/{path}", token=self.c.token)
        self.assertEqual(status, 200, body)
        return json.loads(body)

    def test_every_api_path_needs_the_token(self):
        paths = ["nodes", "jobs", f"jobs/{self.job}", f"jobs/{self.job}/metrics",
                 f"jobs/{self.job}/stages", f"jobs/{self.job}/events", f"jobs/{self.job}/logs",
                 "jobs/no-such-job", "bogus"]
        for path in paths:
            for token in (None, "mallory-token-0123456789"):
                status, body, _ = get(f"{self.base}/api/v1/{path}", token=token)
                self.assertEqual(status, 401, (path, token, body))
                self.assertNotIn(self.job, body)
        self.assertEqual(get(self.base + "/metrics")[0], 401)
        self.assertEqual(get(self.base + "/healthz")[0], 200)
        for asset in ("/", "/app.js", "/app.css"):
            self.assertEqual(get(self.base + asset)[0], 200, asset)
        # Plain HTTP to the HTTPS port serves nothing.
        with self.assertRaises(Exception):
            urllib.request.urlopen(f"http://127.0.0.1:{self.http}/api/v1/jobs", timeout=10)

    def test_healthz(self):
        self.assertEqual(get(self.base + "/healthz")[:2], (200, "ok\n"))
        for port in self.agent_http.values():
            self.assertEqual(get(f"https://127.0.0.1:{port}/healthz")[0], 200)

    def check_promtool(self, text):
        if PROMTOOL is None:
            self.skipTest("promtool (Debian package prometheus) is not installed")
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_manager_metrics(self):
        # Counts by state are refreshed once a second (Note [Metrics]): wait for the end.
        wait_for(lambda: any(lab.get("state") == "SUCCEEDED" and v == 1 for lab, v in
                             samples(self.metrics_text()).get("varuna_jobs", [])),
                 10, "varuna_jobs{state=SUCCEEDED} to read 1")
        status, text, ctype = get(self.base + "/metrics", token=self.c.token)
        self.assertEqual(status, 200)
        self.assertIn("text/plain", ctype)
        self.check_promtool(text)
        s = samples(text)
        job = {"job": self.job}

        def value(name, **labels):
            hits = [v for lab, v in s.get(name, []) if all(lab.get(k) == x
                                                         for k, x in labels.items())]
            self.assertTrue(hits, f"{name}{labels} missing; have {sorted(s)}")
            return hits[0]

        self.assertEqual(value("varuna_nodes", state="ALIVE") + value("varuna_nodes",
                                                                      state="DRAINING"), 2)
        self.assertEqual(value("varuna_node_slots", node="node0"), 2)
        self.assertEqual(value("varuna_jobs", state="SUCCEEDED"), 1)
        self.assertEqual(value("varuna_job_step", **job), STEPS)
        self.assertGreater(value("varuna_job_loss", **job), 0)
        self.assertGreater(value("varuna_job_eval_loss", **job), 0)
        self.assertGreater(value("varuna_job_samples_per_second", **job), 0)
        self.assertGreaterEqual(value("varuna_job_step_seconds_count", **job), STEPS)
        self.assertEqual(value("varuna_job_step_seconds_bucket", le="+Inf", **job),
                         value("varuna_job_step_seconds_count", **job))
        bubble = value("varuna_job_bubble_ratio", **job)
        self.assertTrue(0 <= bubble < 1, bubble)
        mfu = value("varuna_job_mfu", **job)
        self.assertTrue(0 < mfu <= 1, mfu)
        self.assertGreaterEqual(value("varuna_morphs_total", reason="drain", **job), 1)
        # The drain took the in-place path (the default): no stop, a regroup instead.
        for phase in ("save", "plan", "launch", "regroup", "agree", "transfer", "first_step"):
            self.assertGreaterEqual(value("varuna_morph_phase_seconds_count", phase=phase, **job),
                                    1, phase)
        self.assertGreater(value("varuna_heartbeat_latency_seconds_count", node="node0"), 0)

    def test_agent_metrics(self):
        for name, port in self.agent_http.items():
            status, text, _ = get(f"https://127.0.0.1:{port}/metrics")
            self.assertEqual(status, 200)
            self.check_promtool(text)
            s = samples(text)
            for metric in ("varuna_agent_workers", "varuna_agent_slots",
                           "varuna_agent_preemption_notice", "varuna_agent_worker_starts_total"):
                self.assertIn(metric, s, f"{name}: {sorted(s)}")
            states = {lab["state"] for lab, _ in s["varuna_agent_workers"]}
            self.assertEqual(states, {"running", "exited"})
            self.assertEqual(s["varuna_agent_slots"][0][1], 2)

    def test_json_api_is_what_varunactl_prints(self):
        status, body, ctype = get(self.base + "/api/v1/jobs/" + self.job, token=self.c.token)
        self.assertEqual(status, 200)
        self.assertIn("application/json", ctype)
        self.assertEqual(json.loads(body), self.c.status(self.job))
        jobs = self.api("jobs")["jobs"]
        self.assertEqual([j["id"] for j in jobs], [self.job])
        nodes = self.api("nodes")["nodes"]
        self.assertEqual(sorted(n["name"] for n in nodes), ["node0", "node1"])
        steps = self.api(f"jobs/{self.job}/metrics")["steps"]
        self.assertEqual([int(s["step"]) for s in steps], list(range(1, STEPS + 1)))
        self.assertTrue(all(s["stage_busy_s"] for s in steps[-5:]), steps[-1])
        stages = self.api(f"jobs/{self.job}/stages")["stages"]
        self.assertEqual([s["rank"] for s in stages], list(range(self.final["slots"])))
        self.assertTrue(all(s["layers"] and s["node"] == "node0" for s in stages), stages)
        self.assertAlmostEqual(sum(s["cost"] for s in stages if s["pipeline"] == 0), 1.0,
                               places=6)
        logs = self.api(f"jobs/{self.job}/logs?tail=5")
        self.assertEqual(len(logs["ranks"]), self.final["slots"])
        self.assertTrue(all(len(r["lines"]) <= 5 for r in logs["ranks"]))
        self.assertTrue(any(r["lines"] for r in logs["ranks"]), logs)
        # Errors are JSON naming the problem, never a crash.
        status, body, _ = get(self.base + "/api/v1/jobs/no-such-job", token=self.c.token)
        self.assertEqual(status, 404)
        self.assertIn("no-such-job", json.loads(body)["error"])
        self.assertEqual(get(self.base + "/api/v1/bogus", token=self.c.token)[0], 404)
        self.assertEqual(get(self.base + "/api/v1/jobs/%2e%2e%2fx", token=self.c.token)[0], 404)
        self.assertEqual(get(self.base + "/api/v1/jobs/no-such-job/events",
                             token=self.c.token)[0], 404)
        self.assertEqual(get(self.base + "/healthz")[0], 200)
        # Note [Host check] (common/net/http_server.cc): a page whose DNS name was rebound to
        # 127.0.0.1 is refused.
        self.assertEqual(get(self.base + "/api/v1/jobs", token=self.c.token,
                             headers={"Host": "evil.example"})[0], 403)

    def test_plain_http_beyond_loopback_needs_its_own_flag(self):
        r = subprocess.run([os.path.join(BIN_DIR, "varuna-manager"), "--listen", "127.0.0.1:0",
                            "--state_dir", os.path.join(self.c.dir, "other-state"),
                            "--http_listen", "0.0.0.0:0", "--allow_insecure"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--http_allow_remote", r.stderr)


class DashboardTest(Scenario):
    @classmethod
    def setUpClass(cls):
        if browser_missing():
            raise unittest.SkipTest(browser_missing())
        super().setUpClass()

    def test_dashboard_in_a_browser(self):
        node = shutil.which("node")
        modules = BROWSER_MODULES
        status, html, _ = get(self.base + "/")
        self.assertEqual(status, 200)
        self.assertIn("<html", html.lower())
        artifacts = os.environ.get("VARUNA_ARTIFACTS", os.path.join(BIN_DIR, "..", "artifacts"))
        os.makedirs(artifacts, exist_ok=True)
        shot = os.path.join(artifacts, "dashboard.png")
        r = subprocess.run([node, os.path.join(REPO, "tests", "browser", "dashboard.mjs"),
                            "--url", self.base + "/", "--job", self.job, "--steps", str(STEPS),
                            "--ranks", str(self.final["slots"]), "--morph", "--screenshot", shot,
                            "--evals", str(STEPS // EVAL_EVERY),
                            "--token", self.c.token, "--timeout_s", "60"],
                           capture_output=True, text=True, timeout=90,
                           env=dict(os.environ, NODE_PATH=os.path.abspath(modules)))
        if r.returncode == 77:
            self.skipTest(r.stdout.strip())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(os.path.getsize(shot) > 10000, shot)
        print(f"dashboard screenshot: {os.path.abspath(shot)}", file=sys.stderr)


if __name__ == "__main__":
    main()
