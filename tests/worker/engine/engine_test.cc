// The engine with ranks as threads (worker/dist/thread_process_group.h): parity of every P x D
// shape and of a heterogeneous mix with one process, the overlapped all-reduce's bit-identity,
// and a dead peer failing the survivors instead of hanging them.

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
#include "tests/worker/tiny_gpt.h"
#include "worker/dist/thread_process_group.h"
#include "worker/engine/fused_adamw.h"
#include "worker/engine/step_timeline.h"
#include "worker/engine/varuna.h"
#include "worker/models/registry.h"

namespace varuna {
namespace {

using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

ModelSpec GptSpec(int heads = 2, double dropout = 0) {
  return testing::TinyGptSpec(heads, dropout);
}
TensorMap Batch(int64_t step, int64_t n) { return testing::TinyBatch(step, n); }
TensorMap Slice(const TensorMap& m, int64_t start, int64_t len) {
  return testing::SliceBatch(m, start, len);
}

// Every operation of every group, by group name and process (Note [Pipeline links]).
struct Recorder {
  struct Op {
    std::thread::id thread;
    char kind;  // 'S'end, 'R'ecv, 'A'll-reduce
    int peer;   // group rank; -1 for an all-reduce
    bool training;
  };
  std::mutex mu;
  std::map<std::pair<std::string, int>, std::vector<Op>> ops;
  std::atomic<bool> training{false};  // set once every engine is built
};

class RecordingGroup : public ProcessGroup {
 public:
  RecordingGroup(ProcessGroupPtr inner, std::string name, int process, Recorder* rec)
      : inner_(std::move(inner)), name_(std::move(name)), process_(process), rec_(rec) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  bool device_transfers() const override { return inner_->device_transfers(); }
  WorkPtr Send(const torch::Tensor& t, int peer, int tag) override {
    Note('S', peer);
    return inner_->Send(t, peer, tag);
  }
  WorkPtr Recv(const torch::Tensor& t, int peer, int tag) override {
    Note('R', peer);
    return inner_->Recv(t, peer, tag);
  }
  WorkPtr AllReduceSum(const torch::Tensor& t, std::chrono::milliseconds timeout) override {
    Note('A', -1);
    return inner_->AllReduceSum(t, timeout);
  }

 private:
  void Note(char kind, int peer) {
    std::lock_guard<std::mutex> l(rec_->mu);
    rec_->ops[{name_, process_}].push_back(
        {std::this_thread::get_id(), kind, peer, rec_->training.load()});
  }
  ProcessGroupPtr inner_;
  std::string name_;
  int process_;
  Recorder* rec_;
};

class RecordingFactory : public ProcessGroupFactory {
 public:
  RecordingFactory(std::shared_ptr<ThreadWorld> world, Recorder* rec) : inner_(world), rec_(rec) {}
  Backend backend() const override { return inner_.backend(); }
  absl::StatusOr<ProcessGroupPtr> Create(const std::string& name, const std::vector<int>& members,
                                         int rank) override {
    ASSIGN_OR_RETURN(ProcessGroupPtr g, inner_.Create(name, members, rank));
    return std::make_shared<RecordingGroup>(std::move(g), name, rank, rec_);
  }

