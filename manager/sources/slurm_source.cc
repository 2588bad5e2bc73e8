#include "manager/sources/slurm_source.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/yaml_util.h"
#include "glog/logging.h"

namespace varuna {

absl::Status SlurmSourceConfig::Validate() const {
  auto bad = [](absl::string_view m) {
    return absl::InvalidArgumentError(absl::StrCat("manager config slurm: ", m));
  };
  if (max_nodes < 1) return bad("max_nodes must be >= 1");
  if (min_nodes < 0 || min_nodes > max_nodes) return bad("need 0 <= min_nodes <= max_nodes");
  if (slots_per_node < 1) return bad("slots_per_node must be >= 1");
  if (agent_command.empty()) {
    return bad(
        "agent_command is required: the varuna-agent command line run on each node "
        "(its --manager address, --slots, TLS files)");
  }
  if (grace_s < 0) return bad("grace_s must be >= 0");
  if (poll_period < absl::Milliseconds(100)) return bad("poll_s must be >= 0.1");
  if (command_timeout < absl::Seconds(1)) return bad("command_timeout_s must be >= 1");
  auto plain = [](const std::string& v) {
    for (char c : v) {
      if (c == '\n' || c == '\0' || c == ',' || c == ' ') return false;
    }
    return true;
  };
  for (const auto& [key, v] : {std::pair<const char*, const std::string*>{"partition", &partition},
                               {"account", &account},
                               {"qos", &qos},
                               {"time_limit", &time_limit},
                               {"job_name", &job_name}}) {
    if (!plain(*v)) return bad(absl::StrCat(key, " '", *v, "' may not hold spaces or commas"));
  }
  if (job_name.empty()) return bad("job_name may not be empty");
  for (const std::string& a : sbatch_args) {
    if (a.empty() || a[0] != '-') {
      return bad(absl::StrCat("sbatch_args entry '", a, "' is not an option (--name=value)"));
    }
    if (a.rfind("--wrap", 0) == 0 || a.rfind("--parsable", 0) == 0) {
      return bad(absl::StrCat("sbatch_args may not give ", a, ": the manager sets it"));
    }
  }
  return absl::OkStatus();
}
namespace {

std::string CurrentUser() {
  struct passwd pw, *found = nullptr;
  char buf[4096];
  if (getpwuid_r(geteuid(), &pw, buf, sizeof(buf), &found) == 0 && found != nullptr) {
    return pw.pw_name;
  }
  return "";
}

// A scalar field, or "" when absent or not a scalar.
std::string Scalar(const YAML::Node& n, const char* key) {
  const YAML::Node v = n[key];  // a missing key is an invalid node: IsDefined() first
  return v.IsDefined() && v.IsScalar() ? v.Scalar() : "";
}

// 22.05: "job_state": "RUNNING"; 23.02+: "job_state": ["RUNNING", "COMPLETING"].
std::string StateOf(const YAML::Node& job) {
  const YAML::Node v = job["job_state"];
  if (!v.IsDefined()) return "";
  if (v.IsScalar()) return v.Scalar();
  if (v.IsSequence() && v.size() > 0 && v[0].IsScalar()) return v[0].Scalar();
  return "";
}

bool Running(const std::string& state) { return state == "RUNNING" || state == "CONFIGURING"; }

// Ending, and perhaps requeued after (a preempted agent job completes, then is queued again):
// no replacement is asked for until Slurm says which.
bool Ending(const std::string& state) { return state == "COMPLETING" || state == "STAGE_OUT"; }

// Queued and not ended: counts toward what the source has asked for.
bool Pending(const std::string& state) {
  return state == "PENDING" || state == "REQUEUED" || state == "REQUEUE_HOLD" ||
         state == "REQUEUE_FED" || state == "RESIZING" || state == "SUSPENDED";
}

std::string Program(const SlurmSourceConfig& c, const char* name) {
  return c.bin_dir.empty() ? name : absl::StrCat(c.bin_dir, "/", name);
}

}  // namespace

absl::StatusOr<std::vector<SlurmJob>> ParseSqueueJson(const std::string& json,
                                                      const std::string& name,
                                                      const std::string& user) {
  auto doc = ParseYaml(json, "squeue --json");
  if (!doc.ok()) return doc.status();
  try {
    if (!doc->IsMap() || !(*doc)["jobs"].IsDefined() || !(*doc)["jobs"].IsSequence()) {
      return absl::InvalidArgumentError("squeue --json: no 'jobs' list in its output");
    }
    if (const YAML::Node errors = (*doc)["errors"];
        errors.IsDefined() && errors.IsSequence() && errors.size() > 0) {
      // 22.05 exits 0 when slurmctld cannot be reached, with only this to say so:
      // {"source": "slurm_load_jobs", "description": "Failed while looking for jobs",
      //  "error": "Unspecified error", "error_number": -1}.
      std::vector<std::string> parts;
      for (const auto& e : errors) {
        if (e.IsScalar()) parts.push_back(e.Scalar());
        if (!e.IsMap()) continue;
        std::vector<std::string> m;
        for (const char* key : {"source", "description", "error"}) {
          if (std::string v = Scalar(e, key); !v.empty()) m.push_back(std::move(v));
        }
        if (!m.empty()) parts.push_back(absl::StrJoin(m, ": "));
      }
      if (!parts.empty()) {
        return absl::UnavailableError(absl::StrCat("squeue could not read the queue (",
                                                   absl::StrJoin(parts, "; "),
                                                   "): is slurmctld up and reachable?"));
      }
    }
    std::vector<SlurmJob> out;
    for (const auto& j : (*doc)["jobs"]) {
      if (!j.IsMap() || Scalar(j, "name") != name) continue;
      if (!user.empty() && Scalar(j, "user_name") != user) continue;
      SlurmJob job;
      if (!absl::SimpleAtoi(Scalar(j, "job_id"), &job.id) || job.id <= 0) continue;
      job.state = StateOf(j);
      job.node = Scalar(j, "nodes");
      job.reason = Scalar(j, "state_reason");
      out.push_back(std::move(job));
    }
    std::sort(out.begin(), out.end(),
              [](const SlurmJob& a, const SlurmJob& b) { return a.id < b.id; });
    return out;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("squeue --json: ", e.what()));
  }
}

