// varuna-agent: one per machine. Registers with varuna-manager, heartbeats, and runs the
// workers the manager places here. Usage: docs/operations.md.

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "agent/agent_server.h"
#include "agent/process_launcher.h"
#include "common/base/logging.h"
#include "common/launch/tenant_uid.h"
#include "glog/logging.h"

ABSL_FLAG(std::string, manager, "", "varuna-manager address HOST:PORT");
ABSL_FLAG(std::string, listen, "", "address to serve the agent API on (default 0.0.0.0:0)");
ABSL_FLAG(std::string, http_listen, "",
          "HOST:PORT for Prometheus /metrics and /healthz (plain HTTP: loopback unless "
          "--http_allow_remote)");
ABSL_FLAG(bool, http_allow_remote, false,
          "allow --http_listen beyond loopback (plain HTTP, e.g. for a remote Prometheus)");
ABSL_FLAG(std::string, advertise_host, "", "host the manager reaches this agent at");
ABSL_FLAG(int, slots, 0, "worker slots (GPUs) on this machine (default 1)");
ABSL_FLAG(std::string, name, "", "node name (default: hostname)");
ABSL_FLAG(int, standby_workers, -2,
          "warm standby varuna-worker processes kept ready (default: one per free slot; 0: none)");
ABSL_FLAG(
    int, startup_probe_ms, -1,
    "speed probe at start, the baseline for re-admitting a straggler (default 500; 0 = none)");
ABSL_FLAG(std::string, work_dir, "", "where job specs and worker logs go");
ABSL_FLAG(std::string, worker_binary, "", "varuna-worker path (default: next to varuna-agent)");
ABSL_FLAG(std::string, worker_user, "",
          "run as root, start workers as this Unix user (default varuna; ignored when not root)");
ABSL_FLAG(std::string, allowed_worker_users, "",
          "comma-separated Unix users a job's token may ask its workers to run as");
ABSL_FLAG(std::string, allowed_worker_uids, "",
          "FIRST-LAST: the uids a tenant's workers may run as (default 1900000000-1900999999, "
          "the manager's tenant_uids default; none: no tenant uids)");
ABSL_FLAG(int64_t, job_dir_retention_s, -1,
          "remove a finished job's directory (specs, logs) this long after its last worker "
          "exited (default a week; 0 = never)");
ABSL_FLAG(bool, allow_root_workers, false,
          "allow workers to run as root; workers of a token without a user then run as the "
          "agent itself");
ABSL_FLAG(std::string, labels, "", "comma-separated key=value labels");
ABSL_FLAG(std::string, config, "", "YAML config file; flags override it");
ABSL_FLAG(std::string, tls_ca, "", "cluster CA (PEM): the manager's certificate must chain to it");
ABSL_FLAG(std::string, tls_cert, "", "this agent's certificate (PEM)");
ABSL_FLAG(std::string, tls_key, "", "this agent's private key (PEM)");
ABSL_FLAG(std::string, tls_manager_name, "",
          "common name of the manager's certificate (default varuna-manager)");
ABSL_FLAG(bool, allow_insecure, false, "allow a non-loopback --listen without TLS");
ABSL_FLAG(std::string, preemption_notice_file, "",
          "a file whose appearance means this machine is being preempted (first line: seconds "
          "left, optional)");
ABSL_FLAG(std::string, cloud_vm_name, "",
          "this VM's name in the cloud's scheduled events (Azure Resources); the node name and "
          "the hostname are also tried");
ABSL_FLAG(std::string, preemption_notice_url, "",
          "http:// metadata endpoint to poll for a preemption notice (Azure Scheduled Events, "
          "GCE instance/preempted, AWS spot/instance-action)");

ABSL_FLAG(int, slurm_grace_s, 30,
          "under Slurm (SLURM_JOB_ID set): SIGTERM is a preemption notice with this many seconds "
          "left (the partition's GraceTime, or sbatch --signal's lead); the agent stays until "
          "its workers have checkpointed and left, or the time is up. 0: SIGTERM stops at once");

