#include "agent/agent.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/launch_request.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/launch/launch_contract.h"
#include "common/launch/worker_protocol.h"
#include "common/net/proto_json.h"
#include "common/net/rpc.h"
#include "common/pipeline/stage_map.h"
#include "common/pipeline/topology.h"
#include "glog/logging.h"

extern char** environ;

namespace varuna {
namespace fs = std::filesystem;

// A profile travels in one heartbeat, under gRPC's default 4 MiB message limit.
constexpr int64_t kMaxProfileTransferBytes = 2 << 20;

namespace {

// Asks the kernel for a free TCP port. Another process may take it before rank 0 binds it;
// the window is a few milliseconds and the job then fails with a clear store error.
absl::StatusOr<int> PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::InternalError("cannot find a free port");
  }
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

std::string DescribeExit(int code, int sig) {
  return sig != 0 ? absl::StrCat("signal ", sig) : absl::StrCat("code ", code);
}

}  // namespace

std::map<std::string, std::string> AgentEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

absl::Status AgentConfig::Validate() const {
  if (name.empty()) return absl::InvalidArgumentError("agent: --name must not be empty");
  if (manager.empty()) return absl::InvalidArgumentError("agent: --manager HOST:PORT is required");
  if (name.size() > 63) return absl::InvalidArgumentError("agent: --name is longer than 63");
  if (slots < 1 || slots > 1024)
    return absl::InvalidArgumentError("agent: --slots must be in [1, 1024]");
  if (work_dir.empty()) return absl::InvalidArgumentError("agent: --work_dir is required");
  if (standby_workers < -1 || standby_workers > 1024) {
    return absl::InvalidArgumentError("agent: --standby_workers must be in [-1, 1024]");
  }
  if (heartbeat_period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("agent: heartbeat period must be > 0");
  }
  if (!preemption_notice_url.empty() && preemption_notice_url.rfind("http://", 0) != 0) {
    return absl::InvalidArgumentError(
        "agent: --preemption_notice_url must be an http:// URL (a metadata endpoint)");
  }
  if (startup_probe < absl::ZeroDuration() || startup_probe > absl::Seconds(5)) {
    return absl::InvalidArgumentError("agent: startup_probe_s must be in [0, 5]");
  }
  if (notice_poll_period < absl::Milliseconds(10)) {
    return absl::InvalidArgumentError("agent: notice_poll_period_s must be >= 0.01");
  }
  if (absl::StatusOr<UidRange> r = ParseUidRange(allowed_worker_uids); !r.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent: --allowed_worker_uids: ", r.status().message()));
  }
  if (job_dir_retention < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("agent: job_dir_retention_s must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status LoadAgentConfigFile(const std::string& path, AgentConfig* c) {
  return ForEachConfigEntry(
      path, "agent config",
      [&](const std::string& what, const std::string& key, const YAML::Node& v) -> absl::Status {
        auto str = [&](std::string* out) { return ReadInto(v, what, key, out); };
        auto seconds = [&](absl::Duration* out) { return ReadSeconds(v, what, key, out); };
        if (key == "name") return str(&c->name);
        if (key == "manager") return str(&c->manager);
        if (key == "listen") return str(&c->listen);
        if (key == "http_listen") return str(&c->http_listen);
        if (key == "advertise_host") return str(&c->advertise_host);
        if (key == "slots") return ReadInto(v, what, key, &c->slots);
        if (key == "work_dir") return str(&c->work_dir);
        if (key == "worker_binary") return str(&c->worker_binary);
        if (key == "worker_user") return str(&c->worker_user);
        if (key == "allowed_worker_users") return ReadInto(v, what, key, &c->allowed_worker_users);
        if (key == "allowed_worker_uids") return str(&c->allowed_worker_uids);
        if (key == "job_dir_retention_s") return seconds(&c->job_dir_retention);
        if (key == "allow_root_workers") return ReadInto(v, what, key, &c->allow_root_workers);
        if (key == "labels") return ReadInto(v, what, key, &c->labels);
        if (key == "heartbeat_period_s") return seconds(&c->heartbeat_period);
        if (key == "stop_grace_s") return seconds(&c->stop_grace);
        if (key == "rpc_timeout_s") return seconds(&c->rpc_timeout);
        if (key == "tls_ca") return str(&c->tls.ca);
        if (key == "tls_cert") return str(&c->tls.cert);
        if (key == "tls_key") return str(&c->tls.key);
        if (key == "tls_manager_name") return str(&c->tls_manager_name);
        if (key == "allow_insecure") return ReadInto(v, what, key, &c->allow_insecure);
        if (key == "http_allow_remote") return ReadInto(v, what, key, &c->http_allow_remote);
        if (key == "preemption_notice_file") return str(&c->preemption_notice_file);
        if (key == "preemption_notice_url") return str(&c->preemption_notice_url);
        if (key == "cloud_vm_name") return str(&c->cloud_vm_name);
        if (key == "notice_poll_period_s") return seconds(&c->notice_poll_period);
        if (key == "standby_workers") return ReadInto(v, what, key, &c->standby_workers);
        if (key == "startup_probe_s") return seconds(&c->startup_probe);
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": unknown key '", key,
            "' (known: name, manager, listen, http_listen, http_allow_remote, advertise_host, "
            "slots, work_dir, "
            "worker_binary, worker_user, allowed_worker_users, allowed_worker_uids, "
            "allow_root_workers, job_dir_retention_s, "
            "labels, heartbeat_period_s, stop_grace_s, rpc_timeout_s, tls_ca, tls_cert, tls_key, "
            "tls_manager_name, allow_insecure, preemption_notice_file, preemption_notice_url, "
            "cloud_vm_name, "
            "notice_poll_period_s, standby_workers, startup_probe_s)"));
      });
}