 private:
  ThreadFactory inner_;
  Recorder* rec_;
};

struct RankResult {
  std::vector<double> losses;
  std::vector<std::pair<std::string, torch::Tensor>> params;  // after the last step
  absl::Status status;
  int early_buckets = 0, buckets = 0;  // of the last step
  StepResult last;
  std::map<std::string, ShardSpec> shards;  // tensor parallelism: the sharded parameters
  std::vector<std::pair<std::string, torch::Tensor>> initial;  // before the first step
  bool grads_reset = false;         // every parameter's gradient undefined after the last step
  int grad_storages = 0;            // distinct storages of the defined gradients after it
  std::vector<StepTimes> timeline;  // RunOptions::timeline: every step's
  std::shared_ptr<Varuna> engine;   // RunOptions::keep_engines: this rank's, after the run
};

struct RunOptions {
  int steps = 3;
  int chunk = 2;
  bool overlap = true;
  int64_t bucket_bytes = 25 << 20;
  int64_t first_bucket_bytes = 1 << 20;
  std::chrono::milliseconds timeout{20000};
  int die_at_step = -1;  // rank 0 stops taking part before this step
  int tp = 1;            // processes per position (Note [Tensor parallelism])
  int heads = 2;
  double dropout = 0;
  SchedulePolicy schedule = SchedulePolicy::kVaruna;
  bool fused = false;  // FusedAdamW instead of the frontend's AdamW
  double clip = 1.0;
  Precision precision = Precision::kFp32;
  bool timeline = false;         // each rank marks its steps on a StepTimeline
  Recorder* recorder = nullptr;  // records every group's operations
  std::string faults;            // VARUNA_FAULT's text (Note [Faults] in fault.cc)
  bool keep_engines = false;     // RankResult::engine
  bool lr_schedule = false;      // the rate of each step from TestRate, not the optimizer's
};

// A rate that changes every step, so a step taken with another step's rate shows.
double TestRate(int64_t step) { return 1e-2 / static_cast<double>(1 + step); }

// Trains `topology` with one thread per rank (o.tp per position); returns each process's
// results, in process order (position x tp + tp rank).
std::vector<RankResult> Train(const Topology& topology, const RunOptions& o) {
  const int world = topology.world_size() * o.tp;
  // Batches are drawn up front: the generator is shared by the rank threads.
  std::vector<TensorMap> batches;
  for (int s = 0; s < o.steps; ++s) batches.push_back(Batch(s, topology.global_batch()));
  const TensorMap dummy = Batch(99, 2);
  auto shared = std::make_shared<ThreadWorld>();
  std::vector<RankResult> results(world);
  std::vector<std::thread> threads;
  for (int process = 0; process < world; ++process) {
    threads.emplace_back([&, process] {
      RankResult& out = results[process];
      const int r = process / o.tp;
      ThreadFactory threads_factory(shared);
      RecordingFactory recording(shared, o.recorder);
      ProcessGroupFactory& factory = o.recorder
                                         ? static_cast<ProcessGroupFactory&>(recording)
                                         : static_cast<ProcessGroupFactory&>(threads_factory);
      const bool tied = !BuildModel(GptSpec())->tied().empty();
      auto groups = CreateGroups(factory, topology, process, tied, o.timeout, o.tp);
      if (!groups.ok()) {
        out.status = groups.status();
        return;
      }
      absl::StatusOr<Model> model =
          BuildModel(GptSpec(o.heads, o.dropout), TensorParallelOf(*groups, torch::kCPU));
      if (!model.ok()) {
        out.status = model.status();
        return;
      }
      VarunaOptions opts;
      opts.seed = 5;
      opts.clip_grad_norm = o.clip;
      opts.overlap_allreduce = o.overlap;
      opts.bucket_bytes = o.bucket_bytes;
      opts.first_bucket_bytes = o.first_bucket_bytes;
      opts.schedule = o.schedule;
      opts.precision = o.precision;
      StepTimeline timeline(torch::kCPU);
      if (o.timeline) opts.timeline = &timeline;
      if (!o.faults.empty()) {
        absl::StatusOr<std::vector<Fault>> faults = ParseFaults(o.faults);
        if (!faults.ok()) {
          out.status = faults.status();
          return;
        }
        opts.faults = FaultInjector(*faults, r, 1);
      }
      auto engine = Varuna::Create(*std::move(model), topology, r, *std::move(groups), dummy,
                                   o.chunk, torch::kCPU, opts);
      if (!engine.ok()) {
        out.status = engine.status();
        return;
      }
      for (auto& [name, p] : (*engine)->view().named_parameters()) {
        out.initial.emplace_back(name, p.detach().clone());
      }
      const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0);
      if (o.fused) {
        (*engine)->set_optimizer(
            std::make_shared<FusedAdamW>((*engine)->view().parameters(), adamw));
      } else {
        (*engine)->set_optimizer(
            std::make_shared<torch::optim::AdamW>((*engine)->view().parameters(), adamw));
      }
      if (o.lr_schedule) (*engine)->set_lr_schedule(TestRate);
      const Topology& t = (*engine)->view().topology();
      const int k = t.PipelineOf(r);
      if (o.recorder) {
        // Every engine is built (Create is collective) before any step is taken.
        static std::mutex started_mu;
        std::lock_guard<std::mutex> l(started_mu);
        o.recorder->training.store(true);
      }
      // With keep_engines the engine outlives the thread (RankResult::engine), moved there as
      // the thread ends, however it ends.
      struct Keep {
        std::shared_ptr<Varuna>* to;
        std::unique_ptr<Varuna>* from;
        ~Keep() {
          if (to != nullptr) *to = std::move(*from);
        }
      } keep{o.keep_engines ? &out.engine : nullptr, &*engine};
      for (int s = 0; s < o.steps; ++s) {
        if (r == 0 && s == o.die_at_step) return;  // a preempted machine
        const auto t0 = std::chrono::steady_clock::now();
        auto res = (*engine)->step(Slice(batches[s], t.SampleOffset(k), t.pipeline(k).samples));
        if (!res.ok()) {
          out.status = res.status();
          return;
        }
        timeline.EndStep(
            s + 1, res->host_syncs,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        out.losses.push_back(res->loss);
        out.last = *res;
      }
      out.early_buckets = out.last.early_buckets;
      out.buckets = out.last.buckets;
      for (auto& [name, p] : (*engine)->view().named_parameters()) {
        out.params.emplace_back(name, p.detach().clone());
      }
      out.shards = (*engine)->view().sharded_parameters();
      if (o.timeline) out.timeline = timeline.TakeDone(/*wait=*/true);
      out.grads_reset = true;
      std::set<const void*> storages;
      for (const auto& p : (*engine)->view().parameters()) {
        out.grads_reset = out.grads_reset && !p.grad().defined();
        if (p.grad().defined()) storages.insert(p.grad().storage().data());
      }
      out.grad_storages = static_cast<int>(storages.size());
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

Topology Uniform(int P, int D, int64_t batch) {
  Topology t = *Topology::Uniform(P, D, batch);
  return t;
}

void ExpectClose(const std::vector<double>& a, const std::vector<double>& b, double rel) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], rel * std::abs(b[i])) << "step " << i + 1;
  }
}

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

// Note [Roll forward] (worker/engine/regroup.cc): rank 1 posts step 3's agreement and acts as
// if it never completed (a split) while ranks 0, 2, 3 apply step 3. With the agreed vector of
// rank 3 (its stage's replica) it applies step 3 itself and holds bit for bit what it would
// have after an unbroken step 3: the commit needs no copy of the state.
TEST(EngineTest, ARankThatMissedTheAgreementRollsForwardBitForBit) {
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused AdamW" : "AdamW");
    RunOptions o;
    o.fused = fused;
    o.clip = 0.05;  // the clip's coefficient comes from the agreed norm
    const auto want = Train(Uniform(2, 2, 8), o);
    o.faults = "agreement@3:1:split";
    o.keep_engines = true;
    const auto got = Train(Uniform(2, 2, 8), o);
    for (int r : {0, 2, 3}) ASSERT_THAT(got[r].status, IsOk()) << "rank " << r;
    EXPECT_THAT(got[1].status, StatusIs(absl::StatusCode::kAborted, "split at step 3"));
    Varuna& behind = *got[1].engine;
    EXPECT_EQ(behind.iteration(), 2);
    EXPECT_EQ(behind.checkpoints().CommitState().pending, 3);
    const Checkpointer::CommitRecord peer = got[3].engine->checkpoints().CommitState();
    EXPECT_EQ(peer.agreed, 3);
    EXPECT_EQ(peer.pending, 0);
    // Only the pending step, with a vector of the world's size.
    EXPECT_THAT(behind.RollForward(2, peer.vector),
                StatusIs(absl::StatusCode::kFailedPrecondition, "step 3's agreement pending"));
    EXPECT_THAT(behind.RollForward(3, std::vector<double>(3, 0.0)),
                StatusIs(absl::StatusCode::kInvalidArgument, "3 values"));
    ASSERT_THAT(behind.RollForward(3, peer.vector), IsOk());
    EXPECT_EQ(behind.iteration(), 3);
    EXPECT_EQ(behind.checkpoints().CommitState().agreed, 3);
    EXPECT_THAT(behind.RollForward(3, peer.vector),
                StatusIs(absl::StatusCode::kFailedPrecondition, "no agreement pending"));
    const auto params = behind.view().named_parameters();
    ASSERT_EQ(params.size(), want[1].params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].first, want[1].params[i].first);
      EXPECT_TRUE(torch::equal(params[i].second, want[1].params[i].second))
          << params[i].first << " differs from the unbroken run's";
    }
  }
}

