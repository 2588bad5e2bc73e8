#pragma once

// varuna-agent as a process: the Agent state machine on its event loop, the AgentApi gRPC
// service, the heartbeats that register with the manager and report workers (HeartbeatSender),
// the preemption notice poller and the /metrics server.

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "agent/agent.h"
#include "agent/agent_metrics.h"
#include "agent/heartbeat_sender.h"
#include "common/base/event_loop.h"
#include "common/net/http_server.h"
#include "common/net/metrics.h"
#include "varuna/v1/control.grpc.pb.h"

namespace varuna {

// `address`: one manager, or several (a:7070,b:7070): calls go to the one that leads, found
// from a standby's answer (it names the leader) or by trying the next.
std::unique_ptr<ManagerClient> MakeGrpcManagerClient(const std::string& address,
                                                     absl::Duration timeout,
                                                     const TlsConfig& tls = {});

class AgentServer {
 public:
  struct Options {
    // Tests drive heartbeats and ticks by hand (HeartbeatOnce, Tick) on a fake clock.
    bool background_heartbeats = true;
    absl::Duration tick_period = absl::Milliseconds(100);
  };

  AgentServer(AgentConfig config, Clock* clock, ProcessLauncher* launcher,
              std::unique_ptr<ManagerClient> manager, Options options);
  ~AgentServer();

  // Listens on config.listen, then starts heartbeating. The bound address is address().
  absl::Status Start();
  // Stops heartbeats, sends SIGTERM to the workers and waits up to the stop grace for them
  // (SIGKILL after), then stops serving.
  void Shutdown();

  const std::string& address() const { return address_; }
  // Registers if needed, then sends one heartbeat. Thread-safe.
  absl::Status HeartbeatOnce();
  void Tick();
  Agent& agent() { return agent_; }
  // A preemption notice from outside the agent's own sources (Slurm's SIGTERM, main.cc),
  // applied on the loop and reported with the next heartbeat, which it wakes.
  void PostNotice(v1::PreemptionNotice notice);
  // Workers running now (asked on the loop).
  int RunningWorkers();
  // Sends a heartbeat now (from the heartbeat thread): e.g. the exits of workers that left
  // under a notice, before the agent itself goes.
  void ReportNow() { heartbeat_.Wake(); }
  EventLoop& loop() { return loop_; }
  // The /metrics address (HOST:PORT), "" without --http_listen.
  std::string http_address() const { return http_ ? http_->address() : ""; }

 private:
  class Service;
  void NoticeLoop();

  Clock* const clock_;
  Agent agent_;
  const Options options_;
  // Before loop_: its tick may wake the heartbeat thread.
  HeartbeatSender heartbeat_;
  EventLoop loop_;
  std::thread probe_thread_;  // the startup speed probe
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;

  std::thread notice_thread_;  // polls preemption_notice_url (agent/preemption.h)
  int notice_cancel_fd_ = -1;  // an eventfd: Shutdown() ends a poll in flight at once
  std::unique_ptr<MetricsRegistry> metrics_registry_;
  std::unique_ptr<AgentMetrics> metrics_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace varuna
