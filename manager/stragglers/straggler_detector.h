#pragma once

// Straggler detection (Note [Straggler detection] in straggler_detector.cc): each node's speed
// relative to its peers, from the busy and wait times every rank reports each step. Pure: no
// RPC, no clock. The ladder that acts on it is manager/stragglers/straggler_controller.h.

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/pipeline/topology.h"
#include "common/spec/job_spec.h"
#include "varuna/v1/control.pb.h"
#include "varuna/v1/plan.pb.h"

namespace varuna {

// What one rank of a generation does.
struct RankWork {
  std::string node;
  int pipeline = 0;
  int stage = 0;
  int first_segment = 0, end_segment = 0;  // it holds segments [first, end)
  // Its expected busy time per step on a normal node, up to a factor common to the job: the
  // profile's compute of its segments (with recompute where the schedule recomputes) times
  // its pipeline's micro-batches.
  double work = 0;
};

// The topology of a job's current generation, with stage boundaries (the plan's, else the
// cut the workers make by `profile`'s costs); `global_batch` is the spec's.
absl::StatusOr<Topology> TopologyOf(const v1::JobInfo& info, const v1::Profile& profile,
                                    int64_t global_batch);
// The ranks of the current generation of a job (its topology, placement and `profile`).
absl::StatusOr<std::vector<RankWork>> RanksOf(const v1::JobInfo& info, const v1::Profile& profile,
                                              int64_t global_batch);

// The median of `v` (the mean of the middle two when even); 0 when empty.
double Median(std::vector<double> v);

class StragglerDetector {
 public:
  // `planned_slow`: the nodes the job's plan already treats as slow (its stragglers' speeds);
  // they are nobody's reference (Note [Planned-slow references] in straggler_detector.cc).
  StragglerDetector(std::vector<RankWork> ranks, int window,
                    const std::set<std::string>& planned_slow = {});

  // One step's busy and wait seconds per rank (index = rank). A step at or before the newest
  // taken, or lists of another size, are ignored; returns whether the step was taken.
  bool Add(int64_t step, const std::vector<double>& busy, const std::vector<double>& wait);
  // Steps taken, and whether the window is full (the speeds are smoothed over it).
  int steps() const { return steps_; }
  bool full() const { return steps_ >= window_; }
  // Each node's speed relative to its peers: the median of its per-step speeds in the window
  // (1 = as fast as they are, 0.25 = four times as slow), or, when its last two steps were
  // both below `severe_below`, the faster of those two (Note [Straggler detection]; a large
  // slowdown is known in two steps, not half a window). Nodes alone in the job: absent.
  std::map<std::string, double> Speeds(double severe_below = 0) const;
  // Slow links (report only): a rank on a node of normal speed that waits much longer for its
  // pipeline neighbours than its peers holding the same layers, e.g. "rank 4 (node b) waits
  // 0.41 s more per step than its peers for its neighbours on node a: a slow link?".
  std::vector<std::string> SlowLinks(double slow_below) const;
  // The newest step's busy and wait of each rank (the stage map shows them).
  const std::vector<double>& newest_busy() const { return busy_; }
  const std::vector<double>& newest_wait() const { return wait_; }
  const std::vector<RankWork>& ranks() const { return ranks_; }

 private:
  std::vector<RankWork> ranks_;
  std::vector<std::vector<int>> peers_;   // same layers, other nodes (empty: none)
  std::vector<std::vector<int>> others_;  // every rank on another node
  const int window_;
  int steps_ = 0;
  int64_t newest_ = 0;
  std::map<std::string, std::deque<double>> speed_;  // per node, the last `window_` steps
  std::vector<std::deque<double>> excess_wait_;      // per rank: wait beyond its peers'
  std::vector<double> busy_, wait_;
};

}  // namespace varuna
