// varuna-manager: the cluster's one control daemon. Usage: docs/operations.md.

#include <signal.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/logging.h"
#include "glog/logging.h"
#include "manager/manager_server.h"

ABSL_FLAG(std::string, listen, "", "address to serve on, HOST:PORT (default 127.0.0.1:7070)");
ABSL_FLAG(std::string, state_dir, "", "directory for the state database (required)");
ABSL_FLAG(std::string, config, "", "YAML config file; flags override it");
ABSL_FLAG(std::string, machine_list, "", "optional file of hosts allowed to get work");

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
  if (auto v = absl::GetFlag(FLAGS_machine_list); !v.empty()) config.machine_list = v;
  if (absl::Status s = config.Validate(); !s.ok()) {
    std::cerr << "varuna-manager: " << s.message() << "\n";
    return 2;
  }
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  varuna::ManagerServer server(config, varuna::RealClock::Get(),
                               varuna::MakeGrpcAgentClientPool(config.agent_rpc_timeout),
                               varuna::ManagerServer::Options{});
  if (absl::Status s = server.Start(); !s.ok()) {
    std::cerr << "varuna-manager: " << s.message() << "\n";
    return 1;
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