std::vector<std::string> SqueueArgv(const SlurmSourceConfig& c, const std::string& user) {
  std::vector<std::string> argv = {Program(c, "squeue"), "--json", "--name=" + c.job_name};
  if (!user.empty()) argv.push_back("--user=" + user);
  return argv;
}

std::vector<std::string> SbatchArgv(const SlurmSourceConfig& c) {
  std::vector<std::string> argv = {Program(c, "sbatch"), "--parsable", "--job-name=" + c.job_name,
                                   "--partition=" + c.partition, "--nodes=1", "--ntasks=1",
                                   "--exclusive",
                                   // Replaced, not requeued: Slurm holds a requeued job back
                                   // (BeginTime, two minutes here), while a new one starts as
                                   // soon as a node is free (a preemptible partition with
                                   // PreemptMode=REQUEUE cancels what it may not requeue).
                                   "--no-requeue", "--open-mode=append", "--output=" + c.output};
  if (!c.account.empty()) argv.push_back("--account=" + c.account);
  if (!c.qos.empty()) argv.push_back("--qos=" + c.qos);
  if (!c.time_limit.empty()) argv.push_back("--time=" + c.time_limit);
  for (const auto& a : c.sbatch_args) argv.push_back(a);
  // The agent names itself after the Slurm node: squeue's node is how the source knows which
  // of the manager's nodes an agent job is.
  argv.push_back(absl::StrCat("--wrap=exec ", c.agent_command,
                              " --name \"$SLURMD_NODENAME\" --slurm_grace_s ", c.grace_s));
  return argv;
}

std::vector<std::string> ScancelArgv(const SlurmSourceConfig& c, int64_t job) {
  return {Program(c, "scancel"), absl::StrCat(job)};
}

