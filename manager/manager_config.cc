#include "manager/manager_config.h"

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"

namespace varuna {

absl::Status ManagerConfig::Validate() const {
  if (state_dir.empty()) return absl::InvalidArgumentError("manager: --state_dir is required");
  if (heartbeat_period < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError("manager: heartbeat_period_s must be >= 0.001");
  }
  if (max_heartbeats_per_s < 1) {
    return absl::InvalidArgumentError("manager: max_heartbeats_per_s must be >= 1");
  }
  if (suspect_after_missed < 1 || dead_after_missed <= suspect_after_missed) {
    return absl::InvalidArgumentError(
        "manager: need 1 <= suspect_after_missed < dead_after_missed");
  }
  if (stop_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("manager: stop_grace_s must be >= 0");
  }
  if (max_pending_jobs_per_user < 1 || max_finished_jobs < 0) {
    return absl::InvalidArgumentError(
        "manager: need max_pending_jobs_per_user >= 1 and max_finished_jobs >= 0");
  }
  if (max_nodes < 1 || max_slots_per_node < 1) {
    return absl::InvalidArgumentError("manager: max_nodes and max_slots_per_node must be >= 1");
  }
  if (morph_save_timeout <= absl::ZeroDuration() || morph_coalesce < absl::ZeroDuration() ||
      scale_up_delay < absl::ZeroDuration() || morph_window <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "manager: morph_save_timeout_s and morph_window_s must be > 0, morph_coalesce_s and "
        "scale_up_delay_s >= 0");
  }
  if (max_morphs < 0) return absl::InvalidArgumentError("manager: max_morphs must be >= 0");
  if (forget_dead_after < dead_after()) {
    return absl::InvalidArgumentError(
        "manager: forget_dead_after_s must be at least the time to DEAD");
  }
  if (absl::StatusOr<UidRange> r = ParseUidRange(tenant_uids); !r.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("manager: tenant_uids: ", r.status().message()));
  }
  RETURN_IF_ERROR(ValidateStragglers(stragglers, "manager config stragglers", true));
  RETURN_IF_ERROR(sharing.Validate());
  if (slurm.enabled()) RETURN_IF_ERROR(slurm.Validate());
  if (!advertise.empty()) {
    if (absl::Status a = CheckPeerAddress(advertise); !a.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("manager: --advertise: ", a.message()));
    }
  }
  if (!etcd_endpoints.empty()) {
    if (lease_ttl < absl::Seconds(2) || lease_ttl > absl::Seconds(60)) {
      return absl::InvalidArgumentError("manager: lease_ttl_s must be in [2, 60]");
    }
    if (etcd_flush < absl::Seconds(1)) {
      return absl::InvalidArgumentError("manager: etcd_flush_s must be >= 1");
    }
    if (etcd_prefix.empty() || etcd_prefix.front() != '/' || etcd_prefix.back() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("manager: etcd_prefix '", etcd_prefix, "' must start and end with '/'"));
    }
    const std::string host = advertise_address().substr(0, advertise_address().rfind(':'));
    if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
      return absl::InvalidArgumentError(
          "manager: with etcd_endpoints, give --advertise HOST:PORT (the address agents, "
          "varunactl and the other managers reach this one at): --listen is a wildcard");
    }
  }
  RETURN_IF_ERROR(CheckListenSecurity("varuna-manager", listen, tls.enabled(), allow_insecure));
  if (!IsLoopbackListen(listen) && tokens_file.empty() && !allow_insecure) {
    // TLS alone lets anyone who trusts the CA in: the job API (and so every agent's
    // programs) needs tokens beyond loopback.
    return absl::FailedPreconditionError(
        "manager: refusing to serve " + listen +
        " without --tokens_file: anyone who reaches it could submit jobs (or give "
        "--allow_insecure on a trusted network)");
  }
  return absl::OkStatus();
}

std::string ManagerConfig::advertise_address() const {
  return advertise.empty() ? listen : advertise;
}

