"""Issue 47's cases for several managers, tried on a real 3-member etcd (tests/e2e/ha_e2e.py's
HaCluster on scripts/etcd_test_cluster.sh): bad data in etcd, which any manager of the group
writes and every manager reads, must not stop the group from leading nor crash a manager.

CorruptRecordTest (fix ef34715, Note [Records on load] in manager/jobs/job_table.cc): while
a job trains, every manager is SIGKILLed and etcd is damaged under the manager's prefix
(/varuna/): the job's record is bytes that do not parse, a record that parses names an id
that is not its sequence number, the agent's node record, an event and a profile do not
parse. Before the fix the first of these stopped every manager from taking over (exit 75,
restarted, again: a restart loop). Now a manager leads and stays up, the job is FAILED with
the record's key and the problem as its reason (so is the misplaced record, under its
number), its workers are stopped, the agent registers again, a new job runs to SUCCEEDED,
and the next leader after a SIGKILL loads the job as it was saved, FAILED with that reason.

LeaderAddressTest (Note [Leader address] in manager/api/manager_role.cc): the leader key
(/varuna/leader, whose value is the leader's address) holds a value that is no address
(non-ASCII, a newline, a space), put there with etcdctl while no manager runs, and one manager
starts: it stands by and names that leader in `varunactl managers`. Before the fix it passed
the value into gRPC metadata, and on the first two aborted (SIGABRT) on every call, its agent's
heartbeats included. Now each call gets UNAVAILABLE (varunactl exits 3) saying the leader's
address is unusable, the manager lives and its log shows no abort; when the key goes, it leads.

Without etcd-server (etcd and etcdctl) every case skips (exit 77).
"""

import json
import os
import shutil
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from ha_e2e import HaCluster, wait_for, write_job  # noqa: E402
from lib.main import main  # noqa: E402

PREFIX = "/varuna/"  # the managers' etcd_prefix (its default, manager/manager_config.h)
# Wire type 7 in the first tag: no protobuf message parses it.
GARBAGE = b"\xffnot a record (tests/hostile/ha_hostile_e2e.py)"
BAD_LEADERS = ("h\u00f6st:7070", "evil\nhost:7070", "a b:7070")
CRASH_SIGNS = ("SIGABRT", "Check failed", "assertion failed", "*** Aborted at")
EXIT_UNREACHABLE = 3  # varunactl's exit status for UNAVAILABLE (ctl/varunactl.h)


def etcdctl(c, *args):
    """etcdctl (v3 API) on the cluster's etcd; values may be bytes."""
    r = subprocess.run(["etcdctl", "--endpoints", c.endpoints, *args],
                       env=dict(c.etcd_env, ETCDCTL_API="3"), capture_output=True, timeout=30)
    if r.returncode != 0:
        raise AssertionError(f"etcdctl {args[:2]} exited {r.returncode}: {r.stderr!r}")
    return r.stdout


def varint(n):
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append(n & 0x7F | 0x80)
        n >>= 7