namespace {

StandbyPool::Options PoolOptions(const AgentConfig& c) {
  StandbyPool::Options o;
  o.size = c.standby_workers;
  o.slots = c.slots;
  o.work_dir = c.work_dir;
  o.worker_binary = c.worker_binary;
  o.node = c.name;
  o.allow_root_workers = c.allow_root_workers;
  return o;
}

}  // namespace

Agent::Agent(AgentConfig config, Clock* clock, ProcessLauncher* launcher)
    : config_(std::move(config)),
      clock_(clock),
      launcher_(launcher),
      report_(config_.name),
      standbys_(PoolOptions(config_), clock, launcher) {}

void Agent::set_address(std::string address) {
  address_ = std::move(address);
  if (auto hp = SplitHostPort(address_); hp.ok()) standbys_.set_node_addr(hp->first);
}

std::string Agent::JobDir(const std::string& job_id) const {
  return absl::StrCat(config_.work_dir, "/jobs/", job_id);
}

// Note [Job directories]: work_dir/jobs/ID holds a job's rank logs (the agent's, 0600) and a
// directory per generation (genN: the spec copy, the progress files, the workers' working
// directory), which the launcher gives to the job's uid with mode 0700; the spec (its env:
// may hold secrets) is 0600 and the job's too. ID itself is 0711: the job's uid can reach
// its generation without listing anything, other uids see nothing. What workers create is
// 0600 (umask 077). A job's directory goes --job_dir_retention_s (default a week) after
// its last worker here exited (SweepJobDirs), removed without following any link the job
// planted (RemoveTreeNoFollow).
absl::Status Agent::MakeGenerationDir(const std::string& job_dir, const std::string& gen_dir,
                                      const std::string& spec_path, const std::string& yaml,
                                      const std::string& run_as) {
  std::error_code ec;
  fs::create_directories(gen_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", gen_dir, ": ", ec.message()));
  }
  fs::permissions(job_dir, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec,
                  ec);
  if (!ec) fs::permissions(gen_dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot restrict ", job_dir, ": ", ec.message()));
  }
  // Written beside and renamed over: a running worker of this generation may have put
  // anything at spec_path, and opening that for writing could block (a FIFO).
  RETURN_IF_ERROR(WriteFileAtomic(spec_path, yaml, 0));
  if (::chmod(spec_path.c_str(), 0600) != 0) {
    return absl::InternalError(absl::StrCat("cannot restrict ", spec_path, ": ", strerror(errno)));
  }
  // The job's at once: a repeated launch rewrites it while ranks it started still read it. A
  // user that does not resolve is the launcher's to report.
  absl::StatusOr<std::optional<WorkerIdentity>> as =
      ResolveWorkerUser(run_as, config_.allow_root_workers);
  if (as.ok() && *as) RETURN_IF_ERROR(GiveToUser(**as, {spec_path}));
  return absl::OkStatus();
}

