"""Tenants and peers, tried as a hostile user would (docs/operations.md "Security"): one case
of every class of issue 23 replayed against the real binaries of one cluster (mutual TLS, a
tokens file, HTTPS with tokens, agents running workers as the unprivileged user 'varuna')
while a victim job trains. After every attack the victim is still RUNNING in its first
generation and making steps, and every node is ALIVE.

Classes: amplification (a YAML alias bomb), sizes (a job whose program floods its progress
file with huge step lines), one authentication model (HTTP API without a token), the HTTP
server (multi-range requests, slow heads against /healthz), identity (workers are not root; a
token's user an agent does not allow), notices (an Azure event for another VM; a metadata
server that never answers does not hold the agent's shutdown), clients and names (escape
codes in a job name, a token with a newline), metrics (counters at 0 from the job's start),
retention (a per-user cap on pending jobs); and issue 47's: tenants reaching each other's jobs,
roles (a user reaches only her own jobs and no node; the tokens file has an admin), links a job
plants for the root agent (a progress file; profile.json in ProfileLinkTest), an agent whose
workers cannot use its directory, a launch every rank fails, the manager opening tenants'
files, a non-address --advertise, job ids after a state reset (StateResetTest); bad records in
etcd and a standby's unusable leader address are tests/hostile/ha_hostile_e2e.py's. Exits 77 (a ctest skip) when it cannot run here:
not root, or no user 'varuna' (scripts/install_deps.sh makes it)."""

import http.server
import json
import os
import pwd
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from lib.cluster import AGENT, Cluster, CTL, MANAGER, wait_for, write_job  # noqa: E402
from lib.harness import free_port  # noqa: E402

BOB = "bob-token-0123456789abcdef"  # maps to a Unix user no agent allows
MALLORY = "mallory-token-0123456789ab"  # another tenant: a uid of her own
OPS = "ops-token-0123456789abcdef01"  # the cluster's admin (alice, bob, mallory are users)

# What a tenant's job tries against every other job's worker on its node: each must fail.
ATTACK = r"""
import errno, json, os, sys
me = os.getuid()
found, tried = [], {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\0")
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        continue
    if uid == me or not cmd[0].endswith(b"varuna-worker") or b"--job" not in cmd:
        continue
    pid = int(pid)
    spec = cmd[cmd.index(b"--job") + 1].decode()
    gen = os.path.dirname(spec)
    job = os.path.dirname(gen)
    found.append(pid)
    def attempt(name, fn):
        try:
            fn()
            tried[f"{pid} {name}"] = "ALLOWED"
        except OSError as e:
            tried[f"{pid} {name}"] = errno.errorcode.get(e.errno, str(e.errno))
    attempt("read its spec", lambda: open(spec).read())
    attempt("list its generation", lambda: os.listdir(gen))
    attempt("list its job directory", lambda: os.listdir(job))
    attempt("read its log", lambda: open(os.path.join(job, "rank0.log")).read())
    attempt("write its directory", lambda: open(os.path.join(gen, "planted"), "w"))
    attempt("append to its progress file",
            lambda: open(os.path.join(gen, "progress.rank0"), "a").write('{"step": 99999}\n'))
    attempt("read its environment", lambda: open(f"/proc/{pid}/environ", "rb").read())
    attempt("read its memory", lambda: open(f"/proc/{pid}/mem", "rb").read(1))
    attempt("open its control pipe",
            lambda: os.open(f"/proc/{pid}/fd/3", os.O_WRONLY | os.O_NONBLOCK))
    attempt("open the old control FIFO",
            lambda: os.open(os.path.join(gen, "control.rank0"), os.O_WRONLY | os.O_NONBLOCK))
    attempt("signal it", lambda: os.kill(pid, 0))
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump({"uid": me, "victims": found, "tried": tried}, f)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
"""


def tenant_uid(name, first=1900000000, last=1900999999):
    """The manager's uid for a token name without a Unix user (common/launch/tenant_uid.cc)."""
    h = 14695981039346656037
    for c in name.encode():
        h = ((h ^ c) * 1099511628211) % (1 << 64)
    return first + h % (last - first + 1)


