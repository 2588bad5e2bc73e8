#pragma once

// Profiles (varuna.v1.Profile, docs/autoconfig.md): what one model costs on one device kind,
// measured by varuna::Profiler in the worker or estimated from the model spec (the built-in
// cost model). This file reads, writes, checks and queries them; no LibTorch.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "varuna/v1/plan.pb.h"

namespace varuna {

inline constexpr int kProfileVersion = 1;
inline constexpr int64_t kMaxProfileBytes = 64 << 20;

// Identifies a model for profile reuse: the kind and every field that changes its costs,
// e.g. "gpt layers=4 d_model=128 heads=4 seq_len=64 vocab=256". TorchScript models are keyed
// by their directory.
std::string ModelKey(const ModelSpec& model);

// The segments of a built-in model (gpt, mlp) as the worker builds them (worker/models/gpt.cc):
// per segment its forward FLOPs per sample, parameter count and output elements per sample.
struct SegmentShape {
  std::string layers;
  double flops_per_sample = 0;
  double params = 0;
  double out_elems_per_sample = 0;  // activation crossing the cut after this segment
  double graph_elems_per_sample = 0;
};
absl::StatusOr<std::vector<SegmentShape>> DescribeModel(const ModelSpec& model);

// A profile estimated from the model spec with fixed machine constants (kBuiltinFlops,
// link and all-reduce defaults): the fallback when no measured profile exists. Ranks shapes
// sensibly; its absolute times are rough.
absl::StatusOr<v1::Profile> BuiltinProfile(const JobSpec& spec);

// Checks a profile's structure: version, at least one segment, micro-batch sizes ascending
// and positive, every segment costed at every size, times and sizes finite and >= 0.
// Errors name the field ("profile: segments[3].costs[1].backward_s = -1").
absl::Status ValidateProfile(const v1::Profile& profile);
// ValidateProfile, plus: it is for this job's model (model key, segment count) and precision.
absl::Status CheckProfileFor(const v1::Profile& profile, const JobSpec& spec);

// JSON text <-> profile (protobuf JSON mapping). Parse errors name the problem.
absl::StatusOr<v1::Profile> ParseProfileJson(const std::string& json);
std::string ProfileToJson(const v1::Profile& profile);
// Writes a profile as JSON, atomically (temporary file + rename).
absl::Status WriteProfileFile(const std::string& path, const v1::Profile& profile);
// Reads and validates a profile file (at most kMaxProfileBytes).
absl::StatusOr<v1::Profile> LoadProfile(const std::string& path);

// Piecewise-linear lookups (extrapolated from the two nearest points at the ends, never
// below zero).
struct SegmentTimes {
  double forward_s = 0, forward_nograd_s = 0, recompute_s = 0, backward_s = 0, weight_s = 0;
  double activation_bytes = 0, graph_bytes = 0, peak_bytes = 0;
};
SegmentTimes CostAt(const v1::SegmentProfile& segment, int micro_batch);
// Seconds to move `bytes` given samples sorted by bytes; empty samples -> `fallback_*`.
double TransferTime(const google::protobuf::RepeatedPtrField<v1::TransferSample>& samples,
                    double bytes);

// Communication costs derived from a profile, with the defaults and scaling rules of
// docs/autoconfig.md (ring all-reduce model for group sizes that were not measured).
class CommModel {
 public:
  explicit CommModel(const v1::Profile& profile) : profile_(profile) {}
  double P2P(double bytes, bool cross_host) const;
  double AllReduce(double bytes, int group_size, bool cross_host) const;
  // Notes about assumptions made (e.g. cross-host links not measured).
  std::vector<std::string> Notes() const;

 private:
  const v1::Profile& profile_;
};

}  // namespace varuna