std::vector<std::string> SweepJobDirs(const std::string& jobs_dir, absl::Duration retention,
                                      absl::Time now, const std::set<std::string>& keep) {
  std::vector<std::string> removed;
  if (retention <= absl::ZeroDuration()) return removed;
  std::error_code ec;
  for (fs::directory_iterator it(jobs_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string id = it->path().filename().string();
    if (keep.count(id) || !it->is_directory(ec) || it->is_symlink(ec)) continue;
    // The newest change: the directory itself and the agent's logs in it (an exit's banner).
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0) continue;
    int64_t newest = st.st_mtime;
    std::error_code ec2;
    for (fs::directory_iterator f(it->path(), ec2), fend; !ec2 && f != fend; f.increment(ec2)) {
      if (::lstat(f->path().c_str(), &st) == 0) newest = std::max<int64_t>(newest, st.st_mtime);
    }
    if (now - absl::FromUnixSeconds(newest) < retention) continue;
    if (absl::Status s = RemoveTreeNoFollow(it->path().string()); !s.ok()) {
      LOG(WARNING) << "job directory not removed: " << s.message();
      continue;
    }
    LOG(INFO) << "job=" << id << " directory removed (no worker for " << retention << ")";
    removed.push_back(id);
  }
  return removed;
}

namespace {

// The uid the worker runs as (WorkerUser's answer, as the launcher resolves it: a name, a
// tenant's "#UID"); none, or one that does not resolve (a test's launcher runs no such user):
// this process's, so the worker's files must be this process's own.
uid_t UidOf(const std::string& user) {
  absl::StatusOr<std::optional<WorkerIdentity>> id = ResolveWorkerUser(user, /*allow_root=*/true);
  return id.ok() && *id ? (*id)->uid : ::geteuid();
}

}  // namespace