def skip_reason():
    if os.geteuid() != 0:
        return "needs root (agents switch workers to the user 'varuna')"
    try:
        pwd.getpwnam("varuna")
    except KeyError:
        return "no user 'varuna' (scripts/install_deps.sh makes it)"
    return None


class Metadata(http.server.BaseHTTPRequestHandler):
    """A cloud metadata endpoint: an Azure Scheduled Event for another VM, or (mode "hang")
    a server that accepts and never answers."""
    mode = "other_vm"

    def do_GET(self):  # noqa: N802
        if Metadata.mode == "hang":
            time.sleep(30)
            return
        body = json.dumps({"DocumentIncarnation": 1, "Events": [{
            "EventId": "e1", "EventType": "Preempt", "ResourceType": "VirtualMachine",
            "Resources": ["some-other-vm"], "EventStatus": "Scheduled",
            "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class HostileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.meta = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
        cls.meta.daemon_threads = True
        threading.Thread(target=cls.meta.serve_forever, daemon=True).start()
        cls.http = free_port()
        cls.c = Cluster(
            agents=2, slots=4, secure=True, worker_user="varuna",
            tokens=[f"bob {BOB} bob", f"mallory {MALLORY}", f"ops {OPS} - admin"],
            manager_config=(f"http_listen: 127.0.0.1:{cls.http}\nmax_pending_jobs_per_user: 3\n"
                            ),
            agent_args={"node1": ["--preemption_notice_url",
                                  f"http://127.0.0.1:{cls.meta.server_address[1]}/metadata",
                                  "--cloud_vm_name", "this-vm"]})
        try:
            cls.base = f"https://127.0.0.1:{cls.http}"
            cls.ca = os.path.join(cls.c.certs, "ca.pem")
            job = write_job(cls.c, "victim.yaml", steps=100000, parallel={"replicas": 2})
            cls.victim = json.loads(cls.c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
            wait_for(lambda: cls.c.status(cls.victim)["step"] >= 2, 180, "the victim to train")
        except BaseException:
            print(cls.c.tail(), file=sys.stderr)
            cls.c.close()
            cls.meta.shutdown()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.meta.shutdown()

    # ---- helpers -----------------------------------------------------------------------

    def get(self, path, token=None, headers=None, timeout=10):
        h = dict(headers or {})
        if token:
            h["Authorization"] = f"Bearer {token}"
        ctx = ssl.create_default_context(cafile=self.ca)
        try:
            with urllib.request.urlopen(urllib.request.Request(self.base + path, headers=h),
                                        timeout=timeout, context=ctx) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def assert_victim_unharmed(self):
        before = self.c.status(self.victim)["step"]
        wait_for(lambda: self.c.status(self.victim)["step"] > before, 60,
                 "the victim to keep making steps")
        st = self.c.status(self.victim)
        self.assertEqual(st["state"], "RUNNING", st)
        self.assertEqual(st["generation"], 1, st)
        self.assertEqual(sorted(n["state"] for n in self.c.nodes()), ["ALIVE", "ALIVE"])

    def submit_text(self, text, token):
        path = os.path.join(self.c.dir, f"spec-{time.monotonic_ns()}.yaml")
        with open(path, "w") as f:
            f.write(text)
        return subprocess.run([CTL, "--manager", self.c.address, "--tls_ca", self.ca, "--token",
                               token, "submit", path], capture_output=True, text=True,
                              timeout=120)

    # ---- the classes -------------------------------------------------------------------

    def test_amplification_an_alias_bomb_is_refused_fast(self):
        text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        for i in range(1, 8):
            text += f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 10) + "]\n"
        text += "parallel: {pipelines: *h}\n"
        t0 = time.monotonic()
        r = self.submit_text(text, token=self.c.token)
        took = time.monotonic() - t0
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("alias", (r.stdout + r.stderr).lower())
        self.assertLess(took, 10)
        self.assert_victim_unharmed()

    def test_sizes_a_progress_flood_never_wedges_a_node(self):
        # Step lines with 2,000-entry per-stage lists (8 KB each), 400 of them in a few
        # seconds: 3 MB of step records between two heartbeats, over the 2 MiB budget.
        stages = ",".join(["0.5"] * 2000)
        script = os.path.join(self.c.dir, "flood.sh")
        with open(script, "w") as f:
            f.write("i=0\nwhile [ $i -lt 400 ]; do i=$((i+1))\n"
                    f"echo '{{\"step\": '$i', \"loss\": 1, \"stage_busy_s\": [{stages}]}}' "
                    '>> "$VARUNA_PROGRESS_FILE"\ndone\nsleep 60\n')
        os.chmod(script, 0o755)
        job = write_job(self.c, "flood.yaml", steps=1000, parallel={"stages": 1, "replicas": 1},
                        extra=f"entrypoint: [/bin/sh, {script}]\n")
        flood = json.loads(self.c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        try:
            wait_for(lambda: self.c.status(flood)["step"] >= 100, 90, "the flood's steps")
            self.assertEqual(sorted(n["state"] for n in self.c.nodes()), ["ALIVE", "ALIVE"])
            r = self.c.ctl("-o", "json", "metrics", flood, check=None)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assert_victim_unharmed()
        finally:
            self.c.ctl("cancel", flood, check=None)

    def test_one_authentication_model_for_http(self):
        for path in ("/api/v1/jobs", f"/api/v1/jobs/{self.victim}/logs", "/metrics"):
            status, body = self.get(path)
            self.assertEqual(status, 401, path)
            self.assertNotIn(self.victim.encode(), body)
        self.assertEqual(self.get("/api/v1/jobs", token=self.c.token)[0], 200)
        self.assertEqual(self.get("/healthz")[0], 200)

    def test_http_server_ranges_and_slow_heads(self):
        status, whole = self.get("/app.js")
        self.assertEqual(status, 200)
        ranges = "bytes=" + ",".join(["0-"] * 400)
        status, body = self.get("/app.js", headers={"Range": ranges})
        self.assertEqual((status, len(body)), (200, len(whole)))  # once, not 400 times
        slow = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", self.http))
            s.sendall(b"\x16\x03\x01")  # a TLS record header, then nothing
            slow.append(s)
        try:
            t0 = time.monotonic()
            self.assertEqual(self.get("/healthz", timeout=5)[0], 200)
            self.assertLess(time.monotonic() - t0, 2)
        finally:
            for s in slow:
                s.close()

    def ctl_as(self, token, *args):
        return subprocess.run([CTL, "--manager", self.c.address, "--tls_ca", self.ca, "--token",
                               token, *args], capture_output=True, text=True, timeout=60)

    def test_roles_a_user_reaches_only_her_own_jobs_and_no_node(self):
        """Issue 47: any token was an admin (bob cancelled alice's job and read her logs; alice
        drained a node). With an admin line in the tokens file, mallory (a user) sees the
        victim's summary but cannot cancel it, read its logs, metrics, events or the cluster's
        /metrics, nor drain a node; the admin can. Every RPC and path by role is
        tests/manager/api/roles_test.cc's table."""
        listing = self.ctl_as(MALLORY, "list")
        self.assertEqual(listing.returncode, 0, listing.stderr)
        self.assertIn(self.victim, listing.stdout)  # as squeue shows every job
        for args in (("cancel", self.victim), ("logs", self.victim), ("metrics", self.victim),
                     ("events", self.victim), ("drain", "node0"), ("preempt", "node0")):
            r = self.ctl_as(MALLORY, *args)
            self.assertNotEqual(r.returncode, 0, (args, r.stdout))
            self.assertRegex(r.stderr, r"submitted by 'alice'|admin role", (args, r.stderr))
        for path in (f"/api/v1/jobs/{self.victim}/logs", f"/api/v1/jobs/{self.victim}/metrics",
                     f"/api/v1/jobs/{self.victim}/events", "/metrics"):
            status, body = self.get(path, token=MALLORY)
            self.assertEqual(status, 403, (path, body[:200]))
            self.assertNotIn(b"varuna_job_loss", body)
        self.assertEqual(self.get("/metrics", token=self.c.token)[0], 403)  # alice: a user too
        self.assertEqual(self.get(f"/api/v1/jobs/{self.victim}/logs", token=self.c.token)[0], 200)
        # The admin may (a node the cluster lacks, so the victim is not moved): refused for
        # what it names, not for the role.
        r = self.ctl_as(OPS, "drain", "node9")
        self.assertIn("node9", r.stderr)
        self.assertNotIn("role", r.stderr)
        self.assert_victim_unharmed()

    def test_identity_workers_are_not_root_and_token_users_need_the_agents_consent(self):
        uids = set()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
                with open(f"/proc/{pid}/status") as f:
                    uid = int(re.search(r"^Uid:\s+(\d+)", f.read(), re.M).group(1))
            except (OSError, AttributeError):
                continue
            if cmd and cmd[0].endswith(b"varuna-worker") and self.c.dir.encode() in b" ".join(cmd):
                uids.add(uid)
        # alice's token names no Unix user: her jobs run as her own uid, not the agents' shared
        # worker user (docs/operations.md "Who workers run as").
        self.assertEqual(uids, {tenant_uid("alice")})
        job = write_job(self.c, "bobs.yaml", steps=2, parallel={"stages": 1, "replicas": 1})
        r = subprocess.run([CTL, "--manager", self.c.address, "--tls_ca", self.ca, "--token", BOB,
                            "-o", "json", "submit", job], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        bobs = json.loads(r.stdout)["id"]
        wait_for(lambda: self.c.status(bobs)["state"] == "FAILED", 90, "bob's job to be refused")
        # Bob reads his own job's reason (alice, a user, sees only its summary).
        st = json.loads(self.ctl_as(BOB, "-o", "json", "status", bobs).stdout)
        self.assertIn("allowed_worker_users", st.get("reason", ""))
        self.assert_victim_unharmed()

    def test_tenants_cannot_reach_each_others_jobs(self):
        """Issue 47: one job read another's spec (its env: secrets), memory and log, wrote into
        its directory and progress file, and forged commands through its control FIFO. Now
        every tenant has a uid of its own, a job's directory is its uid's alone, and commands
        go through a pipe no path leads to."""
        script = os.path.join(self.c.dir, "attack.py")
        with open(script, "w") as f:
            f.write(ATTACK)
        out = os.path.join(self.c.dir, "attack.json")
        job = write_job(self.c, "attack.yaml", steps=1, parallel={"stages": 1, "replicas": 1},
                        extra=f"entrypoint: [/usr/bin/python3, {script}, {out}]\n")
        r = subprocess.run([CTL, "--manager", self.c.address, "--tls_ca", self.ca, "--token",
                            MALLORY, "-o", "json", "submit", job], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        attack = json.loads(r.stdout)["id"]
        try:
            wait_for(lambda: os.path.exists(out), 90, "the attack to run")
        except AssertionError:
            raise AssertionError(f"{self.c.status(attack)}\n"
                                 f"{self.c.ctl('logs', attack, check=None).stdout}")
        with open(out) as f:
            result = json.load(f)
        self.assertEqual(result["uid"], tenant_uid("mallory"))
        self.assertNotEqual(result["uid"], tenant_uid("alice"))
        self.assertTrue(result["victims"], "the victim's workers run on every node")
        allowed = [k for k, v in result["tried"].items() if v == "ALLOWED"]
        self.assertEqual(allowed, [], result["tried"])
        self.assert_victim_unharmed()

    def test_failures_an_agent_its_workers_cannot_use_refuses_to_start(self):
        """Issue 47: a root agent under a private directory made every rank exit 126 with no
        reason and the job morph 20 times. Now the agent refuses to start, naming both."""
        private = tempfile.mkdtemp(prefix="varuna-private-")  # 0700, root's
        try:
            work = os.path.join(private, "work")
            r = subprocess.run([AGENT, "--manager", self.c.address, "--listen", "127.0.0.1:0",
                                "--name", "strayed", "--work_dir", work, "--worker_user",
                                "varuna"], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"the worker user varuna (uid {pwd.getpwnam('varuna').pw_uid}) "
                          f"cannot enter {work}: Permission denied", r.stderr)
        finally:
            shutil.rmtree(private, ignore_errors=True)

    def test_failures_a_launch_every_rank_fails_ends_the_job_with_its_reason(self):
        """A code_dir the job's uid cannot enter: no rank starts, so the job fails at once
        with the launcher's reason instead of morphing on the same machines."""
        private = tempfile.mkdtemp(prefix="varuna-code-")  # 0700, root's
        try:
            job = write_job(self.c, "nocode.yaml", steps=5, parallel={"stages": 2},
                            extra=f"entrypoint: [/bin/true]\ncode_dir: {private}\n"
                            f"checkpoint: {{dir: {self.c.dir}/ckpt-nocode}}\n")  # it may morph
            t0 = time.monotonic()
            jid = json.loads(self.c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
            wait_for(lambda: self.c.status(jid)["state"] == "FAILED", 60, "the job to fail")
            took = time.monotonic() - t0
            st = self.c.status(jid)
            self.assertIn("no rank could start", st["reason"])
            self.assertIn(f"cannot enter the working directory {private}: Permission denied",
                          st["reason"])
            self.assertEqual(st.get("morphs", []), [], st)
            self.assertEqual(st["generation"], 1, st)
            self.assertLess(took, 60)
        finally:
            shutil.rmtree(private, ignore_errors=True)
        self.assert_victim_unharmed()

    def test_files_a_job_links_to_a_root_file_are_not_read_for_it(self):
        """Issue 47: a job made its progress file (and profile.json) a link to a file only root
        reads; the root agent read it and put its first bytes in the job's reason. Now the agent
        reads what a job wrote only as that file, owned by the job's uid (Note [Files a job
        wrote] in agent/agent.cc), and names it, never its content."""
        secret = os.path.join(self.c.dir, "root-secret")
        with open(secret, "w") as f:
            f.write('{"error": "ROOT-SECRET-MARKER"}\n')
        os.chmod(secret, 0o600)
        script = os.path.join(self.c.dir, "plant.sh")
        with open(script, "w") as f:
            f.write(f'rm -f "$VARUNA_PROGRESS_FILE"\nln -s {secret} "$VARUNA_PROGRESS_FILE"\n'
                    'sleep 4\nexit 1\n')
        os.chmod(script, 0o755)
        job = write_job(self.c, "plant.yaml", steps=5, parallel={"stages": 1, "replicas": 1},
                        extra=f"entrypoint: [/bin/sh, {script}]\n")
        jid = json.loads(self.c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]
        wait_for(lambda: self.c.status(jid)["state"] == "FAILED", 90, "the planting job to end")
        seen = json.dumps(self.c.status(jid)) + self.c.ctl("events", check=None).stdout
        self.assertNotIn("ROOT-SECRET-MARKER", seen)
        self.assertIn("exited with code 1", self.c.status(jid)["reason"])
        self.assert_victim_unharmed()

    def test_files_the_manager_opens_none_of_a_tenants(self):
        """Issue 47: the manager checked data.path and code_dir as root at submit and echoed
        fields of a config.json the tenant could not read. Now it opens no tenant's file
        (varunactl checks with the submitter's rights, the worker as the job's user)."""
        private = tempfile.mkdtemp(prefix="varuna-model-")  # 0700, root's
        try:
            with open(os.path.join(private, "config.json"), "w") as f:
                json.dump({"model_type": "llama", "hidden_size": 4096,
                           "secret_field": "ROOT-CONFIG-MARKER", "num_hidden_layers": 7777}, f)
            job = write_job(self.c, "peek.yaml", steps=1, parallel={"stages": 1, "replicas": 1})
            with open(job) as f:
                text = f.read().replace("model: {", f"model: {{init_from: {private}, ", 1)
            path = os.path.join(self.c.dir, "peek-raw.yaml")
            with open(path, "w") as f:
                f.write(text)
            r = subprocess.run([CTL, "--manager", self.c.address, "--tls_ca", self.ca, "--token",
                                MALLORY, "-o", "json", "submit", "--raw", path],
                               capture_output=True, text=True, timeout=60)
            out = r.stdout + r.stderr
            self.assertNotIn("ROOT-CONFIG-MARKER", out)
            self.assertNotIn("7777", out)
            if r.returncode == 0:  # the worker, as mallory's uid, cannot read it: bad input
                jid = json.loads(r.stdout)["id"]
                wait_for(lambda: self.c.status(jid)["state"] == "FAILED", 90, "the job to fail")
                self.assertNotIn("7777", json.dumps(self.c.status(jid)))
        finally:
            shutil.rmtree(private, ignore_errors=True)
        self.assert_victim_unharmed()

    def test_ha_an_advertised_address_that_is_no_address_stops_the_manager(self):
        """Issue 47: a standby aborted on every call when the leader advertised a non-ASCII
        address. --advertise is checked at start (exit 2), naming the problem."""
        for bad in ("h\u00f6st:7070", "host:99999", "a b:7070"):
            state = tempfile.mkdtemp(prefix="varuna-adv-")
            try:
                r = subprocess.run([MANAGER, "--listen", "127.0.0.1:0", "--state_dir", state,
                                    "--advertise", bad], capture_output=True, text=True,
                                   timeout=30)
            finally:
                shutil.rmtree(state, ignore_errors=True)
            self.assertEqual(r.returncode, 2, (bad, r.stderr))
            self.assertIn("--advertise", r.stderr)

    def test_notices_another_vms_event_is_not_ours(self):
        time.sleep(3)  # node1's agent polls every second
        node1 = [n for n in self.c.nodes() if n["name"] == "node1"][0]
        self.assertEqual(node1["state"], "ALIVE", node1)
        self.assertFalse(node1.get("preemption"), node1)
        self.assert_victim_unharmed()

    def test_clients_and_names(self):
        job = write_job(self.c, "esc.yaml", steps=1, parallel={"stages": 1, "replicas": 1})
        with open(job) as f:
            text = f.read().replace("name: test", 'name: "evil\\e[2J\\e]0;pwned\\a"')
        r = self.submit_text(text, token=self.c.token)
        out = r.stdout + r.stderr
        if r.returncode == 0:
            listing = self.c.ctl("list", check=0).stdout
            self.assertNotIn("\x1b", listing)
        else:
            self.assertIn("name", out)
        self.assertNotIn("\x1b", out)
        r = subprocess.run([CTL, "--manager", self.c.address, "--tls_ca", self.ca,
                            "--token", "abc\ndef-0123456789", "list"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotIn(r.returncode, (0, -6, 134))  # refused, not aborted
        self.assertIn("token", r.stderr)

    def test_metrics_counters_exist_at_zero_from_the_start(self):
        status, text = self.get("/metrics", token=OPS)
        self.assertEqual(status, 200)
        self.assertIn(f'varuna_morphs_total{{job="{self.victim}",reason="lost"}} 0',
                      text.decode())

    def test_retention_pending_jobs_are_capped_per_user(self):
        # 8 ranks: more than the 4 slots the victim leaves free, so these stay PENDING.
        job = write_job(self.c, "huge.yaml", steps=1, parallel={"stages": 2, "replicas": 4})
        ids, refused = [], None
        try:
            for _ in range(4):  # the cap is 3 (alice may have others pending already)
                r = self.c.ctl("-o", "json", "submit", job, check=None)
                if r.returncode != 0:
                    refused = r
                    break
                ids.append(json.loads(r.stdout)["id"])
            self.assertIsNotNone(refused, "a 4th pending job was accepted")
            self.assertIn("max_pending_jobs_per_user", refused.stderr)
            self.assert_victim_unharmed()
        finally:
            for i in ids:
                self.c.ctl("cancel", i, check=None)

    def test_zz_shutdown_never_waits_on_a_metadata_poll(self):
        Metadata.mode = "hang"
        time.sleep(2)  # a poll is in flight, and hangs
        agent = self.c.agents["node1"]
        t0 = time.monotonic()
        agent.terminate()
        agent.wait(timeout=30)
        self.assertLess(time.monotonic() - t0, 5)


class ProfileLinkTest(unittest.TestCase):
    """Issue 47: a job planted `profile.json -> a root-only file`; the root agent read it and
    the JSON error put its first bytes in the job's reason. A tenant's process can replace
    the file between the worker's write and the agent's read (the job's uid owns the
    directory); the test makes that window as wide as it wants by stopping the agent until
    the profiling worker wrote its file and exited, then plants the link and lets the agent
    go on. Now the agent opens it with O_NOFOLLOW, as a regular file owned by the job's uid
    (Note [Files a job wrote] in agent/agent.cc), and says so without its content."""

    def test_a_profile_replaced_by_a_link_is_not_read_for_the_job(self):
        # Heartbeats missed while the agent is stopped must not make its node dead.
        c = Cluster(agents=1, slots=1, worker_user="varuna", defaults=True,
                    manager_config="heartbeat_period_s: 1\nsuspect_after_missed: 90\n"
                                   "dead_after_missed: 120\nstragglers: {policy: report}\n",
                    agent_args={"node0": ["--standby_workers=0", "--startup_probe_ms=0"]})
        agent = c.agents["node0"]
        try:
            secret = os.path.join(c.dir, "root-secret")
            with open(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write("ROOT-SECRET-MARKER not json\n")
            job = write_job(c, "prof.yaml", steps=4, parallel={"stages": 1, "replicas": 1})
            jid = json.loads(c.ctl("-o", "json", "profile", job, check=0).stdout)["id"]
            gen = os.path.realpath(os.path.join(c.dir, "node0", "jobs", jid, "gen1"))

            def worker():
                for pid in filter(str.isdigit, os.listdir("/proc")):
                    try:
                        if os.readlink(f"/proc/{pid}/cwd") == gen:
                            return int(pid)
                    except OSError:
                        pass
                return None

            pid = wait_for(worker, 60, "the profiling worker")
            agent.send_signal(signal.SIGSTOP)
            try:
                profile = os.path.join(gen, "profile.json")
                wait_for(lambda: os.path.exists(profile), 120, "the worker's profile.json")
                # Exited: a zombie of the stopped agent, or gone.
                def exited():
                    try:
                        with open(f"/proc/{pid}/stat") as f:
                            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
                    except OSError:
                        return True  # gone
                wait_for(exited, 60, "the worker to exit")
                planted = profile + ".planted"
                os.symlink(secret, planted)
                os.lchown(planted, pwd.getpwnam("varuna").pw_uid, -1)  # as the job made it
                os.rename(planted, profile)
            finally:
                agent.send_signal(signal.SIGCONT)
            st = wait_for(lambda: (lambda s: s["state"] in ("SUCCEEDED", "FAILED") and s)(
                c.status(jid)), 60, "the profile job to end")
            seen = json.dumps(st) + c.ctl("events", check=None).stdout
            self.assertNotIn("ROOT-SECRET-MARKER", seen)
            # No profile came of it: the job failed saying why (the file, not its content).
            self.assertEqual(st["state"], "FAILED", st)
            self.assertIn("'profile.json' is not a regular file", st.get("reason", ""), st)
            self.assertNotIn("profile_stored", c.ctl("events", check=None).stdout)
        finally:
            if agent.poll() is None:
                agent.send_signal(signal.SIGCONT)
            c.close()


class StateResetTest(unittest.TestCase):
    """Issue 47: after the manager lost its state (a new state_dir) or was restored from a
    backup, it handed out job ids again, and a new job appended to an older job's log on the
    agents. Ids now never fall behind the clock (Note [Job ids] in manager/jobs/job_table.cc)."""

    def test_a_job_after_a_state_reset_gets_a_new_id_and_a_fresh_log(self):
        c = Cluster(agents=1, slots=1)
        try:
            first = json.loads(c.ctl("-o", "json", "submit", write_job(
                c, "first.yaml", steps=2, parallel={"stages": 1}), check=0).stdout)["id"]
            wait_for(lambda: c.status(first)["state"] == "SUCCEEDED", 120, "the first job")
            c.manager.terminate()
            c.manager.wait(timeout=30)
            shutil.rmtree(os.path.join(c.dir, "state"))  # the state is lost
            c.start_manager()
            wait_for(lambda: [n["state"] for n in c.nodes()] == ["ALIVE"], 30, "the agent back")
            second = json.loads(c.ctl("-o", "json", "submit", write_job(
                c, "second.yaml", steps=2, parallel={"stages": 1}), check=0).stdout)["id"]
            self.assertNotEqual(second, first)
            self.assertGreater(int(second), int(first))
            wait_for(lambda: c.status(second)["state"] == "SUCCEEDED", 120, "the second job")
            log = c.ctl("logs", second, check=0).stdout
            self.assertIn(f"job {second} generation 1", log)
            self.assertNotIn(f"job {first} ", log, "the new job's log holds the old job's")
        finally:
            c.close()


if __name__ == "__main__":
    why = skip_reason()
    if why:
        print(f"SKIP: {why}")
        sys.exit(77)
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
