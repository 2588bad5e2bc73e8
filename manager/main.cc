// varuna-manager: the cluster's one control daemon. Usage: docs/operations.md.

#include <signal.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/base/logging.h"
#include "glog/logging.h"
#include "manager/api/manager_server.h"

ABSL_FLAG(std::string, listen, "", "address to serve on, HOST:PORT (default 127.0.0.1:7070)");
ABSL_FLAG(std::string, http_listen, "",
          "HOST:PORT for the dashboard, its JSON API and Prometheus /metrics (port 0 picks one; "
          "HTTPS with --tls_cert/--tls_key, else plain HTTP on loopback unless "
          "--http_allow_remote)");
ABSL_FLAG(bool, http_allow_remote, false,
          "allow plain HTTP beyond loopback (metrics, dashboard, job logs; HTTPS needs no flag)");
ABSL_FLAG(bool, http_open_metrics, false,
          "with --tokens_file, serve /metrics without a bearer token (the API always needs one)");
ABSL_FLAG(std::string, state_dir, "", "directory for the state database (required)");
ABSL_FLAG(std::string, config, "", "YAML config file; flags override it");
ABSL_FLAG(std::string, machine_list, "", "optional file of hosts allowed to get work");
ABSL_FLAG(std::string, tls_ca, "", "cluster CA (PEM): agents' certificates must chain to it");
ABSL_FLAG(std::string, tls_cert, "", "the manager's certificate (PEM, common name varuna-manager)");
ABSL_FLAG(std::string, tls_key, "", "the manager's private key (PEM)");
ABSL_FLAG(std::string, tokens_file, "", "file of 'NAME TOKEN' lines; varunactl must send one");
ABSL_FLAG(bool, allow_insecure, false, "allow a non-loopback --listen without TLS");
ABSL_FLAG(std::string, etcd_endpoints, "",
          "etcd client endpoints HOST:PORT,... : several managers elect a leader and keep the "
          "state in etcd (docs/operations.md \"Several managers\"); default: one manager, SQLite");
ABSL_FLAG(std::string, advertise, "",
          "HOST:PORT clients reach this manager at (default: --listen; needed with etcd when "
          "--listen is a wildcard)");

namespace {

int Run() {
  varuna::ManagerConfig config;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    if (absl::Status s = varuna::LoadManagerConfigFile(path, &config); !s.ok()) {
      std::cerr << "varuna-manager: " << s.message() << "\n";
      return 2;
    }
  }
  if (auto v = absl::GetFlag(FLAGS_listen); !v.empty()) config.listen = v;
  if (auto v = absl::GetFlag(FLAGS_state_dir); !v.empty()) config.state_dir = v;
  if (auto v = absl::GetFlag(FLAGS_http_listen); !v.empty()) config.http_listen = v;
  if (absl::GetFlag(FLAGS_http_allow_remote)) config.http_allow_remote = true;
  if (absl::GetFlag(FLAGS_http_open_metrics)) config.http_open_metrics = true;
  if (auto v = absl::GetFlag(FLAGS_machine_list); !v.empty()) config.machine_list = v;
  if (auto v = absl::GetFlag(FLAGS_tls_ca); !v.empty()) config.tls.ca = v;
  if (auto v = absl::GetFlag(FLAGS_tls_cert); !v.empty()) config.tls.cert = v;
  if (auto v = absl::GetFlag(FLAGS_tls_key); !v.empty()) config.tls.key = v;
  if (auto v = absl::GetFlag(FLAGS_tokens_file); !v.empty()) config.tokens_file = v;
  if (absl::GetFlag(FLAGS_allow_insecure)) config.allow_insecure = true;
  if (auto v = absl::GetFlag(FLAGS_etcd_endpoints); !v.empty()) config.etcd_endpoints = v;
  if (auto v = absl::GetFlag(FLAGS_advertise); !v.empty()) config.advertise = v;
  if (absl::Status s = config.Validate(); !s.ok()) {
    std::cerr << "varuna-manager: " << s.message() << "\n";
    return 2;
  }
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto tls = varuna::LoadTls(config.tls, /*need_cert=*/true, "varuna-manager");
  if (!tls.ok()) {
    std::cerr << "varuna-manager: " << tls.status().message() << "\n";
    return 2;
  }
  varuna::ManagerServer server(config, varuna::RealClock::Get(),
                               varuna::MakeGrpcAgentClientPool(config.agent_rpc_timeout, *tls),
                               varuna::ManagerServer::Options{});
  if (absl::Status s = server.Start(); !s.ok()) {
    std::cerr << "varuna-manager: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kUnavailable ? 1 : 2;
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  LOG(INFO) << "manager got signal " << sig << "; shutting down (jobs keep running)";
  server.Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("varuna-manager --listen HOST:PORT --state_dir DIR [--config FILE]");
  absl::ParseCommandLine(argc, argv);
  varuna::InitLogging(argv[0]);
  return Run();
}
