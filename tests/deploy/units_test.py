"""The systemd units in deploy/ (docs/operations.md "Least privilege"): scored offline by
`systemd-analyze security` (lower is safer; 10 is a unit with no sandboxing at all), and the
settings the design relies on are present. Exits 77 (a ctest skip) without systemd-analyze."""

import os
import re
import shutil
import subprocess
import sys
import unittest

DEPLOY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "systemd")
ANALYZE = shutil.which("systemd-analyze")


def unit(name):
    return os.path.join(DEPLOY, name)


def settings(name):
    out = {}
    with open(unit(name)) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                out.setdefault(k, []).append(v)
    return out


def exposure(name):
    r = subprocess.run([ANALYZE, "security", "--offline=yes", unit(name)], capture_output=True,
                       text=True, timeout=60, cwd="/tmp")
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
    if not m:
        raise AssertionError(r.stdout + r.stderr)
    return float(m.group(1))


class UnitsTest(unittest.TestCase):
    def test_manager_runs_sandboxed_as_its_own_user(self):
        s = settings("varuna-manager.service")
        self.assertEqual(s["User"], ["varuna-manager"])
        for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                           ("PrivateTmp", "yes"), ("CapabilityBoundingSet", "")]:
            self.assertEqual(s.get(key), [value], key)
        self.assertIn("ProtectHome", s)
        score = exposure("varuna-manager.service")
        print(f"varuna-manager.service exposure {score}", file=sys.stderr)
        self.assertLessEqual(score, 2.5)

    def test_agent_keeps_only_what_starting_workers_needs(self):
        s = settings("varuna-agent.service")
        caps = set(s["CapabilityBoundingSet"][0].split())
        self.assertTrue({"CAP_SETUID", "CAP_SETGID", "CAP_KILL"} <= caps, caps)
        self.assertNotIn("CAP_SYS_ADMIN", caps)
        self.assertEqual(s.get("NoNewPrivileges"), ["yes"])
        score = exposure("varuna-agent.service")
        print(f"varuna-agent.service exposure {score}", file=sys.stderr)
        self.assertLessEqual(score, 6.0)


if __name__ == "__main__":
    if ANALYZE is None:
        print("SKIP: no systemd-analyze")
        sys.exit(77)
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
