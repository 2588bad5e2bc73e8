// The Python Varuna API's profiling + auto-configuration flow on libvaruna (docs/autoconfig.md):
// Profiler measures a hand-built model on this machine, AutoConfig picks the shape for a
// cluster of SLOTS slots (SLOTS_PER_NODE per node) and a global batch.
//
//   build/bin/autoconfig_example [SLOTS] [SLOTS_PER_NODE] [GLOBAL_BATCH] [OUT_DIR]

#include <torch/torch.h>

#include <cstdlib>
#include <iostream>

#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/planner/autoconfig.h"
#include "worker/engine/profiler.h"

namespace {

// y = tanh(x W + b); the last layer returns an MSE loss against inputs["target"].
class Dense : public varuna::Layer {
 public:
  Dense(int in, int out, bool last) : last_(last) {
    fc_ = register_module("fc", torch::nn::Linear(in, out));
  }
  torch::Tensor Forward(const torch::Tensor& x, const varuna::TensorMap& in) override {
    torch::Tensor h = fc_(x.defined() ? x : in.at("x"));
    return last_ ? torch::mse_loss(h, in.at("target")) : torch::tanh(h);
  }

 private:
  bool last_;
  torch::nn::Linear fc_{nullptr};
};

}  // namespace

int main(int argc, char** argv) {
  varuna::InitLogging(argv[0]);
  const int slots = argc > 1 ? std::atoi(argv[1]) : 8;
  const int per_node = argc > 2 ? std::atoi(argv[2]) : 4;
  const int64_t global_batch = argc > 3 ? std::atoll(argv[3]) : 64;
  const std::string out_dir = argc > 4 ? argv[4] : "";

  varuna::Model model;
  model.Add("in", 1, [] { return std::make_shared<Dense>(32, 256, false); });
  for (int i = 0; i < 6; ++i) {
    model.Add(varuna::CutPoint{}).Add("mid" + std::to_string(i), 1, [] {
      return std::make_shared<Dense>(256, 256, false);
    });
  }
  model.Add(varuna::CutPoint{}).Add("out", 1, [] { return std::make_shared<Dense>(256, 1, true); });

  // get_batch(size): a batch of `size` samples of every input.
  auto get_batch = [](int size) {
    auto x = torch::randn({size, 32});
    return varuna::TensorMap{{"x", x}, {"target", x.sum(1, true)}};
  };
  varuna::Profiler profiler(model, torch::kCPU, varuna::Precision::kFp32);
  if (auto st = profiler.Initialize(get_batch); !st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 1;
  }
  auto profile = profiler.ProfileAll(get_batch, {1, 2, 4, 8, 16}, out_dir);
  if (!profile.ok()) {
    std::cerr << "error: " << profile.status().message() << "\n";
    return 1;
  }
  std::cout << "profiled " << profile->segments_size() << " segments"
            << (out_dir.empty() ? "" : " -> " + out_dir + "/profile.json") << "\n";

  varuna::AutoConfig config(slots, per_node, global_batch, *profile);
  auto best = config.GetMin();
  if (!best.ok()) {
    std::cerr << "error: " << best.status().message() << "\n";
    return 1;
  }
  std::cout << "AutoConfig for " << slots << " slots (" << per_node << " per node), global batch "
            << global_batch << ": stages=" << best->stages << " replicas=" << best->replicas
            << " micro_batch=" << best->micro_batch << " schedule=" << best->schedule
            << " boundaries=" << absl::StrJoin(best->boundaries, ",") << " predicted step "
            << best->step_s << " s\n";
  return 0;
}
