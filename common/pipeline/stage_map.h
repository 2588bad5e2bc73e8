#pragma once

// The stage_to_rank_map contract (Varuna's format): for each pipeline stage in order, the
// comma-separated global ranks of that stage, each group terminated by ';'.
// P=4, D=2: "0,4;1,5;2,6;3,7;". Rank r runs stage r mod P in replica r div P.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace varuna {

class StageMap {
 public:
  // Parses `text`. Errors (InvalidArgument, message quotes the text and says what is wrong):
  // empty text, a group not terminated by ';', an empty group, a non-integer or negative rank,
  // a rank listed twice, stages with different replica counts, ranks that are not exactly
  // 0..P*D-1, or a rank not placed per the contract (rank r must be stage r mod P, replica
  // r div P).
  static absl::StatusOr<StageMap> Parse(const std::string& text);

  // Returns the canonical map for P stages and D replicas: rank s + d*P in stage s.
  static StageMap Make(int stages, int replicas);

  // Checks that the map covers exactly `world_size` ranks.
  absl::Status ValidateWorldSize(int world_size) const;

  int stages() const { return static_cast<int>(ranks_.size()); }
  int replicas() const { return ranks_.empty() ? 0 : static_cast<int>(ranks_[0].size()); }
  int world_size() const { return stages() * replicas(); }

  // Stage and replica of a global rank. Precondition: 0 <= rank < world_size().
  int StageOf(int rank) const { return rank % stages(); }
  int ReplicaOf(int rank) const { return rank / stages(); }
  // Global rank of (stage, replica).
  int RankOf(int stage, int replica) const { return ranks_[stage][replica]; }
  // Ranks of one stage, replica order (the data-parallel group of that stage).
  const std::vector<int>& StageRanks(int stage) const { return ranks_[stage]; }
  // Ranks of one replica, stage order (its pipeline).
  std::vector<int> ReplicaRanks(int replica) const;

  // Returns the Varuna string form, e.g. "0,2;1,3;".
  std::string ToString() const;

 private:
  std::vector<std::vector<int>> ranks_;  // ranks_[stage][replica]
};

}  // namespace varuna
