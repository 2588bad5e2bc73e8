#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for tests and demos (docs/operations.md "Slurm"):
# Debian's slurmctld and munged in the root namespace, and N real slurmd, each in its own
# network namespace (an address on a bridge) and UTS namespace (its own hostname, nodeK), so
# Slurm sees N machines. Two partitions: `preemptible` (default; PriorityTier 1, preempted by
# requeue with a GraceTime) and `high` (PriorityTier 10, preempts it).
#
#   scripts/slurm_test_cluster.sh start [N]   # N >= 1 slurmd (default 3); prints the export
#   eval "$(scripts/slurm_test_cluster.sh env)"  # SLURM_CONF=... for sinfo, sbatch, srun ...
#   scripts/slurm_test_cluster.sh status
#   scripts/slurm_test_cluster.sh stop        # everything it started, and its namespaces
#
# Idempotent: start stops a previous cluster first; stop is safe to repeat. Needs root
# (namespaces) and slurm-wlm + munge (scripts/install_deps.sh installs them). State, logs and
# the config live in $VARUNA_SLURM_DIR (default /tmp/varuna-slurm); the bridge's subnet is
# $VARUNA_SLURM_SUBNET (default 10.79.0, controller at .1, nodeK at .(10+K)), and nodeK
# resolves through marked /etc/hosts lines while the cluster runs. Jobs run inside their
# node's namespaces: they reach the controller and the other nodes over the bridge.
set -euo pipefail
D=${VARUNA_SLURM_DIR:-/tmp/varuna-slurm}
SUBNET=${VARUNA_SLURM_SUBNET:-10.79.0}
GRACE=${VARUNA_SLURM_GRACE_S:-30}
# Names and the controller's port derive from the subnet, so two clusters (a demo and a test)
# with different subnets and directories do not collide.
IFS=. read -r _ O2 O3 <<< "$SUBNET"
TAG=vsl$(printf '%02x%02x' "$((O2 % 256))" "$((O3 % 256))")
BR=${TAG}br
CTLD_PORT=$((6800 + (O2 * 256 + O3) % 1000))
CONF=$D/slurm.conf
# The nodes' names resolve through /etc/hosts lines carrying this mark (removed by stop), as
# a cluster's DNS would make them.
HOSTS_MARK="# varuna-slurm-test $D"

say() { echo "slurm_test_cluster: $*" >&2; }

nodes_running() { ls "$D"/node*.ns 2>/dev/null | wc -l; }

# The pid in file $1 if it is still one of our daemons (a stale file after a reboot may name
# an unrelated process).
ours() {
  local pid
  pid=$(cat "$1" 2>/dev/null || true)
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) =~ ^(slurmctld|slurmd|munged)$ ]] || return 1
  echo "$pid"
}

stop() {
  for f in "$D"/slurmd.*.pid "$D"/slurmctld.pid "$D"/munged.pid; do
    [[ -f $f ]] || continue
    pid=$(ours "$f") && kill -TERM "$pid" 2>/dev/null || true
  done
  # slurmd's job steps (slurmstepd) and anything left in the namespaces.
  for f in "$D"/node*.ns; do
    [[ -f $f ]] || continue
    ns=$(cat "$f")
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    rm -f "$f"
  done
  sleep 0.5
  for f in "$D"/slurmd.*.pid "$D"/slurmctld.pid "$D"/munged.pid; do
    [[ -f $f ]] || continue
    pid=$(ours "$f") && kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
  done
  ip link del "$BR" 2>/dev/null || true
  # Only lines ending in exactly this cluster's mark; /etc/hosts is rewritten only from a
  # complete copy (grep exits 0 or 1, never 2), so nothing else is lost.
  if grep -q " $HOSTS_MARK\$" /etc/hosts 2>/dev/null; then
    local tmp rc=0
    tmp=$(mktemp /etc/hosts.varuna-slurm.XXXXXX)
    grep -v " $HOSTS_MARK\$" /etc/hosts > "$tmp" || rc=$?
    if ((rc <= 1)); then cat "$tmp" > /etc/hosts; else say "left /etc/hosts alone (grep failed)"; fi
    rm -f "$tmp"
  fi
}

