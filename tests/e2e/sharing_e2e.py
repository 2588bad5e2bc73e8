"""A shared cluster on real processes (docs/operations.md "Sharing a cluster"): a manager with a
`sharing:` block and three agents of two slots, with tokens for alice, bob, carol and an admin.
  - alice's `low` elastic job holds all six slots; bob submits a `high` job of a fixed 2 x 2
    shape: alice's job shrinks in place to 2 slots within 10 s and bob's starts; when bob's
    ends, alice's grows back to 6 with no command; it finishes with every step once and the
    losses of an uninterrupted one-process run (1e-4). Bob's fixed job is never resized.
  - alice's and bob's `normal` elastic jobs converge to three slots each.
  - alice's job that cannot shrink far enough is evicted (checkpoint, PENDING, first in the
    queue: `varunactl queue`) and resumes when bob's ends, losing nothing.
  - carol, over her quota, waits with the reason shown.
  - bad input: an unknown class, and a class above normal from a user who may not use it."""

import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib.cluster import Cluster, wait_for  # noqa: E402
from lib.jobs import MORPH_CONFIG, STEPS, MorphChecks, write_morph_job  # noqa: E402
from lib.main import main  # noqa: E402

TOKENS = {"bob": "bob-token-0123456789ab", "carol": "carol-token-0123456789",
          "ops": "ops-token-0123456789abc"}
SHARING = ("sharing:\n  period_s: 2\n  min_interval_s: 5\n  morph_cost_s: 0.1\n"
           "  users: {carol: {quota_slots: 2}}\n  submit_above_normal: [bob]\n")
# Steps last long enough for the events (VARUNA_STEP_MIN_MS).
def pace(ms):
    return f"env: {{VARUNA_STEP_MIN_MS: '{ms}'}}\n"


