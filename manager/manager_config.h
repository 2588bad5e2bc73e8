#pragma once

// The manager's configuration: flags and the YAML config file (docs/operations.md), checked
// once by Validate() before anything uses it.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/launch/tenant_uid.h"
#include "common/net/rpc.h"
#include "common/spec/job_spec.h"
#include "manager/jobs/job_options.h"
#include "manager/morph/morph_options.h"
#include "manager/nodes/node_options.h"
#include "manager/sharing/sharing_options.h"
#include "manager/sources/slurm_source_config.h"
#include "manager/stragglers/straggler_options.h"

namespace varuna {

struct ManagerConfig {
  std::string listen = "127.0.0.1:7070";
  // Dashboard, JSON API and Prometheus /metrics (docs/observability.md); "" = off.
  std::string http_listen;
  bool http_allow_remote = false;  // serve plain HTTP beyond loopback (HTTPS needs no flag)
  // With a tokens file, /metrics needs a bearer token too unless this is set (/healthz and the
  // dashboard's static files are always open; its data under /api/v1 never is).
  bool http_open_metrics = false;
  std::string state_dir;
  absl::Duration heartbeat_period = absl::Seconds(1);  // what agents are told to use
  // Past this many heartbeats a second from all agents together, the period grows with the
  // cluster (HeartbeatPeriodFor), and with it the SUSPECT and DEAD timeouts.
  int max_heartbeats_per_s = 2000;
  int suspect_after_missed = 3;                       // heartbeats missed before SUSPECT
  int dead_after_missed = 10;                         // heartbeats missed before DEAD
  absl::Duration stop_grace = absl::Seconds(10);      // SIGTERM -> SIGKILL on cancel/failure
  absl::Duration start_timeout = absl::Seconds(120);  // STARTING longer than this fails
  absl::Duration agent_rpc_timeout = absl::Seconds(5);
  std::string machine_list;  // optional: only nodes (name or host) listed here get work
  // data.path etc. must be readable by the manager at submit. Off: the manager opens no
  // tenant's file; varunactl checks them with the submitter's rights, the worker again as the
  // job's user (docs/operations.md "Submit").
  bool check_job_files = false;
  // What a peer can make the manager keep (Note [Peer limits] in peer_limits.cc).
  int max_nodes = 10000;
  int max_slots_per_node = 1024;
  absl::Duration forget_dead_after = absl::Hours(24);  // DEAD this long and idle: forgotten
  // What users can make the manager keep (Note [Retention] in job_table.cc).
  int max_pending_jobs_per_user = 100;  // per token name ("" without tokens: everyone)
  int max_finished_jobs = 1000;         // the oldest finished jobs beyond it are pruned
  absl::Duration finished_job_ttl = absl::Hours(24 * 7);  // 0 = no age limit (at most a week)
  // Security (docs/operations.md "Security"): mutual TLS with agents, bearer tokens for
  // varunactl. Empty = plaintext / no tokens, allowed only on loopback or with allow_insecure.
  TlsFiles tls;
  std::string tokens_file;  // lines "NAME TOKEN [USER|-] [admin|user]"
  // Note [Tenant uids] in common/launch/tenant_uid.cc: the uids of token names without a Unix
  // user ("none": those run as each agent's --worker_user). FIRST-LAST; it matches the
  // agents' --allowed_worker_uids default.
  std::string tenant_uids = kDefaultTenantUids;
  bool allow_insecure = false;
  // Morphing (docs/morphing.md): how long workers get to save before the manager stops
  // waiting, how long after the last trigger the re-plan waits for more (coalescing), how
  // long a joined node must stay before a job grows onto it, and the restart budget.
  absl::Duration morph_save_timeout = absl::Seconds(60);
  absl::Duration morph_coalesce = absl::Seconds(1);
  absl::Duration scale_up_delay = absl::Seconds(10);
  int max_morphs = 20;
  absl::Duration morph_window = absl::Hours(1);
  // Morph in place (docs/morphing.md): on a lost worker or node, a notice, a drain or a join,
  // survivors regroup and keep their processes and state instead of saving, stopping and
  // relaunching; false keeps every morph on the relaunch path (which stays the fallback).
  bool morph_in_place = true;
  // Stragglers (docs/job_spec.md "stragglers"): what a job's unset stragglers: fields take.
  // The config file's `stragglers:` block may give any of them; every field must end up set.
  StragglerSpec stragglers{"auto", 0.7, 5, 0.05, 120, 0.9};
  SlurmSourceConfig slurm;
  // Priority classes, quotas, fair share and the allocator (docs/operations.md "Sharing a
  // cluster"); sharing.enabled once the file has a `sharing:` block.
  SharingOptions sharing;
  // Several managers on etcd (docs/operations.md "Several managers"): "" = one manager, its
  // state in SQLite under state_dir. Else etcd's client endpoints (host:port,...): managers
  // elect a leader on a lease of lease_ttl and keep the state under etcd_prefix; state_dir
  // holds each one's local copy of events and step records. `advertise` is the address
  // clients and standbys hand out for this manager (default: listen, unless a wildcard).
  std::string etcd_endpoints;
  std::string etcd_prefix = "/varuna/";
  absl::Duration lease_ttl = absl::Seconds(3);
  absl::Duration etcd_flush = absl::Seconds(5);  // Note [High-rate state]
  std::string advertise;
  std::string advertise_address() const;  // advertise, else listen

  absl::Status Validate() const;
  // Each room's options (LevelDB's Options): what that room reads of this config, so that no
  // room includes it. Manager hands them out.
  NodeOptions node_options() const;
  JobOptions job_options() const;
  MorphOptions morph_options() const;
  StragglerOptions straggler_options() const;
  absl::Duration suspect_after() const { return heartbeat_period * suspect_after_missed; }
  absl::Duration dead_after() const { return heartbeat_period * dead_after_missed; }
  // The period agents are told with `nodes` registered: heartbeat_period, or longer so that
  // nodes / period stays at most max_heartbeats_per_s (10,000 agents at 2,000/s: 5 s).
  absl::Duration HeartbeatPeriodFor(size_t nodes) const {
    return std::max(heartbeat_period,
                    absl::Seconds(static_cast<double>(nodes) / max_heartbeats_per_s));
  }
};

// Reads a manager config file (YAML; durations as *_s in seconds). Unknown keys are errors.
absl::Status LoadManagerConfigFile(const std::string& path, ManagerConfig* config);

}  // namespace varuna
