#pragma once

// The agents as the manager's components see them, in memory: every call is recorded with
// its callback, and the test answers it (or never does). No gRPC, no threads.

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "manager/nodes/agent_client.h"

namespace varuna::testing {

class FakeAgentPool final : public AgentClientPool {
 public:
  template <typename Req, typename Resp>
  struct Call {
    std::string address;
    Req req;
    AgentClient::Done<Resp> done;
  };
  using LaunchCall = Call<v1::LaunchRequest, v1::LaunchResponse>;
  using StopCall = Call<v1::StopRequest, v1::StopResponse>;
  using CheckpointCall = Call<v1::CheckpointRequest, v1::CheckpointResponse>;
  using LogsCall = Call<v1::FetchLogsRequest, v1::FetchLogsResponse>;

  std::shared_ptr<AgentClient> For(const std::string& /*node*/,
                                   const std::string& address) override {
    return std::make_shared<Client>(this, address);
  }

  // Calls not answered yet, oldest first; Take* removes them.
  std::deque<LaunchCall> launches;
  std::deque<StopCall> stops;
  std::deque<CheckpointCall> checkpoints;
  std::deque<LogsCall> logs;

  // Answers every pending launch (rank 0's node gets `master_port`); returns how many.
  int AnswerLaunches(int master_port = 29500) {
    int n = 0;
    while (!launches.empty()) {
      LaunchCall c = std::move(launches.front());
      launches.pop_front();
      v1::LaunchResponse r;
      r.set_master_port(master_port);
      c.done(r);
      ++n;
    }
    return n;
  }
  // Answers every pending checkpoint request with `status` (OK: the workers were signalled).
  int AnswerCheckpoints(absl::Status status = absl::OkStatus()) {
    int n = 0;
    while (!checkpoints.empty()) {
      CheckpointCall c = std::move(checkpoints.front());
      checkpoints.pop_front();
      if (status.ok()) {
        c.done(v1::CheckpointResponse());
      } else {
        c.done(status);
      }
      ++n;
    }
    return n;
  }

 private:
  class Client final : public AgentClient {
   public:
    Client(FakeAgentPool* pool, std::string address) : pool_(pool), address_(std::move(address)) {}
    void Launch(const v1::LaunchRequest& req, Done<v1::LaunchResponse> done) override {
      pool_->launches.push_back({address_, req, std::move(done)});
    }
    void Stop(const v1::StopRequest& req, Done<v1::StopResponse> done) override {
      pool_->stops.push_back({address_, req, std::move(done)});
    }
    void Checkpoint(const v1::CheckpointRequest& req, Done<v1::CheckpointResponse> done) override {
      pool_->checkpoints.push_back({address_, req, std::move(done)});
    }
    void FetchLogs(const v1::FetchLogsRequest& req, Done<v1::FetchLogsResponse> done) override {
      pool_->logs.push_back({address_, req, std::move(done)});
    }

   private:
    FakeAgentPool* const pool_;
    const std::string address_;
  };
};

// The manager's loop as a queue the test drains: what components post runs when the test
// calls Run(), in order, including what those tasks post.
class PostQueue {
 public:
  std::function<void(std::function<void()>)> poster() {
    return [this](std::function<void()> f) { tasks_.push_back(std::move(f)); };
  }
  int Run() {
    int n = 0;
    while (!tasks_.empty()) {
      std::function<void()> f = std::move(tasks_.front());
      tasks_.pop_front();
      f();
      ++n;
    }
    return n;
  }

 private:
  std::deque<std::function<void()>> tasks_;
};

}  // namespace varuna::testing
