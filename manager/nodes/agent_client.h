#pragma once

// The agents as the manager sees them: asynchronous calls whose callbacks run on a gRPC
// thread (the manager re-posts them to its loop). Every call has a deadline.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/net/rpc.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class AgentClient {
 public:
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;
  virtual ~AgentClient() = default;
  virtual void Launch(const v1::LaunchRequest& req, Done<v1::LaunchResponse> done) = 0;
  virtual void Stop(const v1::StopRequest& req, Done<v1::StopResponse> done) = 0;
  virtual void Checkpoint(const v1::CheckpointRequest& req, Done<v1::CheckpointResponse> done) = 0;
  virtual void FetchLogs(const v1::FetchLogsRequest& req, Done<v1::FetchLogsResponse> done) = 0;
  // The speed probe (Note [Speed probe] in agent/probe.cc); an agent without one: Unimplemented.
  virtual void Probe(const v1::ProbeRequest& req, Done<v1::ProbeResponse> done) {
    (void)req;
    done(absl::UnimplementedError("this agent has no speed probe"));
  }
};

// Hands out one client per agent (node name and address; channels are reused).
class AgentClientPool {
 public:
  virtual ~AgentClientPool() = default;
  virtual std::shared_ptr<AgentClient> For(const std::string& node, const std::string& address) = 0;
  // The leader's term, sent with every call from now on (Note [Leader lease] in
  // manager/ha/leader_election.h); 0 (one manager) sends none.
  virtual void set_term(int64_t term) { (void)term; }
  // Runs before every call to an agent; a manager past its leader's safe time stops there
  // (Note [Leader lease]).
  virtual void set_fence(std::function<void()> fence) { (void)fence; }
};

// With `tls` enabled, calls present the manager's certificate (agents accept no one else), and
// the agent's certificate must be issued to `node` (Note [Agent identity] in agent_client.cc).
std::unique_ptr<AgentClientPool> MakeGrpcAgentClientPool(absl::Duration timeout,
                                                         const TlsConfig& tls = {});

}  // namespace varuna