def field(number, value):
    """One protobuf field: an int as a varint, bytes length-delimited."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def misplaced_record(seq):
    """A JobRecord (proto/varuna/v1/control.proto) that parses, a RUNNING job with sequence
    number `seq` whose id 'seventy' is not that number: JobRecord{info: JobInfo{id: 1,
    name: 2, state: 3}, seq: 4}. No byte of it is NUL (it goes on etcdctl's command line)."""
    info = field(1, b"seventy") + field(2, b"bogus") + field(3, 3)
    return field(1, info) + field(4, seq)


def workers_of(c, job_id):
    """Pids of the job's worker processes under this cluster's agents (a worker's argv holds
    --job WORK_DIR/jobs/ID/genN/...)."""
    mine, job = os.path.basename(c.dir).encode(), f"/jobs/{job_id}/".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"--job\0" in cmd and mine in cmd and job in cmd:
            found.append(int(pid))
    return found


def submit(c, job):
    return json.loads(c.ctl("-o", "json", "submit", job, check=0).stdout)["id"]


class Fixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for tool in ("etcd", "etcdctl"):
            if not shutil.which(tool):
                raise unittest.SkipTest(f"etcd-server is not installed (no {tool})")

    def cluster(self, **kw):
        c = HaCluster(**kw)
        self.addCleanup(c.close)
        return c

    def wait(self, c, fn, timeout, what):
        """wait_for, with the processes' log tails when it times out."""
        try:
            return wait_for(fn, timeout, what, period=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{c.tail()}") from None

    def state_is(self, c, job_id, *states):
        return lambda: (lambda s: s if s.get("state") in states else None)(c.status(job_id))


class CorruptRecordTest(Fixture):
    def test_a_corrupt_job_record_is_quarantined_and_a_manager_still_leads(self):
        c = self.cluster(managers=2, agents=1, slots=2)
        victim = submit(c, write_job(c, "victim", 100000, replicas=1, step_min_ms=100))
        self.wait(c, lambda: c.status(victim).get("step", 0) >= 2, 180, "the victim to train")
        self.assertTrue(workers_of(c, victim), "no worker process of the victim found (has a "
                        "worker's command line changed?)")
        # No manager runs while etcd is damaged: none writes the records again meanwhile.
        for p in c.managers:
            p.kill()
        for p in c.managers:
            p.wait(timeout=30)
        misplaced = str(int(victim) + 1000)
        etcdctl(c, "put", f"{PREFIX}jobs/{victim}", GARBAGE)
        etcdctl(c, "put", f"{PREFIX}jobs/{misplaced}", misplaced_record(int(misplaced)))
        etcdctl(c, "put", f"{PREFIX}nodes/node0", GARBAGE)
        etcdctl(c, "put", f"{PREFIX}events/999999999999", GARBAGE)
        etcdctl(c, "put", f"{PREFIX}profiles/hostile", GARBAGE)
        c.revive_exited()  # what their units do

        st = self.wait(c, self.state_is(c, victim, "FAILED"), 60,
                       "a leader to load the state, the victim quarantined FAILED")
        self.assertIn(f"{PREFIX}jobs/{victim}", st["reason"], st)
        self.assertIn("does not parse", st["reason"], st)
        bogus = c.status(misplaced)
        self.assertEqual(bogus.get("state"), "FAILED", bogus)
        self.assertIn("'seventy'", bogus["reason"], bogus)
        self.assertIn("is not its sequence number", bogus["reason"], bogus)
        ids = [j["id"] for j in json.loads(c.ctl("-o", "json", "list", check=0).stdout)]
        self.assertEqual(ids.count(victim), 1, ids)
        self.assertEqual(ids.count(misplaced), 1, ids)
        self.assertNotIn("seventy", ids)
        time.sleep(3)  # a manager in a restart loop would have exited by now
        self.assertEqual([p.poll() for p in c.managers], [None, None], c.tail())

        # The node record was dropped: the agent registers again, and the quarantined job's
        # workers are stopped like any failed job's.
        self.wait(c, lambda: [n["state"] for n in c.nodes()] == ["ALIVE"], 60,
                  "the agent to register again")
        self.wait(c, lambda: not workers_of(c, victim), 60, "the victim's workers to stop")
        after = submit(c, write_job(c, "after", 3, replicas=1))
        done = self.wait(c, self.state_is(c, after, "SUCCEEDED", "FAILED"), 180, "the new job")
        self.assertEqual(done["state"], "SUCCEEDED", done)

        # The quarantine was saved: the next leader loads the victim as a plain FAILED job (its
        # spec is in etcd); the misplaced record, which has none, is FAILED again.
        old = self.wait(c, c.leader, 30, "the leader")
        c.managers[old - 1].kill()
        c.managers[old - 1].wait(timeout=30)
        self.wait(c, lambda: (lambda n: n if n and n != old else None)(c.leader()), 30,
                  "the other manager to lead")
        again = self.wait(c, self.state_is(c, victim, "FAILED"), 30, "the victim after takeover")
        self.assertEqual(again["reason"], st["reason"])
        self.assertEqual(c.status(misplaced).get("state"), "FAILED")
        self.assertEqual(c.status(after).get("state"), "SUCCEEDED")


class LeaderAddressTest(Fixture):
    def test_a_standby_given_an_unusable_leader_address_answers_and_lives(self):
        c = self.cluster(managers=1, agents=1)
        me = c.addresses[0]
        c.managers[0].terminate()  # a clean stop revokes its lease: the leader key goes
        c.managers[0].wait(timeout=30)
        log = os.path.join(c.dir, "manager0.log")
        start = os.path.getsize(log)
        for k, bad in enumerate(BAD_LEADERS):
            # A put without a lease: the key stays until it is deleted, whoever campaigns.
            etcdctl(c, "put", f"{PREFIX}leader", bad.encode())
            if k == 0:
                c.start_manager(0)
            self.wait(c, lambda: c.managers_view(me).get("leader") == bad, 30,
                      f"the manager to stand by for the leader {bad!r}")
            for args in (["list"], ["status", "1"], ["nodes"]):
                r = c.ctl(*args, manager=me, timeout=30)
                self.assertEqual(r.returncode, EXIT_UNREACHABLE,
                                 f"{bad!r} {args}: {r.stdout}{r.stderr}\n{c.tail()}")
                self.assertIn("unusable", r.stderr, f"{bad!r} {args}\n{c.tail()}")
            time.sleep(1)  # the agent's heartbeats (every 0.5 s) reach the standby too
            self.assertIsNone(c.managers[0].poll(), f"{bad!r}: the standby died\n{c.tail()}")
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        for sign in CRASH_SIGNS:
            self.assertFalse(sign in text, f"{sign!r} in manager0.log\n{c.tail()}")

        # The bad leader gone, the standby is elected, loads the state and serves.
        etcdctl(c, "del", f"{PREFIX}leader")
        self.wait(c, lambda: c.managers_view(me).get("leader") == me, 30, "the manager to lead")
        self.wait(c, lambda: c.ctl("list", manager=me, timeout=10).returncode == 0, 30,
                  "varunactl list to answer")
        self.wait(c, lambda: [n["state"] for n in c.nodes()] == ["ALIVE"], 30,
                  "the agent to be ALIVE again")


if __name__ == "__main__":
    main()
