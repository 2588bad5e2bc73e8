#pragma once

// varuna::Profiler (the Python Varuna API's profiler; docs/autoconfig.md "Profiling"): measures
// what a model costs on this device so AutoConfig can simulate any shape. Per segment and
// micro-batch size: forward (with and without the graph), recompute and backward time, activation
// bytes at the cut, bytes the graph holds and the peak; per segment the optimizer update. With a
// process group of 2+ ranks, also one-way transfer time by size (same host and, when two ranks are
// on different hosts, across hosts) and all-reduce time by size. Medians after warm-up.
//
//   varuna::Profiler profiler(model, torch::kCPU, varuna::Precision::kFp32);
//   profiler.Initialize(get_batch);   // get_batch(n) -> n samples of every input
//   auto profile = profiler.ProfileAll(get_batch, {1, 2, 4, 8}, "/tmp/prof");  // profile.json

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "varuna/v1/plan.pb.h"
#include "worker/dist/comm.h"
#include "worker/engine/varuna.h"
#include "worker/models/model.h"

namespace varuna {

struct ProfilerOptions {
  std::string model_key = "custom";  // ModelKey(spec.model) for built-in models
  std::string optimizer = "adamw";   // adamw | sgd: the update that is timed
  int warmup = 2;
  int repeats = 9;
  uint64_t seed = 1;
  // Communication (optional): this rank, the world group and every rank's host name.
  int rank = 0;
  ProcessGroupPtr world;
  std::vector<std::string> hosts;
  std::chrono::milliseconds timeout{300000};
};

class Profiler {
 public:
  using GetBatch = std::function<TensorMap(int size)>;

  Profiler(Model model, torch::Device device, Precision precision, ProfilerOptions options = {});

  // Builds every layer (seeded as the engine does) and runs one forward + backward.
  absl::Status Initialize(const GetBatch& get_batch);
  // Profiles every segment at each micro-batch size (ascending, positive) and, with a world
  // group, the links. Every rank of the group must call it. Writes OUT_FOLDER/profile.json
  // when out_folder is not empty (rank 0 only).
  absl::StatusOr<v1::Profile> ProfileAll(const GetBatch& get_batch,
                                         const std::vector<int>& micro_batch_sizes,
                                         const std::string& out_folder);

 private:
  struct Samples;  // one micro-batch size's samples, per segment (profiler.cc)

  absl::Status ProfileSegments(const GetBatch& get_batch, const std::vector<int>& sizes,
                               v1::Profile* out);
  // ProfileSegments' parts, in the order it runs them (profiler.cc).
  void AddSegments(v1::Profile* out) const;
  void ProfilePass(const TensorMap& batch, bool keep, Samples* sm);
  void TimeForwardNoGraph(const TensorMap& batch, bool keep, std::vector<torch::Tensor>* acts,
                          std::vector<std::vector<double>>* fwd_ng);
  void TimeStagePasses(const TensorMap& batch, const std::vector<torch::Tensor>& acts, bool keep,
                       Samples* sm);
  void TimeRecompute(const TensorMap& batch, const std::vector<torch::Tensor>& acts, bool keep,
                     std::vector<std::vector<double>>* rec);
  void WriteSegmentCosts(const std::vector<int>& sizes, const std::vector<Samples>& samples,
                         bool track, v1::Profile* out) const;
  absl::Status ProfileOptimizer(v1::Profile* out);
  void ProfileStepOverhead(const GetBatch& get_batch, int size, v1::Profile* out) const;
  absl::Status ProfileLinks(double max_bytes, double max_param_bytes, v1::Profile* out);

  Model model_;
  torch::Device device_;
  Precision precision_;
  ProfilerOptions options_;
  std::vector<std::vector<std::shared_ptr<Layer>>> segments_;  // built layers per segment
  std::vector<std::vector<std::string>> layer_names_;          // per segment, per built layer
};

}  // namespace varuna
