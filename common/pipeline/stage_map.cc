#include "common/pipeline/stage_map.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace varuna {
namespace {

absl::Status ParseError(const std::string& text, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("stage_to_rank_map \"", text, "\": ", what));
}

}  // namespace

absl::StatusOr<StageMap> StageMap::Parse(const std::string& text) {
  absl::string_view body = absl::StripAsciiWhitespace(text);
  if (body.empty()) return ParseError(text, "is empty");
  if (body.back() != ';') {
    return ParseError(text, "must end with ';' (every stage group is terminated by ';')");
  }
  body.remove_suffix(1);

  StageMap map;
  std::set<int> seen;
  int max_rank = 0;
  for (absl::string_view group : absl::StrSplit(body, ';')) {
    const int stage = static_cast<int>(map.ranks_.size());
    if (absl::StripAsciiWhitespace(group).empty()) {
      return ParseError(text, absl::StrCat("stage ", stage, " has an empty rank group"));
    }
    std::vector<int> ranks;
    for (absl::string_view token : absl::StrSplit(group, ',')) {
      token = absl::StripAsciiWhitespace(token);
      int rank = 0;
      if (!absl::SimpleAtoi(token, &rank)) {
        return ParseError(
            text, absl::StrCat("rank \"", token, "\" of stage ", stage, " is not an integer"));
      }
      if (rank < 0) {
        return ParseError(text, absl::StrCat("rank ", rank, " of stage ", stage, " is negative"));
      }
      if (!seen.insert(rank).second) {
        return ParseError(text, absl::StrCat("rank ", rank, " is listed twice"));
      }
      max_rank = std::max(max_rank, rank);
      ranks.push_back(rank);
    }
    if (stage > 0 && ranks.size() != map.ranks_[0].size()) {
      return ParseError(
          text, absl::StrCat("stage ", stage, " has ", ranks.size(), " replicas but stage 0 has ",
                             map.ranks_[0].size(), "; all stages need the same replica count"));
    }
    map.ranks_.push_back(std::move(ranks));
  }

  const int stages = map.stages();
  const int world = map.world_size();
  // The ranks are distinct and there are `world` of them: they are 0..world-1 iff the largest
  // is world-1.
  if (max_rank != world - 1) {
    return ParseError(
        text, absl::StrCat("ranks must be exactly 0..", world - 1, " (", stages, " stages x ",
                           map.replicas(), " replicas) but rank ", max_rank, " is listed"));
  }
  for (int s = 0; s < stages; ++s) {
    for (int d = 0; d < map.replicas(); ++d) {
      const int rank = map.ranks_[s][d];
      if (rank != s + d * stages) {
        return ParseError(
            text, absl::StrCat("rank ", rank, " is placed at stage ", s, " replica ", d,
                               " but must be at stage ", rank % stages, " replica ", rank / stages,
                               " (rank r runs stage r mod P, replica r div P)"));
      }
    }
  }
  return map;
}

StageMap StageMap::Make(int stages, int replicas) {
  StageMap map;
  map.ranks_.resize(stages);
  for (int s = 0; s < stages; ++s) {
    for (int d = 0; d < replicas; ++d) map.ranks_[s].push_back(s + d * stages);
  }
  return map;
}

absl::Status StageMap::ValidateWorldSize(int world_size) const {
  if (this->world_size() != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("stage_to_rank_map \"", ToString(), "\" has ",
                                                   this->world_size(), " ranks but WORLD_SIZE is ",
                                                   world_size));
  }
  return absl::OkStatus();
}

std::vector<int> StageMap::ReplicaRanks(int replica) const {
  std::vector<int> ranks;
  ranks.reserve(ranks_.size());
  for (const std::vector<int>& stage : ranks_) ranks.push_back(stage[replica]);
  return ranks;
}

std::string StageMap::ToString() const {
  std::string out;
  for (const std::vector<int>& stage : ranks_)
    absl::StrAppend(&out, absl::StrJoin(stage, ","), ";");
  return out;
}

}  // namespace varuna
