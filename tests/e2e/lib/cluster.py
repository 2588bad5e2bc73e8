"""A cluster of real binaries on this machine: a varuna-manager and agents as separate
processes (Cluster), varunactl, separate hosts as network namespaces on a bridge (Hosts), and
the wait every test uses."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from lib.harness import BIN_DIR, free_port, job_yaml, write_text_corpus

MANAGER = os.path.join(BIN_DIR, "varuna-manager")
AGENT = os.path.join(BIN_DIR, "varuna-agent")
CTL = os.path.join(BIN_DIR, "varunactl")
MAKE_CERTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts",
                          "make_certs.sh")


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Cluster:
    """A manager and agents as separate processes; logs under one temp dir."""

    def __init__(self, agents=2, slots=2, manager_host="127.0.0.1", agent_host=None,
                 secure=False, manager_config="", agent_args=None, worker_user=None,
                 tokens=None, port=None, defaults=False):
        """agent_host(name) -> (argv prefix, listen host) places agents elsewhere (NetnsTest).
        secure: mutual TLS (certificates from scripts/make_certs.sh) and a tokens file; ctl()
        then sends the CA and `self.token`; alice's jobs run as her tenant uid (docs/operations.md
        "Who workers run as"). worker_user: the agents' --worker_user (default: workers run as
        the agent, --allow_root_workers). tokens: extra tokens-file lines.
        defaults: the manager's and agents' own timers, standbys and probes (benchmarks), not
        the tests' short heartbeats, report-only stragglers and no standbys."""
        self.worker_user = worker_user
        self.dir = tempfile.mkdtemp(prefix="varuna-cp-")
        # Workers of another uid (a tenant's, --worker_user) read the corpus, enter the agents'
        # work_dirs and make checkpoint directories here, as in /tmp; the secrets (tokens,
        # keys) keep modes of their own.
        os.chmod(self.dir, 0o1777)
        self.certs = os.path.join(self.dir, "certs") if secure else None
        self.token = "alice-token-0123456789" if secure else None
        if secure:
            subprocess.run([MAKE_CERTS, self.certs, "varuna-manager=127.0.0.1"] +
                           [f"node{i}=127.0.0.1" for i in range(agents)], check=True,
                           stdout=subprocess.DEVNULL)
            with open(os.open(os.path.join(self.dir, "tokens"), os.O_WRONLY | os.O_CREAT, 0o600),
                      "w") as f:
                f.write(f"alice {self.token}\n" + "".join(t + "\n" for t in tokens or []))
        self.port = port or free_port()
        self.address = f"{manager_host}:{self.port}"
        self.agent_host = agent_host or (lambda name: ([], "127.0.0.1"))
        self.agent_args = agent_args or {}
        self.config = os.path.join(self.dir, "manager.yaml")
        with open(self.config, "w") as f:
            # Stragglers are reported, not acted on, unless a test asks: tests run side by side
            # on two cores, and a rank that shares its core looks slow to the detector.
            f.write(manager_config if defaults else
                    "heartbeat_period_s: 1\nsuspect_after_missed: 2\ndead_after_missed: 4\n"
                    "stop_grace_s: 3\n" + manager_config +
                    ("" if "stragglers" in manager_config else "stragglers: {policy: report}\n"))
        self.defaults = defaults
        self.manager = None
        self.agents = {}
        try:
            self.start_manager()
            for i in range(agents):
                self.start_agent(f"node{i}", slots)
            wait_for(lambda: len([n for n in self.nodes() if n["state"] == "ALIVE"]) == agents,
                     20, "agents to register")
        except BaseException:
            print(self.tail(), file=sys.stderr)  # why it failed, before the logs go
            self.close()  # no processes or temp dir left behind by a failed start
            raise

    def start_manager(self):
        with open(os.path.join(self.dir, "manager.log"), "a") as log:  # the child keeps it
            self.manager = subprocess.Popen(
                [MANAGER, "--listen", self.address, "--state_dir",
                 os.path.join(self.dir, "state"), "--config", self.config]
                + self.insecure(self.address.rsplit(":", 1)[0])
                + (self.tls_flags("varuna-manager") +
                   ["--tokens_file", os.path.join(self.dir, "tokens")] if self.certs else []),
                stdout=log, stderr=subprocess.STDOUT)

    def start_agent(self, name, slots):
        prefix, host = self.agent_host(name)
        with open(os.path.join(self.dir, f"{name}.log"), "a") as log:
            self.agents[name] = subprocess.Popen(
                prefix + [AGENT, "--manager", self.address, "--listen", f"{host}:0", "--slots",
                          str(slots), "--name", name, "--work_dir", os.path.join(self.dir, name)]
                + self.insecure(host) + (self.tls_flags(name) if self.certs else [])
                + self.worker_user_flags() + self.standby_flags(name)
                + self.agent_args.get(name, []),
                stdout=log, stderr=subprocess.STDOUT)

    def standby_flags(self, name):
        """No warm standby workers unless a test asks (agent_args): they cost CPU here."""
        args = self.agent_args.get(name, [])
        if self.defaults:
            return []
        given = any(a.startswith("--standby_workers") for a in args)
        probe = any(a.startswith("--startup_probe_ms") for a in args)
        # Nor a startup speed probe (half a second of CPU per agent) unless a test asks.
        return ([] if given else ["--standby_workers=0"]) + ([] if probe else
                                                              ["--startup_probe_ms=0"])

    def worker_user_flags(self):
        """The harness's temp dirs are root's (0700): workers run as the agent, asked for
        explicitly (tests/hostile runs them as the unprivileged user)."""
        if self.worker_user is not None:
            return ["--worker_user", self.worker_user]
        return ["--allow_root_workers"] if os.geteuid() == 0 else []

    def insecure(self, host):
        """Plaintext beyond loopback (the network-namespace hosts) must be asked for."""
        return [] if host.startswith("127.") or self.certs else ["--allow_insecure"]

    def tls_flags(self, name):
        return ["--tls_ca", os.path.join(self.certs, "ca.pem"),
                "--tls_cert", os.path.join(self.certs, name + ".pem"),
                "--tls_key", os.path.join(self.certs, name + ".key")]

    def ctl(self, *args, check=None, timeout=300, auth=True):
        extra = []
        if self.certs and auth:
            extra = ["--tls_ca", os.path.join(self.certs, "ca.pem"), "--token", self.token]
        try:
            r = subprocess.run([CTL, "--manager", self.address, *extra, *args],
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"varunactl {' '.join(args)} timed out:\n{e.stdout}\n"
                                 f"{e.stderr}\n{self.tail()}")
        if check is not None and r.returncode != check:
            raise AssertionError(f"varunactl {' '.join(args)} exited {r.returncode}:\n"
                                 f"{r.stdout}\n{r.stderr}\n{self.tail()}")
        return r

    def status(self, job_id):
        return json.loads(self.ctl("-o", "json", "status", job_id, check=0).stdout)

    def nodes(self):
        r = self.ctl("-o", "json", "nodes")
        return json.loads(r.stdout) if r.returncode == 0 else []

    def workers(self):
        """pids of worker processes this cluster started (their argv names our work dirs)."""
        r = subprocess.run(["pgrep", "-f", self.dir + r"/node[0-9]+/jobs/"], capture_output=True,
                           text=True)
        return [int(p) for p in r.stdout.split()]

    def tail(self):
        out = []
        for name in ["manager"] + list(self.agents):
            path = os.path.join(self.dir, f"{name}.log")
            if os.path.exists(path):
                with open(path) as f:
                    out.append(f"--- {name}.log\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def close(self):
        for p in list(self.agents.values()) + [self.manager]:
            if p is not None and p.poll() is None:
                p.terminate()
        # One 20 s grace for all of them, not 20 s each: an agent stopping its workers under a
        # loaded CI machine took that long once, and three in a row outlived a test's timeout.
        deadline = time.time() + 20
        for p in list(self.agents.values()) + [self.manager]:
            if p is not None:
                try:
                    p.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if os.environ.get("VARUNA_KEEP_TMP"):
            print(f"kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def write_job(cluster, name="job.yaml", steps=6, extra="", parallel=None):
    data = os.path.join(cluster.dir, "corpus.txt")
    if not os.path.exists(data):
        write_text_corpus(data)
    return job_yaml(os.path.join(cluster.dir, name), data, train={"steps": steps},
                    parallel={"stages": 2, **(parallel or {})}, extra=extra)


class Hosts:
    """Separate 'machines' on this one: one network namespace per host, each with its own
    eth0 on a bridge in the root namespace, where the manager listens on the bridge address.
    Hosts reach each other only over that bridge, so nothing works by way of loopback."""

    _count = 0

    def __init__(self, names):
        # Names unique per instance: a namespace deleted by an earlier test takes its veth
        # pair down asynchronously, so reusing that name can still find it there.
        Hosts._count += 1
        tag = f"{os.getpid() % 100000}{chr(ord('a') + Hosts._count % 26)}"
        self.subnet = f"10.213.{(os.getpid() + Hosts._count) % 250}"
        self.bridge = f"vbr{tag}"
        self.ns, self.veth, self.ip = {}, {}, {}
        self.forward_rule = None
        try:
            self._ip("link", "add", self.bridge, "type", "bridge")
            self._ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            # With br_netfilter loaded, bridged frames pass iptables' FORWARD chain, whose
            # policy may be DROP (Docker sets that): let this bridge's own traffic through.
            if shutil.which("iptables"):
                rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
                if subprocess.run(["iptables", "-I", *rule], capture_output=True).returncode == 0:
                    self.forward_rule = rule
            for i, name in enumerate(names, start=1):
                ns, veth = f"vns{tag}_{i}", f"vh{tag}_{i}"
                self._ip("netns", "add", ns)
                self.ns[name], self.veth[name], self.ip[name] = ns, veth, f"{self.subnet}.{10 + i}"
                self._ip("link", "add", veth, "type", "veth", "peer", "name", f"vn{tag}_{i}")
                self._ip("link", "set", f"vn{tag}_{i}", "netns", ns)
                self._ip("-n", ns, "link", "set", f"vn{tag}_{i}", "name", "eth0")
                self._ip("-n", ns, "addr", "add", f"{self.ip[name]}/24", "dev", "eth0")
                self._ip("-n", ns, "link", "set", "eth0", "up")
                self._ip("-n", ns, "link", "set", "lo", "up")
                self._ip("link", "set", veth, "master", self.bridge)
                self._ip("link", "set", veth, "up")
        except Exception:
            self.close()
            raise

    @staticmethod
    def _ip(*args):
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise OSError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def agent_host(self, name):
        return ["ip", "netns", "exec", self.ns[name]], self.ip[name]

    def cut(self, name, up=False):
        """Pulls (or plugs back) the host's cable: its processes live on, unreachable."""
        self._ip("link", "set", self.veth[name], "up" if up else "down")

    def close(self):
        if self.forward_rule:
            subprocess.run(["iptables", "-D", *self.forward_rule], capture_output=True)
            self.forward_rule = None
        # Deleting the host end removes the pair at once; the namespace goes after it.
        for veth in self.veth.values():
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
