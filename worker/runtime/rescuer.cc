#include "worker/runtime/rescuer.h"

#include <chrono>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/launch/exit_codes.h"
#include "worker/runtime/events.h"
#include "worker/runtime/process_state.h"

namespace varuna {

StartupWatch::StartupWatch()
    : thread_([this] {
        while (!done_.load()) {
          if (ProcessState::Get().rescue_requested.load()) {
            ReportToAgent(SavedEvent(/*rescued=*/true, 0));
            std::_Exit(kExitRescued);
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }) {}

void StartupWatch::Done() {
  done_.store(true);
  if (thread_.joinable()) thread_.join();
}

Rescuer::Rescuer(Varuna* engine, std::string ckpt_dir, Checkpointer::InfoAt ckpt_info,
                 std::string who)
    : engine_(engine),
      who_(std::move(who)),
      ckpt_dir_(std::move(ckpt_dir)),
      ckpt_info_(std::move(ckpt_info)),
      thread_([this] { Watch(); }) {}

Rescuer::~Rescuer() {
  finished_.store(true);
  thread_.join();
}

void Rescuer::RescueAndExit() {
  ProcessState::Get().rescue_requested.store(true);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the watch exits
}

void Rescuer::Watch() {
  using Clock = std::chrono::steady_clock;
  while (!ProcessState::Get().rescue_requested.load()) {
    if (finished_.load()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard<std::mutex> hold(mu_);
  if (ckpt_dir_.empty()) {
    LOG(WARNING) << who_ << " step aborted; the job has no checkpoint.dir, nothing saved";
    ReportToAgent(ErrorEvent("step aborted with no checkpoint.dir: nothing saved"));
    std::_Exit(1);
  }
  Checkpointer& ckpt = engine_->checkpoints();
  const auto c0 = Clock::now();
  absl::StatusOr<int64_t> saved = ckpt.Rescue(ckpt_dir_, ckpt_info_);
  if (!saved.ok()) {
    LOG(ERROR) << who_ << " rescue failed: " << saved.status();
    ReportToAgent(ErrorEvent(absl::StrCat("rescue failed: ", saved.status().message())));
    std::_Exit(1);
  }
  LOG(INFO) << who_ << " rescued step " << *saved
            << (ckpt.rescued_pending() > 0 ? absl::StrCat(" and its layers with step ",
                                                          ckpt.rescued_pending(), "'s gradients")
                                           : "")
            << " (committed " << ckpt.committed_step() << ") in "
            << absl::StrFormat("%.3f", std::chrono::duration<double>(Clock::now() - c0).count())
            << " s; exiting";
  ReportToAgent(
      SavedEvent(/*rescued=*/true, *saved, ckpt.committed_step(), ckpt.rescued_pending()));
  std::_Exit(kExitRescued);
}

}  // namespace varuna
