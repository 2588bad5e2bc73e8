#include "manager/stragglers/straggler_detector.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/pipeline/partition.h"
#include "common/pipeline/topology.h"
#include "common/planner/profile.h"
#include "manager/jobs/job.h"

namespace varuna {

// Note [Straggler detection]: every rank reports every rank's busy time (compute) and wait
// time (blocked on receives) of each step, gathered by the step's agreement all-reduce
// (StepMetrics.rank_busy_s, Note [Step timing] in worker/engine/varuna.h). A rank's normalised time
// is its busy time over its expected work (RankWork.work: the profile's compute of its layers
// times its micro-batches), so a rank doing half the work of another is not "twice as fast".
// Its peers are the ranks on other nodes that hold the same layers (data-parallel replicas of
// its stage: exact, whatever the cost model's errors); when it has none (one pipeline, or a
// pipeline cut its own way), every rank on another node (then the cost model's accuracy
// matters). Its speed in a step is the normal time of the group (its peers and itself: the
// lower median, so that of two the faster is normal) over its own; a node's is the median
// over its ranks. Speeds are smoothed by the median over a window of
// steps (stragglers.window_steps), so one noisy step (a GC pause, a checkpoint) makes no
// straggler. A large slowdown does not wait for half a window: a node whose last two steps
// were both below half of slow_below is known from those two (the faster of them), since
// one noisy step cannot make two, and each step at a tenth of the speed costs a job ten
// steps' time (docs/benchmarks.md (k)). Busy time excludes waiting, so a slow node's peers,
// which wait for it, are not slow themselves.
//
// A slow link shows as waiting, not computing: a rank on a node of normal speed whose wait
// exceeds its same-layer peers' by a quarter of its step's pipeline time, over the window's
// median, is reported with its neighbours' nodes (SlowLinks). It is only reported: the
// planner does not model a single slow link.
//
// Note [Planned-slow references]: a node the job's plan already treats as slow (a rebalance
// gave it less work) is no reference for the others' speed. Its measured speed depends on the
// load the rebalance left it: a machine throttled by a quota, a noisy neighbour or a thermal
// cap runs a small share in bursts at nearly full speed, while the nodes that took its work
// now run theirs at full occupancy. Compared with it, a normal node reads slow (0.67x in the
// straggler e2e test: the ladder then rebalanced onto the slow node again, and back). So a
// node's peers exclude planned-slow nodes; with no other peer it has no reading (as a node
// alone in the job). A planned-slow node is still measured against the normal ones, which is
// how it recovers (Note [Straggler ladder] in straggler_controller.cc, with probation).

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double m = v[mid];
  if (v.size() % 2 == 0) m = (m + *std::max_element(v.begin(), v.begin() + mid)) / 2;
  return m;
}

namespace {

// The lower median: of two, the faster (a pair has no majority to say which is normal, and
// the slower is the suspect); of three with one slow, a normal one.
double LowerMedian(std::vector<double> v) {
  const size_t mid = (v.size() - 1) / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  return v[mid];
}

}  // namespace

absl::StatusOr<Topology> TopologyOf(const v1::JobInfo& info, const v1::Profile& profile,
                                    int64_t global_batch) {
  if (info.placement().empty() || info.stages() < 1) {
    return absl::FailedPreconditionError("the job is not placed");
  }
  const int mb = std::max(1, info.micro_batch());
  Topology topo;
  if (!info.pipelines().empty()) {
    ASSIGN_OR_RETURN(topo, Topology::Parse(info.pipelines()));
  } else {
    ASSIGN_OR_RETURN(topo, Topology::Uniform(info.stages(), info.replicas(), global_batch));
    if (info.boundaries_size() == info.stages() + 1) {
      RETURN_IF_ERROR(topo.SetUniformBoundaries(
          std::vector<int>(info.boundaries().begin(), info.boundaries().end())));
    }
  }
  const int S = profile.segments_size();
  std::vector<double> forward;
  for (const auto& seg : profile.segments()) forward.push_back(CostAt(seg, mb).forward_s);
  if (!topo.has_boundaries() && topo.uniform()) {
    // No boundaries in the plan (placement rule): the workers cut by the same costs.
    ASSIGN_OR_RETURN(std::vector<int> bounds, PartitionByCost(forward, info.stages()));
    RETURN_IF_ERROR(topo.SetUniformBoundaries(bounds));
  }
  if (!topo.has_boundaries() || topo.pipeline(0).boundaries.back() != S) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job's stages do not match the profile's ", S, " segments"));
  }
  return topo;
}

absl::StatusOr<std::vector<RankWork>> RanksOf(const v1::JobInfo& info, const v1::Profile& profile,
                                              int64_t global_batch) {
  ASSIGN_OR_RETURN(Topology topo, TopologyOf(info, profile, global_batch));
  const int mb = std::max(1, info.micro_batch());
  std::vector<SegmentTimes> t;
  for (const auto& seg : profile.segments()) t.push_back(CostAt(seg, mb));
  std::map<int, std::string> node_of = PositionNodes(info);
  const bool recompute = info.schedule().empty() || info.schedule() == "varuna";
  std::vector<RankWork> out;
  for (int r = 0; r < topo.world_size(); ++r) {
    RankWork w;
    w.node = node_of.count(r) ? node_of[r] : "";
    w.pipeline = topo.PipelineOf(r);
    w.stage = topo.StageOf(r);
    std::tie(w.first_segment, w.end_segment) = topo.SegmentsOf(r);
    const PipelineLayout& p = topo.pipeline(w.pipeline);
    const bool last = w.stage == p.stages() - 1;
    double per_mb = 0;
    for (int g = w.first_segment; g < w.end_segment; ++g) {
      per_mb += recompute && !last ? t[g].forward_nograd_s + t[g].recompute_s + t[g].backward_s
                                   : t[g].forward_s + t[g].backward_s;
    }
    w.work = per_mb * static_cast<double>((p.samples + mb - 1) / mb);
    out.push_back(std::move(w));
  }
  return out;
}