absl::StatusOr<v1::LaunchResponse> Agent::Launch(const v1::LaunchRequest& req) {
  const std::string who = absl::StrCat("job=", req.job_id(), " gen=", req.generation());
  RETURN_IF_ERROR(ValidateLaunch(req, config_.slots, config_.name));
  int& newest = newest_generation_[req.job_id()];
  if (req.generation() < newest) {
    return absl::FailedPreconditionError(absl::StrCat("launch ", who, " is stale: generation ",
                                                      newest, " was already launched here"));
  }
  // The port first: a worker adopted below is told it in its ReconfigureCommand.
  v1::LaunchResponse resp;
  const std::string port_key = absl::StrCat(req.job_id(), "/", req.generation());
  int master_port = req.master_port();
  if (master_port == 0) {
    auto it = master_port_.find(port_key);
    if (it != master_port_.end()) {
      master_port = it->second;
    } else {
      ASSIGN_OR_RETURN(master_port, PickFreePort());
      master_port_[port_key] = master_port;
    }
  }
  resp.set_master_port(master_port);
  // Note [Morph in place] in worker/engine/regroup.cc: running workers of the older generation that
  // take a rank of this one are told to regroup, and keep their processes.
  std::set<int> adopted = Adopt(req, master_port);
  if (req.generation() > newest) {
    // A new generation replaces whatever an older one left running (and did not adopt).
    SignalWorkers(req.job_id(), req.generation() - 1, SIGKILL, false, absl::ZeroDuration());
    newest = req.generation();
  }

  // Note [Worker user] in agent/launch_request.h.
  absl::StatusOr<std::string> user =
      WorkerUser(req, config_.allowed_worker_users, *ParseUidRange(config_.allowed_worker_uids),
                 config_.allow_root_workers, config_.worker_user);
  if (!user.ok()) {
    return absl::Status(user.status().code(),
                        absl::StrCat("launch ", who, ": ", user.status().message()));
  }
  const std::string run_as = *user;
  const uid_t run_as_uid = UidOf(run_as);
  const std::string job_dir = JobDir(req.job_id());
  const std::string gen_dir = absl::StrCat(job_dir, "/gen", req.generation());
  const std::string spec_path = gen_dir + "/job.yaml";
  if (absl::Status s = MakeGenerationDir(job_dir, gen_dir, spec_path, req.spec_yaml(), run_as);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("launch ", who, ": ", s.message()));
  }
  std::error_code ec;

  LaunchContract contract = ContractOf(req);
  contract.master_port = master_port;
  contract.spec_path = spec_path;
  contract.gen_dir = gen_dir;
  contract.node = config_.name;
  if (auto hp = SplitHostPort(address_); hp.ok()) contract.node_addr = hp->first;
  contract.worker_binary = config_.worker_binary;
  std::map<std::string, std::string> base_env = AgentEnvironment();
  for (const auto& [k, v] : req.env()) base_env[k] = v;

  int started = 0;
  for (const auto& r : req.ranks()) {
    const Key key{req.job_id(), r.rank()};
    auto it = workers_.find(key);
    if (it != workers_.end() && it->second.generation == req.generation()) continue;  // repeat
    if (adopted.count(r.rank())) continue;

    Worker w;
    w.job_id = req.job_id();
    w.generation = req.generation();
    w.rank = r.rank();
    w.log_path = absl::StrCat(job_dir, "/rank", r.rank(), ".log");
    w.progress_path = absl::StrCat(gen_dir, "/progress.rank", r.rank());
    w.uid = run_as_uid;
    fs::remove(w.progress_path, ec);

    ProcessSpec spec;
    spec.control_pipe = true;
    RankProcess process =
        RankContract(contract, r.rank(), r.local_rank(), w.progress_path, base_env);
    spec.argv = std::move(process.argv);
    spec.env = std::move(process.env);
    spec.user = run_as;
    spec.allow_root = config_.allow_root_workers;
    spec.owned_paths = {gen_dir, spec_path};
    spec.log_path = w.log_path;
    spec.cwd = req.entrypoint().empty() || req.code_dir().empty() ? gen_dir : req.code_dir();
    AppendToRegularFile(
        w.log_path, absl::StrCat("==== varuna-agent ", config_.name, ": job ", req.job_id(),
                                 " generation ", req.generation(), " rank ", r.rank(), " (local ",
                                 r.local_rank(), "): ", absl::StrJoin(spec.argv, " "), "\n"))
        .IgnoreError();
    absl::StatusOr<int> pid = absl::UnavailableError("no standby");
    if (req.entrypoint().empty()) pid = standbys_.Take(spec, run_as, gen_dir, r.rank());
    if (!pid.ok()) pid = launcher_->Launch(spec);
    if (!pid.ok()) {
      return absl::Status(pid.status().code(),
                          absl::StrCat("launch ", who, " rank ", r.rank(), " on node ",
                                       config_.name, ": ", pid.status().message()));
    }
    w.pid = *pid;
    w.running = true;
    LOG(INFO) << who << " rank=" << r.rank() << " started pid=" << w.pid;
    workers_[key] = std::move(w);
    ++started;
    if (ever_started_.size() > 100000) ever_started_.clear();  // bounded
    const bool restart = !ever_started_.insert(key).second;
    if (metrics_) metrics_->OnWorkerStarted(req.job_id(), restart);
  }
  UpdateWorkerMetrics();
  if (started == 0) VLOG(1) << who << " repeated launch; nothing new";
  return resp;
}

int Agent::SignalWorkers(const std::string& job_id, int max_generation, int sig, bool arm_kill,
                         absl::Duration grace) {
  int n = 0;
  for (auto& [key, w] : workers_) {
    if (key.first != job_id || !w.running || w.generation > max_generation) continue;
    if (arm_kill && w.kill_at != absl::InfiniteFuture()) continue;  // already stopping
    absl::Status s = launcher_->Signal(w.pid, sig);
    if (!s.ok()) LOG(WARNING) << "job=" << job_id << " rank=" << w.rank << ": " << s.message();
    if (arm_kill) w.kill_at = clock_->Now() + grace;
    ++n;
  }
  return n;
}

