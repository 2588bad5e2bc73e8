#pragma once

// The agent's heartbeats to the manager. The sender owns the manager client, this node's
// registration (and a leaving agent's giving up: Note [Forgotten while leaving] in
// heartbeat_sender.cc), the heartbeat period and the leader term the manager's replies set,
// the previous heartbeat's round trip, and the heartbeat thread with what wakes or stops it.
// Each heartbeat is built, and its reply applied, on the agent's event loop.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "common/base/event_loop.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

// The manager as the agent sees it. Every call has a deadline.
class ManagerClient {
 public:
  virtual ~ManagerClient() = default;
  virtual absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req) = 0;
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) = 0;
  // The manager it talks to now (with several, the one that answered as leader last).
  virtual std::string current() const { return ""; }
};

class HeartbeatSender {
 public:
  // `agent` is used on `loop` only; both outlive the sender. The period is the agent's own
  // setting until the manager's first reply names one.
  HeartbeatSender(std::unique_ptr<ManagerClient> manager, Agent* agent, EventLoop* loop);
  HeartbeatSender(const HeartbeatSender&) = delete;
  HeartbeatSender& operator=(const HeartbeatSender&) = delete;

  // The address this node registers under (its AgentApi's, "host:port"). Before the first
  // heartbeat.
  void set_address(std::string address) { address_ = std::move(address); }
  // Registers if needed, then sends one heartbeat. Thread-safe.
  absl::Status Once();
  // Starts the heartbeat thread: a heartbeat every period, and at once when woken, until Stop.
  void Start();
  // Sends a heartbeat now (from the heartbeat thread), not at the end of the period.
  void Wake();
  // Ends the heartbeats: the thread leaves after the heartbeat in flight (Join waits for it)
  // and WaitStopped returns. False if they were stopped already.
  bool Stop();
  void Join();
  // Waits up to `timeout` for Stop; returns whether it came (the notice poller's pace).
  bool WaitStopped(absl::Duration timeout);
  // Whether the manager has this node registered, as far as the last call showed (/healthz).
  bool registered() const { return registered_.load(); }
  // The newest leader term seen (several managers): the AgentApi refuses calls with an older
  // one, and raises it (Note [Leader lease] in manager/ha/leader_election.h).
  std::atomic<int64_t>* manager_term() { return &manager_term_; }

 private:
  void Loop();
  void AdoptHeartbeatPeriod(int64_t period_ms);
  void AdoptTerm(int64_t term);

  const std::unique_ptr<ManagerClient> manager_;
  Agent* const agent_;
  EventLoop* const loop_;
  std::string address_;
  std::atomic<bool> registered_{false};
  std::atomic<bool> given_up_{false};  // (Note [Forgotten while leaving])
  // The manager's heartbeat period from its replies (its SUSPECT/DEAD timeouts are counted in
  // it); the agent's own setting until then.
  std::atomic<int64_t> heartbeat_period_ms_;
  std::atomic<int64_t> manager_term_{0};
  double last_rtt_s_ = 0;  // the previous heartbeat's round trip (heartbeat thread only)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  bool wake_ = false;  // guarded by mu_: heartbeat now (Wake)
  std::thread thread_;
};

}  // namespace varuna
