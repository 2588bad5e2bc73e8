// The commit with ranks as threads (tests/worker/engine/thread_ranks.h; Note [Committed step] in
// worker/engine/varuna.cc): a rank that missed a step's agreement reaches that step bit for bit
// without any copy of the state, in place (Note [Roll forward] in worker/engine/regroup.cc) and
// through a rescue and a resume (Note [Rolled rescue] in common/checkpoint/checkpoint_store.cc).

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_store.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine/thread_ranks.h"
#include "worker/dist/thread_process_group.h"
#include "worker/engine/fused_adamw.h"
#include "worker/engine/varuna.h"
#include "worker/models/registry.h"
#include "worker/models/tensor_parallel.h"

namespace varuna {
namespace {

using thread_ranks::Batch;
using thread_ranks::GptSpec;
using thread_ranks::RunOptions;
using thread_ranks::TestRate;
using thread_ranks::Train;
using thread_ranks::Uniform;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

// Note [Roll forward] (worker/engine/regroup.cc): rank 1 posts step 3's agreement and acts as
// if it never completed (a split) while ranks 0, 2, 3 apply step 3. With the agreed vector of
// rank 3 (its stage's replica) it applies step 3 itself and holds bit for bit what it would
// have after an unbroken step 3: the commit needs no copy of the state.
TEST(CommitTest, ARankThatMissedTheAgreementRollsForwardBitForBit) {
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
TEST(CommitTest, ARescueBehindTheAgreementRollsForwardAtResumeBitForBit) {
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
    EXPECT_EQ(behind.rescued_pending(), 3);  // its layers with step 3's gradients
    EXPECT_FALSE(VerifyCheckpoint(CheckpointPath(dir, 3)).ok()) << "nobody's update yet";
    {
      const auto v = ahead.Rescue(dir);
      ASSERT_THAT(v.status(), IsOk());
      EXPECT_EQ(*v, 3);
    }
    EXPECT_EQ(ahead.rescued_pending(), 0);
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

}  // namespace
}  // namespace varuna