v1::StopResponse Agent::Stop(const v1::StopRequest& req) {
  const int max_gen = req.generation() == 0 ? INT_MAX : req.generation();
  const absl::Duration grace =
      req.grace_ms() > 0 ? absl::Milliseconds(req.grace_ms()) : config_.stop_grace;
  v1::StopResponse resp;
  resp.set_signalled(SignalWorkers(req.job_id(), max_gen, SIGTERM, true, grace));
  if (resp.signalled() > 0) {
    LOG(INFO) << "job=" << req.job_id() << " gen<=" << max_gen << " stopping " << resp.signalled()
              << " workers (SIGKILL after " << grace << ")";
  }
  return resp;
}

const char* Agent::CommandWorker(const Worker& w, v1::AgentCommand command, int fallback_signal) {
  command.set_generation(w.generation);
  absl::StatusOr<std::string> line = SerializeAgentCommand(command);
  const absl::Status sent = line.ok() ? launcher_->SendCommand(w.pid, *line) : line.status();
  if (sent.ok()) return "command";
  VLOG(1) << "job=" << w.job_id << " gen=" << w.generation << " rank=" << w.rank << " "
          << CommandKindName(command) << " by signal " << fallback_signal << ": " << sent.message();
  return launcher_->Signal(w.pid, fallback_signal).ok() ? "signal" : "";
}

v1::CheckpointResponse Agent::Checkpoint(const v1::CheckpointRequest& req) {
  v1::CheckpointResponse resp;
  if (req.probe()) return resp;
  int commanded = 0, signalled = 0;
  for (auto& [key, w] : workers_) {
    if (key.first != req.job_id() || !w.running) continue;
    if (req.generation() != 0 && w.generation != req.generation()) continue;
    // A graceful save is the worker's stop (checkpoint at the step boundary, exit 0), an abort
    // its checkpoint_now; each by the control pipe, else by the signal that always meant it.
    v1::AgentCommand command;
    if (req.abort_step()) {
      command.mutable_checkpoint_now();
    } else {
      command.mutable_stop()->set_park(req.park());
    }
    const std::string how = CommandWorker(w, command, req.abort_step() ? SIGUSR2 : SIGUSR1);
    commanded += how == "command" ? 1 : 0;
    signalled += how == "signal" ? 1 : 0;
  }
  LOG(INFO) << "job=" << req.job_id() << " gen=" << req.generation()
            << (req.abort_step() ? " abort-and-save (checkpoint_now/SIGUSR2)"
                                 : " checkpoint-and-stop (stop/SIGUSR1)")
            << " requested from " << commanded + signalled << " workers (" << commanded
            << " by command, " << signalled << " by signal)";
  resp.set_signalled(commanded + signalled);
  return resp;
}

absl::StatusOr<v1::FetchLogsResponse> Agent::FetchLogs(const v1::FetchLogsRequest& req) const {
  if (req.job_id().empty() || req.job_id().find('/') != std::string::npos ||
      req.job_id().find("..") != std::string::npos || req.rank() < 0) {
    return absl::InvalidArgumentError("logs: bad job id or rank");
  }
  const std::string path = absl::StrCat(JobDir(req.job_id()), "/rank", req.rank(), ".log");
  const int64_t max =
      std::clamp<int64_t>(req.max_bytes() > 0 ? req.max_bytes() : (1 << 20), 1, 1 << 20);
  auto slice = ReadRegularFileSlice(path, req.offset(), max, "log");
  if (!slice.ok()) {
    return absl::NotFoundError(absl::StrCat("no log for job ", req.job_id(), " rank ", req.rank(),
                                            " on node ", config_.name));
  }
  v1::FetchLogsResponse resp;
  resp.set_next_offset(slice->offset + static_cast<int64_t>(slice->data.size()));
  resp.set_size(slice->size);
  resp.set_data(std::move(slice->data));
  return resp;
}

namespace {

// The newest line the launcher wrote into a rank's log ("varuna-agent: ..."), or "".
std::string LaunchFailure(const std::string& log_path) {
  auto tail = ReadRegularFileSlice(log_path, -4096, 4096, "log");
  if (!tail.ok()) return "";
  std::vector<absl::string_view> lines = absl::StrSplit(tail->data, '\n', absl::SkipEmpty());
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (absl::StartsWith(*it, "varuna-agent: ")) return std::string(it->substr(0, 500));
  }
  return "";
}

}  // namespace

