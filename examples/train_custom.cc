// A training program written on the libvaruna API instead of the generic varuna-worker:
// a hand-built model (layers + CutPoints), synthetic data, torchrun environment. Under
// varuna-agent (an `entrypoint:` job) it reports its progress in the worker protocol
// (docs/architecture.md "Worker protocol"); run by hand, those reports do nothing.
//
//   torchrun --no-python --nproc_per_node 2 build/bin/train_custom --stage_to_rank_map "0;1;"
//   build/bin/train_custom            # one process

#include <torch/torch.h>

#include <iostream>

#include "common/base/logging.h"
#include "common/launch/worker_channel.h"
#include "worker/engine/varuna.h"

namespace {

// y = x W + b per layer; the last layer returns an MSE loss against inputs["target"].
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
  std::string map_text = "0;";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--stage_to_rank_map=", 0) == 0) map_text = a.substr(20);
    if (a == "--stage_to_rank_map" && i + 1 < argc) map_text = argv[++i];
    // Heterogeneous pipelines (docs/heterogeneous.md), e.g. --pipelines=0,1,3:24;0,3:8.
    if (a.rfind("--pipelines=", 0) == 0) map_text = a.substr(12);
  }
  varuna::Model model;
  model.Add("in", 1, [] { return std::make_shared<Dense>(16, 64, false); })
      .Add(varuna::CutPoint{})
      .Add("mid", 1, [] { return std::make_shared<Dense>(64, 64, false); })
      .Add(varuna::CutPoint{})
      .Add("out", 1, [] { return std::make_shared<Dense>(64, 1, true); });

  // Every rank draws the same data stream; each replica takes its slice.
  auto make_batch = [](int64_t step, int64_t n) {
    torch::manual_seed(1000 + step);
    auto x = torch::randn({n, 16});
    return varuna::TensorMap{{"x", x}, {"target", 0.25 * x.sum(1, true)}};
  };
  // The Python Varuna API's constructor: model, stage_to_rank_map, dummy inputs, global batch,
  // chunk size, precision (and local rank, device, shared weights). Rank and rendezvous: torchrun
  // env.
  auto engine = varuna::Varuna::Create(model, map_text, make_batch(0, 2), /*batch_size=*/32,
                                       /*chunk_size=*/8, varuna::Precision::kFp32);
  // The agent shows the last event of a failed rank as the job's reason.
  auto fail = [](const absl::Status& s) {
    std::cerr << "error: " << s.message() << "\n";
    varuna::v1::WorkerEvent e;
    e.mutable_error()->set_message(std::string(s.message()));
    (void)varuna::AppendWorkerEvent(e);
    return 1;
  };
  if (!engine.ok()) return fail(engine.status());
  varuna::v1::WorkerEvent ready;
  ready.mutable_ready()->set_resumed_from(0);
  (void)varuna::AppendWorkerEvent(ready);
  auto& v = **engine;
  const varuna::EngineView view = v.view();
  v.set_optimizer(std::make_shared<torch::optim::Adam>(view.parameters(), 1e-2));
  // This rank's pipeline reads its own contiguous share of every global batch.
  const int64_t share = view.topology().pipeline(view.replica()).samples;
  const int64_t offset = view.topology().SampleOffset(view.replica());
  for (int64_t step = 1; step <= 50; ++step) {
    auto full = make_batch(step, 32);
    varuna::TensorMap mine;
    for (auto& [k, t] : full) mine[k] = t.narrow(0, offset, share);
    auto r = v.step(mine);
    if (!r.ok()) return fail(r.status());
    varuna::v1::WorkerEvent progress;  // every rank: the loss is global after the step
    progress.mutable_step()->set_step(static_cast<int32_t>(step));
    progress.mutable_step()->set_loss(r->loss);
    (void)varuna::AppendWorkerEvent(progress);
    if (view.is_last_stage() && (step == 1 || step % 10 == 0)) {
      std::cout << "step " << step << " loss " << r->loss << "\n";
    }
  }
  return 0;
}
