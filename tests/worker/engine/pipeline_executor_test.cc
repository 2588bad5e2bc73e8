// The pipeline executor with ranks as threads (worker/dist/thread_process_group.h): a model cut
// into two stages gives the loss and gradients of the uncut model under every schedule, and each
// run is timed.

#include "worker/engine/pipeline_executor.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"
#include "worker/dist/thread_process_group.h"
#include "worker/models/linear.h"
#include "worker/models/registry.h"

namespace varuna {
namespace {

using ::varuna::testing::IsOk;

constexpr int kSeqLen = 8;
constexpr int kSeed = 5;
constexpr int kCut = 3;  // stage 0: embed, blocks.0, blocks.1; stage 1: blocks.2, blocks.3, head

Model Gpt() {
  ModelSpec spec;
  spec.layers = 4;
  spec.d_model = 32;
  spec.heads = 2;
  spec.seq_len = kSeqLen;
  spec.vocab = 64;
  return *BuildModel(spec);
}

TensorMap Batch(int64_t n) {
  torch::manual_seed(1000);
  auto ids = torch::randint(0, 64, {n, kSeqLen + 1}, torch::kLong);
  return {{"input_ids", ids.narrow(1, 0, kSeqLen).contiguous()},
          {"labels", ids.narrow(1, 1, kSeqLen).contiguous()}};
}

// Layers [first, last) of the model, initialised as the engine does (Note [Init]).
std::vector<std::shared_ptr<Layer>> Layers(const Model& model, int first, int last) {
  std::vector<std::shared_ptr<Layer>> layers;
  for (int i = first; i < last; ++i) layers.push_back(BuildLayer(model, i, kSeed, torch::kCPU));
  return layers;
}

std::vector<torch::Tensor> Grads(const std::vector<std::shared_ptr<Layer>>& layers) {
  std::vector<torch::Tensor> grads;
  for (const auto& l : layers) {
    for (const auto& p : l->parameters()) grads.push_back(p.grad().clone());
  }
  return grads;
}

struct StageRun {
  absl::StatusOr<PipelineResult> result = absl::UnknownError("not run");
  int armed = 0;         // calls of before_last_backward
  int weight_calls = 0;  // calls of after_last_weight_pass, and the weights they named
  size_t weights = 0;
  PipelineTiming last;
};

class PipelineExecutorTest : public ::testing::TestWithParam<SchedulePolicy> {};

TEST_P(PipelineExecutorTest, TwoStagesMatchOneStage) {
  constexpr int kBatch = 10, kChunk = 3;  // 4 micro-batches, the last one smaller
  const Model model = Gpt();
  const int n = static_cast<int>(model.layers().size());
  const TensorMap batch = Batch(kBatch);
  PipelineRunOptions run;
  run.weight_denominator = kBatch;

  // The uncut model on one stage.
  const auto whole = Layers(model, 0, n);
  StageConfig one;
  one.chunk_size = kChunk;
  one.schedule = GetParam();
  PipelineExecutor single(whole, one);
  int armed = 0;
  run.before_last_backward = [&] { ++armed; };
  auto reference = single.Run(batch, run);
  ASSERT_THAT(reference.status(), IsOk());
  EXPECT_EQ(armed, 1);

  // The same model cut in two, one thread per stage. The boundary is what the dry run would
  // find: stage 0's output at 1 and 2 samples.
  const std::vector<std::vector<std::shared_ptr<Layer>>> stages = {Layers(model, 0, kCut),
                                                                   Layers(model, kCut, n)};
  std::vector<int64_t> meta;
  {
    torch::NoGradGuard g;
    const TensorMap b = Batch(2);
    TensorMap one_sample;
    for (const auto& [k, t] : b) one_sample[k] = t.narrow(0, 0, 1);
    meta = MakeBoundaryMeta(ForwardLayers(stages[0], {}, one_sample, Precision::kFp32, torch::kCPU),
                            ForwardLayers(stages[0], {}, b, Precision::kFp32, torch::kCPU));
  }
  auto world = std::make_shared<ThreadWorld>();
  std::vector<StageRun> runs(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ThreadFactory factory(world);
      StageConfig c;
      // One group per direction (Note [Pipeline links] in worker/dist/process_group.h), made
      // in the same order on both ranks.
      ProcessGroupPtr act = *factory.Create("act:0>1", {0, 1}, r);
      ProcessGroupPtr grad = *factory.Create("grad:1>0", {0, 1}, r);
      if (r == 0) {
        c.links.act_out = act;
        c.links.grad_in = grad;
      } else {
        c.links.act_in = act;
        c.links.grad_out = grad;
      }
      c.rank = r;
      c.stage = r;
      c.stages = 2;
      c.chunk_size = kChunk;
      c.schedule = GetParam();
      c.timeout = std::chrono::seconds(20);
      (r == 0 ? c.out_meta : c.in_meta) = meta;
      PipelineExecutor exec(stages[r], c);
      PipelineRunOptions mine = run;
      mine.before_last_backward = [&runs, r] { ++runs[r].armed; };
      mine.after_last_weight_pass = [&runs, r](const std::vector<torch::Tensor>& w) {
        ++runs[r].weight_calls;
        runs[r].weights += w.size();
      };
      runs[r].result = exec.Run(batch, mine);
      runs[r].last = exec.last_timing();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_THAT(runs[r].result.status(), IsOk()) << "stage " << r;
    EXPECT_EQ(runs[r].armed, 1) << "stage " << r;
    // A split backward defers each block's four linear weights (and the MLP head's none: the
    // GPT head is a tied matmul, computed in B).
    EXPECT_EQ(runs[r].weight_calls, SplitsBackward(GetParam()) ? 1 : 0) << "stage " << r;
    EXPECT_EQ(runs[r].weights, SplitsBackward(GetParam()) ? 8u : 0u) << "stage " << r;
    // Note [Step timing] in varuna.h: the run is timed, waits included.
    const PipelineTiming& t = runs[r].result->timing;
    EXPECT_GT(t.pipeline_s, 0) << "stage " << r;
    EXPECT_GE(t.wait_s, 0) << "stage " << r;
    EXPECT_LE(t.wait_s, t.pipeline_s) << "stage " << r;
    EXPECT_EQ(runs[r].last.pipeline_s, t.pipeline_s);
    EXPECT_EQ(runs[r].last.wait_s, t.wait_s);
  }
  EXPECT_EQ(runs[0].result->loss(), 0);  // only the last stage has the loss
  EXPECT_NEAR(runs[1].result->loss(), reference->loss(), 1e-6 * std::abs(reference->loss()));
  std::vector<torch::Tensor> want = Grads(whole), got = Grads(stages[0]);
  for (const auto& g : Grads(stages[1])) got.push_back(g);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], want[i], /*rtol=*/1e-4, /*atol=*/1e-6))
        << "parameter " << i << " differs by " << (got[i] - want[i]).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineExecutorTest,
                         ::testing::Values(SchedulePolicy::kVaruna, SchedulePolicy::kGPipe,
                                           SchedulePolicy::k1F1B, SchedulePolicy::kZbH1),
                         [](const auto& info) {
                           std::string name = SchedulePolicyName(info.param);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Note [Deferred weight gradients] in worker/models/linear.cc. B (the backward without the recorded
// weights) then W (Apply) gives autograd's gradients, in both weight layouts, with a bias and a 3-D
// input.
TEST(LinearTest, DeferredWeightGradientsEqualAutograd) {
  for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    torch::manual_seed(3);
    const bool out_in = layout == WeightLayout::kOutIn;
    auto w = (out_in ? torch::randn({5, 4}) : torch::randn({4, 5})).requires_grad_(true);
    auto b = torch::randn({5}).requires_grad_(true);
    auto x = torch::randn({2, 3, 4}).requires_grad_(true);
    ApplyLinear(x, w, b, layout).tanh().sum().backward();
    const torch::Tensor want_w = w.grad().clone(), want_b = b.grad().clone();
    const torch::Tensor want_x = x.grad().clone();
    for (auto* t : {&w, &b, &x}) t->mutable_grad() = torch::Tensor();

    WeightGradCapture capture;
    torch::Tensor loss;
    {
      ScopedWeightGradCapture scope(&capture);
      loss = ApplyLinear(x, w, b, layout).tanh().sum();
    }
    EXPECT_TRUE(capture.Defers(w));
    EXPECT_FALSE(capture.Defers(b));
    torch::autograd::backward({loss}, {}, false, false, {x, b});
    EXPECT_FALSE(w.grad().defined()) << "B computed the weight gradient";
    const std::vector<torch::Tensor> done = capture.Apply();
    ASSERT_EQ(done.size(), 1u);
    EXPECT_TRUE(done[0].is_same(w));
    EXPECT_TRUE(capture.empty());
    EXPECT_TRUE(torch::allclose(w.grad(), want_w, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(b.grad(), want_b, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(x.grad(), want_x, 1e-5, 1e-6));
  }
}

// Evaluation runs forwards only: the loss is each micro-batch's weighted by its samples, no
// gradient is made and the callback is not called.
TEST(PipelineExecutorEvalTest, ForwardOnlyLossWithoutGradients) {
  const Model model = Gpt();
  const auto layers = Layers(model, 0, static_cast<int>(model.layers().size()));
  StageConfig c;
  c.chunk_size = 4;
  PipelineExecutor exec(layers, c);
  PipelineRunOptions run;
  run.train = false;
  bool called = false;
  run.before_last_backward = [&] { called = true; };
  const TensorMap batch = Batch(6);
  auto got = exec.Run(batch, run);
  ASSERT_THAT(got.status(), IsOk());
  double want = 0;
  {
    torch::NoGradGuard g;
    for (int64_t start : {0, 4}) {
      const int64_t len = start == 0 ? 4 : 2;
      TensorMap mb;
      for (const auto& [k, t] : batch) mb[k] = t.narrow(0, start, len);
      want += ForwardLayers(layers, {}, mb, Precision::kFp32, torch::kCPU).item<double>() * len;
    }
  }
  EXPECT_NEAR(got->loss(), want, 1e-6 * std::abs(want));
  EXPECT_FALSE(called);
  for (const auto& l : layers) {
    for (const auto& p : l->parameters()) EXPECT_FALSE(p.grad().defined());
  }
  EXPECT_GT(got->timing.pipeline_s, 0);
  EXPECT_EQ(got->timing.wait_s, 0);  // nothing to receive on a single stage
}

// Note [Autocast cache] in pipeline_executor.cc: a run keeps its weights' bf16 casts for its
// micro-batches and drops them at its end, so the next run sees weights an update changed.
TEST(PipelineExecutorEvalTest, Bf16CastsDoNotOutliveARun) {
  const Model model = Gpt();
  const auto layers = Layers(model, 0, static_cast<int>(model.layers().size()));
  StageConfig c;
  c.chunk_size = 2;
  c.precision = Precision::kBf16;
  PipelineExecutor exec(layers, c);
  PipelineRunOptions run;
  run.weight_denominator = 4;
  const TensorMap batch = Batch(4);
  auto first = exec.Run(batch, run);
  ASSERT_THAT(first.status(), IsOk());
  {
    // An "update" in place, as the optimizer makes; large enough to move the loss (the
    // initial weights give about ln(vocab) whatever their scale).
    torch::NoGradGuard g;
    torch::manual_seed(3);
    for (const auto& l : layers) {
      for (auto& p : l->parameters()) p.add_(torch::randn_like(p), 0.5);
    }
  }
  auto got = exec.Run(batch, run);
  ASSERT_THAT(got.status(), IsOk());
  // The reference: other layers (no cached cast of theirs exists) with the changed weights.
  const auto fresh = Layers(model, 0, static_cast<int>(model.layers().size()));
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < fresh.size(); ++i) {
      const auto to = fresh[i]->parameters();
      const auto from = layers[i]->parameters();
      for (size_t j = 0; j < to.size(); ++j) to[j].copy_(from[j]);
    }
  }
  double want = 0;
  for (int64_t start : {0, 2}) {
    TensorMap mb;
    for (const auto& [k, t] : batch) mb[k] = t.narrow(0, start, 2);
    want += ForwardLayers(fresh, {}, mb, Precision::kBf16, torch::kCPU).item<double>() * 2 / 4;
  }
  EXPECT_NEAR(got->loss(), want, 1e-6 * std::abs(want));
  EXPECT_GT(std::abs(want - first->loss()), 0.1);  // the change shows in the loss
}

TEST(PipelineExecutorEvalTest, BoundaryMetaSizesBatchDimensions) {
  const std::vector<int64_t> meta =
      MakeBoundaryMeta(torch::zeros({1, 8, 32}), torch::zeros({2, 8, 32}));
  const TensorSpec s = BoundarySpec(meta, 5);
  EXPECT_THAT(s.shape, ::testing::ElementsAre(5, 8, 32));
  EXPECT_EQ(s.dtype, torch::kFloat);
}

}  // namespace
}  // namespace varuna
