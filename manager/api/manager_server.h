#pragma once

// varuna-manager as a process: the Manager state machines on one event loop thread, the
// JobApi and AgentRegistry gRPC services posting to it, its role among managers (alone on
// SQLite, or leader or standby over etcd: ManagerRole) and its HTTP face (ManagerHttp).

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/base/event_loop.h"
#include "manager/api/manager_api.h"
#include "manager/api/manager_http.h"
#include "manager/api/manager_role.h"
#include "manager/manager.h"
#include "manager/nodes/agent_client.h"

namespace grpc {
class Server;
}

namespace varuna {

class ManagerServer {
 public:
  struct Options {
    // Zero: no background ticks; tests call Tick() after moving a fake clock.
    absl::Duration tick_period = absl::Milliseconds(200);
  };
  ManagerServer(ManagerConfig config, Clock* clock, std::unique_ptr<AgentClientPool> agents,
                Options options);
  ~ManagerServer();

  // Opens the state, recovers jobs and nodes, and starts serving on config.listen.
  absl::Status Start();
  void Shutdown();

  const std::string& address() const { return address_; }
  // The dashboard / metrics address (HOST:PORT), "" without --http_listen.
  std::string http_address() const { return http_ ? http_->address() : ""; }
  void Tick();
  EventLoop& loop() { return loop_; }
  Manager& manager() { return *manager_; }
  // The services' facade over manager(), on loop() only.
  ManagerApi api() { return ManagerApi(manager_.get(), agents_.get()); }
  // Whether this manager acts: always with one manager; with etcd, once elected and recovered.
  bool leading() const { return role_.leading(); }

 private:
  class JobService;
  class RegistryService;
  // The leader's first acts on the loop: the store guarded by `term`, the state loaded.
  void TakeOver(int64_t term);

  ManagerConfig config_;
  Clock* const clock_;
  std::unique_ptr<AgentClientPool> agents_;
  EventLoop loop_;
  EventLoop files_;       // file checks for submissions (Note [Off the loop])
  EventLoop slurm_loop_;  // Slurm's commands (manager/sources/slurm_source.h), which may block
  std::unique_ptr<SlurmCommands> slurm_commands_;
  ManagerRole role_;  // the state store's owner
  std::unique_ptr<Manager> manager_;
  std::unique_ptr<JobService> job_service_;
  std::unique_ptr<RegistryService> registry_service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<ManagerHttp> http_;  // with --http_listen
  bool stopped_ = false;
};

}  // namespace varuna