write_conf() {
  local n=$1
  cat > "$CONF" <<EOF
# Written by scripts/slurm_test_cluster.sh: a test cluster of $n nodes on one machine.
ClusterName=varuna-test
SlurmctldHost=$(hostname -s)($SUBNET.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=6818
AuthType=auth/munge
# cred_expire is also how long a requeued job waits before it may start again (120 s by
# default, which a test of a preempted allocation would spend idle).
AuthInfo=socket=$D/munge.sock,cred_expire=10
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
LaunchParameters=use_interactive_step
ReturnToService=2
SchedulerType=sched/backfill
# A test cluster decides at once: the main loop's default sched_interval (60 s) delays a
# preemption by up to a minute.
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/linear
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
SlurmctldTimeout=30
SlurmdTimeout=20
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=600
EOF
  for ((i = 1; i <= n; i++)); do
    echo "NodeName=node$i NodeAddr=$SUBNET.$((10 + i)) CPUs=2 RealMemory=2000 State=UNKNOWN" >> "$CONF"
  done
  cat >> "$CONF" <<EOF
PartitionName=preemptible Nodes=ALL Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE MaxTime=INFINITE State=UP
PartitionName=high Nodes=ALL PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
EOF
}

start() {
  local n=$1
  [[ $n =~ ^[1-9][0-9]?$ ]] || { say "N must be 1..99, got '$n'"; exit 2; }
  [[ $(id -u) == 0 ]] || { say "needs root (network and UTS namespaces)"; exit 1; }
  for b in slurmctld slurmd munged ip unshare; do
    command -v "$b" > /dev/null || { say "missing $b (apt-get install slurm-wlm munge iproute2)"; exit 1; }
  done
  stop
  rm -rf "$D/state" "$D/spool" "$D/log"
  mkdir -p "$D/state" "$D/spool" "$D/log"
  if [[ ! -f $D/munge.key ]]; then
    dd if=/dev/urandom of="$D/munge.key" bs=1024 count=1 status=none
    chmod 400 "$D/munge.key"
  fi
  munged --force --key-file="$D/munge.key" --socket="$D/munge.sock" --pid-file="$D/munged.pid" \
    --log-file="$D/log/munged.log" --seed-file="$D/munge.seed"
  ip link add "$BR" type bridge
  ip addr add "$SUBNET.1/24" dev "$BR"
  ip link set "$BR" up
  if command -v iptables > /dev/null; then
    iptables -C FORWARD -i "$BR" -o "$BR" -j ACCEPT 2>/dev/null ||
      iptables -I FORWARD -i "$BR" -o "$BR" -j ACCEPT 2>/dev/null || true
  fi
  write_conf "$n"
  for ((i = 1; i <= n; i++)); do
    local ns=${TAG}n$i
    ip netns add "$ns"
    echo "$ns" > "$D/node$i.ns"
    ip link add "${TAG}h$i" type veth peer name "${TAG}p$i"
    ip link set "${TAG}p$i" netns "$ns"
    ip link set "${TAG}h$i" master "$BR"
    ip link set "${TAG}h$i" up
    ip netns exec "$ns" ip addr add "$SUBNET.$((10 + i))/24" dev "${TAG}p$i"
    ip netns exec "$ns" ip link set "${TAG}p$i" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip route add default via "$SUBNET.1" 2>/dev/null || true
  done
  [[ -z $(tail -c 1 /etc/hosts) ]] || echo >> /etc/hosts  # a last line without newline
  for ((i = 1; i <= n; i++)); do echo "$SUBNET.$((10 + i)) node$i $HOSTS_MARK" >> /etc/hosts; done
  slurmctld -f "$CONF"
  for ((i = 1; i <= n; i++)); do
    # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup mounts slurmd reads.
    nsenter --net="/run/netns/${TAG}n$i" unshare --uts \
      sh -c "hostname node$i && exec slurmd -f '$CONF'"
  done
  export SLURM_CONF=$CONF
  for _ in $(seq 150); do
    idle=$(sinfo -h -p preemptible -t idle -o '%D' 2>/dev/null | awk '{s += $1} END {print s + 0}')
    [[ $idle == "$n" ]] && break
    sleep 0.2
  done
  if [[ ${idle:-0} != "$n" ]]; then
    say "only ${idle:-0} of $n nodes came up idle; logs in $D/log"
    sinfo >&2 || true
    exit 1
  fi
  say "$n nodes up (partitions preemptible, high); logs in $D/log"
  echo "export SLURM_CONF=$CONF"
}

case ${1:-} in
  start) start "${2:-3}" ;;
  stop) stop; say "stopped" ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  status)
    export SLURM_CONF=$CONF
    [[ -f $D/slurmctld.pid ]] && kill -0 "$(cat "$D/slurmctld.pid")" 2>/dev/null || {
      echo "not running"
      exit 1
    }
    sinfo
    ;;
  *)
    echo "usage: $0 start [N] | stop | env | status" >&2
    exit 2
    ;;
esac
