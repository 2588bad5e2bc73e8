// The commit protocol's fault matrix with ranks as threads (Note [Faults] in
// worker/engine/fault.cc, Note [Committed step] in worker/engine/varuna.cc). A 2 x 2 job is
// interrupted at every point of step 4 by a kill, a freeze or a split of one rank, of a whole
// stage, or of a rank in its rescue or its periodic checkpoint; then each morph path must lose
// at most the step in flight and train on bit for bit as an unbroken run:
// - relaunch: every survivor rescues (Note [Rescue] in worker/engine/checkpoint.cc) and a fresh
//   job resumes from the newest complete checkpoint;
// - in place: the survivors and a joiner in each lost rank's place form a new world and
//   HandOver (worker/engine/regroup.h) agrees the step and moves the layers.
// A kill here closes the rank's "sockets" at once (ThreadWorld::Kill); a freeze stops the rank
// where it is, holding what it holds, until every other rank is done, and the survivors' waits
// are aborted a moment later, as the manager does once the agent reports the rank frozen (no
// cell depends on a timeout). Each cell takes well under a second; one real process cell per
// path stays in tests/e2e/commit_e2e.py.
// VARUNA_TEST_DEVICE=cuda runs the same matrix with every rank's state on the GPU (ctest
// gpu_fault_matrix, the device check's matrix phase: the rescue's side-stream copies, the
// rolled rescue's gradients and the in-place hand-over on CUDA tensors); without a GPU it
// reports itself skipped. On a GPU the runs are compared within 1e-4 relative instead of bit
// for bit: some CUDA backward kernels (embedding, attention) add with atomics, in no fixed
// order.

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_store.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/tiny_gpt.h"
#include "worker/dist/thread_process_group.h"
#include "worker/engine/fault.h"
#include "worker/engine/regroup.h"
#include "worker/engine/varuna.h"
#include "worker/models/registry.h"

