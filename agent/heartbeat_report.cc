#include "agent/heartbeat_report.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace varuna {

HeartbeatReport::HeartbeatReport(std::string node) : node_(std::move(node)) {}

void HeartbeatReport::SetNotice(const v1::PreemptionNotice& notice) {
  if (!notice_) {
    urgent_ = true;
    LOG(WARNING) << "node=" << node_ << " preemption notice from " << notice.source()
                 << (notice.detail().empty() ? "" : ": ") << notice.detail();
  }
  notice_ = notice;
}

bool HeartbeatReport::TakeUrgent() { return std::exchange(urgent_, false); }

void HeartbeatReport::Queue(const std::string& job_id, int generation, const v1::StepMetrics& m,
                            Steps* steps) {
  int64_t& forwarded = forwarded_step_[absl::StrCat(job_id, "/", generation)];
  if (m.step() > forwarded) {
    forwarded = m.step();
    if (steps->pending.size() < 100000) steps->pending.push_back(m);
  }
}

v1::HeartbeatRequest HeartbeatReport::Begin() const {
  v1::HeartbeatRequest hb;
  hb.set_name(node_);
  if (notice_) *hb.mutable_preemption() = *notice_;
  hb.set_probe_score(probe_score_);
  return hb;
}

// Note [Heartbeat budget]: a heartbeat must always fit the manager's request limit (gRPC's
// 4 MiB), whatever the workers wrote: a refused heartbeat is refused again next time, and the
// node would stay DEAD. So each worker's status is small (errors are cut, the progress copy
// carries no per-stage lists: Agent::BuildHeartbeat), and what can be large goes in only while
// the request stays under kMaxHeartbeatBytes: profiles, then step records oldest first; what
// does not fit follows in later heartbeats (they are kept until the manager acknowledges them).
void HeartbeatReport::Fill(v1::HeartbeatRequest* hb, const std::vector<Row>& rows) const {
  constexpr size_t kMaxStepsPerBeat = 1000;
  for (const Row& r : rows) r.steps->in_flight = 0;
  size_t bytes = hb->ByteSizeLong();
  for (const Row& r : rows) {
    const std::string& profile = *r.profile_json;
    if (profile.empty()) continue;
    if (bytes + profile.size() + 16 > kMaxHeartbeatBytes) continue;  // a later one
    r.status->set_profile_json(profile);
    bytes += profile.size() + 16;
  }
  for (const Row& r : rows) {
    Steps& steps = *r.steps;
    while (steps.in_flight < std::min(steps.pending.size(), kMaxStepsPerBeat)) {
      const v1::StepMetrics& m = steps.pending[steps.in_flight];
      const size_t size = m.ByteSizeLong() + 8;
      if (bytes + size > kMaxHeartbeatBytes) break;
      *r.status->add_steps() = m;
      bytes += size;
      ++steps.in_flight;
    }
  }
}

// Note [Durable step records]: the leader acknowledges a heartbeat once it stored the step
// records in its own database; with several managers they reach etcd in batches (Note
// [High-rate state] in manager/ha/etcd_store.h), so a leader killed in between took the last
// seconds of records with it. So the agent keeps acknowledged records until the manager says
// they are durable (HeartbeatResponse.durable: per job, the newest step up to which a new
// leader would load every record it got) and, when a manager of another term answers, sends
// every one of them again: that manager's durable step is etcd's newest, which may lack older
// records the last leader held. Saving a record
// twice is harmless (a step's record replaces its own: Note [Step records] in
// manager/state/state_store.cc). With one manager on SQLite a record is durable when stored.
void HeartbeatReport::Acknowledge(Steps* steps, int64_t durable_step, bool new_term) const {
  const size_t acked = std::min(steps->in_flight, steps->pending.size());
  for (size_t i = 0; i < acked; ++i) {
    if (steps->unconfirmed.size() < 100000) steps->unconfirmed.push_back(steps->pending[i]);
  }
  steps->pending.erase(steps->pending.begin(), steps->pending.begin() + static_cast<long>(acked));
  steps->in_flight = 0;
  // A new leader's durable step is the newest in etcd, which may lack older records the last
  // leader held: on a new term everything unconfirmed goes again, none is dropped.
  while (!new_term && !steps->unconfirmed.empty() &&
         steps->unconfirmed.front().step() <= durable_step) {
    steps->unconfirmed.pop_front();
  }
  if (new_term && !steps->unconfirmed.empty()) {
    steps->pending.insert(steps->pending.begin(), steps->unconfirmed.begin(),
                          steps->unconfirmed.end());
    steps->unconfirmed.clear();
  }
}

}  // namespace varuna