class SharingTest(MorphChecks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The cluster's own token is alice's (a user: the file has an admin line, ops).
        cls.c = Cluster(agents=3, slots=2, secure=True, manager_config=MORPH_CONFIG + SHARING,
                        tokens=[f"{n} {t} - {'admin' if n == 'ops' else 'user'}"
                                for n, t in TOKENS.items()])

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def as_user(self, user, *args, check=None):
        c = self.c
        return c.ctl("--tls_ca", os.path.join(c.certs, "ca.pem"), "--token", TOKENS[user], *args,
                     check=check, auth=False)

    def submit_as(self, user, job):
        r = self.as_user(user, "-o", "json", "submit", job, check=0)
        return json.loads(r.stdout)["id"]

    def status(self, job_id):
        """Any user's job, read with the admin token."""
        return json.loads(self.as_user("ops", "-o", "json", "status", job_id, check=0).stdout)

    def job(self, name, steps, extra, stages=2, replicas=None, ms=150):
        return write_morph_job(self.c, name, steps=steps, stages=stages, extra=pace(ms) + extra,
                               extra_parallel={"replicas": replicas} if replicas else None)

    def test_1_a_higher_class_makes_room_in_place_and_gives_it_back(self):
        c = self.c
        a = self.submit(self.job("a.yaml", STEPS, "priority: low\nresources: {min_slots: 2}\n",
                                 ms=300))
        st = self.running_at(a, 5)
        self.assertEqual(st["slots"], 6, st)
        b = self.submit_as("bob", self.job("b.yaml", 30, "priority: high\n", replicas=2))
        t0 = time.time()
        wait_for(lambda: c.status(a)["slots"] == 2 and c.status(a)["state"] == "RUNNING", 60,
                 "alice's job to shrink to 2 slots")
        shrunk_s = time.time() - t0
        self.assertLess(shrunk_s, 10, f"shrank after {shrunk_s:.1f} s")
        wait_for(lambda: self.status(b)["state"] in ("RUNNING", "SUCCEEDED"), 60,
                 "bob's job to start")
        wait_for(lambda: self.status(b)["state"] == "SUCCEEDED", 180, "bob's job to end")
        wait_for(lambda: c.status(a)["slots"] == 6 or c.status(a)["state"] != "RUNNING" and
                 c.status(a)["state"] != "RECONFIGURING", 60, "alice's job to grow back")
        st, _ = self.finish(a)
        kinds = [m.get("kind") for m in st.get("morphs", [])]
        self.assertIn("resize", kinds, st)
        self.assertEqual([m.get("to", {}).get("replicas") for m in st["morphs"]][-1], 3, st)
        for m in st["morphs"]:
            self.assertEqual(int(m.get("steps_lost", 0)), 0, m)
        bst = self.status(b)
        self.assertEqual(bst.get("morphs", []), [], "bob's fixed job was never resized")
        self.assertEqual(bst["slots"], 4, bst)
        events = self.as_user("ops", "-o", "json", "events", check=0).stdout
        self.assertIn("job_resized", events)
        print(f"shrank in {shrunk_s:.1f} s; morphs of alice's job: "
              f"{[(m.get('kind'), m.get('reason')) for m in st['morphs']]}", file=sys.stderr)

    def test_2_eviction_loses_nothing(self):
        # Alice's low job needs at least 4 slots; bob's high 2 x 2 needs 4 of the 6: alice's
        # job is evicted (checkpoint, back to PENDING), waits first in its class, and resumes
        # from its checkpoint when bob's ends, with every step once and the reference losses.
        c = self.c
        a = self.submit(self.job("ea.yaml", STEPS, "priority: low\nresources: {min_slots: 4}\n",
                                 ms=300))
        self.running_at(a, 5)
        b = self.submit_as("bob", self.job("eb.yaml", 40, "priority: high\n", replicas=2))
        wait_for(lambda: c.status(a)["state"] == "PENDING", 60, "alice's job to be evicted")
        wait_for(lambda: self.status(b)["state"] != "PENDING", 60, "bob's job to start")
        wait_for(lambda: c.status(a)["queue_position"] == 1, 10, "alice's job first in the queue")
        queue = json.loads(self.as_user("ops", "-o", "json", "queue", check=0).stdout)
        self.assertEqual([j["id"] for j in queue][:1], [a], queue)
        self.assertEqual(queue[0]["queue_position"], 1, queue)
        table = self.as_user("ops", "queue", check=0).stdout
        self.assertIn("WHY IT WAITS", table)
        print(f"queue while evicted:\n{table}", file=sys.stderr)
        listing = self.as_user("ops", "list", check=0).stdout
        self.assertIn("slots by user", listing)
        wait_for(lambda: self.status(b)["state"] == "SUCCEEDED", 180, "bob's job to end")
        st, _ = self.finish(a)
        kinds = [m.get("kind") for m in st["morphs"]]
        self.assertIn("evict", kinds, st)
        events = self.as_user("ops", "-o", "json", "events", check=0).stdout
        self.assertIn("job_evicted", events)

    def test_3_equal_users_split_equally_and_a_user_over_quota_waits(self):
        c = self.c
        # Data-parallel jobs (1 stage) whose batch of 24 divides by 3.
        a = self.submit(self.job("fa.yaml", 2000, "", stages=1))
        wait_for(lambda: c.status(a)["slots"] == 6 and c.status(a)["state"] == "RUNNING", 120,
                 "alice's job on 6 slots")
        b = self.submit_as("bob", self.job("fb.yaml", 2000, "", stages=1))
        wait_for(lambda: c.status(a)["slots"] == 3 and self.status(b)["slots"] == 3 and
                 self.status(b)["state"] == "RUNNING", 90, "a 3 + 3 split")
        q = self.submit_as("carol", self.job("q.yaml", 20, "resources: {min_slots: 4}\n",
                                             stages=1))
        wait_for(lambda: "quota" in self.status(q)["reason"], 30, "carol's reason")
        self.assertEqual(self.status(q)["state"], "PENDING")
        print(f"carol waits: {self.status(q)['reason']}", file=sys.stderr)
        for j in (a, b, q):
            self.as_user("ops", "cancel", j, check=0)
        wait_for(lambda: c.workers() == [], 60, "no worker left")

    def test_4_bad_priorities_are_refused_by_name(self):
        r = self.as_user("carol", "submit", self.job("x.yaml", 5, "priority: urgent\n"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("priority 'urgent' is not a class of this cluster", r.stderr)
        r = self.as_user("carol", "submit", self.job("y.yaml", 5, "priority: high\n"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("may not submit priority 'high'", r.stderr)


if __name__ == "__main__":
    main()
