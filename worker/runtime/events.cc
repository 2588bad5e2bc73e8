#include "worker/runtime/events.h"

#include <chrono>
#include <utility>

#include "common/base/logging.h"
#include "common/launch/worker_channel.h"

namespace varuna {

void ReportToAgent(v1::WorkerEvent event) {
  absl::Status s = AppendWorkerEvent(std::move(event));
  if (!s.ok()) LOG(WARNING) << "report to the agent lost: " << s.message();
}

v1::WorkerEvent ErrorEvent(std::string message) {
  v1::WorkerEvent e;
  e.mutable_error()->set_message(std::move(message));
  return e;
}

v1::WorkerEvent SavedEvent(bool rescued, int64_t step, int64_t committed, int64_t pending) {
  v1::WorkerEvent e;
  const auto saved = static_cast<int32_t>(step);
  if (rescued) {
    e.mutable_rescued()->set_saved_step(saved);
    e.mutable_rescued()->set_committed_step(static_cast<int32_t>(committed));
    e.mutable_rescued()->set_pending_step(pending);
  } else {
    e.mutable_stopped()->set_saved_step(saved);
  }
  return e;
}

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace varuna
