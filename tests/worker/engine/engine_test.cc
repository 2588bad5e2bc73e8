// The engine with ranks as threads (tests/worker/engine/thread_ranks.h): parity of every P x D
// shape and of a heterogeneous mix with one process, the overlapped all-reduce's bit-identity,
// and a dead peer failing the survivors instead of hanging them. What a failure mid-step leaves
// (roll forward, rolled rescue) is in commit_test.cc.

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_store.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine/thread_ranks.h"
#include "tests/worker/tiny_gpt.h"
#include "worker/dist/thread_process_group.h"
#include "worker/engine/fused_adamw.h"
#include "worker/engine/step_timeline.h"
#include "worker/engine/varuna.h"
#include "worker/models/registry.h"

namespace varuna {
namespace {

using thread_ranks::Batch;
using thread_ranks::ExpectClose;
using thread_ranks::GptSpec;
using thread_ranks::RankResult;
using thread_ranks::Recorder;
using thread_ranks::RecordingFactory;
using thread_ranks::RunOptions;
using thread_ranks::Slice;
using thread_ranks::TestRate;
using thread_ranks::Train;
using thread_ranks::Uniform;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

TEST(EngineTest, EveryShapeMatchesOneProcess) {
  const RunOptions o;
  const auto reference = Train(Uniform(1, 1, 8), o);
  ASSERT_TRUE(reference[0].status.ok()) << reference[0].status;
  ASSERT_EQ(reference[0].losses.size(), 3u);
  // The loss moves (the optimizer really steps).
  EXPECT_NE(reference[0].losses[0], reference[0].losses[2]);
  for (auto [P, D] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}, {2, 2}, {3, 1}, {1, 4}}) {
    SCOPED_TRACE(absl::StrCat("P=", P, " D=", D));
    const auto got = Train(Uniform(P, D, 8), o);
    for (const auto& r : got) ASSERT_TRUE(r.status.ok()) << r.status;
    // Every last stage reports the same global loss.
    for (int k = 0; k < D; ++k) ExpectClose(got[k * P + P - 1].losses, reference[0].losses, 1e-5);
  }
}

// Note [Host syncs] (worker/engine/varuna.cc): a step reads the device back once, the
// agreement's result. With one pipeline the gradients are left undefined after it, not
// zeroed; with several they are views of the data-parallel buckets (Note [Gradients as bucket
// views] in gradient_reducer.cc): as many storages as buckets, nothing copied beside them.
TEST(EngineTest, OneHostReadPerStepAndGradientsResetAfterIt) {
  RunOptions o;
  o.bucket_bytes = 1 << 14;  // several buckets
  o.first_bucket_bytes = 1 << 12;
  for (auto [P, D] : std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {1, 2}}) {
    SCOPED_TRACE(absl::StrCat("P=", P, " D=", D));
    for (const auto& r : Train(Uniform(P, D, 8), o)) {
      ASSERT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.last.host_syncs, 1);
      if (D == 1) {
        EXPECT_TRUE(r.grads_reset);
      } else {
        EXPECT_GT(r.buckets, 2);
        EXPECT_EQ(r.grad_storages, r.buckets);
      }
    }
  }
}

