#include "manager/jobs/event_log.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/base/status_macros.h"
#include "glog/logging.h"
#include "manager/jobs/job.h"

namespace varuna {

absl::Status EventLog::Load() {
  ASSIGN_OR_RETURN(std::vector<v1::Event> events, store_->LoadEvents(kMaxEvents));
  for (auto& e : events) {
    next_seq_ = std::max(next_seq_, e.seq() + 1);
    events_.push_back(std::move(e));
  }
  return absl::OkStatus();
}

void EventLog::Emit(const std::string& kind, const std::string& job_id, const std::string& node,
                    const std::string& message) {
  v1::Event e;
  e.set_seq(next_seq_++);
  e.set_at(TimeText(clock_->Now()));
  e.set_job_id(job_id);
  e.set_node(node);
  e.set_kind(kind);
  e.set_message(message);
  absl::Status s = store_->SaveEvent(e);
  if (!s.ok()) LOG(WARNING) << "cannot persist event: " << s.message();
  events_.push_back(std::move(e));
  while (events_.size() > kMaxEvents) events_.pop_front();
}

v1::ListEventsResponse EventLog::List(const v1::ListEventsRequest& req) const {
  v1::ListEventsResponse resp;
  const int limit = req.limit() > 0 ? std::min<int>(req.limit(), kMaxEvents) : 1000;
  // A page ends at `limit` events or kMaxReplyBytes; then last_seq is the page's last event,
  // so a client polling from it gets the rest next time (never skips any).
  size_t bytes = 0;
  bool full = false;
  for (const v1::Event& e : events_) {
    if (e.seq() <= req.after_seq()) continue;
    if (!req.job_id().empty() && e.job_id() != req.job_id()) continue;
    const size_t size = e.ByteSizeLong();
    if (resp.events_size() >= limit || (resp.events_size() > 0 && bytes + size > kMaxReplyBytes)) {
      full = true;
      break;
    }
    bytes += size;
    *resp.add_events() = e;
  }
  resp.set_last_seq(full ? resp.events(resp.events_size() - 1).seq() : next_seq_ - 1);
  return resp;
}

}  // namespace varuna
