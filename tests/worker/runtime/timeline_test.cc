// --timeline_out and --trace_steps (worker/runtime/timeline_out.h, step_trace.h): the kernel
// categories, the summary's self times and device counts, the profiler on the CPU, the file.

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include "tests/testing/status_matchers.h"

#include "worker/engine/pipeline_executor.h"
#include "worker/engine/step_timeline.h"
#include "worker/models/registry.h"
#include "worker/runtime/step_trace.h"
#include "worker/runtime/timeline_out.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

TEST(KernelCategoryTest, NamesAsAProfileReadsThem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"},
      {"nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "gemm"},
      {"void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>", "gemm"},
      {"aten::addmm", "gemm"},
      {"aten::mm", "gemm"},
      {"void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "attention"},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", "attention"},
      {"ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"},
      {"void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>", "optimizer"},
      {"aten::_fused_adamw_", "optimizer"},
      {"void at::native::multi_tensor_apply_kernel<LpNormFunctor<float, 1>>", "norm"},
      {"aten::native_layer_norm", "norm"},
      {"void at::native::cunn_SoftMaxForward<4, float>", "softmax_loss"},
      {"aten::nll_loss_forward", "softmax_loss"},
      {"Memcpy HtoD (Pinned -> Device)", "copy"},
      {"aten::copy_", "copy"},
      {"aten::fill_", "memset"},
      {"void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", "elementwise"},
      {"aten::add_", "elementwise"},
      {"aten::empty", "other"},
  };
  for (const auto& [name, want] : cases) EXPECT_EQ(KernelCategory(name), want) << name;
}

TraceEvent Op(const std::string& name, uint64_t start, uint64_t dur, uint64_t thread = 1) {
  TraceEvent e;
  e.name = name;
  e.start_ns = start;
  e.duration_ns = dur;
  e.thread = thread;
  return e;
}

// On a host, operators nest: each is charged its own time less its children's.
TEST(SummarizeTest, HostOperatorsAreChargedTheirSelfTime) {
  std::vector<TraceEvent> events = {
      Op("aten::linear", 0, 100),              // calls addmm: 100 - 70 = 30 of its own
      Op("aten::addmm", 10, 70),               // calls copy_: 70 - 20 = 50
      Op("aten::copy_", 20, 20),               // a leaf
      Op("aten::add_", 200, 40),               // a sibling, later
      Op("aten::mm", 15, 1000, /*thread=*/2),  // another thread: no parent
      Op("aten::_local_scalar_dense", 300, 5),
  };
  const TraceSummary s = Summarize(events);
  EXPECT_EQ(s.where, "host");
  std::map<std::string, TraceBucket> cats;
  for (const TraceBucket& b : s.categories) cats[b.name] = b;
  EXPECT_DOUBLE_EQ(cats["gemm"].time_s, (30 + 50 + 1000) / 1e9);
  EXPECT_EQ(cats["gemm"].count, 3);
  EXPECT_DOUBLE_EQ(cats["copy"].time_s, 20 / 1e9);
  EXPECT_DOUBLE_EQ(cats["elementwise"].time_s, 40 / 1e9);
  EXPECT_DOUBLE_EQ(s.total_s, (100 + 1000 + 40 + 5) / 1e9);
  EXPECT_EQ(s.copies.count, 1);
  EXPECT_EQ(s.syncs, 1);                         // the item()
  EXPECT_EQ(s.categories.front().name, "gemm");  // the longest first
  EXPECT_EQ(s.top.front().name, "aten::mm");
}

// With device events the summary is the device's: kernels, copies and sets; host operators
// are left out, and the host's waits are counted from the runtime's calls.
TEST(SummarizeTest, DeviceEventsAreTheDevicesTime) {
  auto with = [](TraceEvent e, TraceEvent::Kind k) {
    e.kind = k;
    return e;
  };
  std::vector<TraceEvent> events = {
      Op("aten::linear", 0, 5000),  // host: not counted
      with(Op("sm90_xmma_gemm_bf16", 0, 300), TraceEvent::Kind::kKernel),
      with(Op("sm90_xmma_gemm_bf16", 400, 300), TraceEvent::Kind::kKernel),
      with(Op("flash_bwd_kernel", 800, 200), TraceEvent::Kind::kKernel),
      with(Op("Memcpy HtoD (Pinned -> Device)", 0, 10), TraceEvent::Kind::kCopy),
      with(Op("Memset (Device)", 0, 2), TraceEvent::Kind::kMemset),
      with(Op("cudaStreamSynchronize", 0, 50), TraceEvent::Kind::kRuntime),
      with(Op("cudaLaunchKernel", 0, 3), TraceEvent::Kind::kRuntime),
      with(Op("cudaMemcpyAsync", 0, 3), TraceEvent::Kind::kRuntime),
  };
  const TraceSummary s = Summarize(events);
  EXPECT_EQ(s.where, "device");
  ASSERT_GE(s.categories.size(), 4u);
  EXPECT_EQ(s.categories[0].name, "gemm");
  EXPECT_DOUBLE_EQ(s.categories[0].time_s, 600 / 1e9);
  EXPECT_EQ(s.categories[0].count, 2);
  EXPECT_EQ(s.categories[1].name, "attention");
  EXPECT_DOUBLE_EQ(s.total_s, (600 + 200 + 10 + 2) / 1e9);
  EXPECT_EQ(s.copies.count, 1);
  EXPECT_EQ(s.syncs, 1);
}

