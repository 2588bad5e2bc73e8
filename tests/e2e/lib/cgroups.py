"""Nodes of different speeds on one machine: each agent (with its workers and its speed
probe) in a cgroup v1 cpu controller group capped at a share of a core (CappedCluster), as
the straggler test and bench/stragglers.py emulate slow machines."""

import os
import time

from lib.cluster import Cluster

CGROUP_ROOT = "/sys/fs/cgroup/cpu"
# A short CFS period spreads the cap, so a slow node is slow at every step size (with 20 ms a
# rank whose share is a few ms of work fits its quota unthrottled); the kernel's smallest
# quota is 1 ms, so the period must stay >= 1 ms / (the smallest cap in cores).
PERIOD_US = 10000
SHARE = 0.5        # each node's cap, cores: 3 x 0.5 fits a 2-core machine without contention


def cgroup_available():
    try:
        path = os.path.join(CGROUP_ROOT, f"varuna-probe-{os.getpid()}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
            f.write("-1")
        os.rmdir(path)
        return True
    except OSError:
        return False


class CappedCluster(Cluster):
    """Each agent (and so its workers and its probe) in cgroup ROOT/nodeN, capped at SHARE."""

    def __init__(self, root, period_us=PERIOD_US, **kw):
        self.root = root
        self.period_us = period_us
        self.wrapper = os.path.join(root, "capped.sh")
        super().__init__(**kw)

    def start_agent(self, name, slots):
        cg = os.path.join(self.root, name)
        os.makedirs(cg, exist_ok=True)
        set_share(cg, SHARE, self.period_us)
        argv_prefix = self.agent_host
        self.agent_host = lambda n: (["/bin/sh", "-c", f'echo $$ > {cg}/tasks && exec "$@"', "sh"]
                                     + argv_prefix(n)[0], argv_prefix(n)[1])
        try:
            super().start_agent(name, slots)
        finally:
            self.agent_host = argv_prefix


def set_share(cg, cores, period_us=PERIOD_US):
    with open(os.path.join(cg, "cpu.cfs_quota_us"), "w") as f:
        f.write("-1")  # no cap while the period changes (a quota may not exceed it)
    with open(os.path.join(cg, "cpu.cfs_period_us"), "w") as f:
        f.write(str(period_us))
    with open(os.path.join(cg, "cpu.cfs_quota_us"), "w") as f:
        f.write(str(max(1000, int(cores * period_us))))


def remove_cgroup_tree(root):
    """Removes cgroup `root` and those under it, deepest first, once their processes are gone."""
    if not os.path.isdir(root):
        return
    for path in sorted((d for d, _, _ in os.walk(root)), key=len, reverse=True):
        for _ in range(50):
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.1)