// Note [Rolled rescue] in common/checkpoint/checkpoint_store.cc, the relaunch path's side of
// the same split: rank 1 (stage 1) rescues its step 2 and its layers with step 3's gradients,
// rank 0 (stage 0) its step 3 with step 3's update; ranks 2 and 3 are lost. A fresh
// one-process engine resumes step 3 from those two rescues alone, bit for bit the unbroken
// run's. Without the update (rank 0's rescue written with the rolled rescue off) step 3 is
// not complete, and a load of it anyway names why.
TEST(EngineTest, ARescueBehindTheAgreementRollsForwardAtResumeBitForBit) {
  std::string tmpl = ::testing::TempDir() + "/rolled_rescue_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl, off = tmpl + "/off";
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused AdamW" : "AdamW");
    std::filesystem::remove_all(dir + "/varuna_ckpt_2");
    std::filesystem::remove_all(dir + "/varuna_ckpt_3");
    std::filesystem::remove_all(off);
    RunOptions o;
    o.fused = fused;
    o.clip = 0.05;         // the clip's coefficient comes from the recorded norm
    o.lr_schedule = true;  // the roll takes step 3's rate
    const auto want = Train(Uniform(2, 2, 8), o);
    o.faults = "agreement@3:1:split";
    o.keep_engines = true;
    const auto got = Train(Uniform(2, 2, 8), o);
    ASSERT_THAT(got[1].status, StatusIs(absl::StatusCode::kAborted, "split at step 3"));
    Checkpointer& behind = got[1].engine->checkpoints();
    Checkpointer& ahead = got[0].engine->checkpoints();
    {
      const auto v = behind.Rescue(dir);
      ASSERT_THAT(v.status(), IsOk());
      EXPECT_EQ(*v, 2);
    }
    EXPECT_EQ(behind.rescued_also(), 3);  // its layers with step 3's gradients
    EXPECT_FALSE(VerifyCheckpoint(CheckpointPath(dir, 3)).ok()) << "nobody's update yet";
    {
      const auto v = ahead.Rescue(dir);
      ASSERT_THAT(v.status(), IsOk());
      EXPECT_EQ(*v, 3);
    }
    EXPECT_EQ(ahead.rescued_also(), 0);
    ASSERT_THAT(VerifyCheckpoint(CheckpointPath(dir, 3)), IsOk());

    auto world = std::make_shared<ThreadWorld>();
    ThreadFactory factory(world);
    auto fresh = [&]() -> absl::StatusOr<std::unique_ptr<Varuna>> {
      ASSIGN_OR_RETURN(ProcessGroups g,
                       CreateGroups(factory, Uniform(1, 1, 8), 0, true, std::chrono::seconds(5)));
      ASSIGN_OR_RETURN(Model m, BuildModel(GptSpec()));
      VarunaOptions opts;
      opts.seed = 5;
      opts.clip_grad_norm = o.clip;
      ASSIGN_OR_RETURN(auto e, Varuna::Create(std::move(m), Uniform(1, 1, 8), 0, std::move(g),
                                              Batch(99, 2), 2, torch::kCPU, opts));
      const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0);
      if (fused) {
        e->set_optimizer(std::make_shared<FusedAdamW>(e->view().parameters(), adamw));
      } else {
        e->set_optimizer(std::make_shared<torch::optim::AdamW>(e->view().parameters(), adamw));
      }
      e->set_lr_schedule(TestRate);
      return e;
    };
    ASSERT_OK_AND_ASSIGN(auto resumed, fresh());
    {
      const auto v = resumed->checkpoints().Load(CheckpointPath(dir, 3));
      ASSERT_THAT(v.status(), IsOk());
      EXPECT_EQ(*v, 3);
    }
    std::map<std::string, torch::Tensor> unbroken;
    for (int r : {0, 1}) {
      for (const auto& [name, p] : want[r].params) unbroken[name] = p;
    }
    const auto params = resumed->view().named_parameters();
    ASSERT_EQ(params.size(), unbroken.size());
    for (const auto& [name, p] : params) {
      ASSERT_TRUE(unbroken.count(name)) << name;
      EXPECT_TRUE(torch::equal(p, unbroken[name])) << name << " differs from the unbroken run's";
    }

    // The same checkpoint into one position of tp 2 (two processes as threads: each takes its
    // slice of the rolled layers' gradients and rolls that slice forward), and into D=2 (each
    // replica's gradients are views of its buckets, put back after the roll).
    for (const int tp : {2, 1}) {
      const Topology shape = Uniform(1, tp == 2 ? 1 : 2, 8);
      const int processes = shape.world_size() * tp;
      SCOPED_TRACE(absl::StrCat("into ", shape.ToString(), " tp ", tp));
      auto world = std::make_shared<ThreadWorld>();
      std::vector<std::vector<std::pair<std::string, torch::Tensor>>> held(processes);
      std::map<std::string, ShardSpec> shards;
      std::vector<absl::Status> status(processes);
      std::vector<std::thread> threads;
      for (int j = 0; j < processes; ++j) {
        threads.emplace_back([&, j] {
          status[j] = [&]() -> absl::Status {
            ThreadFactory f(world);
            ASSIGN_OR_RETURN(ProcessGroups g,
                             CreateGroups(f, shape, j, true, std::chrono::seconds(20), tp));
            ASSIGN_OR_RETURN(Model m, BuildModel(GptSpec(), TensorParallelOf(g, torch::kCPU)));
            VarunaOptions opts;
            opts.seed = 5;
            opts.clip_grad_norm = o.clip;
            ASSIGN_OR_RETURN(auto e, Varuna::Create(std::move(m), shape, j / tp, std::move(g),
                                                    Batch(99, 2), 2, torch::kCPU, opts));
            const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0);
            if (fused) {
              e->set_optimizer(std::make_shared<FusedAdamW>(e->view().parameters(), adamw));
            } else {
              e->set_optimizer(
                  std::make_shared<torch::optim::AdamW>(e->view().parameters(), adamw));
            }
            e->set_lr_schedule(TestRate);
            ASSIGN_OR_RETURN(int64_t step, e->checkpoints().Load(CheckpointPath(dir, 3)));
            if (step != 3) return absl::InternalError(absl::StrCat("loaded step ", step));
            for (const auto& [name, p] : e->view().named_parameters()) {
              held[j].emplace_back(name, p.detach().clone());
            }
            if (j == 0) shards = e->view().sharded_parameters();
            return absl::OkStatus();
          }();
        });
      }
      for (auto& t : threads) t.join();
      for (int j = 0; j < processes; ++j) ASSERT_THAT(status[j], IsOk()) << "process " << j;
      EXPECT_EQ(shards.empty(), tp == 1);
      for (int j = 0; j < processes; j += tp) {
        for (size_t i = 0; i < held[j].size(); ++i) {
          const auto& [name, p] = held[j][i];
          torch::Tensor have = p;
          if (auto it = shards.find(name); it != shards.end()) {
            have = JoinShards({held[j][i].second, held[j + 1][i].second}, it->second);
          }
          ASSERT_TRUE(unbroken.count(name)) << name;
          EXPECT_TRUE(torch::equal(have, unbroken[name]))
              << name << " differs (process " << j << ")";
        }
      }
    }

    // An overflow's vote (update_skipped): the rolled layers stay as the rank behind holds them.
    {
      const std::string record = CheckpointPath(dir, 3) + "/rescue.rank0.json";
      std::string text;
      {
        std::ifstream in(record);
        text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      const size_t at = text.find("\"update_skipped\": \"0\"");
      ASSERT_NE(at, std::string::npos) << text;
      text[at + std::string("\"update_skipped\": \"").size()] = '1';
      {
        std::ofstream out(record, std::ios::trunc);
        out << text;
      }
      ASSERT_OK_AND_ASSIGN(auto skipped, fresh());
      const auto v = skipped->checkpoints().Load(CheckpointPath(dir, 3));
      ASSERT_THAT(v.status(), IsOk());
      std::map<std::string, torch::Tensor> loaded;
      for (const auto& [name, p] : skipped->view().named_parameters()) loaded[name] = p;
      const auto behind_params = got[1].engine->view().named_parameters();
      ASSERT_FALSE(behind_params.empty());
      for (const auto& [name, p] : behind_params) {
        ASSERT_TRUE(loaded.count(name)) << name;
        EXPECT_TRUE(torch::equal(loaded[name], p)) << name << " moved on a skipped step";
      }
    }

    // The rolled rescue off on the rank ahead: no update recorded, so no step 3.
    ahead.set_rolled_rescue(false);
    {
      const auto v = behind.Rescue(off);
      ASSERT_THAT(v.status(), IsOk());
      EXPECT_EQ(*v, 2);
    }
    {
      const auto v = ahead.Rescue(off);
      ASSERT_THAT(v.status(), IsOk());
      EXPECT_EQ(*v, 3);
    }
    EXPECT_THAT(VerifyCheckpoint(CheckpointPath(off, 3)),
                StatusIs(absl::StatusCode::kDataLoss, "no writer recorded layers/"));
    ASSERT_OK_AND_ASSIGN(auto refused, fresh());
    EXPECT_THAT(
        refused->checkpoints().Load(CheckpointPath(off, 3)),
        StatusIs(absl::StatusCode::kFailedPrecondition, "no rescuer recorded that step's update"));
  }
  std::filesystem::remove_all(dir);
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