// Note [Step timeline] (worker/engine/step_timeline.cc): every step is split into its phases on
// every rank; on the CPU the phases are host times inside the step's wall time.
TEST(EngineTest, TheTimelineSplitsEveryStepIntoItsPhases) {
  RunOptions o;
  o.timeline = true;
  o.steps = 4;
  for (auto [P, D] : std::vector<std::pair<int, int>>{{1, 1}, {2, 2}}) {
    SCOPED_TRACE(absl::StrCat("P=", P, " D=", D));
    for (const auto& r : Train(Uniform(P, D, 8), o)) {
      ASSERT_TRUE(r.status.ok()) << r.status;
      ASSERT_EQ(r.timeline.size(), 4u);
      for (size_t i = 0; i < r.timeline.size(); ++i) {
        const StepTimes& t = r.timeline[i];
        SCOPED_TRACE(absl::StrCat("step ", t.step));
        EXPECT_EQ(t.step, static_cast<int64_t>(i + 1));
        EXPECT_EQ(t.clock, "host");
        EXPECT_EQ(t.host_syncs, 1);
        double sum = 0;
        for (int p = 0; p < kStepPhases; ++p) {
          const auto phase = static_cast<StepPhase>(p);
          // Every phase runs on every rank; with one rank there is nothing to communicate.
          if (phase != StepPhase::kComm || P * D > 1) {
            EXPECT_GT(t.seconds[p], 0) << StepPhaseName(phase);
          }
          sum += t.seconds[p];
        }
        EXPECT_LE(sum, t.step_s);
        // Alone, the compute is most of a step (with peers, a pipeline's waits for its
        // neighbours are in no phase).
        if (P * D == 1) EXPECT_GT(t.seconds[0] + t.seconds[1], 0.3 * t.step_s);
      }
    }
  }
}

// Note [Pipeline links] (worker/dist/process_group.h): each adjacent pair of stages talks over
// two groups, one per direction; on each end of a link one thread at a time posts one kind of
// operation to the one peer, and the world group carries no point-to-point traffic once the
// steps run (NCCL would give the world group one stream per pair for both directions).
TEST(EngineTest, PipelineTrafficTakesOneGroupPerDirection) {
  Recorder rec;
  RunOptions o;
  o.recorder = &rec;
  o.steps = 2;
  const auto got = Train(Uniform(3, 2, 12), o);
  for (const auto& r : got) ASSERT_TRUE(r.status.ok()) << r.status;
  int links = 0;
  for (const auto& [key, ops] : rec.ops) {
    const auto& [name, process] = key;
    SCOPED_TRACE(absl::StrCat(name, " on process ", process));
    int a = 0, b = 0;
    char sep = 0;
    const bool act = std::sscanf(name.c_str(), "act:%d%c%d", &a, &sep, &b) == 3;
    const bool grad = !act && std::sscanf(name.c_str(), "grad:%d%c%d", &a, &sep, &b) == 3;
    if (!act && !grad) {
      // Other groups (world, data-parallel, tied): no pipeline traffic while training.
      for (const auto& op : ops) {
        if (name == "world" && op.training) EXPECT_EQ(op.kind, 'A');
      }
      continue;
    }
    ++links;
    ASSERT_EQ(sep, '>');
    ASSERT_TRUE(process == a || process == b);
    // "act:a>b" and "grad:a>b" both carry a's messages to b only.
    const char want = process == a ? 'S' : 'R';
    const int peer = (process == a) == (a < b) ? 1 : 0;  // the pair's group ranks by stage
    std::set<std::thread::id> threads;
    int training_ops = 0;
    for (const auto& op : ops) {
      EXPECT_EQ(op.kind, want);
      EXPECT_EQ(op.peer, peer);
      training_ops += op.training;
      if (op.training) threads.insert(op.thread);
    }
    // One sender or receiver thread per step posts all of a step's operations on its link.
    EXPECT_LE(threads.size(), 2u);
    // Each step's micro-batches (12 / 2 replicas, chunk 2: 3) one by one, in order.
    EXPECT_EQ(training_ops, 2 * 3);
    // Start-up: the dry run's boundary shapes on the activation links only.
    EXPECT_EQ(static_cast<int>(ops.size()) - training_ops, act ? 1 : 0);
  }
  // 2 pipelines x 2 adjacent pairs x 2 directions, each seen from both ends.
  EXPECT_EQ(links, 2 * 2 * 2 * 2);
}