StragglerDetector::StragglerDetector(std::vector<RankWork> ranks, int window,
                                     const std::set<std::string>& planned_slow)
    : ranks_(std::move(ranks)), window_(std::max(1, window)) {
  const int W = static_cast<int>(ranks_.size());
  peers_.resize(W);
  others_.resize(W);
  excess_wait_.resize(W);
  for (int r = 0; r < W; ++r) {
    for (int q = 0; q < W; ++q) {
      if (ranks_[q].node == ranks_[r].node || planned_slow.count(ranks_[q].node)) continue;
      others_[r].push_back(q);
      if (ranks_[q].first_segment == ranks_[r].first_segment &&
          ranks_[q].end_segment == ranks_[r].end_segment) {
        peers_[r].push_back(q);
      }
    }
  }
}

bool StragglerDetector::Add(int64_t step, const std::vector<double>& busy,
                            const std::vector<double>& wait) {
  const size_t W = ranks_.size();
  if (step <= newest_ || busy.size() != W || wait.size() != W || W == 0) return false;
  newest_ = step;
  busy_ = busy;
  wait_ = wait;
  // Normalised time per rank; 0 = unusable (no work expected, nothing measured).
  std::vector<double> norm(W, 0);
  for (size_t r = 0; r < W; ++r) {
    if (ranks_[r].work > 0 && std::isfinite(busy[r]) && busy[r] > 0) {
      norm[r] = busy[r] / ranks_[r].work;
    }
  }
  std::map<std::string, std::vector<double>> node_speeds;
  for (size_t r = 0; r < W; ++r) {
    if (norm[r] <= 0) continue;
    const std::vector<int>& ref = peers_[r].empty() ? others_[r] : peers_[r];
    std::vector<double> group{norm[r]};
    for (int q : ref) {
      if (norm[q] > 0) group.push_back(norm[q]);
    }
    if (group.size() < 2) continue;
    node_speeds[ranks_[r].node].push_back(LowerMedian(group) / norm[r]);
    // The wait beyond its same-layer peers', as a share of its own time in the schedule.
    std::vector<double> peer_wait;
    for (int q : peers_[r]) {
      if (std::isfinite(wait[q])) peer_wait.push_back(wait[q]);
    }
    if (!peer_wait.empty() && std::isfinite(wait[r])) {
      std::deque<double>& e = excess_wait_[r];
      e.push_back(wait[r] - Median(peer_wait));
      while (static_cast<int>(e.size()) > window_) e.pop_front();
    }
  }
  for (auto& [node, v] : node_speeds) {
    std::deque<double>& d = speed_[node];
    d.push_back(Median(v));
    while (static_cast<int>(d.size()) > window_) d.pop_front();
  }
  ++steps_;
  return true;
}

std::map<std::string, double> StragglerDetector::Speeds(double severe_below) const {
  std::map<std::string, double> out;
  for (const auto& [node, d] : speed_) {
    if (d.empty()) continue;
    const size_t n = d.size();
    if (n >= 2 && std::max(d[n - 1], d[n - 2]) < severe_below) {
      out[node] = std::max(d[n - 1], d[n - 2]);
    } else {
      out[node] = Median(std::vector<double>(d.begin(), d.end()));
    }
  }
  return out;
}

std::vector<std::string> StragglerDetector::SlowLinks(double slow_below) const {
  std::vector<std::string> out;
  if (!full()) return out;
  const std::map<std::string, double> speeds = Speeds();
  auto normal = [&](const std::string& node) {
    auto it = speeds.find(node);
    return it == speeds.end() || it->second >= slow_below;
  };
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const std::deque<double>& e = excess_wait_[r];
    if (static_cast<int>(e.size()) < window_ || !normal(ranks_[r].node)) continue;
    const double excess = Median(std::vector<double>(e.begin(), e.end()));
    const double own = busy_.size() > r ? busy_[r] + wait_[r] : 0;
    if (own <= 0 || excess < 0.25 * own) continue;
    std::vector<std::string> neighbours;
    for (size_t q = 0; q < ranks_.size(); ++q) {
      if (ranks_[q].pipeline != ranks_[r].pipeline || ranks_[q].node == ranks_[r].node) continue;
      if (std::abs(ranks_[q].stage - ranks_[r].stage) != 1 || !normal(ranks_[q].node)) continue;
      if (std::find(neighbours.begin(), neighbours.end(), ranks_[q].node) == neighbours.end()) {
        neighbours.push_back(ranks_[q].node);
      }
    }
    if (neighbours.empty()) continue;  // its wait is a slow neighbour's compute
    out.push_back(absl::StrFormat(
        "rank %d (node %s) waits %.3f s more per step than its peers for its neighbours on "
        "node %s: a slow link?",
        r, ranks_[r].node, excess, absl::StrJoin(neighbours, ", ")));
  }
  return out;
}

}  // namespace varuna
