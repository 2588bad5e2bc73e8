#include "common/pipeline/topology.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/base/status_macros.h"
#include "common/pipeline/limits.h"

namespace varuna {
namespace {

// Boundaries of one pipeline: from 0, increasing (every stage at least one segment).
absl::Status CheckBoundaries(const std::string& which, const std::vector<int>& b) {
  if (b.size() < 2) return absl::InvalidArgumentError(absl::StrCat(which, " has no stages"));
  if (b.front() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(which, " must start at segment 0, not ", b.front()));
  }
  for (size_t i = 1; i < b.size(); ++i) {
    if (b[i] <= b[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, ": boundaries ", absl::StrJoin(b, ","),
                       " must increase (every stage needs at least one segment)"));
    }
  }
  return absl::OkStatus();
}

absl::Status TextError(const std::string& text, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("pipelines \"", text, "\": ", what));
}

}  // namespace

absl::StatusOr<Topology> Topology::Uniform(int stages, int replicas, int64_t global_batch) {
  if (stages < 1 || replicas < 1 || static_cast<int64_t>(stages) * replicas > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad shape ", stages, " stages x ", replicas, " replicas"));
  }
  if (global_batch < replicas || global_batch % replicas != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.global_batch=", global_batch,
                     global_batch < replicas ? " is smaller than " : " is not divisible by ",
                     "the ", replicas, " data-parallel replicas"));
  }
  Topology t;
  for (int d = 0; d < replicas; ++d) {
    PipelineLayout p;
    p.boundaries.assign(stages + 1, -1);
    p.samples = global_batch / replicas;
    p.first_rank = d * stages;
    t.pipelines_.push_back(std::move(p));
  }
  t.world_ = stages * replicas;
  return t;
}

absl::StatusOr<Topology> Topology::Make(std::vector<PipelineLayout> pipelines) {
  if (pipelines.empty()) return absl::InvalidArgumentError("at least one pipeline is needed");
  Topology t;
  int64_t world = 0;
  for (size_t k = 0; k < pipelines.size(); ++k) {
    PipelineLayout& p = pipelines[k];
    const std::string which = absl::StrCat("pipeline ", k);
    RETURN_IF_ERROR(CheckBoundaries(which, p.boundaries));
    if (p.boundaries.back() != pipelines[0].boundaries.back()) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, " ends at segment ", p.boundaries.back(), " but pipeline 0 ends at ",
                       pipelines[0].boundaries.back(), ": every pipeline holds the whole model"));
    }
    if (p.samples < 1 || p.samples > kMaxGlobalBatch) {
      return absl::InvalidArgumentError(absl::StrCat(which, " reads ", p.samples,
                                                     " samples per step; it must be in [1, ",
                                                     kMaxGlobalBatch, "]"));
    }
    p.first_rank = static_cast<int>(world);
    world += p.stages();
    if (world > kMaxSlots) {
      return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxSlots, " ranks"));
    }
  }
  t.pipelines_ = std::move(pipelines);
  t.world_ = static_cast<int>(world);
  return t;
}

absl::StatusOr<Topology> Topology::Parse(const std::string& text) {
  absl::string_view body = absl::StripAsciiWhitespace(text);
  if (body.empty()) return TextError(text, "is empty");
  if (body.back() == ';') body.remove_suffix(1);
  std::vector<PipelineLayout> pipelines;
  for (absl::string_view entry : absl::StrSplit(body, ';')) {
    const std::string which = absl::StrCat("pipeline ", pipelines.size());
    std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    if (parts.size() != 2) {
      return TextError(text, absl::StrCat(which, " must be \"b0,b1,...,bS:samples\""));
    }
    PipelineLayout p;
    for (absl::string_view b : absl::StrSplit(parts[0], ',')) {
      int v = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(b), &v) || v < 0) {
        return TextError(
            text, absl::StrCat(which, ": boundary \"", b, "\" is not a non-negative integer"));
      }
      p.boundaries.push_back(v);
    }
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[1]), &p.samples)) {
      return TextError(text, absl::StrCat(which, ": samples \"", parts[1], "\" is not an integer"));
    }
    pipelines.push_back(std::move(p));
  }
  auto t = Make(std::move(pipelines));
  if (!t.ok()) return TextError(text, t.status().message());
  return t;
}