TEST(SummarizeTest, TheJsonLineHasEveryField) {
  TraceSummary s = Summarize({Op("aten::mm", 0, 2000), Op("aten::copy_", 3000, 1000)});
  const std::string j = TraceSummaryJson(s, 2, 3, 5);
  EXPECT_THAT(j, HasSubstr("{\"trace\":{\"first_step\":2,\"steps\":3,\"asked\":5,"
                           "\"where\":\"host\",\"total_s\":3e-06,"));
  EXPECT_THAT(j, HasSubstr("\"categories\":[{\"name\":\"gemm\",\"time_s\":2e-06,\"count\":1},"));
  EXPECT_THAT(j, HasSubstr("\"copies\":{\"time_s\":1e-06,\"count\":1},\"syncs\":0}}"));
}

// The profiler itself, on the CPU: matrix products show as gemm, item() as a sync.
TEST(StepTraceTest, TracesOperatorsOnTheCpu) {
  ASSERT_OK_AND_ASSIGN(auto trace, StepTrace::Start(torch::kCPU));
  torch::Tensor a = torch::randn({64, 64});
  double sum = 0;
  for (int i = 0; i < 5; ++i) sum += torch::mm(a, a).sum().item<double>();
  ASSERT_OK_AND_ASSIGN(TraceSummary s, trace->Stop());
  EXPECT_TRUE(std::isfinite(sum));
  EXPECT_EQ(s.where, "host");
  std::map<std::string, TraceBucket> cats;
  for (const TraceBucket& b : s.categories) cats[b.name] = b;
  EXPECT_EQ(cats["gemm"].count, 5);
  EXPECT_GT(cats["gemm"].time_s, 0);
  EXPECT_EQ(s.syncs, 5);
  // A second trace in the same process works too (one at a time).
  ASSERT_OK_AND_ASSIGN(auto again, StepTrace::Start(torch::kCPU));
  torch::mm(a, a);
  ASSERT_OK_AND_ASSIGN(TraceSummary s2, again->Stop());
  EXPECT_GE(s2.categories.size(), 1u);
}

// Note [Autocast cache] (worker/engine/pipeline_executor.cc), seen by the profiler: four bf16
// forwards that keep the cache cast each weight once, not four times.
TEST(StepTraceTest, TheKeptAutocastCacheCastsEachWeightOnce) {
  ModelSpec spec;
  spec.layers = 2;
  spec.d_model = 32;
  spec.heads = 2;
  spec.seq_len = 8;
  spec.vocab = 64;
  const Model model = *BuildModel(spec);
  std::vector<std::shared_ptr<Layer>> layers;
  for (size_t i = 0; i < model.layers().size(); ++i) {
    layers.push_back(BuildLayer(model, static_cast<int>(i), 5, torch::kCPU));
  }
  int64_t weights = 0;
  for (const auto& l : layers) {
    for (const auto& p : l->named_parameters())
      weights += p.key().find("weight") != std::string::npos;
  }
  torch::manual_seed(1);
  const auto ids = torch::randint(0, 64, {2, 9}, torch::kLong);
  const TensorMap mb = {{"input_ids", ids.narrow(1, 0, 8).contiguous()},
                        {"labels", ids.narrow(1, 1, 8).contiguous()}};
  auto casts = [&](bool keep) -> int64_t {
    auto trace = StepTrace::Start(torch::kCPU);
    if (!trace.ok()) return -1;
    for (int m = 0; m < 4; ++m) ForwardLayers(layers, {}, mb, Precision::kBf16, torch::kCPU, keep);
    at::autocast::clear_cache();
    auto s = (*trace)->Stop();
    if (!s.ok()) return -1;
    for (const TraceBucket& b : s->categories) {
      if (b.name == "copy") return b.count;
    }
    return 0;
  };
  const int64_t cleared = casts(false), kept = casts(true);
  ASSERT_GT(weights, 4);
  ASSERT_GT(kept, 0);
  // Three forwards' worth of weight casts saved (every linear weight is cast under autocast).
  EXPECT_GE(cleared - kept, 3 * (weights - 4)) << "cleared " << cleared << " kept " << kept;
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);) out.push_back(line);
  return out;
}