// Note [Autocast cache] (worker/engine/pipeline_executor.cc): with casts kept for a step, bf16
// still trains every weight on every schedule. Varuna's schedule forwards without grad and
// recomputes with it, reusing the first's casts: were such a cast without its edge to the
// weight, the weight would get no gradient and (weight decay 0) stay as it was.
TEST(EngineTest, Bf16WithTheAutocastCacheTrainsEveryWeightOnEveryShape) {
  RunOptions o;
  o.precision = Precision::kBf16;
  o.steps = 2;
  const auto reference = Train(Uniform(1, 1, 8), o);
  ASSERT_TRUE(reference[0].status.ok()) << reference[0].status;
  for (auto schedule : {SchedulePolicy::kVaruna, SchedulePolicy::kGPipe, SchedulePolicy::kZbH1}) {
    o.schedule = schedule;
    SCOPED_TRACE(SchedulePolicyName(schedule));
    const auto got = Train(Uniform(2, 1, 8), o);
    for (const auto& r : got) {
      ASSERT_TRUE(r.status.ok()) << r.status;
      ASSERT_EQ(r.params.size(), r.initial.size());
      for (size_t i = 0; i < r.params.size(); ++i) {
        EXPECT_FALSE(torch::equal(r.params[i].second, r.initial[i].second))
            << r.params[i].first << " did not move";
      }
    }
    ExpectClose(got[1].losses, reference[0].losses, 1e-3);
  }
}

// The clip folded into the fused AdamW as its gradient scale (Note [Fused AdamW]) trains as
// the frontend's AdamW after a per-parameter clip does.
TEST(EngineTest, TheFusedOptimizerClipsAsTheLoopDoes) {
  RunOptions o;
  o.steps = 5;
  o.clip = 0.05;
  const auto loop = Train(Uniform(1, 1, 8), o);
  o.fused = true;
  const auto fused = Train(Uniform(1, 1, 8), o);
  ASSERT_TRUE(loop[0].status.ok()) << loop[0].status;
  ASSERT_TRUE(fused[0].status.ok()) << fused[0].status;
  EXPECT_GT(loop[0].last.grad_norm, 2 * o.clip);  // the clip acts at every step
  ExpectClose(fused[0].losses, loop[0].losses, 1e-6);
  // Adam is nearly blind to a gradient's scale: the clip must still show at this tolerance,
  // or the comparison above would pass with the fused run ignoring it.
  o.clip = 0;
  const auto unclipped = Train(Uniform(1, 1, 8), o);
  ASSERT_TRUE(unclipped[0].status.ok()) << unclipped[0].status;
  double most = 0;
  for (size_t i = 0; i < loop[0].losses.size(); ++i) {
    most = std::max(
        most, std::abs(unclipped[0].losses[i] - loop[0].losses[i]) / std::abs(loop[0].losses[i]));
  }
  EXPECT_GT(most, 1e-5);
  // 1e-5, not the optimizer's own 1e-6 (fused_adamw_test.cc): g / scale and g * (1 / scale)
  // differ in the last bit, and five steps through the model (Adam normalises small
  // gradients' updates to about lr) carry that to about 2e-6 here.
  for (size_t i = 0; i < loop[0].params.size(); ++i) {
    EXPECT_LT((fused[0].params[i].second - loop[0].params[i].second).abs().max().item<double>(),
              1e-5)
        << loop[0].params[i].first;
  }
}

// Note [Step timing] (worker/engine/varuna.h): every rank learns pipeline 0's per-stage busy and
// wait times, its bubble and the model's parameter count from the step's agreement all-reduce.
TEST(EngineTest, StepTimingIsSharedByEveryRank) {
  const auto one = Train(Uniform(1, 1, 8), RunOptions());
  ASSERT_TRUE(one[0].status.ok()) << one[0].status;
  const int64_t n = one[0].last.model_parameters;
  int64_t counted = 0;
  for (const auto& [name, p] : one[0].params) counted += name == "head.lm_head" ? 0 : p.numel();
  EXPECT_EQ(n, counted);  // the tied LM head once
  EXPECT_EQ(one[0].last.stage_busy_s.size(), 1u);
  const auto got = Train(Uniform(3, 2, 12), RunOptions());
  for (const auto& r : got) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.last.model_parameters, n);
    ASSERT_EQ(r.last.stage_busy_s.size(), 3u);
    ASSERT_EQ(r.last.stage_wait_s.size(), 3u);
    EXPECT_EQ(r.last.stage_busy_s, got[0].last.stage_busy_s);  // the same on every rank
    for (double b : r.last.stage_busy_s) EXPECT_GT(b, 0);
    EXPECT_GE(r.last.bubble_ratio, 0);
    EXPECT_LT(r.last.bubble_ratio, 1);
  }
}