SlurmPlan PlanSlurm(const SlurmSourceConfig& c, const std::vector<SlurmJob>& jobs,
                    const SlurmView& view, SlurmMemory* memory, absl::Time now) {
  SlurmPlan plan;
  std::map<int64_t, const SlurmJob*> by_id;
  for (const auto& j : jobs) by_id[j.id] = &j;
  std::map<std::string, const SlurmView::Node*> nodes;
  for (const auto& n : view.nodes) nodes[n.name] = &n;

  // An agent job that no longer runs where it ran: its node is lost, unless the agent said
  // so first (a notice: the node is leaving) or the source released it.
  for (auto it = memory->node_job.begin(); it != memory->node_job.end();) {
    const auto& [node, id] = *it;
    auto j = by_id.find(id);
    if (j != by_id.end() && Running(j->second->state) && j->second->node == node) {
      ++it;
      continue;
    }
    auto n = nodes.find(node);
    if (memory->released.count(id)) {
      if (n == nodes.end() || n->second->used_slots == 0) plan.forget.push_back(node);
    } else if (n != nodes.end() && n->second->alive && !n->second->leaving) {
      plan.lost.emplace_back(
          node, j == by_id.end()
                    ? absl::StrCat("its Slurm job ", id, " is gone from the queue")
                    : absl::StrCat("its Slurm job ", id, " is ", j->second->state,
                                   j->second->reason == "None" || j->second->reason.empty()
                                       ? ""
                                       : absl::StrCat(" (", j->second->reason, ")")));
    }
    memory->running_since.erase(id);
    memory->idle_since.erase(node);
    it = memory->node_job.erase(it);
  }

  std::vector<int64_t> pending;
  std::vector<std::pair<absl::Duration, int64_t>> idle;  // running jobs idle this long
  for (const auto& j : jobs) {
    if (memory->released.count(j.id)) continue;
    if (Pending(j.state)) {
      ++plan.pending;
      pending.push_back(j.id);
      if (plan.pending_reason.empty() && !j.reason.empty() && j.reason != "None") {
        plan.pending_reason = j.reason;
      }
      continue;
    }
    if (Ending(j.state)) {
      ++plan.ending;
      continue;
    }
    if (!Running(j.state) || j.node.empty()) continue;
    ++plan.running;
    memory->node_job[j.node] = j.id;
    memory->running_since.emplace(j.id, now);
    auto n = nodes.find(j.node);
    if (n == nodes.end() || !n->second->alive) {
      // Running, but no agent registered from it: idle too, and worth a warning once it lasts.
      const absl::Duration up = now - memory->running_since[j.id];
      idle.emplace_back(up, j.id);
      if (up >= c.idle_release && plan.warning.empty()) {
        plan.warning_job = j.id;
        plan.warning = absl::StrCat("agent job ", j.id, " has run on ", j.node, " for ",
                                    absl::FormatDuration(absl::Trunc(up, absl::Seconds(1))),
                                    " but no agent registered from it: check slurm.agent_command "
                                    "and the job's output (",
                                    c.output, ")");
      }
      continue;
    }
    if (n->second->used_slots > 0) {
      memory->idle_since.erase(j.node);
    } else {
      const absl::Time since = memory->idle_since.emplace(j.node, now).first->second;
      idle.emplace_back(now - since, j.id);
    }
  }
  for (auto it = memory->released.begin(); it != memory->released.end();) {
    it = by_id.count(*it) ? std::next(it) : memory->released.erase(it);  // gone from squeue
  }

  const int64_t slots = std::max<int64_t>(0, view.wanted_slots);
  const int64_t want = (slots + c.slots_per_node - 1) / c.slots_per_node;
  plan.wanted_nodes =
      static_cast<int>(std::clamp<int64_t>(want, c.min_nodes, static_cast<int64_t>(c.max_nodes)));
  const int have = plan.running + plan.pending + plan.ending;
  if (have < plan.wanted_nodes) {
    plan.submit = plan.wanted_nodes - have;
    return plan;
  }
  int excess = have - plan.ending - plan.wanted_nodes;  // an ending job is going anyway
  // Queued ones first (newest first): nothing runs there yet.
  for (auto it = pending.rbegin(); it != pending.rend() && excess > 0; ++it, --excess) {
    plan.cancel.emplace_back(*it, absl::StrCat("queued agent job ", *it, " no longer wanted (",
                                               plan.wanted_nodes, " nodes wanted)"));
  }
  std::sort(idle.rbegin(), idle.rend());  // the longest idle first
  for (const auto& [for_how_long, id] : idle) {
    if (excess == 0 || for_how_long < c.idle_release) break;
    plan.cancel.emplace_back(
        id, absl::StrCat("agent job ", id, " idle for ",
                         absl::FormatDuration(absl::Trunc(for_how_long, absl::Seconds(1))),
                         " and no job wants it (", plan.wanted_nodes, " nodes wanted)"));
    --excess;
  }
  return plan;
}

