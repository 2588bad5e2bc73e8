#include "agent/standby_pool.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "common/base/safe_file.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/launch/worker_protocol.h"
#include "common/net/proto_json.h"
#include "glog/logging.h"

namespace varuna {

namespace fs = std::filesystem;

StandbyPool::StandbyPool(Options options, Clock* clock, ProcessLauncher* launcher)
    : options_(std::move(options)), clock_(clock), launcher_(launcher) {}

void StandbyPool::Keep(int running) {
  if (options_.size == 0 || stopping_) return;
  const int free = std::max(0, options_.slots - running);
  const int want = options_.size < 0 ? free : std::min(free, options_.size);
  while (static_cast<int>(standbys_.size()) > want) {
    launcher_->Signal(standbys_.back().pid, SIGTERM).IgnoreError();  // reaped later
    standbys_.pop_back();
  }
  for (Standby& sb : standbys_) {
    if (!sb.ready) sb.ready = launcher_->Listening(sb.pid);  // LibTorch is loaded
  }
  // Fill only slots that stayed free a while: right after workers exit (a relaunch about to
  // start, a job ending) a standby loading LibTorch would only compete with the launch.
  const absl::Time now = clock_->Now();
  if (running != running_seen_) {
    running_seen_ = running;
    running_since_ = now;
  }
  if (now - running_since_ < absl::Seconds(2)) return;
  while (static_cast<int>(standbys_.size()) < want) {
    const std::string dir = absl::StrCat(options_.work_dir, "/standby");
    std::error_code ec;
    fs::create_directories(dir, ec);
    const int seq = ++seq_;
    ProcessSpec spec;
    spec.argv = {options_.worker_binary, "--standby"};
    spec.env = AgentEnvironment();
    if (!spec.env.count("OMP_NUM_THREADS")) spec.env["OMP_NUM_THREADS"] = "1";
    spec.control_pipe = true;
    spec.env[kStandbyDirEnv] = dir;
    if (!node_addr_.empty()) spec.env["VARUNA_NODE_ADDR"] = node_addr_;
    spec.env["VARUNA_NODE"] = options_.node;
    spec.log_path = absl::StrCat(dir, "/standby", seq, ".log");
    spec.cwd = dir;
    // A root agent's standbys wait as root and drop to the job's user when assigned, so one
    // pool serves every user (Note [Standby workers]); otherwise they are the agent's user.
    spec.user = "";
    absl::StatusOr<int> pid = launcher_->Launch(spec);
    if (!pid.ok()) {
      if (!failed_) LOG(WARNING) << "standby worker not started: " << pid.status();
      failed_ = true;
      return;
    }
    failed_ = false;
    standbys_.push_back({*pid, dir});
  }
}

absl::StatusOr<int> StandbyPool::Take(const ProcessSpec& spec, const std::string& user,
                                      const std::string& gen_dir, int rank) {
  auto it =
      std::find_if(standbys_.begin(), standbys_.end(), [](const Standby& s) { return s.ready; });
  if (it == standbys_.end()) return absl::UnavailableError("no ready standby worker");
  // What the dynamic loader and the C library read at exec (LD_PRELOAD, MALLOC_ARENA_MAX,
  // GLIBC_TUNABLES) a process already running cannot take: a launch that sets them differently
  // from the standby's start gets a fresh process, as its other ranks would.
  const std::map<std::string, std::string> standby_env = AgentEnvironment();
  for (const auto& [k, v] : spec.env) {
    if (!absl::StartsWith(k, "LD_") && !absl::StartsWith(k, "MALLOC_") && k != "GLIBC_TUNABLES") {
      continue;
    }
    auto at_start = standby_env.find(k);
    if (at_start == standby_env.end() || at_start->second != v) {
      return absl::UnavailableError(
          absl::StrCat("the launch sets ", k, ", which only a new process takes"));
    }
  }
  absl::StatusOr<std::optional<WorkerIdentity>> as =
      ResolveWorkerUser(user, options_.allow_root_workers);
  if (!as.ok()) return as.status();  // the launch reports it the same way
  const Standby sb = *it;
  standbys_.erase(it);
  v1::StandbyStart start;
  for (const auto& a : spec.argv) start.add_argv(a);
  std::map<std::string, std::string> env = spec.env;
  if (*as) {
    SetUserEnvironment(**as, gen_dir, &env);
    v1::StandbyCredentials* become = start.mutable_become();
    become->set_uid((*as)->uid);
    become->set_gid((*as)->gid);
    for (gid_t g : (*as)->groups) become->add_groups(g);
  }
  for (const auto& [k, v] : env) (*start.mutable_env())[k] = v;
  start.set_cwd(spec.cwd);
  start.set_log_path(spec.log_path);
  // The start file stays the agent's (StandbyStartPath): once the standby is the job's user,
  // its processes could reach the control pipe through /proc, but only this file can be
  // named in a StartCommand.
  const std::string path = StandbyStartPath(sb.dir, sb.pid);
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  fs::permissions(fs::path(path).parent_path(), fs::perms::owner_all, ec);
  absl::Status st =
      ec ? absl::InternalError(absl::StrCat("standby start directory: ", ec.message()))
         : WriteFileAtomic(path, ProtoJson(start), 0);
  // What a launched worker gets from the launcher (its generation's directory and spec), and
  // its log, which the standby opens as that user, belong to the user it runs as.
  std::vector<std::string> give = spec.owned_paths;  // the generation's directory, its spec
  give.push_back(spec.log_path);
  if (st.ok() && *as) st = GiveToUser(**as, give);
  v1::AgentCommand c;
  c.mutable_start()->set_spec_path(path);
  absl::StatusOr<std::string> line = SerializeAgentCommand(c);
  if (st.ok()) st = line.ok() ? launcher_->SendCommand(sb.pid, *line) : line.status();
  if (!st.ok()) {
    LOG(WARNING) << "standby pid " << sb.pid << " not used (" << st.message()
                 << "); starting a process";
    launcher_->Signal(sb.pid, SIGKILL).IgnoreError();
    return st;
  }
  LOG(INFO) << "standby pid " << sb.pid << " takes rank " << rank << " (" << gen_dir << ")";
  return sb.pid;
}

void StandbyPool::Forget(int pid) {
  standbys_.erase(std::remove_if(standbys_.begin(), standbys_.end(),
                                 [&](const Standby& s) { return s.pid == pid; }),
                  standbys_.end());
}

void StandbyPool::StopAll() {
  stopping_ = true;
  for (const Standby& sb : standbys_) launcher_->Signal(sb.pid, SIGKILL).IgnoreError();
  standbys_.clear();
}

}  // namespace varuna