TEST(EngineTest, HeterogeneousPipelinesMatchOneProcess) {
  const auto reference = Train(Uniform(1, 1, 8), RunOptions());
  ASSERT_TRUE(reference[0].status.ok()) << reference[0].status;
  // A 2-stage pipeline with 6 samples beside a 1-stage one with 2 (segments: embed, 4 blocks,
  // head).
  ASSERT_OK_AND_ASSIGN(Topology t, Topology::Parse("0,3,6:6;0,6:2"));
  const auto got = Train(t, RunOptions());
  for (const auto& r : got) ASSERT_TRUE(r.status.ok()) << r.status;
  ExpectClose(got[1].losses, reference[0].losses, 1e-5);
  ExpectClose(got[2].losses, reference[0].losses, 1e-5);
}

// Note [Tensor parallelism] (worker/models/tensor_parallel.cc): tp_size processes per stage compute
// what one process does, alone and in P x D and heterogeneous mixes, under several schedules,
// from the same initial model. (Dropout is checked with processes, tests/e2e: threads share
// one random generator.)
TEST(EngineTest, TensorParallelMatchesOneProcess) {
  RunOptions o;
  o.heads = 4;
  const auto reference = Train(Uniform(1, 1, 8), o);
  ASSERT_TRUE(reference[0].status.ok()) << reference[0].status;
  struct Case {
    std::string topology;
    int tp;
    SchedulePolicy schedule;
  };
  for (const Case& c : std::vector<Case>{{"0,6:8", 2, SchedulePolicy::kVaruna},
                                         {"0,6:8", 4, SchedulePolicy::k1F1B},
                                         {"0,3,6:4;0,3,6:4", 2, SchedulePolicy::kVaruna},
                                         {"0,3,6:4;0,3,6:4", 2, SchedulePolicy::kZbH1},
                                         {"0,3,6:6;0,6:2", 2, SchedulePolicy::k1F1B}}) {
    SCOPED_TRACE(absl::StrCat(c.topology, " tp=", c.tp, " ", SchedulePolicyName(c.schedule)));
    ASSERT_OK_AND_ASSIGN(Topology t, Topology::Parse(c.topology));
    RunOptions tp = o;
    tp.tp = c.tp;
    tp.schedule = c.schedule;
    const auto got = Train(t, tp);
    for (const auto& r : got) ASSERT_TRUE(r.status.ok()) << r.status;
    // Every last stage's processes report the reference's loss and parameter count.
    for (int k = 0; k < t.num_pipelines(); ++k) {
      const int last = t.pipeline(k).first_rank + t.pipeline(k).stages() - 1;
      for (int j = 0; j < c.tp; ++j) {
        ExpectClose(got[last * c.tp + j].losses, reference[0].losses, 1e-5);
        EXPECT_EQ(got[last * c.tp + j].last.model_parameters, reference[0].last.model_parameters);
      }
    }
    if (c.topology != "0,6:8") continue;
    // One position: its processes' initial slices join into the unsplit model's parameters
    // (trained ones are compared through the losses: Adam turns the round-off of gradients
    // that are zero in exact arithmetic, such as an attention key's bias, into whole steps).
    const auto& shards = got[0].shards;
    EXPECT_EQ(shards.count("blocks.0.qkv.weight"), 1u);
    EXPECT_EQ(shards.count("blocks.0.ln1.weight"), 0u);
    for (size_t i = 0; i < reference[0].initial.size(); ++i) {
      const auto& [name, want] = reference[0].initial[i];
      torch::Tensor have = got[0].initial[i].second;
      if (auto it = shards.find(name); it != shards.end()) {
        std::vector<torch::Tensor> parts;
        for (int j = 0; j < c.tp; ++j) parts.push_back(got[j].initial[i].second);
        have = JoinShards(parts, it->second);
      }
      EXPECT_TRUE(torch::equal(have, want)) << name;
    }
  }
}

