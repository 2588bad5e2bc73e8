#include "agent/heartbeat_sender.h"

#include <chrono>
#include <utility>

#include "glog/logging.h"

namespace varuna {

HeartbeatSender::HeartbeatSender(std::unique_ptr<ManagerClient> manager, Agent* agent,
                                 EventLoop* loop)
    : manager_(std::move(manager)),
      agent_(agent),
      loop_(loop),
      heartbeat_period_ms_(absl::ToInt64Milliseconds(agent->config().heartbeat_period)) {}

absl::Status HeartbeatSender::Once() {
  const AgentConfig& c = agent_->config();
  if (!registered_) {
    if (given_up_)
      return absl::FailedPreconditionError("leaving: the manager has forgotten this node");
    v1::RegisterRequest reg;
    reg.set_name(c.name);
    reg.set_address(address_);
    reg.set_slots(c.slots);
    for (const auto& [k, v] : c.labels) (*reg.mutable_labels())[k] = v;
    auto r = manager_->Register(reg);
    if (!r.ok()) return r.status();
    registered_ = true;
    LOG(INFO) << "node=" << c.name << " registered with manager " << manager_->current();
    AdoptHeartbeatPeriod(r->heartbeat_period_ms());
    AdoptTerm(r->manager_term());
  }
  v1::HeartbeatRequest hb = loop_->RunSync([this] { return agent_->BuildHeartbeat(); });
  hb.set_last_rtt_s(last_rtt_s_);
  const auto t0 = std::chrono::steady_clock::now();
  auto resp = manager_->Heartbeat(hb);
  // A failed call is not a latency sample (a timeout would read as a 10 s heartbeat).
  last_rtt_s_ =
      resp.ok() ? std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() : 0;
  if (!resp.ok()) {
    if (resp.status().code() == absl::StatusCode::kNotFound) {
      registered_ = false;  // the manager forgot us: register on the next beat
      // Note [Forgotten while leaving]: a node with a preemption notice that the manager
      // forgets was given back to its machine source (Slurm released its agent job). Coming
      // back under its name in the seconds before the agent exits would leave a DEAD node that
      // no source will ever give back, so a leaving agent stays forgotten.
      if (loop_->RunSync([this] { return agent_->report().notice().has_value(); })) {
        given_up_ = true;
        LOG(INFO) << "node=" << c.name
                  << " forgotten by the manager while leaving; not registering again";
      }
    }
    return resp.status();
  }
  AdoptHeartbeatPeriod(resp->heartbeat_period_ms());
  AdoptTerm(resp->manager_term());
  loop_->Post([agent = agent_, r = *std::move(resp)] { agent->OnHeartbeatResponse(r); });
  return absl::OkStatus();
}

void HeartbeatSender::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void HeartbeatSender::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

bool HeartbeatSender::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return false;
    stop_ = true;
  }
  cv_.notify_all();
  return true;
}

void HeartbeatSender::Join() {
  if (thread_.joinable()) thread_.join();
}

bool HeartbeatSender::WaitStopped(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] { return stop_; });
}

void HeartbeatSender::AdoptTerm(int64_t term) {
  int64_t seen = manager_term_.load();
  while (term > seen && !manager_term_.compare_exchange_weak(seen, term)) {
  }
}

void HeartbeatSender::AdoptHeartbeatPeriod(int64_t period_ms) {
  if (period_ms > 0 && period_ms != heartbeat_period_ms_.exchange(period_ms)) {
    LOG(INFO) << "node=" << agent_->config().name << " heartbeat period " << period_ms
              << "ms, as the manager asks";
  }
}

void HeartbeatSender::Loop() {
  bool reachable = true;  // as the previous heartbeat found the manager: logs only the changes
  for (;;) {
    absl::Status s = Once();
    const absl::Duration period = absl::Milliseconds(heartbeat_period_ms_.load());
    if (!s.ok() && reachable) {
      LOG(WARNING) << "node=" << agent_->config().name << " heartbeat failed (workers keep "
                   << "running; retrying every " << period << "): " << s.message();
    } else if (s.ok() && !reachable) {
      LOG(INFO) << "node=" << agent_->config().name << " manager reachable again";
    }
    reachable = s.ok();
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, absl::ToChronoNanoseconds(period), [this] { return stop_ || wake_; })) {
      if (wake_ && !stop_) {
        wake_ = false;
        continue;
      }
      return;
    }
  }
}

}  // namespace varuna