void Agent::Reap() {
  for (const ProcessExit& e : launcher_->Reap()) {
    standbys_.Forget(e.pid);
    for (auto& [key, w] : workers_) {
      if (w.pid != e.pid || !w.running) continue;
      w.running = false;
      w.exit_code = e.exit_code;
      w.signal = e.signal;
      if (metrics_) metrics_->OnWorkerExited(w.job_id, e.exit_code, e.signal);
      w.exited_at = absl::ToDoubleSeconds(clock_->Now() - absl::UnixEpoch());
      report_.MarkUrgent();
      ReadProgress(w);  // its last lines (how it ended) go with the exit
      if (w.error.empty() && (e.exit_code == 126 || e.exit_code == 127) && e.signal == 0) {
        // It never ran: the launcher wrote why (Note [Launch failures] in process_launcher.cc).
        w.error = LaunchFailure(w.log_path);
      }
      LOG(INFO) << "job=" << w.job_id << " gen=" << w.generation << " rank=" << w.rank
                << " exited with " << DescribeExit(e.exit_code, e.signal);
      AppendToRegularFile(w.log_path,
                          absl::StrCat("==== varuna-agent ", config_.name, ": rank ", w.rank,
                                       " exited with ", DescribeExit(e.exit_code, e.signal), "\n"))
          .IgnoreError();
    }
  }
}

// Note [Progress file]: the worker (the job's code) owns this file, so it is read like any
// outside input: non-blocking opens of a regular file only (a FIFO put there cannot freeze
// the agent), at most 256 KiB per read, only complete lines, each through the protocol's codec
// (ParseWorkerEvent: bounded, both line forms); a bad line is skipped, and the first one of a
// worker is logged. Step records are forwarded once per job generation from this node,
// whichever of its ranks wrote them first (every rank reports the same global loss).
void Agent::ReadProgress(Worker& w) {
  constexpr int64_t kMaxRead = 256 << 10;
  static_assert(kMaxRead > kMaxEventLineBytes, "a read must hold a whole line");
  // Note [Files a job wrote]: the worker's directory is its own, so anything in it may be a
  // link or a hard link planted to make the agent (root) read another file: read only the
  // regular file itself, owned by the worker's user.
  const fs::path progress(w.progress_path);
  auto slice = ReadOwnedFileSlice(progress.parent_path().string(), progress.filename().string(),
                                  w.uid, w.progress_offset, kMaxRead, "progress file");
  if (!slice.ok() || slice->data.empty()) return;
  const size_t end = slice->data.rfind('\n');
  if (end == std::string::npos) {
    // No complete line: wait for the rest, unless the line is absurdly long.
    if (slice->data.size() >= static_cast<size_t>(kMaxRead)) w.progress_offset += kMaxRead;
    return;
  }
  w.progress_offset = slice->offset + static_cast<int64_t>(end) + 1;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(slice->data).substr(0, end), '\n')) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<v1::WorkerEvent> event = ParseWorkerEvent(line);
    if (!event.ok()) {
      if (w.bad_lines++ == 0) {
        LOG(WARNING) << "job=" << w.job_id << " gen=" << w.generation << " rank=" << w.rank
                     << " progress line skipped: " << event.status().message()
                     << " (later bad lines are skipped silently)";
      }
      continue;
    }
    switch (event->kind_case()) {
      case v1::WorkerEvent::kParked:
        w.parked = event->parked().reason();
        break;
      case v1::WorkerEvent::kReady:
        w.parked.clear();
        w.resumed_from = event->ready().resumed_from();
        w.in_place = event->ready().in_place();
        w.ready_at = event->t();
        break;
      case v1::WorkerEvent::kProfile: {
        // Only the file this generation's worker was told to write (never a path of its own).
        const std::string dir = fs::path(w.progress_path).parent_path().string();
        auto text =
            event->profile().path() == dir + "/profile.json"
                ? ReadOwnedFile(dir, "profile.json", w.uid, kMaxProfileTransferBytes, "profile")
                : absl::StatusOr<std::string>(
                      absl::InvalidArgumentError("profile path is not the one the agent chose"));
        if (text.ok()) {
          w.profile_json = *std::move(text);
        } else {
          w.error = std::string(text.status().message()).substr(0, 2000);
        }
        break;
      }
      case v1::WorkerEvent::kError:
        if (!event->error().command().empty()) {
          // A command the worker cannot carry out; it keeps running.
          LOG(WARNING) << "job=" << w.job_id << " gen=" << w.generation << " rank=" << w.rank
                       << " refused " << event->error().command() << ": "
                       << event->error().message();
          break;
        }
        w.error = event->error().message();
        break;
      case v1::WorkerEvent::kStopped:
        w.last.set_stopped(true);
        w.saved_step = event->stopped().saved_step();
        w.committed_step = event->stopped().saved_step();  // a stop saves what all agreed
        break;
      case v1::WorkerEvent::kRescued:
        w.last.set_stopped(false);
        w.saved_step = event->rescued().saved_step();
        w.committed_step = event->rescued().committed_step();
        w.pending_step = event->rescued().pending_step();
        break;
      case v1::WorkerEvent::kStep:
        w.last = event->step();
        report_.Queue(w.job_id, w.generation, event->step(), &w.steps);
        break;
      case v1::WorkerEvent::KIND_NOT_SET:
        break;
    }
  }
}