namespace {

class CommandLineSlurm final : public SlurmCommands {
 public:
  explicit CommandLineSlurm(const SlurmSourceConfig& c) : timeout_(c.command_timeout) {
    if (!c.slurm_conf.empty()) env_.emplace_back("SLURM_CONF", c.slurm_conf);
  }
  absl::StatusOr<CommandResult> Run(const std::vector<std::string>& argv) override {
    return RunCommand(argv, env_, timeout_);
  }

 private:
  const absl::Duration timeout_;
  std::vector<std::pair<std::string, std::string>> env_;
};

}  // namespace

std::unique_ptr<SlurmCommands> MakeSlurmCommands(const SlurmSourceConfig& c) {
  return std::make_unique<CommandLineSlurm>(c);
}

SlurmSource::SlurmSource(const SlurmSourceConfig& config, Clock* clock, SlurmCommands* commands,
                         Post on_loop, Post off_loop, Host* host)
    : config_(config),
      clock_(clock),
      commands_(commands),
      on_loop_(std::move(on_loop)),
      off_loop_(std::move(off_loop)),
      host_(host),
      user_(CurrentUser()) {}

std::string SlurmSource::CommandError(const std::string& what,
                                      const absl::StatusOr<CommandResult>& r) {
  if (!r.ok()) return absl::StrCat(what, ": ", r.status().message());
  std::string text(absl::StripAsciiWhitespace(r->err));
  if (text.empty()) text = std::string(absl::StripAsciiWhitespace(r->out));
  // The last line says what went wrong (sbatch: error: ...); keep it short.
  if (auto nl = text.rfind('\n'); nl != std::string::npos) text = text.substr(nl + 1);
  if (text.size() > 300) text = text.substr(0, 300) + "...";
  return absl::StrCat(what, " exited with status ", r->exit_code, text.empty() ? "" : ": ", text);
}

void SlurmSource::Tick() {
  if (busy_ || clock_->Now() < next_at_) return;
  busy_ = true;
  off_loop_([this, argv = SqueueArgv(config_, user_)] {
    auto r = commands_->Run(argv);
    on_loop_([this, r = std::move(r)]() mutable { OnQueue(std::move(r)); });
  });
}

void SlurmSource::OnQueue(absl::StatusOr<CommandResult> r) {
  if (!r.ok() || r->exit_code != 0) {
    Failed(CommandError("squeue", r));
    return;
  }
  auto jobs = ParseSqueueJson(r->out, config_.job_name, user_);
  if (!jobs.ok()) {
    Failed(std::string(jobs.status().message()));
    return;
  }
  SlurmPlan plan = PlanSlurm(config_, *jobs, host_->View(), &memory_, clock_->Now());
  for (const auto& [node, why] : plan.lost) {
    LOG(WARNING) << "node=" << node << " lost: " << why;
    host_->LoseNode(node, why);
  }
  for (const std::string& node : plan.forget) host_->ForgetNode(node);
  if (!plan.warning.empty() && warned_.insert(plan.warning_job).second) {  // once per job
    LOG(WARNING) << "slurm: " << plan.warning;
    host_->Event("slurm_warning", "", plan.warning);
  }
  last_ = plan;
  if (plan.submit == 0 && plan.cancel.empty()) {
    Done();
    return;
  }
  off_loop_([this, plan] {
    Acted acted;
    for (int i = 0; i < plan.submit && acted.error.empty(); ++i) {
      auto s = commands_->Run(SbatchArgv(config_));
      int64_t id = 0;
      // --parsable: "ID" or "ID;CLUSTER".
      const std::string out(absl::StripAsciiWhitespace(s.ok() ? s->out : ""));
      const std::string first = out.substr(0, out.find(';'));
      if (s.ok() && s->exit_code == 0 && absl::SimpleAtoi(first, &id) && id > 0) {
        acted.submitted.push_back(id);
      } else if (s.ok() && s->exit_code == 0) {
        acted.error =
            absl::StrCat("sbatch --parsable printed '", first.substr(0, 80), "', not a job id");
      } else {
        acted.error = CommandError(absl::StrCat("sbatch --partition=", config_.partition), s);
      }
    }
    for (const auto& [id, why] : plan.cancel) {
      auto s = commands_->Run(ScancelArgv(config_, id));
      if (s.ok() && s->exit_code == 0) {
        acted.cancelled.push_back(id);
      } else if (acted.error.empty()) {
        acted.error = CommandError("scancel", s);
      }
    }
    on_loop_([this, plan, acted] { OnActed(plan, acted); });
  });
}