absl::Status Topology::Validate(int num_segments, int64_t global_batch) const {
  if (has_boundaries() && pipelines_[0].boundaries.back() != num_segments) {
    return absl::InvalidArgumentError(absl::StrCat("pipelines ", ToString(), " cover ",
                                                   pipelines_[0].boundaries.back(),
                                                   " segments but the model has ", num_segments));
  }
  for (const PipelineLayout& p : pipelines_) {
    if (p.stages() > num_segments) {
      return absl::InvalidArgumentError(absl::StrCat("the model has ", num_segments,
                                                     " segments, fewer than the ", p.stages(),
                                                     " pipeline stages requested"));
    }
  }
  if (this->global_batch() != global_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the pipelines read ", this->global_batch(), " samples per step (",
        absl::StrJoin(
            pipelines_, " + ",
            [](std::string* out, const PipelineLayout& p) { absl::StrAppend(out, p.samples); }),
        ") but train.global_batch is ", global_batch));
  }
  return absl::OkStatus();
}

absl::Status Topology::SetUniformBoundaries(const std::vector<int>& boundaries) {
  RETURN_IF_ERROR(CheckBoundaries("stage boundaries", boundaries));
  for (PipelineLayout& p : pipelines_) {
    if (boundaries.size() != p.boundaries.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage boundaries ", absl::StrJoin(boundaries, ","), " are for ",
          static_cast<int>(boundaries.size()) - 1, " stages; the pipelines have ", p.stages()));
    }
  }
  for (PipelineLayout& p : pipelines_) p.boundaries = boundaries;
  return absl::OkStatus();
}

bool Topology::uniform() const {
  if (pipelines_.empty()) return false;
  for (const PipelineLayout& p : pipelines_) {
    if (p.boundaries != pipelines_[0].boundaries || p.samples != pipelines_[0].samples) {
      return false;
    }
  }
  return true;
}

StageMap Topology::ToStageMap() const {
  return StageMap::Make(pipelines_[0].stages(), num_pipelines());
}

int64_t Topology::global_batch() const {
  int64_t n = 0;
  for (const PipelineLayout& p : pipelines_) n += p.samples;
  return n;
}

int Topology::PipelineOf(int rank) const {
  // Pipelines are few; ranks are contiguous per pipeline.
  int k = num_pipelines() - 1;
  while (k > 0 && pipelines_[k].first_rank > rank) --k;
  return k;
}

bool Topology::IsLastStage(int rank) const {
  const PipelineLayout& p = pipelines_[PipelineOf(rank)];
  return rank == p.first_rank + p.stages() - 1;
}

std::pair<int, int> Topology::SegmentsOf(int rank) const {
  const PipelineLayout& p = pipelines_[PipelineOf(rank)];
  const int s = rank - p.first_rank;
  return {p.boundaries[s], p.boundaries[s + 1]};
}

int64_t Topology::SampleOffset(int k) const {
  int64_t n = 0;
  for (int i = 0; i < k; ++i) n += pipelines_[i].samples;
  return n;
}

std::vector<int> Topology::Holders(int segment) const {
  std::vector<int> ranks;
  for (const PipelineLayout& p : pipelines_) {
    const auto it = std::upper_bound(p.boundaries.begin(), p.boundaries.end(), segment);
    ranks.push_back(p.first_rank + static_cast<int>(it - p.boundaries.begin()) - 1);
  }
  return ranks;
}

std::vector<std::vector<int>> Topology::HolderSets() const {
  std::vector<std::vector<int>> sets;
  if (num_pipelines() < 2) return sets;
  if (!has_boundaries()) {
    const int P = pipelines_[0].stages();
    for (int s = 0; s < P; ++s) {
      std::vector<int> ranks;
      for (const PipelineLayout& p : pipelines_) ranks.push_back(p.first_rank + s);
      sets.push_back(std::move(ranks));
    }
    return sets;
  }
  std::set<std::vector<int>> seen;
  for (int seg = 0; seg < pipelines_[0].boundaries.back(); ++seg) {
    std::vector<int> ranks = Holders(seg);
    if (seen.insert(ranks).second) sets.push_back(std::move(ranks));
  }
  return sets;
}

std::string Topology::ToString() const {
  if (!pipelines_.empty() && !has_boundaries()) {
    // Uniform, not yet cut: the stage map says all there is.
    return absl::StrCat(ToStageMap().ToString(), " (", pipelines_[0].samples, " samples each)");
  }
  return absl::StrJoin(pipelines_, ";", [](std::string* out, const PipelineLayout& p) {
    absl::StrAppend(out, absl::StrJoin(p.boundaries, ","), ":", p.samples);
  });
}

}  // namespace varuna
