#include "common/base/event_loop.h"

#include "absl/time/clock.h"

namespace varuna {

EventLoop::EventLoop(std::string name, absl::Duration tick_period, std::function<void()> on_tick)
    : name_(std::move(name)), tick_period_(tick_period), on_tick_(std::move(on_tick)) {}

EventLoop::~EventLoop() { Stop(); }

void EventLoop::Start() {
  if (started_) return;
  started_ = true;
  std::promise<void> ready;
  auto ready_f = ready.get_future();
  thread_ = std::thread([this, &ready] {
    thread_id_ = std::this_thread::get_id();
    ready.set_value();
    Run();
  });
  ready_f.wait();
}

void EventLoop::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void EventLoop::Post(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stopping_ && !InLoopThread()) return;
  queue_.push_back(std::move(fn));
}

void EventLoop::Run() {
  absl::Time next_tick = absl::Now() + tick_period_;
  const bool ticks = tick_period_ > absl::ZeroDuration() && on_tick_ != nullptr;
  for (;;) {
    std::deque<std::function<void()>> batch;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stopping_; };
      if (ticks) {
        mu_.AwaitWithDeadline(absl::Condition(&ready), next_tick);
      } else {
        mu_.Await(absl::Condition(&ready));
      }
      batch.swap(queue_);
      stop = stopping_;
    }
    for (auto& fn : batch) fn();
    if (stop) {
      // Drain what the last batch posted, then leave.
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return;
      continue;
    }
    if (ticks && absl::Now() >= next_tick) {
      on_tick_();
      next_tick = absl::Now() + tick_period_;
    }
  }
}

}  // namespace varuna
