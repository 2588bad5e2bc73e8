#pragma once

// The threads that own the worker's exit when a step cannot finish (Note [Rescue] in
// worker/engine/checkpoint.cc).
//
// StartupWatch: until the engine is up, an abort (SIGUSR2: a peer is gone) means exit at
// once: nothing was trained, so the checkpoint this rank would resume from is the state.
// Without it a rank blocked in the rendezvous with a dead peer would wait for timeout_s.
//
// Rescuer: from then on, on ProcessState::rescue_requested (SIGUSR2, the agent's
// checkpoint_now, or a failed step), saves the last completed step of the current engine
// and exits kExitRescued. It owns the exit from then on, so the training thread, blocked on a
// dead peer or back from a failed step, never has to return. A morph in place replaces the
// engine under Swap.

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "worker/engine/varuna.h"

namespace varuna {

class StartupWatch {
 public:
  StartupWatch();
  ~StartupWatch() { Done(); }
  // The engine is up (or the run ends): the watch stops. Idempotent.
  void Done();

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

class Rescuer {
 public:
  // Watches for a rescue of `engine` into `ckpt_dir` (empty: nothing can be saved, the
  // worker exits 1 saying so), writing `ckpt_info(step)` into each step's checkpoint.
  Rescuer(Varuna* engine, std::string ckpt_dir, Checkpointer::InfoAt ckpt_info, std::string who);
  ~Rescuer();
  Rescuer(const Rescuer&) = delete;
  Rescuer& operator=(const Rescuer&) = delete;

  // Runs `swap` (which replaces the engine) with no rescue in progress, then rescues `next`.
  template <typename Fn>
  void Swap(Varuna* next, std::string who, Fn swap) {
    std::lock_guard<std::mutex> hold(mu_);
    swap();
    engine_ = next;
    who_ = std::move(who);
  }
  // Asks for the rescue and waits for it: it exits the process.
  [[noreturn]] void RescueAndExit();

 private:
  void Watch();

  std::mutex mu_;
  Varuna* engine_;   // guarded by mu_
  std::string who_;  // guarded by mu_
  const std::string ckpt_dir_;
  const Checkpointer::InfoAt ckpt_info_;
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace varuna