void SlurmSource::OnActed(const SlurmPlan& plan, const Acted& acted) {
  if (!acted.submitted.empty()) {
    const std::string msg = absl::StrCat(
        "asked for ", acted.submitted.size(), " node(s) on partition ", config_.partition,
        ": agent job(s) ", absl::StrJoin(acted.submitted, ","), " (", plan.running, " running, ",
        plan.pending, " queued, ", plan.wanted_nodes, " wanted)");
    LOG(INFO) << "slurm: " << msg;
    host_->Event("slurm_requested", "", msg);
    last_.pending += static_cast<int>(acted.submitted.size());
  }
  for (int64_t id : acted.cancelled) {
    for (const auto& [cid, why] : plan.cancel) {
      if (cid != id) continue;
      LOG(INFO) << "slurm: released " << why;
      std::string node;
      for (const auto& [n, j] : memory_.node_job) {
        if (j == id) node = n;
      }
      host_->Event("slurm_released", node, absl::StrCat("cancelled ", why));
    }
    memory_.released.insert(id);
  }
  if (!acted.error.empty()) {
    Failed(acted.error);
    return;
  }
  Done();
}

void SlurmSource::Failed(const std::string& message) {
  busy_ = false;
  ++failures_;
  if (message != error_) {
    LOG(WARNING) << "slurm: " << message;
    host_->Event("slurm_error", "", message);
  }
  error_ = message;
  error_at_ = clock_->Now();
  // Backs off to five minutes; the nodes and jobs the manager has are left as they are.
  const absl::Duration wait =
      std::min(config_.poll_period * (int64_t{1} << std::min(failures_, 6)), absl::Minutes(5));
  next_at_ = clock_->Now() + wait;
}

void SlurmSource::Done() {
  busy_ = false;
  if (failures_ > 0) {
    LOG(INFO) << "slurm: commands work again after " << failures_ << " failure(s)";
    host_->Event("slurm_ok", "", absl::StrCat("Slurm answers again (after: ", error_, ")"));
  }
  failures_ = 0;
  error_.clear();
  next_at_ = clock_->Now() + config_.poll_period;
}

v1::MachineSource SlurmSource::Status() const {
  v1::MachineSource s;
  s.set_name("slurm");
  s.set_detail(absl::StrCat("partition ", config_.partition, ", job name ", config_.job_name,
                            ", at most ", config_.max_nodes, " nodes"));
  s.set_running(last_.running);
  s.set_pending(last_.pending);
  s.set_wanted(last_.wanted_nodes);
  s.set_pending_reason(last_.pending_reason);
  s.set_error(error_.empty() ? last_.warning : error_);
  if (!error_.empty()) s.set_error_age_s(absl::ToDoubleSeconds(clock_->Now() - error_at_));
  s.set_failures(failures_);
  return s;
}

std::string SlurmSource::SourceOf(const std::string& node) const {
  auto it = memory_.node_job.find(node);
  return it == memory_.node_job.end() ? "" : absl::StrCat("slurm job ", it->second);
}

}  // namespace varuna
