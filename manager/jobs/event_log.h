#pragma once

// The cluster's event log (varunactl events, the dashboard): node and job transitions with
// their reasons, newest kMaxEvents in memory and every one in the state database. Loop
// thread only.

#include <cstdint>
#include <deque>
#include <string>

#include "absl/status/status.h"
#include "common/base/clock.h"
#include "manager/state/state_store.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class EventLog {
 public:
  static constexpr size_t kMaxEvents = 10000;
  static constexpr size_t kMaxReplyBytes = 1 << 20;  // one List page

  EventLog(Clock* clock, StateStore* store) : clock_(clock), store_(store) {}

  // Loads the newest kMaxEvents events from the store.
  absl::Status Load();
  // Records an event ("" job or node when it has none). A failed write is logged, not fatal.
  void Emit(const std::string& kind, const std::string& job_id, const std::string& node,
            const std::string& message);
  // Events after req.after_seq (of req.job_id if set), at most req.limit (default 1000).
  v1::ListEventsResponse List(const v1::ListEventsRequest& req) const;

 private:
  Clock* const clock_;
  StateStore* const store_;
  std::deque<v1::Event> events_;
  int64_t next_seq_ = 1;
};

}  // namespace varuna
