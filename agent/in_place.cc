// The agent's half of a morph in place (docs/morphing.md "Morph in place"): adopting the
// workers of an older generation, the pool of warm standby workers, and the stopped-process
// check. Agent methods, on the agent's event loop like the rest (agent.h).

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "common/base/safe_file.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/launch/worker_protocol.h"
#include "common/net/proto_json.h"
#include "common/net/rpc.h"
#include "glog/logging.h"

namespace varuna {

namespace fs = std::filesystem;

// Note [Frozen workers]: a stopped process (SIGSTOP, a debugger, a cgroup freeze) does not
// fail; its peers only see it go silent, for as long as their timeout_s. The agent reads the
// state from /proc/PID/stat (the field after the parenthesised name) and reports it, so the
// manager can treat the rank as lost at once rather than wait for the peers' timeouts.
bool ProcessStopped(int pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  const char state = text[close + 2];
  return state == 'T' || state == 't';
}

std::set<int> Agent::Adopt(const v1::LaunchRequest& req, int master_port) {
  std::set<int> adopted;
  if (req.adopt().empty()) return adopted;
  const std::string who = absl::StrCat("job=", req.job_id(), " gen=", req.generation());
  std::map<int, int> local;  // new rank -> local rank
  for (const auto& r : req.ranks()) local[r.rank()] = r.local_rank();
  std::vector<std::pair<Key, Worker>> moved;
  for (const auto& a : req.adopt()) {
    auto it = workers_.find({req.job_id(), a.old_rank()});
    if (it == workers_.end() || !it->second.running ||
        it->second.generation != a.old_generation() || !local.count(a.new_rank())) {
      continue;  // gone meanwhile: a fresh worker joins in its place
    }
    v1::AgentCommand c;
    v1::ReconfigureCommand* r = c.mutable_reconfigure();
    r->set_generation(req.generation());
    r->set_pipelines(req.pipelines());
    r->set_stage_to_rank_map(req.stage_to_rank_map());
    r->set_per_replica_batch(req.per_replica_batch());
    for (int b : req.stage_boundaries()) r->add_stage_boundaries(b);
    r->set_rank(a.new_rank());
    r->set_micro_batch(req.micro_batch());
    r->set_master_addr(req.master_addr());
    r->set_master_port(master_port);
    r->set_schedule(req.schedule());
    c.set_generation(it->second.generation);
    absl::StatusOr<std::string> line = SerializeAgentCommand(c);
    const absl::Status sent =
        line.ok() ? launcher_->SendCommand(it->second.pid, *line) : line.status();
    if (!sent.ok()) {
      LOG(WARNING) << who << " rank " << a.old_rank() << " of generation " << a.old_generation()
                   << " did not take the reconfigure (" << sent.message()
                   << "); a fresh worker replaces it";
      continue;
    }
    Worker w = std::move(it->second);
    workers_.erase(it);
    LOG(INFO) << who << " adopted pid=" << w.pid << " (generation " << w.generation << " rank "
              << w.rank << ") as rank " << a.new_rank();
    w.generation = req.generation();
    w.rank = a.new_rank();
    w.resumed_from = -1;
    w.ready_at = 0;
    w.in_place.Clear();
    w.parked.clear();
    // Its step records not yet acknowledged stay: the new generation continues after the
    // step they end with and never reports them again (the manager takes them under either
    // generation).
    moved.emplace_back(Key{req.job_id(), a.new_rank()}, std::move(w));
    adopted.insert(a.new_rank());
  }
  for (auto& [key, w] : moved) {
    // An older worker filed under the rank this survivor takes (lost, frozen, not adopted)
    // would drop out of the table here, and with it the SIGKILL that Launch sends every
    // older worker left: it goes now (a frozen process would otherwise stay stopped forever).
    auto old = workers_.find(key);
    if (old != workers_.end() && old->second.running && old->second.generation < req.generation()) {
      LOG(INFO) << who << " stops pid " << old->second.pid << " (generation "
                << old->second.generation << " rank " << old->second.rank
                << "): not adopted, its rank is taken";
      launcher_->Signal(old->second.pid, SIGKILL).IgnoreError();
    }
    workers_[key] = std::move(w);
  }
  return adopted;
}

void Agent::KeepStandbys() {
  if (config_.standby_workers == 0 || stopping_) return;
  int running = 0;
  for (const auto& [key, w] : workers_) running += w.running ? 1 : 0;
  const int free = std::max(0, config_.slots - running);
  const int want = config_.standby_workers < 0 ? free : std::min(free, config_.standby_workers);
  while (static_cast<int>(standbys_.size()) > want) {
    launcher_->Signal(standbys_.back().pid, SIGTERM).IgnoreError();  // reaped later
    standbys_.pop_back();
  }
  for (Standby& sb : standbys_) {
    if (sb.ready) continue;
    // Opening a FIFO for writing without blocking succeeds only once a reader holds it.
    const int fd = open(sb.fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
      sb.ready = true;
      close(fd);
    }
  }
  // Fill only slots that stayed free a while: right after workers exit (a relaunch about to
  // start, a job ending) a standby loading LibTorch would only compete with the launch.
  const absl::Time now = clock_->Now();
  if (running != standby_running_seen_) {
    standby_running_seen_ = running;
    standby_running_since_ = now;
  }
  if (now - standby_running_since_ < absl::Seconds(2)) return;
  while (static_cast<int>(standbys_.size()) < want) {
    const std::string dir = absl::StrCat(config_.work_dir, "/standby");
    std::error_code ec;
    fs::create_directories(dir, ec);
    const int seq = ++standby_seq_;
    ProcessSpec spec;
    spec.argv = {config_.worker_binary, "--standby"};
    spec.env = AgentEnvironment();
    if (!spec.env.count("OMP_NUM_THREADS")) spec.env["OMP_NUM_THREADS"] = "1";
    spec.control_fifo = absl::StrCat(dir, "/control", seq);
    spec.env[kControlFifoEnv] = spec.control_fifo;
    if (auto hp = SplitHostPort(address_); hp.ok()) spec.env["VARUNA_NODE_ADDR"] = hp->first;
    spec.env["VARUNA_NODE"] = config_.name;
    spec.log_path = absl::StrCat(dir, "/standby", seq, ".log");
    spec.cwd = dir;
    // A root agent's standbys wait as root and drop to the job's user when assigned, so one
    // pool serves every user (Note [Standby workers]); otherwise they are the agent's user.
    spec.user = "";
    absl::StatusOr<int> pid = launcher_->Launch(spec);
    if (!pid.ok()) {
      if (!standby_failed_) LOG(WARNING) << "standby worker not started: " << pid.status();
      standby_failed_ = true;
      return;
    }
    standby_failed_ = false;
    standbys_.push_back({*pid, spec.control_fifo});
  }
}

absl::StatusOr<int> Agent::StartInStandby(const ProcessSpec& spec, const std::string& user,
                                          const std::string& gen_dir, int rank) {
  auto it =
      std::find_if(standbys_.begin(), standbys_.end(), [](const Standby& s) { return s.ready; });
  if (it == standbys_.end()) return absl::UnavailableError("no ready standby worker");
  absl::StatusOr<std::optional<WorkerIdentity>> as =
      ResolveWorkerUser(user, config_.allow_root_workers);
  if (!as.ok()) return as.status();  // the launch reports it the same way
  const Standby sb = *it;
  standbys_.erase(it);
  v1::StandbyStart start;
  for (const auto& a : spec.argv) start.add_argv(a);
  std::map<std::string, std::string> env = spec.env;
  if (*as) {
    SetUserEnvironment(**as, &env);
    v1::StandbyCredentials* become = start.mutable_become();
    become->set_uid((*as)->uid);
    become->set_gid((*as)->gid);
    for (gid_t g : (*as)->groups) become->add_groups(g);
  }
  for (const auto& [k, v] : env) (*start.mutable_env())[k] = v;
  start.set_cwd(spec.cwd);
  start.set_log_path(spec.log_path);
  // The start file stays the agent's (StandbyStartPath): the job's user gets the FIFO below
  // and could send a StartCommand of its own, but only this file can be named in one.
  const std::string path = StandbyStartPath(sb.fifo, sb.pid);
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  fs::permissions(fs::path(path).parent_path(), fs::perms::owner_all, ec);
  absl::Status st =
      ec ? absl::InternalError(absl::StrCat("standby start directory: ", ec.message()))
         : WriteFileAtomic(path, ProtoJson(start), 0);
  // What a launched worker gets from the launcher: its generation's directory, its log and
  // its control FIFO belong to the user it runs as.
  if (st.ok() && *as) st = GiveToUser(**as, {gen_dir, spec.log_path, sb.fifo});
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

}  // namespace varuna
