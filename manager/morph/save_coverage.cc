#include "manager/morph/save_coverage.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/status/statusor.h"
#include "common/launch/exit_codes.h"
#include "common/pipeline/topology.h"

namespace varuna {

SaveCoverage CoverageOf(const Job& job) {
  absl::StatusOr<Topology> topo = absl::NotFoundError("uniform");
  if (!job.info().pipelines().empty()) topo = Topology::Parse(job.info().pipelines());
  const int stages = topo.ok() ? topo->pipeline(0).stages() : std::max(1, job.info().stages());
  // Steps saved per stage of pipeline 0 (heterogeneous: per segment first).
  std::vector<std::set<int64_t>> by_stage(stages);
  std::vector<std::set<int64_t>> by_segment(topo.ok() ? topo->pipeline(0).boundaries.back() : 0);
  SaveCoverage out;
  auto saver = [&](const v1::RankExit& e) {
    return e.signal() == 0 &&
           (e.exit_code() == kExitRescued || (e.exit_code() == 0 && job.gen.stopped_after > 0));
  };
  // A rescue writes the step it has and, with the next step's agreement pending, its layers
  // with that step's gradients into that step's checkpoint (Note [Rolled rescue] in
  // common/checkpoint/checkpoint_store.cc), which covers it only when another saver has the
  // step (and with it the update): so a pending step counts when some saver saved it.
  std::set<int64_t> own;
  for (const auto& e : job.rec.exits()) {
    if (saver(e) && e.saved_step() > 0) own.insert(e.saved_step());
  }
  for (const auto& e : job.rec.exits()) {
    out.committed = std::max(out.committed, e.committed_step());
    if (!saver(e)) continue;
    std::vector<int64_t> steps;
    if (e.saved_step() > 0) steps.push_back(e.saved_step());
    if (e.pending_step() > 0 && own.count(e.pending_step())) steps.push_back(e.pending_step());
    for (int64_t step : steps) {
      v1::SavedStep s;
      s.set_rank(e.rank());
      s.set_step(step);
      out.saved.push_back(s);
      // Exits name processes; stages hold positions of tp_size processes each.
      const int position = e.rank() / TpOf(job.info());
      if (e.rank() < 0) continue;
      if (!topo.ok()) {
        by_stage[position % stages].insert(step);
      } else if (position < topo->world_size()) {
        const auto [first, last] = topo->SegmentsOf(position);
        for (int sg = first; sg < last; ++sg) by_segment[sg].insert(step);
      }
    }
  }
  if (topo.ok()) {
    const std::vector<int>& b = topo->pipeline(0).boundaries;
    for (int s = 0; s < stages; ++s) {
      for (int64_t step : by_segment[b[s]]) {
        bool all = true;
        for (int sg = b[s]; sg < b[s + 1]; ++sg) all = all && by_segment[sg].count(step) > 0;
        if (all) by_stage[s].insert(step);
      }
    }
  }
  std::set<int64_t> common;
  for (int s = 0; s < stages; ++s) {
    if (by_stage[s].empty()) out.missing.push_back(s);
    if (s == 0) {
      common = by_stage[0];
    } else {
      std::set<int64_t> both;
      for (int64_t step : common) {
        if (by_stage[s].count(step)) both.insert(step);
      }
      common = std::move(both);
    }
  }
  out.common_step = common.empty() ? -1 : *common.rbegin();
  for (const auto& s : out.saved) out.newest_saved = std::max(out.newest_saved, s.step());
  return out;
}

}  // namespace varuna