// Note [Overlapped all-reduce] (worker/engine/gradient_reducer.cc): posting buckets from the
// backward's hooks changes when they are summed, never what: losses and parameters are
// bit-identical to the non-overlapped path, with many small buckets (so several are posted
// mid-backward) and with the default ones. With zb-h1 the linears' weight gradients arrive in the W
// passes, outside autograd (GradientReducer::DeferredGradientsReady): their buckets must still wait
// for them.
TEST(EngineTest, OverlappedAllReduceIsBitIdentical) {
  for (int64_t bucket : {int64_t{4096}, int64_t{25} << 20}) {
    for (auto [P, D, schedule] :
         std::vector<std::tuple<int, int, SchedulePolicy>>{{1, 3, SchedulePolicy::kVaruna},
                                                           {2, 2, SchedulePolicy::kVaruna},
                                                           {2, 2, SchedulePolicy::kZbH1}}) {
      SCOPED_TRACE(
          absl::StrCat("bucket=", bucket, " P=", P, " D=", D, " ", SchedulePolicyName(schedule)));
      RunOptions o;
      o.schedule = schedule;
      o.bucket_bytes = bucket;
      o.first_bucket_bytes = std::min<int64_t>(bucket, 1024);
      o.overlap = false;
      const auto base = Train(Uniform(P, D, 12), o);
      o.overlap = true;
      const auto over = Train(Uniform(P, D, 12), o);
      for (int r = 0; r < P * D; ++r) {
        ASSERT_TRUE(base[r].status.ok()) << base[r].status;
        ASSERT_TRUE(over[r].status.ok()) << over[r].status;
        EXPECT_EQ(base[r].losses, over[r].losses) << "rank " << r;
        EXPECT_EQ(base[r].early_buckets, 0);
        // Small buckets: several are posted while the backward is still running.
        if (bucket < 10000) EXPECT_GT(over[r].early_buckets, 1) << "rank " << r;
        EXPECT_LT(over[r].early_buckets, over[r].buckets) << "tied buckets wait for the pipeline";
        ASSERT_EQ(base[r].params.size(), over[r].params.size());
        for (size_t i = 0; i < base[r].params.size(); ++i) {
          EXPECT_TRUE(torch::equal(base[r].params[i].second, over[r].params[i].second))
              << "rank " << r << " " << base[r].params[i].first;
        }
      }
    }
  }
}

// A rank that stops taking part mid-run (a preempted VM) fails its peers' next collective or
// receive within the timeout: nobody hangs, and the error names a timeout.
TEST(EngineTest, ADeadPeerFailsTheSurvivorsWithinTheTimeout) {
  RunOptions o;
  o.die_at_step = 1;
  o.timeout = std::chrono::milliseconds(1500);
  const auto t0 = std::chrono::steady_clock::now();
  const auto got = Train(Uniform(2, 2, 8), o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 30.0);
  for (int r = 1; r < 4; ++r) {
    EXPECT_THAT(got[r].status, StatusIs(absl::StatusCode::kDeadlineExceeded, "timed out"))
        << "rank " << r;
    EXPECT_EQ(got[r].losses.size(), 1u) << "rank " << r;
  }
}

TEST(EngineTest, GroupsThatDoNotMatchTheTopologyAreRefused) {
  auto shared = std::make_shared<ThreadWorld>();
  ThreadFactory factory(shared);
  const Topology small = Uniform(1, 1, 8);
  ASSERT_OK_AND_ASSIGN(ProcessGroups g,
                       CreateGroups(factory, small, 0, true, std::chrono::seconds(5)));
  ASSERT_OK_AND_ASSIGN(Model m, BuildModel(GptSpec()));
  EXPECT_THAT(Varuna::Create(std::move(m), Uniform(2, 1, 8), 0, g, Batch(0, 2), 2, torch::kCPU,
                             VarunaOptions())
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "process groups do not match"));
}

}  // namespace
}  // namespace varuna