// Each worker's row is small (Note [Heartbeat budget] in heartbeat_report.cc): its error cut,
// its progress copy without the per-stage lists; the report adds what can be large.
v1::HeartbeatRequest Agent::BuildHeartbeat() {
  Reap();
  UpdateWorkerMetrics();
  v1::HeartbeatRequest hb = report_.Begin();
  std::vector<HeartbeatReport::Row> rows;
  for (auto& [key, w] : workers_) {
    if (w.running) ReadProgress(w);
    v1::WorkerStatus* s = hb.add_workers();
    s->set_job_id(w.job_id);
    s->set_generation(w.generation);
    s->set_rank(w.rank);
    s->set_pid(w.pid);
    s->set_state(w.running ? v1::WORKER_RUNNING : v1::WORKER_EXITED);
    s->set_exit_code(w.exit_code);
    s->set_signal(w.signal);
    s->set_error(w.error.substr(0, kMaxErrorBytes));
    *s->mutable_progress() = w.last;
    s->mutable_progress()->clear_stage_busy_s();  // in the step records, not here
    s->mutable_progress()->clear_stage_wait_s();
    s->mutable_progress()->clear_rank_busy_s();
    s->mutable_progress()->clear_rank_wait_s();
    s->set_resumed_from(w.resumed_from);
    s->set_ready_at(w.ready_at);
    s->set_exited_at(w.exited_at);
    s->set_saved_step(w.saved_step);
    s->set_committed_step(w.committed_step);
    s->set_pending_step(w.pending_step);
    if (w.in_place.ByteSizeLong() > 0) *s->mutable_in_place() = w.in_place;
    s->set_parked(w.parked);
    s->set_frozen(w.running && w.frozen);  // Tick looks every 100 ms
    rows.push_back({s, &w.profile_json, &w.steps});
  }
  report_.Fill(&hb, rows);
  return hb;
}

void Agent::UpdateWorkerMetrics() {
  if (!metrics_) return;
  int running = 0, exited = 0;
  for (const auto& [key, w] : workers_) (w.running ? running : exited) += 1;
  metrics_->SetWorkers(running, exited);
  if (const auto& notice = report_.notice()) {
    const double now = absl::ToDoubleSeconds(clock_->Now() - absl::UnixEpoch());
    metrics_->SetNotice(true, notice->deadline_ms() > 0 ? notice->deadline_ms() / 1e3 - now : 0);
  } else {
    metrics_->SetNotice(false, 0);
  }
}