namespace {

// The `slurm:` block (SlurmSourceConfig's keys).
absl::Status ReadSlurm(const YAML::Node& v, const std::string& what, SlurmSourceConfig* s) {
  if (v.IsNull()) return absl::OkStatus();
  return ForEachEntry(
      v, what, "slurm", [&](const std::string& key, const YAML::Node& value) -> absl::Status {
        const std::string path = absl::StrCat("slurm.", key);
        auto str = [&](std::string* out) { return ReadInto(value, what, path, out); };
        auto num = [&](int* out) { return ReadInto(value, what, path, out); };
        auto seconds = [&](absl::Duration* out) { return ReadSeconds(value, what, path, out); };
        if (key == "partition") return str(&s->partition);
        if (key == "account") return str(&s->account);
        if (key == "qos") return str(&s->qos);
        if (key == "time_limit") return str(&s->time_limit);
        if (key == "max_nodes") return num(&s->max_nodes);
        if (key == "min_nodes") return num(&s->min_nodes);
        if (key == "slots_per_node") return num(&s->slots_per_node);
        if (key == "sbatch_args") return ReadInto(value, what, path, &s->sbatch_args);
        if (key == "agent_command") return str(&s->agent_command);
        if (key == "job_name") return str(&s->job_name);
        if (key == "grace_s") return num(&s->grace_s);
        if (key == "output") return str(&s->output);
        if (key == "poll_s") return seconds(&s->poll_period);
        if (key == "idle_release_s") return seconds(&s->idle_release);
        if (key == "command_timeout_s") return seconds(&s->command_timeout);
        if (key == "slurm_conf") return str(&s->slurm_conf);
        if (key == "bin_dir") return str(&s->bin_dir);
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": unknown key '", path,
            "' (known: partition, account, qos, time_limit, max_nodes, min_nodes, "
            "slots_per_node, sbatch_args, agent_command, job_name, grace_s, output, poll_s, "
            "idle_release_s, command_timeout_s, slurm_conf, bin_dir)"));
      });
}

// The `stragglers:` block: a mapping of StragglerSpec's keys; the ones it leaves out keep
// their defaults. Ranges are checked by Validate().
absl::Status ReadStragglers(const YAML::Node& v, const std::string& what, StragglerSpec* s) {
  if (v.IsNull()) return absl::OkStatus();
  return ForEachEntry(
      v, what, "stragglers", [&](const std::string& key, const YAML::Node& value) -> absl::Status {
        const std::string path = absl::StrCat("stragglers.", key);
        if (key == "policy") return ReadInto(value, what, path, &s->policy);
        if (key == "slow_below") return ReadInto(value, what, path, &s->slow_below);
        if (key == "window_steps") return ReadInto(value, what, path, &s->window_steps);
        if (key == "min_gain") return ReadInto(value, what, path, &s->min_gain);
        if (key == "probation_s") return ReadInto(value, what, path, &s->probation_s);
        if (key == "recovered_above") return ReadInto(value, what, path, &s->recovered_above);
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": unknown key '", path,
                         "' (known: policy, slow_below, window_steps, min_gain, probation_s, "
                         "recovered_above)"));
      });
}

}  // namespace