namespace varuna {
namespace {

using ::varuna::testing::IsOk;
namespace fs = std::filesystem;

// VARUNA_TEST_DEVICE: "cpu" (unset) or "cuda"; anything else is refused by the fixture.
std::string DeviceName() {
  const char* d = std::getenv("VARUNA_TEST_DEVICE");
  return d == nullptr || *d == 0 ? "cpu" : d;
}
torch::Device TestDevice() {
  return DeviceName() == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
}

constexpr int kWorld = 4;  // 2 stages x 2 replicas: ranks 1 and 3 hold stage 1
constexpr int64_t kSteps = 6;
constexpr int64_t kFaultStep = 4;
constexpr auto kTimeout = std::chrono::milliseconds(30000);  // no cell waits for it
// From a freeze to the survivors' abort: the agent's report and the manager's reconfigure.
constexpr auto kFrozenNoticed = std::chrono::milliseconds(200);

struct RankGone {};  // a kill's actor throws it: the rank's thread ends there

Topology Shape() { return *Topology::Uniform(2, 2, 8); }

// Every step's global batch and the engines' dummy batch, drawn once on the main thread (the
// generator is global: rank threads must not draw).
const std::vector<TensorMap>& Batches() {
  static const std::vector<TensorMap>* const kBatches = [] {
    auto* b = new std::vector<TensorMap>;
    b->push_back(testing::TinyBatch(99, 2));
    for (int64_t s = 1; s <= kSteps; ++s) b->push_back(testing::TinyBatch(s, 8));
    return b;
  }();
  return *kBatches;
}

absl::StatusOr<std::unique_ptr<Varuna>> Build(ProcessGroupFactory& factory, int rank,
                                              std::chrono::milliseconds timeout,
                                              FaultInjector faults,
                                              c10::intrusive_ptr<c10d::Store> store = {}) {
  const Topology t = Shape();
  ASSIGN_OR_RETURN(Model probe, BuildModel(testing::TinyGptSpec()));
  ASSIGN_OR_RETURN(ProcessGroups groups,
                   CreateGroups(factory, t, rank, !probe.tied().empty(), timeout));
  groups.store = std::move(store);  // a hand-over's rendezvous (thread groups have none)
  ASSIGN_OR_RETURN(Model model, BuildModel(testing::TinyGptSpec()));
  VarunaOptions opts;
  opts.seed = 5;
  opts.clip_grad_norm = 1.0;
  opts.faults = std::move(faults);
  ASSIGN_OR_RETURN(std::unique_ptr<Varuna> engine,
                   Varuna::Create(std::move(model), t, rank, std::move(groups), Batches()[0], 2,
                                  TestDevice(), opts));
  engine->set_optimizer(std::make_shared<torch::optim::AdamW>(
      engine->view().parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0)));
  return engine;
}

absl::StatusOr<StepResult> Step(Varuna& engine, int rank, int64_t step) {
  const Topology& t = engine.view().topology();
  const int k = t.PipelineOf(rank);
  return engine.step(
      testing::SliceBatch(Batches()[step], t.SampleOffset(k), t.pipeline(k).samples));
}

using Params = std::vector<std::pair<std::string, torch::Tensor>>;

Params ParamsOf(Varuna& engine) {
  Params out;
  for (auto& [name, p] : engine.view().named_parameters()) {
    out.emplace_back(name, p.detach().clone());
  }
  return out;
}

// How a job ends: every step's loss (0 for a step this run did not take) and each rank's
// parameters after the last step.
struct Outcome {
  std::vector<double> losses = std::vector<double>(kSteps + 1, 0.0);
  std::vector<Params> params = std::vector<Params>(kWorld);
  std::vector<absl::Status> status = std::vector<absl::Status>(kWorld);
};

// Trains every rank from `first` to kSteps; `start(rank, engine)` brings each engine to the
// step before `first` (Load, HandOver) and returns that step.
template <typename Start>
Outcome TrainOn(Start start) {
  Batches();
  auto world = std::make_shared<ThreadWorld>();
  auto store = c10::make_intrusive<c10d::HashStore>();
  Outcome out;
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      ThreadFactory factory(world);
      absl::Status& st = out.status[r];
      auto engine = Build(factory, r, kTimeout, FaultInjector(), store);
      if (!engine.ok()) {
        st = engine.status();
        return;
      }
      absl::StatusOr<int64_t> from = start(r, **engine);
      if (!from.ok()) {
        st = from.status();
        return;
      }
      for (int64_t s = *from + 1; s <= kSteps; ++s) {
        auto res = Step(**engine, r, s);
        if (!res.ok()) {
          st = res.status();
          return;
        }
        if (r == 0) out.losses[s] = res->loss;
      }
      out.params[r] = ParamsOf(**engine);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

const Outcome& Unbroken() {
  static const Outcome* const kOutcome =
      new Outcome(TrainOn([](int, Varuna&) -> absl::StatusOr<int64_t> { return 0; }));
  return *kOutcome;
}

enum class Path { kRelaunch, kInPlace };

struct Cell {
  std::string name;
  std::string faults;       // VARUNA_FAULT's text
  bool every_step = false;  // a periodic checkpoint after every step (a stage can be lost whole)
  // The step the next generation continues after, relative to the faulted one: -1 when no
  // survivor of some stage applied it (it was in flight), 0 when one of each stage did.
  int resumes = -1;
};

void PrintTo(const Cell& c, std::ostream* os) { *os << c.name << " (" << c.faults << ")"; }
void PrintTo(Path p, std::ostream* os) { *os << (p == Path::kRelaunch ? "relaunch" : "in place"); }

// A rank of the interrupted generation.
struct Survivor {
  std::unique_ptr<Varuna> engine;  // null once gone
  absl::Status status;             // the failed step's, or OK
  int64_t last = 0;                // the last step it completed
  int64_t rescued = -1;            // relaunch: the step its rescue wrote
};

// Generation 1: trains with `cell`'s faults until a step fails; on the relaunch path every
// rank whose step failed rescues into `dir`.
std::vector<Survivor> Interrupt(const Cell& cell, Path path, const std::string& dir) {
  absl::StatusOr<std::vector<Fault>> faults = ParseFaults(cell.faults);
  EXPECT_THAT(faults, IsOk());
  if (!faults.ok()) return {};
  Batches();
  auto world = std::make_shared<ThreadWorld>();
  std::mutex mu;
  std::condition_variable cv;
  int running = kWorld;  // guarded by mu: ranks neither done nor frozen
  auto done = [&](bool* counted) {
    std::lock_guard<std::mutex> l(mu);
    if (!*counted) --running;
    *counted = true;
    cv.notify_all();
  };
  std::vector<Survivor> out(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      bool counted = false;
      Survivor& me = out[r];
      FaultInjector injector(*faults, r, 1);
      injector.set_actor([&](const Fault& f) {
        if (f.action == FaultAction::kFreeze) {  // stopped until every other rank is done
          done(&counted);
          std::this_thread::sleep_for(kFrozenNoticed);
          world->Kill();
          std::unique_lock<std::mutex> l(mu);
          cv.wait_for(l, std::chrono::seconds(60), [&] { return running == 0; });
          throw RankGone{};
        }
        world->Kill();
        throw RankGone{};
      });
      ThreadFactory factory(world);
      try {
        auto engine = Build(factory, r, kTimeout, std::move(injector));
        if (!engine.ok()) {
          me.status = engine.status();
          done(&counted);
          return;
        }
        for (int64_t s = 1; s <= kSteps && me.status.ok(); ++s) {
          absl::StatusOr<StepResult> res = Step(**engine, r, s);
          if (!res.ok()) {
            // The manager aborts every rank's waits at once (SIGUSR2, a reconfigure).
            me.status = res.status();
            world->Kill();
            break;
          }
          me.last = s;
          if (cell.every_step) me.status = (*engine)->checkpoints().Save(dir);
        }
        if (!me.status.ok() && path == Path::kRelaunch) {
          absl::StatusOr<int64_t> saved = (*engine)->checkpoints().Rescue(dir);
          EXPECT_THAT(saved, IsOk()) << "rank " << r;
          me.rescued = saved.value_or(-1);
        }
        me.engine = *std::move(engine);
      } catch (const RankGone&) {
        me.engine.reset();
      }
      done(&counted);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

void ExpectSameAsUnbroken(const Outcome& got, int64_t from) {
  const Outcome& want = Unbroken();
  for (int r = 0; r < kWorld; ++r) ASSERT_THAT(got.status[r], IsOk()) << "rank " << r;
  const bool exact = TestDevice().is_cpu();  // see the top of the file
  for (int64_t s = from + 1; s <= kSteps; ++s) {
    if (exact) {
      EXPECT_EQ(got.losses[s], want.losses[s]) << "step " << s;
    } else {
      EXPECT_NEAR(got.losses[s], want.losses[s], 1e-4 * std::abs(want.losses[s])) << "step " << s;
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(got.params[r].size(), want.params[r].size());
    for (size_t i = 0; i < got.params[r].size(); ++i) {
      const torch::Tensor& a = got.params[r][i].second;
      const torch::Tensor& b = want.params[r][i].second;
      EXPECT_TRUE(exact ? torch::equal(a, b) : torch::allclose(a, b, 1e-4, 1e-6))
          << "rank " << r << " " << got.params[r][i].first << " differs from the unbroken run's"
          << " by up to " << (a - b).abs().max().item<double>();
    }
  }
}

class FaultMatrixTest : public ::testing::TestWithParam<std::tuple<Path, Cell>> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(DeviceName() == "cpu" || DeviceName() == "cuda")
        << "VARUNA_TEST_DEVICE must be cpu or cuda, not '" << DeviceName() << "'";
    if (DeviceName() == "cuda" && !torch::cuda::is_available()) {
      GTEST_SKIP() << "VARUNA_TEST_DEVICE=cuda but no CUDA device is visible";
    }
    std::string tmpl = ::testing::TempDir() + "/fault_matrix_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_P(FaultMatrixTest, LosesAtMostTheStepInFlightAndTrainsOnBitForBit) {
  const auto& [path, cell] = GetParam();
  Unbroken();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Survivor> gen1 = Interrupt(cell, path, dir_);
  ASSERT_EQ(gen1.size(), static_cast<size_t>(kWorld));
  int lost = 0;
  for (int r = 0; r < kWorld; ++r) {
    if (gen1[r].engine == nullptr) {
      ++lost;
      continue;
    }
    // Every survivor's step failed (nobody finished the run around a lost peer), none hung.
    EXPECT_FALSE(gen1[r].status.ok()) << "rank " << r;
    EXPECT_GE(gen1[r].last, kFaultStep - 1) << "rank " << r;
    // A rescue writes the newest step the rank applied (and, pending, its next step's layers).
    if (path == Path::kRelaunch) EXPECT_EQ(gen1[r].rescued, gen1[r].last) << "rank " << r;
  }
  const bool takes_a_rank =
      absl::StrContains(cell.faults, "kill") || absl::StrContains(cell.faults, "freeze");
  EXPECT_EQ(lost > 0, takes_a_rank) << cell.faults;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);

  int64_t resumed = -1;
  Outcome got;
  if (path == Path::kRelaunch) {
    absl::StatusOr<std::optional<int64_t>> step = ResolveResumeStep(dir_, std::nullopt);
    ASSERT_THAT(step, IsOk());
    ASSERT_TRUE(step->has_value()) << "no checkpoint at all";
    resumed = **step;
    ASSERT_THAT(VerifyCheckpoint(CheckpointPath(dir_, resumed)), IsOk());
    got = TrainOn(
        [&](int, Varuna& e) { return e.checkpoints().Load(CheckpointPath(dir_, resumed)); });
  } else {
    std::mutex mu;
    std::set<int64_t> steps;
    got = TrainOn([&](int r, Varuna& e) -> absl::StatusOr<int64_t> {
      ASSIGN_OR_RETURN(HandoverStats h, HandOver(gen1[r].engine.get(), e, e.view().groups(), r,
                                                 cell.every_step ? dir_ : ""));
      std::lock_guard<std::mutex> l(mu);
      steps.insert(h.step);
      return h.step;
    });
    for (int r = 0; r < kWorld; ++r) ASSERT_THAT(got.status[r], IsOk()) << "rank " << r;
    ASSERT_EQ(steps.size(), 1u) << "the ranks continue after different steps";
    resumed = *steps.begin();
  }
  // At most the step in flight is lost, and only when it was in flight.
  EXPECT_GE(resumed, kFaultStep - 1);
  EXPECT_LE(resumed, kFaultStep);
  EXPECT_EQ(resumed, kFaultStep + cell.resumes);
  ExpectSameAsUnbroken(got, resumed);
}

std::vector<Cell> Cells(Path path) {
  std::vector<Cell> cells;
  const std::string f = absl::StrCat(kFaultStep);
  for (const char* point : {"forward", "pipeline", "backward", "dp_allreduce", "agreement",
                            "after_agreement", "update"}) {
    // Past its agreement the step is applied by every survivor.
    const bool agreed = std::string(point) == "after_agreement" || std::string(point) == "update";
    for (const char* action : {"kill", "freeze"}) {
      cells.push_back({absl::StrCat(point, "_", action), absl::StrCat(point, "@", f, ":1:", action),
                       false, agreed ? 0 : -1});
    }
    // Both replicas of stage 1 at once: only the periodic checkpoint holds it.
    cells.push_back({absl::StrCat(point, "_kill_stage_lost"),
                     absl::StrCat(point, "@", f, ":1:kill,", point, "@", f, ":3:kill"), true, -1});
  }
  // Rank 1 misses the step its replica (rank 3) applies.
  cells.push_back({"agreement_split", absl::StrCat("agreement@", f, ":1:split"), false, 0});
  // morph_link_cut's failure: stage 1's only survivor is the rank that missed the step. In
  // place it rolls forward with rank 0's vector (Note [Roll forward] in regroup.cc); on the
  // relaunch path its rescue writes its layers with the step's gradients into the step's
  // checkpoint, rank 0's records the step's update, and the loader rolls them forward (Note
  // [Rolled rescue] in common/checkpoint/checkpoint_store.cc).
  cells.push_back({"agreement_split_replicas_lost",
                   absl::StrCat("agreement@", f, ":1:split,after_agreement@", f,
                                ":2:kill,after_agreement@", f, ":3:kill"),
                   false, 0});
  // The periodic checkpoint of the faulted step is left half written; the survivors hold it.
  cells.push_back(
      {"checkpoint_write_kill", absl::StrCat("checkpoint_write@", f, ":0:kill"), true, 0});
  if (path == Path::kRelaunch) {
    // Rank 3 dies in the update; rank 1, the other holder of stage 1, then fails in its
    // rescue: the periodic checkpoint rank 1 wrote after the step holds stage 1.
    for (const char* action : {"kill", "freeze"}) {
      cells.push_back({absl::StrCat("rescue_save_", action),
                       absl::StrCat("update@", f, ":3:kill,rescue_save@", f, ":1:", action), true,
                       0});
    }
  }
  return cells;
}

std::vector<std::tuple<Path, Cell>> AllCells() {
  std::vector<std::tuple<Path, Cell>> out;
  for (Path p : {Path::kRelaunch, Path::kInPlace}) {
    for (Cell& c : Cells(p)) out.emplace_back(p, std::move(c));
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryPoint, FaultMatrixTest, ::testing::ValuesIn(AllCells()),
                         [](const ::testing::TestParamInfo<std::tuple<Path, Cell>>& info) {
                           return absl::StrCat(std::get<0>(info.param) == Path::kRelaunch
                                                   ? "Relaunch_"
                                                   : "InPlace_",
                                               std::get<1>(info.param).name);
                         });

}  // namespace
}  // namespace varuna
