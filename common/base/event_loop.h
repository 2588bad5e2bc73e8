#pragma once

// One thread that owns a daemon's state: gRPC handlers and timers post closures to it and
// never touch the state themselves (docs/architecture.md "Control plane").

#include <deque>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <type_traits>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace varuna {

class EventLoop {
 public:
  // `on_tick` runs on the loop thread every `tick_period` of real time; a zero period never
  // ticks (tests call the tick themselves through RunSync).
  EventLoop(std::string name, absl::Duration tick_period, std::function<void()> on_tick);
  ~EventLoop();  // Stops and joins.
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  void Start();
  // Runs what is queued, then joins. Closures posted afterwards are dropped.
  void Stop();

  // Queues `fn` to run on the loop thread. Thread-safe.
  void Post(std::function<void()> fn);

  // Runs `fn` on the loop thread and returns its result. Must not be called from the loop
  // thread itself (runs inline there).
  template <typename F>
  auto RunSync(F fn) -> std::invoke_result_t<F> {
    using R = std::invoke_result_t<F>;
    if (std::this_thread::get_id() == thread_id_) return fn();
    std::promise<R> done;
    auto result = done.get_future();
    Post([&] {
      if constexpr (std::is_void_v<R>) {
        fn();
        done.set_value();
      } else {
        done.set_value(fn());
      }
    });
    return result.get();
  }

  bool InLoopThread() const { return std::this_thread::get_id() == thread_id_; }

 private:
  void Run();

  const std::string name_;
  const absl::Duration tick_period_;
  const std::function<void()> on_tick_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ = false;
  std::thread thread_;
  std::thread::id thread_id_;
};

}  // namespace varuna
