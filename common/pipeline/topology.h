#pragma once

// Topology: where every rank of a job sits (ARCHITECTURE "Stage map", docs/heterogeneous.md).
//
// A job runs one or more pipelines side by side. Pipeline k owns a contiguous block of ranks,
// one per stage, in stage order (the blocks follow each other in pipeline order); stage s of
// pipeline k runs the segments [boundaries[s], boundaries[s+1]). Every pipeline holds the
// whole model but may cut it differently (Oobleck's heterogeneous pipelines), and reads its
// own contiguous share of each step's global batch (`samples`, after the shares of the
// pipelines before it).
//
// The uniform case (P stages x D replicas, every pipeline cut alike, global_batch / D samples
// each) is what Varuna's stage_to_rank_map describes: rank r is stage r mod P of pipeline
// r div P. Its boundaries may be left empty, to be filled by the engine (PartitionByCost).
//
// Data-parallel gradient sync is per segment: a segment's gradient is all-reduced over its
// holders (one rank per pipeline). Segments with the same holder set share one process group
// (HolderSets); the checkpoint writer of a segment is its holder in pipeline 0.
//
// Text form (--pipelines, VARUNA_PIPELINES, LaunchRequest.pipelines): pipelines separated by
// ';', each "b0,b1,...,bS:samples", e.g. "0,3,6:12;0,6:4" (a 2-stage pipeline reading 12
// samples, then a 1-stage one reading 4).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/pipeline/stage_map.h"

namespace varuna {

struct PipelineLayout {
  // stages + 1 segment indices, increasing, from 0; all -1 while unset (uniform case)
  std::vector<int> boundaries;
  int64_t samples = 0;  // share of the global batch per step
  int first_rank = 0;   // derived: ranks [first_rank, first_rank + stages())
  int stages() const { return static_cast<int>(boundaries.size()) - 1; }
};

class Topology {
 public:
  // P x D, every pipeline global_batch / D samples (checked divisible), boundaries unset.
  static absl::StatusOr<Topology> Uniform(int stages, int replicas, int64_t global_batch);
  // From explicit pipelines (first_rank is recomputed). Checks: at least one pipeline, each
  // with >= 1 stage, boundaries increasing from 0 to the same last index, samples >= 1.
  static absl::StatusOr<Topology> Make(std::vector<PipelineLayout> pipelines);
  // Parses the text form; errors quote the text and say what is wrong.
  static absl::StatusOr<Topology> Parse(const std::string& text);

  // Checks against a model and a batch: the boundaries end at `num_segments` (when set) and
  // the shares add up to `global_batch`.
  absl::Status Validate(int num_segments, int64_t global_batch) const;

  // Sets the same boundaries on every pipeline (uniform case). Error if the count is not
  // stages + 1 or a pipeline's depth differs.
  absl::Status SetUniformBoundaries(const std::vector<int>& boundaries);
  bool has_boundaries() const { return !pipelines_.empty() && pipelines_[0].boundaries[0] == 0; }

  // Every pipeline has the same depth, boundaries and share: a stage_to_rank_map describes it.
  bool uniform() const;
  // The stage map of a uniform topology (P = depth, D = pipelines).
  StageMap ToStageMap() const;

  int world_size() const { return world_; }
  int num_pipelines() const { return static_cast<int>(pipelines_.size()); }
  const PipelineLayout& pipeline(int k) const { return pipelines_[k]; }
  const std::vector<PipelineLayout>& pipelines() const { return pipelines_; }
  int64_t global_batch() const;

  // Position of a rank. Precondition: 0 <= rank < world_size().
  int PipelineOf(int rank) const;
  int StageOf(int rank) const { return rank - pipelines_[PipelineOf(rank)].first_rank; }
  bool IsFirstStage(int rank) const { return StageOf(rank) == 0; }
  bool IsLastStage(int rank) const;
  // [first, last) segments of a rank (needs boundaries: {-1, -1} without).
  std::pair<int, int> SegmentsOf(int rank) const;
  // First sample of pipeline k within a step's global batch.
  int64_t SampleOffset(int k) const;

  // Ranks holding `segment`, one per pipeline, in pipeline order (needs boundaries).
  std::vector<int> Holders(int segment) const;
  // Distinct holder sets with more than one rank, ordered by their first segment. Without
  // boundaries (uniform case) these are the stages' rank groups, which hold whatever the
  // boundaries turn out to be. Every rank that creates groups walks this same list.
  std::vector<std::vector<int>> HolderSets() const;

  // "0,3,6:12;0,6:4" (unset boundaries print as -1).
  std::string ToString() const;

 private:
  std::vector<PipelineLayout> pipelines_;
  int world_ = 0;
};

}  // namespace varuna
