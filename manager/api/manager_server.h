#pragma once

// varuna-manager as a process: the Manager state machines on one event loop thread, the
// JobApi and AgentRegistry gRPC services posting to it, and the SQLite store.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/base/event_loop.h"
#include "common/net/http_server.h"
#include "common/net/metrics.h"
#include "manager/manager.h"
#include "manager/nodes/agent_client.h"
#include "manager/state/state_store.h"

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
  // Whether this manager acts: always with one manager; with etcd, once elected and recovered.
  bool leading() const;

 private:
  class JobService;
  class RegistryService;
  // With etcd_endpoints: the client, the election, the store's etcd side (manager_server.cc).
  struct Ha;
  // The leader's first acts on the loop: the store guarded by `term`, the state loaded.
  void TakeOver(int64_t term);

  ManagerConfig config_;
  Clock* const clock_;
  std::unique_ptr<AgentClientPool> agents_;
  EventLoop loop_;
  EventLoop files_;       // file checks for submissions (Note [Off the loop])
  EventLoop slurm_loop_;  // Slurm's commands (manager/sources/slurm_source.h), which may block
  std::unique_ptr<SlurmCommands> slurm_commands_;
  std::unique_ptr<Ha> ha_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Manager> manager_;
  std::unique_ptr<JobService> job_service_;
  std::unique_ptr<RegistryService> registry_service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<MetricsRegistry> metrics_registry_;
  std::unique_ptr<ManagerMetrics> metrics_;
  std::unique_ptr<HttpServer> http_;
  bool stopped_ = false;
};

}  // namespace varuna