absl::Status LoadManagerConfigFile(const std::string& path, ManagerConfig* c) {
  return ForEachConfigEntry(
      path, "manager config",
      [&](const std::string& what, const std::string& key, const YAML::Node& v) -> absl::Status {
        auto str = [&](std::string* out) { return ReadInto(v, what, key, out); };
        auto num = [&](auto* out) { return ReadInto(v, what, key, out); };
        auto seconds = [&](absl::Duration* out) { return ReadSeconds(v, what, key, out); };
        if (key == "listen") return str(&c->listen);
        if (key == "http_listen") return str(&c->http_listen);
        if (key == "state_dir") return str(&c->state_dir);
        if (key == "heartbeat_period_s") return seconds(&c->heartbeat_period);
        if (key == "suspect_after_missed") return num(&c->suspect_after_missed);
        if (key == "max_heartbeats_per_s") return num(&c->max_heartbeats_per_s);
        if (key == "dead_after_missed") return num(&c->dead_after_missed);
        if (key == "stop_grace_s") return seconds(&c->stop_grace);
        if (key == "start_timeout_s") return seconds(&c->start_timeout);
        if (key == "agent_rpc_timeout_s") return seconds(&c->agent_rpc_timeout);
        if (key == "forget_dead_after_s") return seconds(&c->forget_dead_after);
        if (key == "max_nodes") return num(&c->max_nodes);
        if (key == "max_slots_per_node") return num(&c->max_slots_per_node);
        if (key == "machine_list") return str(&c->machine_list);
        if (key == "check_job_files") return num(&c->check_job_files);
        if (key == "tls_ca") return str(&c->tls.ca);
        if (key == "tls_cert") return str(&c->tls.cert);
        if (key == "tls_key") return str(&c->tls.key);
        if (key == "tokens_file") return str(&c->tokens_file);
        if (key == "tenant_uids") return str(&c->tenant_uids);
        if (key == "allow_insecure") return num(&c->allow_insecure);
        if (key == "http_allow_remote") return num(&c->http_allow_remote);
        if (key == "http_open_metrics") return num(&c->http_open_metrics);
        if (key == "max_pending_jobs_per_user") return num(&c->max_pending_jobs_per_user);
        if (key == "max_finished_jobs") return num(&c->max_finished_jobs);
        if (key == "finished_job_ttl_s") return seconds(&c->finished_job_ttl);
        if (key == "morph_save_timeout_s") return seconds(&c->morph_save_timeout);
        if (key == "morph_coalesce_s") return seconds(&c->morph_coalesce);
        if (key == "scale_up_delay_s") return seconds(&c->scale_up_delay);
        if (key == "max_morphs") return num(&c->max_morphs);
        if (key == "morph_window_s") return seconds(&c->morph_window);
        if (key == "morph_in_place") return num(&c->morph_in_place);
        if (key == "stragglers") return ReadStragglers(v, what, &c->stragglers);
        if (key == "slurm") return ReadSlurm(v, what, &c->slurm);
        if (key == "sharing") return ReadSharing(v, what, &c->sharing);
        if (key == "etcd_endpoints") return str(&c->etcd_endpoints);
        if (key == "etcd_prefix") return str(&c->etcd_prefix);
        if (key == "lease_ttl_s") return seconds(&c->lease_ttl);
        if (key == "etcd_flush_s") return seconds(&c->etcd_flush);
        if (key == "advertise") return str(&c->advertise);
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": unknown key '", key,
            "' (known: listen, http_listen, http_allow_remote, http_open_metrics, state_dir, "
            "heartbeat_period_s, "
            "max_heartbeats_per_s, suspect_after_missed, "
            "dead_after_missed, stop_grace_s, start_timeout_s, agent_rpc_timeout_s, "
            "forget_dead_after_s, max_pending_jobs_per_user, max_finished_jobs, "
            "finished_job_ttl_s, max_nodes, max_slots_per_node, machine_list, check_job_files, "
            "tls_ca, tls_cert, tls_key, tokens_file, tenant_uids, allow_insecure, "
            "morph_save_timeout_s, "
            "morph_coalesce_s, scale_up_delay_s, max_morphs, morph_window_s, morph_in_place, "
            "stragglers, slurm, sharing, etcd_endpoints, etcd_prefix, lease_ttl_s, etcd_flush_s, "
            "advertise)"));
      });
}

NodeOptions ManagerConfig::node_options() const {
  NodeOptions o;
  o.heartbeat_period = heartbeat_period;
  o.max_heartbeats_per_s = max_heartbeats_per_s;
  o.suspect_after_missed = suspect_after_missed;
  o.dead_after_missed = dead_after_missed;
  o.forget_dead_after = forget_dead_after;
  o.machine_list = machine_list;
  o.max_nodes = max_nodes;
  o.max_slots_per_node = max_slots_per_node;
  return o;
}

JobOptions ManagerConfig::job_options() const {
  JobOptions o;
  o.stop_grace = stop_grace;
  o.start_timeout = start_timeout;
  o.max_pending_jobs_per_user = max_pending_jobs_per_user;
  o.morph_in_place = morph_in_place;
  o.stragglers = stragglers;
  o.priority_classes = sharing.classes;
  o.submit_above_normal = sharing.submit_above_normal;
  return o;
}

MorphOptions ManagerConfig::morph_options() const {
  MorphOptions o;
  o.stop_grace = stop_grace;
  o.start_timeout = start_timeout;
  o.morph_save_timeout = morph_save_timeout;
  o.morph_coalesce = morph_coalesce;
  o.scale_up_delay = scale_up_delay;
  o.max_morphs = max_morphs;
  o.morph_window = morph_window;
  o.morph_in_place = morph_in_place;
  o.allocator_grows = sharing.enabled;
  return o;
}

StragglerOptions ManagerConfig::straggler_options() const {
  StragglerOptions o;
  o.stragglers = stragglers;
  o.max_morphs = max_morphs;
  o.morph_window = morph_window;
  return o;
}

}  // namespace varuna
