#pragma once

// The engine with ranks as threads (worker/dist/thread_process_group.h), for the engine's
// tests: Train() runs a topology for a few steps with one thread per process and returns what
// each saw (losses, parameters, gradients, timelines, the engine itself on request); a recorder
// of every group's operations; the tiny GPT's spec and batches.

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/worker/tiny_gpt.h"
#include "worker/dist/thread_process_group.h"
#include "worker/engine/fused_adamw.h"
#include "worker/engine/step_timeline.h"
#include "worker/engine/varuna.h"
#include "worker/models/registry.h"

namespace varuna {
namespace thread_ranks {

inline ModelSpec GptSpec(int heads = 2, double dropout = 0) {
  return testing::TinyGptSpec(heads, dropout);
}
inline TensorMap Batch(int64_t step, int64_t n) { return testing::TinyBatch(step, n); }
inline TensorMap Slice(const TensorMap& m, int64_t start, int64_t len) {
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
inline double TestRate(int64_t step) { return 1e-2 / static_cast<double>(1 + step); }

// Trains `topology` with one thread per rank (o.tp per position); returns each process's
// results, in process order (position x tp + tp rank).
inline std::vector<RankResult> Train(const Topology& topology, const RunOptions& o) {
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

inline Topology Uniform(int P, int D, int64_t batch) {
  Topology t = *Topology::Uniform(P, D, batch);
  return t;
}

inline void ExpectClose(const std::vector<double>& a, const std::vector<double>& b, double rel) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], rel * std::abs(b[i])) << "step " << i + 1;
  }
}

}  // namespace thread_ranks
}  // namespace varuna