// The file: a line per step (written once the step's events are done), the trace's summary
// after its steps, the trace started past the first step.
TEST(TimelineOutTest, WritesEveryStepAndOneTrace) {
  const std::string path = ::testing::TempDir() + "/timeline.jsonl";
  ASSERT_OK_AND_ASSIGN(auto out, TimelineOut::Open(path, 0, /*trace_steps=*/2, torch::kCPU));
  torch::Tensor a = torch::randn({32, 32});
  for (int64_t step = 1; step <= 4; ++step) {
    ASSERT_THAT(out->BeforeStep(step, 1, 4), IsOk());
    {
      StepTimeline::Scope f(out->timeline(), StepPhase::kForward);
      torch::mm(a, a);
    }
    {
      StepTimeline::Scope o(out->timeline(), StepPhase::kOptimizer);
      a.add_(1e-3);
    }
    ASSERT_THAT(out->AfterStep(step, 1, 0.5), IsOk());
  }
  ASSERT_THAT(out->Finish(), IsOk());
  const std::vector<std::string> lines = Lines(path);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_THAT(lines[0], HasSubstr("{\"step\":1,\"rank\":0,\"forward_s\":"));
  EXPECT_THAT(lines[0], HasSubstr("\"host_syncs\":1,\"step_s\":0.5,\"clock\":\"host\","
                                  "\"traced\":false}"));
  EXPECT_THAT(lines[1], HasSubstr("\"traced\":true"));
  EXPECT_THAT(lines[2], HasSubstr("\"traced\":true"));
  // The summary follows its last step (3): a trace line between steps 3 and 4.
  EXPECT_THAT(lines[3], HasSubstr("{\"trace\":{\"first_step\":2,\"steps\":2,\"asked\":2,"));
  EXPECT_THAT(lines[4], HasSubstr("{\"step\":4,"));
  EXPECT_THAT(lines[4], HasSubstr("\"traced\":false"));
}

// A run shorter than the trace: the trace starts at the first step and says how many it got.
TEST(TimelineOutTest, AShortRunSaysHowManyStepsItTraced) {
  const std::string path = ::testing::TempDir() + "/short.jsonl";
  ASSERT_OK_AND_ASSIGN(auto out, TimelineOut::Open(path, 3, /*trace_steps=*/5, torch::kCPU));
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_THAT(out->BeforeStep(step, 1, 2), IsOk());
    ASSERT_THAT(out->AfterStep(step, 0, 0.1), IsOk());
  }
  ASSERT_THAT(out->Finish(), IsOk());
  const std::vector<std::string> lines = Lines(path + ".rank3");  // not rank 0: its own file
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[0], HasSubstr("\"rank\":3"));
  EXPECT_THAT(lines[2], HasSubstr("{\"trace\":{\"first_step\":1,\"steps\":2,\"asked\":5,"));
}

TEST(TimelineOutTest, AnUnwritableFileIsNamed) {
  EXPECT_THAT(TimelineOut::Open("/nonexistent/dir/t.jsonl", 0, 0, torch::kCPU).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "/nonexistent/dir/t.jsonl"));
}

// A write that fails mid-run (here every write: /dev/full) warns and turns the timeline off;
// training goes on, every call says OK, and the steps the engine still marks are dropped as
// they end instead of piling up.
TEST(TimelineOutTest, AFailedWriteMidRunTurnsTheTimelineOffNotTheRun) {
  if (!std::ifstream("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  ASSERT_OK_AND_ASSIGN(auto out, TimelineOut::Open("/dev/full", 0, /*trace_steps=*/2, torch::kCPU));
  for (int64_t step = 1; step <= 5; ++step) {
    ASSERT_THAT(out->BeforeStep(step, 1, 5), IsOk()) << "step " << step;
    {
      StepTimeline::Scope f(out->timeline(), StepPhase::kForward);
      torch::mm(torch::ones({8, 8}), torch::ones({8, 8}));
    }
    ASSERT_THAT(out->AfterStep(step, 1, 0.1), IsOk()) << "step " << step;
    EXPECT_TRUE(out->timeline()->TakeDone(/*wait=*/true).empty()) << "step " << step;
  }
  EXPECT_THAT(out->Finish(), IsOk());
}

// A failed step's spans are dropped; the next step starts clean.
TEST(StepTimelineTest, AFailedStepIsDropped) {
  StepTimeline t(torch::kCPU);
  t.Begin(StepPhase::kForward);
  t.DiscardStep();
  t.Begin(StepPhase::kBackward);
  t.Begin(StepPhase::kBackward);  // ignored: already open
  t.End(StepPhase::kForward);     // ignored: not open
  t.EndStep(7, 1, 1.0);           // closes the backward
  const std::vector<StepTimes> done = t.TakeDone(/*wait=*/false);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].step, 7);
  EXPECT_EQ(done[0].seconds[static_cast<int>(StepPhase::kForward)], 0);
  EXPECT_GT(done[0].seconds[static_cast<int>(StepPhase::kBackward)], 0);
  EXPECT_TRUE(t.TakeDone(false).empty());
}

}  // namespace
}  // namespace varuna