namespace {

// A root agent's workers run as another user (Note [Worker user] in agent/launch_request.h),
// who must be able to enter --work_dir (their generations live there) and run the worker
// binary: if --worker_user cannot, refuse to start naming both, instead of every rank of every
// job exiting with code 126. Tenant uids (--allowed_worker_uids) are only warned about: a
// cluster without tokens never uses them, and their launches say why they fail.
bool CheckWorkersCanStart(const varuna::AgentConfig& config) {
  if (geteuid() != 0) return true;  // workers run as the agent itself
  if (!config.allow_root_workers) {
    auto user = varuna::ResolveWorkerUser(config.worker_user, false);
    if (user.ok() && *user) {
      absl::Status s = varuna::CheckUserCanUse(**user, config.work_dir, config.worker_binary);
      if (!s.ok()) {
        std::cerr << "varuna-agent: " << s.message()
                  << ": workers would fail to start; give --work_dir a directory and "
                     "--worker_binary a program --worker_user can reach (e.g. "
                     "/var/lib/varuna-agent and /usr/local/bin/varuna-worker), or another "
                     "--worker_user\n";
        return false;
      }
    }
  }
  auto range = varuna::ParseUidRange(config.allowed_worker_uids);
  if (range.ok() && !range->empty()) {
    auto tenant = varuna::ResolveWorkerUser(absl::StrCat("#", range->first), false);
    if (tenant.ok() && *tenant) {
      absl::Status s = varuna::CheckUserCanUse(**tenant, config.work_dir, config.worker_binary);
      if (!s.ok()) {
        LOG(WARNING) << "tenants' jobs (uids " << range->ToString()
                     << ") will not start here: " << s.message();
      }
    }
  }
  return true;
}

std::string Hostname() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

int Run() {
  varuna::AgentConfig config;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    absl::Status s = varuna::LoadAgentConfigFile(path, &config);
    if (!s.ok()) {
      std::cerr << "varuna-agent: " << s.message() << "\n";
      return 2;
    }
  }
  if (auto v = absl::GetFlag(FLAGS_manager); !v.empty()) config.manager = v;
  if (auto v = absl::GetFlag(FLAGS_listen); !v.empty()) config.listen = v;
  if (auto v = absl::GetFlag(FLAGS_http_listen); !v.empty()) config.http_listen = v;
  if (absl::GetFlag(FLAGS_http_allow_remote)) config.http_allow_remote = true;
  if (auto v = absl::GetFlag(FLAGS_advertise_host); !v.empty()) config.advertise_host = v;
  if (auto v = absl::GetFlag(FLAGS_slots); v != 0) config.slots = v;
  if (auto v = absl::GetFlag(FLAGS_standby_workers); v != -2) config.standby_workers = v;
  if (auto v = absl::GetFlag(FLAGS_startup_probe_ms); v != -1) {
    config.startup_probe = absl::Milliseconds(v);
  }
  if (auto v = absl::GetFlag(FLAGS_name); !v.empty()) config.name = v;
  if (auto v = absl::GetFlag(FLAGS_work_dir); !v.empty()) config.work_dir = v;
  if (auto v = absl::GetFlag(FLAGS_worker_binary); !v.empty()) config.worker_binary = v;
  if (auto v = absl::GetFlag(FLAGS_worker_user); !v.empty()) config.worker_user = v;
  if (auto v = absl::GetFlag(FLAGS_allowed_worker_users); !v.empty()) {
    config.allowed_worker_users = absl::StrSplit(v, ',', absl::SkipEmpty());
  }
  if (auto v = absl::GetFlag(FLAGS_allowed_worker_uids); !v.empty()) {
    config.allowed_worker_uids = v;
  }
  if (auto v = absl::GetFlag(FLAGS_job_dir_retention_s); v >= 0) {
    config.job_dir_retention = absl::Seconds(v);
  }
  if (absl::GetFlag(FLAGS_allow_root_workers)) config.allow_root_workers = true;
  if (auto v = absl::GetFlag(FLAGS_tls_ca); !v.empty()) config.tls.ca = v;
  if (auto v = absl::GetFlag(FLAGS_tls_cert); !v.empty()) config.tls.cert = v;
  if (auto v = absl::GetFlag(FLAGS_tls_key); !v.empty()) config.tls.key = v;
  if (auto v = absl::GetFlag(FLAGS_tls_manager_name); !v.empty()) config.tls_manager_name = v;
  if (absl::GetFlag(FLAGS_allow_insecure)) config.allow_insecure = true;
  if (auto v = absl::GetFlag(FLAGS_preemption_notice_file); !v.empty()) {
    config.preemption_notice_file = v;
  }
  if (auto v = absl::GetFlag(FLAGS_cloud_vm_name); !v.empty()) config.cloud_vm_name = v;
  if (auto v = absl::GetFlag(FLAGS_preemption_notice_url); !v.empty()) {
    config.preemption_notice_url = v;
  }
  for (absl::string_view kv : absl::StrSplit(absl::GetFlag(FLAGS_labels), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (p.first.empty() || kv.find('=') == absl::string_view::npos) {
      std::cerr << "varuna-agent: --labels entry '" << kv << "' is not key=value\n";
      return 2;
    }
    config.labels[p.first] = p.second;
  }
  if (config.name.empty()) config.name = Hostname();
  if (config.worker_binary.empty()) {
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    config.worker_binary = (self.parent_path() / "varuna-worker").string();
  }
  if (absl::Status s = config.Validate(); !s.ok()) {
    std::cerr << "varuna-agent: " << s.message() << "\n";
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(config.work_dir, ec);
  if (ec) {
    std::cerr << "varuna-agent: cannot create --work_dir " << config.work_dir << ": "
              << ec.message() << "\n";
    return 2;
  }
  if (!CheckWorkersCanStart(config)) return 2;

  // SIGTERM/SIGINT are taken by sigwait below; every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto tls = varuna::LoadTls(config.tls, /*need_cert=*/true, "varuna-agent");
  if (!tls.ok()) {
    std::cerr << "varuna-agent: " << tls.status().message() << "\n";
    return 2;
  }
  varuna::RealProcessLauncher launcher;
  auto manager = varuna::MakeGrpcManagerClient(config.manager, config.rpc_timeout, *tls);
  varuna::AgentServer server(config, varuna::RealClock::Get(), &launcher, std::move(manager),
                             varuna::AgentServer::Options{});
  if (absl::Status s = server.Start(); !s.ok()) {
    std::cerr << "varuna-agent: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kUnavailable ? 1 : 2;
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  // Note [Slurm preemption]: Slurm preempts a job by SIGTERM, then SIGKILL once the grace
  // time is up. Under Slurm the first SIGTERM is a preemption notice like a cloud's: the
  // manager checkpoints the job at a step boundary and morphs it off this node (or, when
  // every node is going, parks it until machines come back); the agent stays until its
  // workers are gone or the time is nearly up. A second signal stops it at once.
  const int grace_s = absl::GetFlag(FLAGS_slurm_grace_s);
  if (sig == SIGTERM && grace_s > 0 && std::getenv("SLURM_JOB_ID") != nullptr) {
    const auto deadline = absl::Now() + absl::Seconds(grace_s);
    varuna::v1::PreemptionNotice notice;
    notice.set_source("slurm");
    notice.set_deadline_ms(absl::ToUnixMillis(deadline));
    notice.set_detail(absl::StrCat("SIGTERM from Slurm job ", std::getenv("SLURM_JOB_ID")));
    LOG(INFO) << "node=" << config.name << " Slurm preemption (SIGTERM): notice, " << grace_s
              << " s to leave";
    server.PostNotice(notice);
    const timespec tick{0, 250'000'000};
    // Leave 2 s of the grace for the shutdown itself.
    bool again = false;
    while (absl::Now() < deadline - absl::Seconds(2)) {
      if (sigtimedwait(&stop_signals, nullptr, &tick) > 0) {
        again = true;
        break;
      }
      if (absl::Now() > deadline - absl::Seconds(grace_s) + absl::Seconds(2) &&
          server.RunningWorkers() == 0) {
        break;
      }
    }
    // The workers' exits (each saved its step) reach the manager before the agent goes, so
    // the job's morph completes: it waits for machines rather than for these workers.
    if (!again) {
      server.ReportNow();
      const timespec second{1, 0};
      sigtimedwait(&stop_signals, nullptr, &second);
    }
  }
  LOG(INFO) << "node=" << config.name << " got signal " << sig << "; shutting down";
  server.Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "varuna-agent --manager HOST:PORT --listen HOST:PORT --slots N --name NAME "
      "--work_dir DIR [--config FILE]");
  absl::ParseCommandLine(argc, argv);
  varuna::InitLogging(argv[0]);
  return Run();
}