// The file's existence is the notice; a number on its first line is the seconds left.
void Agent::CheckNoticeFile() {
  if (config_.preemption_notice_file.empty() || report_.notice()) return;
  std::error_code ec;
  if (!fs::exists(config_.preemption_notice_file, ec)) return;
  v1::PreemptionNotice n;
  n.set_source("file");
  n.set_detail(config_.preemption_notice_file);
  auto text = ReadRegularFile(config_.preemption_notice_file, 4096, "preemption notice file");
  double seconds = 0;
  if (text.ok() &&
      absl::SimpleAtod(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))), &seconds) &&
      seconds >= 0 && seconds < 86400 * 365) {
    n.set_deadline_ms(absl::ToUnixMillis(clock_->Now() + absl::Seconds(seconds)));
  }
  report_.SetNotice(n);
}

void Agent::OnHeartbeatResponse(const v1::HeartbeatResponse& resp) {
  // Note [Durable step records] in heartbeat_report.cc.
  std::map<std::string, int64_t> durable;
  for (const v1::DurableStep& d : resp.durable()) durable[d.job_id()] = d.step();
  const bool new_term = resp.manager_term() != manager_term_;
  manager_term_ = resp.manager_term();
  for (auto& [key, w] : workers_) {
    auto it = durable.find(w.job_id);
    report_.Acknowledge(&w.steps, it == durable.end() ? 0 : it->second, new_term);
  }
  for (const v1::JobRef& ref : resp.stop()) {
    v1::StopRequest stop;
    stop.set_job_id(ref.job_id());
    stop.set_generation(ref.generation());
    Stop(stop);
  }
  for (const v1::JobRef& ref : resp.release()) {
    const int max_gen = ref.generation() == 0 ? INT_MAX : ref.generation();
    for (auto it = workers_.begin(); it != workers_.end();) {
      const Worker& w = it->second;
      if (w.job_id == ref.job_id() && !w.running && w.generation <= max_gen && w.steps.empty()) {
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void Agent::Tick() {
  Reap();
  CheckNoticeFile();
  standbys_.Keep(running_workers());
  const absl::Time now = clock_->Now();
  if (now - last_sweep_ >= absl::Minutes(1)) {  // Note [Job directories]
    last_sweep_ = now;
    std::set<std::string> running;
    for (const auto& [key, w] : workers_) {
      if (w.running) running.insert(key.first);
    }
    const std::vector<std::string> removed =
        SweepJobDirs(config_.work_dir + "/jobs", config_.job_dir_retention, absl::Now(), running);
    // The job's metric series go with its directory (its workers were released long ago).
    for (const std::string& id : removed) {
      if (metrics_) metrics_->ForgetJob(id);
    }
    if (!removed.empty()) ForgetJobsWithoutDirs();
  }
  // A parked or stopped worker starts a morph: tell the manager now, not at the next period.
  for (auto& [key, w] : workers_) {
    if (!w.running) continue;
    const bool was_parked = !w.parked.empty();
    ReadProgress(w);
    const bool frozen = ProcessStopped(w.pid);
    if ((!was_parked && !w.parked.empty()) || (frozen && !w.frozen)) report_.MarkUrgent();
    w.frozen = frozen;
  }
  for (auto& [key, w] : workers_) {
    if (!w.running || w.kill_at > now) continue;
    LOG(WARNING) << "job=" << w.job_id << " rank=" << w.rank << " pid=" << w.pid
                 << " ignored SIGTERM for the grace period; SIGKILL";
    launcher_->Signal(w.pid, SIGKILL).IgnoreError();
    w.kill_at = now + absl::Seconds(5);
  }
}

int Agent::StopAll() {
  // Standbys hold no state: they go at once, and no new one starts.
  standbys_.StopAll();
  std::set<std::string> jobs;
  for (const auto& [key, w] : workers_) jobs.insert(key.first);
  int n = 0;
  for (const auto& job : jobs) n += SignalWorkers(job, INT_MAX, SIGTERM, true, config_.stop_grace);
  return n;
}

void Agent::KillAll() {
  for (auto& [key, w] : workers_) {
    if (w.running) launcher_->Signal(w.pid, SIGKILL).IgnoreError();
  }
}

void Agent::ForgetJobsWithoutDirs() {
  std::error_code ec;
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (!it->second.running && !fs::exists(JobDir(it->first.first), ec)) {
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

int Agent::running_workers() const {
  int n = 0;
  for (const auto& [key, w] : workers_) n += w.running ? 1 : 0;
  return n;
}

}  // namespace varuna
