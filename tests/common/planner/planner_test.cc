// The planner library: simulator (hand-computed cases), profiles, AutoConfig.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <limits>
#include <set>

#include "common/pipeline/partition.h"
#include "common/pipeline/topology.h"
#include "common/planner/autoconfig.h"
#include "common/planner/hetero_plan.h"
#include "common/planner/profile.h"
#include "common/planner/simulator.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using ::varuna::testing::StatusIs;

SimInput Equal(SchedulePolicy policy, int P, int M, double f, double b) {
  SimInput in;
  in.policy = policy;
  in.micro_batches = M;
  SimStage s;
  s.forward_s = s.forward_nograd_s = s.recompute_s = f;
  s.backward_s = b;
  in.stages.assign(P, s);
  in.record_order = true;
  return in;
}

TEST(SimulatorTest, OneStageIsSerial) {
  for (auto policy : {SchedulePolicy::kVaruna, SchedulePolicy::kGPipe, SchedulePolicy::k1F1B}) {
    SimInput in = Equal(policy, 1, 4, 1.0, 2.0);
    in.stages[0].allreduce_s = 0.5;
    in.stages[0].optimizer_s = 0.25;
    in.step_overhead_s = 0.125;
    in.sync_s = 100;  // only with 2+ stages
    const SimResult r = SimulateStep(in);
    EXPECT_DOUBLE_EQ(r.pipeline_s, 12.0);
    EXPECT_DOUBLE_EQ(r.step_s, 12.0 + 0.5 + 0.25 + 0.125);
    EXPECT_DOUBLE_EQ(r.bubble, 0.0);
  }
}

// Equal stages, free transfers, backward = 2 x forward: GPipe and 1F1B take (M+P-1)(f+b) and
// idle (P-1)/(M+P-1) of it.
TEST(SimulatorTest, GPipeAnd1F1BBubbleIsClassic) {
  for (auto policy : {SchedulePolicy::kGPipe, SchedulePolicy::k1F1B}) {
    for (int P : {2, 3, 4, 8}) {
      for (int M : {1, 2, 5, 8, 16}) {
        const SimResult r = SimulateStep(Equal(policy, P, M, 1.0, 2.0));
        SCOPED_TRACE(absl::StrCat(SchedulePolicyName(policy), " P=", P, " M=", M));
        EXPECT_DOUBLE_EQ(r.pipeline_s, 3.0 * (M + P - 1));
        EXPECT_NEAR(r.bubble, (P - 1.0) / (M + P - 1.0), 1e-12);
      }
    }
  }
}

// Varuna: non-last stages forward without the graph, recompute, then backward. With P=2, M=1
// the recompute of stage 0 overlaps stage 1's forward + backward: no cost. With P=2, M=4
// stage 0 does 4 x (1 + 1 + 2) = 16 of work and never idles: F0-F3 [0,4] (the forwards
// overtake R0 while stage 1 still owes the gradient), R0 [4,5], B0 [5,7] (gradient at 4),
// R1 [7,8], B1 [8,10] (at 7), R2, B2 [10,13] (at 10), R3, B3 [13,16] (at 13). 1F1B has no
// recompute: 15.
TEST(SimulatorTest, VarunaRecomputeCost) {
  {
    const SimResult r = SimulateStep(Equal(SchedulePolicy::kVaruna, 2, 1, 1.0, 2.0));
    EXPECT_DOUBLE_EQ(r.pipeline_s, 6.0);  // same as 1F1B: F0 | F0 B0 | B0
    EXPECT_EQ(FormatSchedule(r.executed[0]), "F0 R0 B0");
  }
  {
    const SimResult r = SimulateStep(Equal(SchedulePolicy::kVaruna, 2, 4, 1.0, 2.0));
    EXPECT_DOUBLE_EQ(r.busy_s[0], 16.0);
    EXPECT_DOUBLE_EQ(r.busy_s[1], 12.0);
    EXPECT_DOUBLE_EQ(r.pipeline_s, 16.0)
        << FormatSchedule(r.executed[0]) << " | " << FormatSchedule(r.executed[1]);
    EXPECT_DOUBLE_EQ(SimulateStep(Equal(SchedulePolicy::k1F1B, 2, 4, 1.0, 2.0)).pipeline_s, 15.0);
  }
}

// The simulator runs MakeSchedule's lists; without run-time reordering (gpipe, 1f1b, or
// varuna when every gradient is already there) it executes them verbatim, and with it it
// makes exactly the engine's YieldRecompute swaps.
TEST(SimulatorTest, ExecutesTheEnginesTaskLists) {
  for (auto policy : {SchedulePolicy::kGPipe, SchedulePolicy::k1F1B, SchedulePolicy::kVaruna,
                      SchedulePolicy::kZbH1}) {
    for (int P : {1, 2, 3, 5}) {
      for (int M : {1, 3, 8}) {
        SimInput in = Equal(policy, P, M, 1.0, 2.0);
        const SimResult r = SimulateStep(in);
        for (int s = 0; s < P; ++s) {
          std::vector<Task> want = MakeSchedule(policy, P, M, s);
          SCOPED_TRACE(absl::StrCat(SchedulePolicyName(policy), " P=", P, " M=", M, " s=", s));
          if (policy != SchedulePolicy::kVaruna) {
            EXPECT_EQ(r.executed[s], want);
          } else {
            // Same multiset, forwards and backwards each in micro-batch order.
            ASSERT_EQ(r.executed[s].size(), want.size());
            int f = 0, b = 0;
            for (const Task& t : r.executed[s]) {
              if (t.kind == TaskKind::kForward) EXPECT_EQ(t.micro_batch, f++);
              if (t.kind == TaskKind::kBackward) EXPECT_EQ(t.micro_batch, b++);
            }
          }
        }
      }
    }
  }
}

// ZB-H1 with F = B = W = 1 (backward 2, of which weights 1) and M >= P: each stage idles
// P - 1 units where 1F1B idles (P - 1)(F + B + W) = 3(P - 1) (Note [Schedules]).
TEST(SimulatorTest, ZbH1BubbleIsAThirdOf1F1B) {
  for (int P : {2, 3, 4, 6}) {
    for (int M : {P, 8, 16}) {
      SimInput in = Equal(SchedulePolicy::kZbH1, P, M, 1.0, 2.0);
      for (auto& s : in.stages) s.weight_s = 1.0;
      const SimResult zb = SimulateStep(in);
      const SimResult ofob = SimulateStep(Equal(SchedulePolicy::k1F1B, P, M, 1.0, 2.0));
      SCOPED_TRACE(absl::StrCat("P=", P, " M=", M, ": ", FormatSchedule(zb.executed[0])));
      EXPECT_DOUBLE_EQ(ofob.pipeline_s, 3.0 * (M + P - 1));
      EXPECT_DOUBLE_EQ(zb.pipeline_s, 3.0 * M + P - 1);
      for (int s = 0; s < P; ++s) EXPECT_DOUBLE_EQ(zb.busy_s[s], 3.0 * M);
    }
  }
}

TEST(SimulatorTest, TransfersAndPostPipelinePhases) {
  // P=2, M=1, f=1, b=2, 0.5 per transfer: F0 [0,1] -> arrives 1.5, F0 [1.5,2.5], B0 [2.5,4.5]
  // -> arrives 5, B0 [5,7]. Tied all-reduce 1 after both finish (7 -> 8), data-parallel 0.5
  // and 0.25, sync 0.1, optimizer max 0.3.
  SimInput in = Equal(SchedulePolicy::k1F1B, 2, 1, 1.0, 2.0);
  in.stages[0].send_act_s = 0.5;
  in.stages[1].send_grad_s = 0.5;
  in.stages[0].allreduce_s = 0.5;
  in.stages[1].allreduce_s = 0.25;
  in.stages[0].optimizer_s = 0.3;
  in.stages[1].optimizer_s = 0.1;
  in.tied_allreduce_s = 1;
  in.sync_s = 0.1;
  const SimResult r = SimulateStep(in);
  EXPECT_DOUBLE_EQ(r.pipeline_s, 7.0);
  EXPECT_DOUBLE_EQ(r.step_s, 7.0 + 1.0 + 0.5 + 0.1 + 0.3);
}

TEST(SimulatorTest, MemoryCountsLiveGraphsAndStashes) {
  // GPipe keeps all M graphs on every stage; varuna's first stage stashes and holds one graph.
  SimInput in = Equal(SchedulePolicy::kGPipe, 2, 4, 1.0, 2.0);
  for (auto& s : in.stages) {
    s.static_bytes = 100;
    s.graph_bytes = 10;
    s.stash_bytes = 1;
  }
  EXPECT_DOUBLE_EQ(SimulateStep(in).peak_bytes[0], 140);
  in.policy = SchedulePolicy::kVaruna;
  const SimResult r = SimulateStep(in);
  EXPECT_LT(r.peak_bytes[0], 140);
  EXPECT_DOUBLE_EQ(r.peak_bytes[1], 100 + 10);  // the last stage alternates F B: one graph
}

JobSpec Gpt(int layers, int64_t global_batch) {
  JobSpec spec;
  spec.model.kind = "gpt";
  spec.model.layers = layers;
  spec.train.global_batch = global_batch;
  return spec;
}

TEST(ProfileTest, BuiltinRoundTripsThroughJson) {
  JobSpec spec = Gpt(4, 16);
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  EXPECT_EQ(p.segments_size(), 6);
  ASSERT_OK_AND_ASSIGN(v1::Profile back, ParseProfileJson(ProfileToJson(p)));
  EXPECT_EQ(back.SerializeAsString(), p.SerializeAsString());
  EXPECT_OK(CheckProfileFor(back, spec));
}

// llama and gpt2 have built-in cost models whose segments are named as the worker's profiler
// names them (its layers, comma-joined), so a measured profile and the built-in one agree.
TEST(ProfileTest, HuggingFaceKindsHaveCostModels) {
  JobSpec spec = Gpt(3, 16);
  spec.model.kind = "llama";
  spec.model.d_model = 64;
  spec.model.kv_heads = 2;
  spec.model.ffn = 96;
  spec.model.tie_embeddings = true;
  FillModelDefaults(&spec.model);
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  ASSERT_EQ(p.segments_size(), 5);
  EXPECT_EQ(p.segments(0).layers(), "model.embed_tokens");
  EXPECT_EQ(p.segments(4).layers(), "model.norm,lm_head");
  // q, o: d x d; k, v: d x 32; SwiGLU 3 x d x 96; two norms.
  EXPECT_DOUBLE_EQ(p.segments(1).param_bytes(),
                   4.0 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 96 + 2 * 64));
  EXPECT_GT(p.tied_bytes(), 0);
  EXPECT_OK(CheckProfileFor(p, spec));
  spec.model.kind = "gpt2";
  spec.model.ffn = 0;
  spec.model.max_positions = 0;
  FillModelDefaults(&spec.model);
  ASSERT_OK_AND_ASSIGN(p, BuiltinProfile(spec));
  EXPECT_EQ(p.segments(0).layers(), "transformer.wte,transformer.wpe");
  EXPECT_EQ(p.segments(4).layers(), "transformer.ln_f,lm_head");
  spec.model.kind = "bert";
  spec.model.ffn = 0;
  spec.model.max_positions = 0;
  spec.model.mask_token = 1;
  FillModelDefaults(&spec.model);
  ASSERT_OK_AND_ASSIGN(p, BuiltinProfile(spec));
  ASSERT_EQ(p.segments_size(), 5);
  EXPECT_EQ(p.segments(0).layers(), "bert.embeddings");
  EXPECT_EQ(p.segments(1).layers(), "bert.encoder.layer.0");
  EXPECT_EQ(p.segments(4).layers(), "cls.predictions");
  EXPECT_GT(p.tied_bytes(), 0);
  EXPECT_OK(CheckProfileFor(p, spec));
}

TEST(ProfileTest, DamagedAndForeignProfilesAreClearErrors) {
  JobSpec spec = Gpt(4, 16);
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  EXPECT_THAT(ParseProfileJson("{not json").status().message(), HasSubstr("not a valid profile"));
  EXPECT_THAT(ParseProfileJson("{\"version\": 1, \"bogus\": 2}").status().message(),
              HasSubstr("not a valid profile"));
  std::string truncated = ProfileToJson(p);
  truncated.resize(truncated.size() / 2);
  EXPECT_FALSE(ParseProfileJson(truncated).ok());

  v1::Profile bad = p;
  bad.mutable_segments(2)->mutable_costs(1)->set_backward_s(-1);
  EXPECT_THAT(ValidateProfile(bad).message(), HasSubstr("segments[2].costs[1].backward_s"));
  bad = p;
  bad.set_version(7);
  EXPECT_THAT(ValidateProfile(bad).message(), HasSubstr("version"));
  bad = p;
  bad.mutable_segments(1)->mutable_costs()->RemoveLast();
  EXPECT_THAT(ValidateProfile(bad).message(), HasSubstr("segments[1].costs"));

  JobSpec other = Gpt(8, 16);
  absl::Status st = CheckProfileFor(p, other);
  EXPECT_THAT(st.message(), HasSubstr("layers=4"));
  EXPECT_THAT(st.message(), HasSubstr("layers=8"));
  EXPECT_FALSE(PlanShapes(other, p, {{4}}).ok());
  other = spec;
  other.train.precision = "bf16";
  EXPECT_THAT(CheckProfileFor(p, other).message(), HasSubstr("bf16"));
}

TEST(AutoConfigTest, RanksEveryFeasibleShapeBestFirst) {
  JobSpec spec = Gpt(4, 16);
  spec.parallel.schedule = "auto";
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  PlanRequest every;  // every shape simulated (none only bounded: Note [Pruning])
  every.slots_per_node = {4, 2};
  every.simulate_within = std::numeric_limits<double>::infinity();
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, p, every));
  ASSERT_GT(set.plans_size(), 10);
  for (int i = 1; i < set.plans_size(); ++i) {
    EXPECT_LE(set.plans(i - 1).step_s(), set.plans(i).step_s());
  }
  bool saw_p5 = false;  // not a divisor of 6 segments nor of 6 slots
  for (const auto& plan : set.plans()) {
    EXPECT_EQ(plan.boundaries_size(), plan.stages() + 1);
    EXPECT_EQ(plan.peak_bytes_size(), plan.stages());
    EXPECT_EQ(16 % plan.replicas(), 0);
    EXPECT_EQ(16 / plan.replicas() % plan.micro_batch(), 0);
    EXPECT_LE(plan.slots(), 6);
    saw_p5 |= plan.stages() == 5;
  }
  EXPECT_TRUE(saw_p5);
  EXPECT_THAT(set.cost_source(), HasSubstr("built-in"));
  // The fixed fields are kept.
  spec.parallel.stages = 2;
  spec.parallel.schedule = "gpipe";
  ASSERT_OK_AND_ASSIGN(set, PlanShapes(spec, p, {{4, 2}}));
  for (const auto& plan : set.plans()) {
    EXPECT_EQ(plan.stages(), 2);
    EXPECT_EQ(plan.schedule(), "gpipe");
  }
}

TEST(AutoConfigTest, InfeasibleInputsSayWhy) {
  JobSpec spec = Gpt(4, 16);
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  spec.resources.min_slots = 8;
  EXPECT_THAT(PlanShapes(spec, p, {{2, 2}}).status().message(),
              HasSubstr("resources.min_slots = 8"));
  spec.resources.min_slots = 1;
  EXPECT_THAT(PlanShapes(spec, p, {{}}).status().message(), HasSubstr("no free slots"));
  // Tensor parallelism needs tp_size slots on one node (tests in tp_plan_test.cc).
  spec.parallel.tp_size = 2;
  EXPECT_THAT(PlanShapes(spec, p, {{1, 1}}).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "parallel.tp_size = 2 needs 2 free slots on one node"));
  spec.parallel.tp_size = 1;
  // A global batch no width divides (with a fixed width).
  spec.train.global_batch = 7;
  spec.parallel.replicas = 2;
  EXPECT_THAT(PlanShapes(spec, p, {{4}}).status().message(),
              HasSubstr("global_batch 7 is not divisible by 2 replicas"));
  // Memory: one slot of 1 MiB fits nothing; the reason is listed per shape.
  spec.parallel.replicas = 0;
  spec.train.global_batch = 16;
  PlanRequest tiny{{4}, 1 << 20, false};
  auto st = PlanShapes(spec, p, tiny).status();
  EXPECT_THAT(st.message(), HasSubstr("memory: stage 0 needs"));
  // --all lists rejected widths too.
  spec.train.global_batch = 6;
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, p, {{4}, 0, true}));
  bool saw = false;
  for (const auto& r : set.rejected())
    saw |= r.rejected().find("not divisible by 4") != std::string::npos;
  EXPECT_TRUE(saw);
}

// The planner's fast split reaches the exact dynamic program's bottleneck.
TEST(AutoConfigTest, StageBoundariesMatchTheExactBottleneck) {
  JobSpec spec = Gpt(30, 64);
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  uint64_t x = 12345;
  for (auto& seg : *p.mutable_segments()) {
    for (auto& c : *seg.mutable_costs()) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const double r = 0.5 + static_cast<double>(x >> 40) / (1 << 24);
      c.set_forward_s(c.forward_s() * r);
      c.set_backward_s(c.backward_s() * r);
    }
  }
  std::vector<double> costs;
  const int mb = p.micro_batches(p.micro_batches_size() - 1);
  for (const auto& seg : p.segments()) {
    const SegmentTimes t = CostAt(seg, mb);
    costs.push_back(t.forward_s + t.backward_s);
  }
  auto bottleneck = [&](const std::vector<int>& b) {
    double worst = 0;
    for (size_t s = 0; s + 1 < b.size(); ++s) {
      double sum = 0;
      for (int g = b[s]; g < b[s + 1]; ++g) sum += costs[g];
      worst = std::max(worst, sum);
    }
    return worst;
  };
  for (int P = 1; P <= 32; ++P) {
    ASSERT_OK_AND_ASSIGN(std::vector<int> fast, StageBoundaries(p, P));
    ASSERT_OK_AND_ASSIGN(std::vector<int> exact, PartitionByCost(costs, P));
    ASSERT_EQ(fast.size(), static_cast<size_t>(P + 1));
    for (size_t i = 1; i < fast.size(); ++i) EXPECT_LT(fast[i - 1], fast[i]);
    EXPECT_NEAR(bottleneck(fast), bottleneck(exact), 1e-9 * bottleneck(exact)) << "P=" << P;
  }
  EXPECT_FALSE(StageBoundaries(p, 33).ok());
}

// Permanent problems are errors (InvalidArgument), not a wait; the engine's smaller last
// micro-batch is accepted; steps too long to simulate are rejected with the reason.
TEST(AutoConfigTest, PermanentProblemsAndLongSteps) {
  JobSpec spec = Gpt(4, 16);
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  spec.parallel.stages = 7;
  EXPECT_EQ(PlanShapes(spec, p, {{8}}).status().code(), absl::StatusCode::kInvalidArgument);
  spec.parallel.stages = 0;
  spec.parallel.micro_batch = 3;  // does not divide 16: the last micro-batch has 1
  spec.parallel.replicas = 1;
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, p, {{2}}));
  EXPECT_EQ(set.plans(0).micro_batch(), 3);
  // The widest width fails only on micro-batches: a narrower one is still tried.
  spec.parallel.replicas = 0;
  spec.parallel.micro_batch = 4;
  spec.train.global_batch = 12;
  spec.parallel.stages = 1;
  ASSERT_OK_AND_ASSIGN(set, PlanShapes(spec, p, {{6}}));
  EXPECT_EQ(set.plans(0).replicas(), 3);
  spec = Gpt(4, 1 << 20);
  spec.parallel.micro_batch = 1;
  spec.parallel.stages = 2;
  EXPECT_THAT(PlanShapes(spec, p, {{2}}).status().message(), HasSubstr("micro-batches per step"));
}

// Oobleck's unit case: layers costing 1..6 into 2 stages cut after the fourth (10 vs 11).
TEST(HeteroPlanTest, TemplateDpOobleckExample) {
  const std::vector<double> costs = {1, 2, 3, 4, 5, 6};
  const auto templates = PipelineTemplates(costs, costs, 6);
  ASSERT_EQ(templates.size(), 6u);
  EXPECT_EQ(templates[0], (std::vector<int>{0, 6}));
  EXPECT_EQ(templates[1], (std::vector<int>{0, 4, 6}));
  EXPECT_EQ(templates[5], (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(PipelineTemplates(costs, costs, 2).size(), 2u);
}

// Against every cut: the same (bottleneck, total) for every depth, the last stage costed with
// its own per-segment work.
TEST(HeteroPlanTest, TemplateDpMatchesBruteForce) {
  uint64_t x = 99;
  auto next = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return 0.1 + static_cast<double>(x >> 40) / (1 << 24);
  };
  for (int round = 0; round < 20; ++round) {
    const int S = 2 + round % 8;
    std::vector<double> work(S), last(S);
    for (int g = 0; g < S; ++g) {
      last[g] = next();
      work[g] = last[g] + (round % 2 ? next() : 0);  // recompute on non-last stages
    }
    auto score = [&](const std::vector<int>& b) {
      double worst = 0, total = 0;
      const int n = static_cast<int>(b.size()) - 1;
      for (int s = 0; s < n; ++s) {
        double w = 0;
        for (int g = b[s]; g < b[s + 1]; ++g) w += s == n - 1 ? last[g] : work[g];
        worst = std::max(worst, w);
        total += w;
      }
      return std::make_pair(worst, total);
    };
    const auto templates = PipelineTemplates(work, last, S);
    ASSERT_EQ(static_cast<int>(templates.size()), S);
    for (int n = 1; n <= S; ++n) {
      // Every cut: a bitmask of the S-1 places between segments with n-1 set.
      std::pair<double, double> best{std::numeric_limits<double>::infinity(), 0};
      for (int mask = 0; mask < (1 << (S - 1)); ++mask) {
        if (__builtin_popcount(mask) != n - 1) continue;
        std::vector<int> b = {0};
        for (int i = 0; i < S - 1; ++i) {
          if (mask & (1 << i)) b.push_back(i + 1);
        }
        b.push_back(S);
        const auto sc = score(b);
        if (sc.first < best.first - 1e-12 ||
            (std::abs(sc.first - best.first) <= 1e-12 && sc.second < best.second)) {
          best = sc;
        }
      }
      const std::vector<int>& got = templates[n - 1];
      SCOPED_TRACE(absl::StrCat("round ", round, " n=", n));
      ASSERT_EQ(static_cast<int>(got.size()), n + 1);
      for (int i = 1; i <= n; ++i) EXPECT_LT(got[i - 1], got[i]);
      EXPECT_NEAR(score(got).first, best.first, 1e-9);
      EXPECT_NEAR(score(got).second, best.second, 1e-9);
    }
  }
}

TEST(HeteroPlanTest, MixesUseExactlyTheSlots) {
  for (auto [slots, want] : {std::pair<int, int>{5, 5}, {7, 13}, {3, 1}, {2, 0}}) {
    std::vector<int> depths;
    for (int d = 1; d <= slots; ++d) depths.push_back(d);
    std::set<std::vector<std::pair<int, int>>> seen;
    EnumerateMixes(depths, slots, {}, nullptr, [&](const Mix& mix) {
      int sum = 0;
      std::vector<std::pair<int, int>> key;
      for (size_t i = 0; i < mix.size(); ++i) {
        sum += mix[i].stages * mix[i].count;
        EXPECT_GE(mix[i].count, 1);
        if (i > 0) EXPECT_GT(mix[i - 1].stages, mix[i].stages);
        key.emplace_back(mix[i].stages, mix[i].count);
      }
      EXPECT_EQ(sum, slots);
      EXPECT_GE(mix.size(), 2u);  // never one depth: that is the P x D shape
      EXPECT_TRUE(seen.insert(key).second);
      return true;
    });
    EXPECT_EQ(static_cast<int>(seen.size()), want) << slots << " slots";
  }
  // The caps: two distinct depths at most; at most 3 pipelines (7 = 4+3, 5+1+1, 3+3+1, ...).
  MixLimits two;
  two.max_distinct = 2;
  int n = 0;
  EnumerateMixes({1, 2, 3, 4, 5, 6, 7}, 7, two, nullptr, [&](const Mix&) { return ++n, true; });
  EXPECT_EQ(n, 11);
  MixLimits three_pipes;
  three_pipes.max_pipelines = 3;
  n = 0;
  EnumerateMixes({1, 2, 3, 4, 5, 6, 7}, 7, three_pipes, nullptr, [&](const Mix& mix) {
    int pipes = 0;
    for (const MixPart& p : mix) pipes += p.count;
    EXPECT_LE(pipes, 3);
    return ++n, true;
  });
  EXPECT_EQ(n, 7);  // 6+1, 5+2, 5+1+1, 4+3, 4+2+1, 3+3+1, 3+2+2
}

// Identical pipelines get the same count, the counts add up, and the pipelines finish within
// one micro-batch of each other.
TEST(HeteroPlanTest, SplitBatchEvensOutThePipelines) {
  const Mix mix = {{4, 1}, {3, 2}};
  const std::vector<LinearTime> lines = {{0.9, 0.25}, {0.6, 0.33}};
  for (int64_t B : {3, 5, 16, 17, 100, 1001}) {
    const std::vector<int64_t> b = SplitBatch(mix, lines, B);
    ASSERT_EQ(b.size(), 2u) << B;
    EXPECT_EQ(b[0] + 2 * b[1], B);
    EXPECT_GE(b[0], 1);
    EXPECT_GE(b[1], 1);
    if (B >= 16) {
      EXPECT_LE(std::abs(lines[0].At(b[0]) - lines[1].At(b[1])), 0.33 * 2 + 1e-9) << B;
    }
    const double z = WaterLevel(mix, lines, B);
    EXPECT_GE(std::max(lines[0].At(b[0]), lines[1].At(b[1])), z - 1e-9);
  }
  EXPECT_TRUE(SplitBatch(mix, lines, 2).empty());  // three pipelines, two micro-batches
  // 2 x b0 + 2 x b1 cannot add up to an odd count.
  EXPECT_TRUE(SplitBatch({{2, 2}, {1, 2}}, {{1, 1}, {0, 1}}, 9).empty());
}

// A profile whose segments all cost the same (1 ms forward, 2 ms backward per sample) and
// whose communication is nearly free.
v1::Profile Balanced(const JobSpec& spec) {
  v1::Profile p = *BuiltinProfile(spec);
  for (auto& seg : *p.mutable_segments()) {
    seg.set_param_bytes(1000);
    seg.set_optimizer_s(1e-5);
    for (auto& c : *seg.mutable_costs()) {
      const double mb = c.micro_batch();
      c.set_forward_s(1e-3 * mb);
      c.set_forward_nograd_s(1e-3 * mb);
      c.set_recompute_s(1e-3 * mb);
      c.set_backward_s(2e-3 * mb);
      c.set_activation_bytes(100 * mb);
      c.set_graph_bytes(1000 * mb);
      c.set_peak_bytes(2000 * mb);
    }
  }
  p.set_tied_bytes(0);
  p.set_step_overhead_s(0);
  return p;
}

// 7 slots, 12 equal segments, 16 micro-batches: 4+3 (or 2+2+2+1, ...) pipelines finish in
// 36 + 8 x 9 = 108 ms where 3x2 on 6 slots takes 36 + 7 x 12 = 120 and 7x1 36 + 15 x 6 = 126.
TEST(AutoConfigTest, HeterogeneousPlanUsesEverySlot) {
  JobSpec spec = Gpt(10, 16);
  spec.parallel.schedule = "1f1b";
  spec.parallel.micro_batch = 1;
  const v1::Profile p = Balanced(spec);
  PlanRequest req{{7}};
  ASSERT_OK_AND_ASSIGN(v1::PlanSet homogeneous, PlanShapes(spec, p, req));
  for (const auto& plan : homogeneous.plans()) EXPECT_FALSE(plan.heterogeneous());
  EXPECT_NEAR(homogeneous.plans(0).step_s(), 0.120, 0.002);
  req.heterogeneous = true;
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, p, req));
  const v1::Plan& best = set.plans(0);
  ASSERT_TRUE(best.heterogeneous()) << best.DebugString();
  EXPECT_EQ(best.slots(), 7);
  EXPECT_NEAR(best.step_s(), 0.108, 0.002);
  EXPECT_LT(best.step_s(), homogeneous.plans(0).step_s());
  // The topology is what the engine reads: 7 ranks, 16 samples, the plan's pipelines.
  ASSERT_OK_AND_ASSIGN(Topology topo, Topology::Parse(best.topology()));
  EXPECT_EQ(topo.world_size(), 7);
  EXPECT_EQ(topo.global_batch(), 16);
  EXPECT_OK(topo.Validate(12, 16));
  EXPECT_EQ(topo.num_pipelines(), best.replicas());
  EXPECT_EQ(best.boundaries_size(), best.stages() + 1);
  // Every mix: the counts add up to the 16 micro-batches on the 7 slots; where one pipeline of
  // each depth makes any split possible (4+3, 6+1, ...) they finish within one micro-batch.
  bool saw_homogeneous = false, saw_pair = false;
  for (int i = 0; i < set.plans_size(); ++i) {
    const v1::Plan& plan = set.plans(i);
    if (i > 0) EXPECT_LE(set.plans(i - 1).step_s(), plan.step_s());
    if (!plan.heterogeneous()) {
      saw_homogeneous = true;
      continue;
    }
    SCOPED_TRACE(plan.topology());
    int deepest = 0, ranks = 0, micro = 0, copies = 0;
    double slowest = 0, fastest = 1e9, per_mb = 0;
    for (const auto& pp : plan.pipelines()) {
      deepest = std::max(deepest, pp.stages());
      ranks += pp.stages() * pp.count();
      micro += pp.microbatches() * pp.count();
      copies = std::max(copies, pp.count());
      EXPECT_EQ(pp.samples(), pp.microbatches());
      EXPECT_EQ(pp.boundaries_size(), pp.stages() + 1);
      slowest = std::max(slowest, pp.step_s());
      fastest = std::min(fastest, pp.step_s());
      for (double b : pp.busy_s()) per_mb = std::max(per_mb, b / pp.microbatches());
    }
    EXPECT_EQ(deepest, plan.stages());
    EXPECT_EQ(ranks, 7);
    EXPECT_EQ(micro, 16);
    if (copies == 1 && plan.pipelines_size() == 2) {
      saw_pair = true;
      EXPECT_LE(slowest - fastest, per_mb + 1e-9);  // within one micro-batch
    }
  }
  EXPECT_TRUE(saw_homogeneous);  // P x D shapes are still there, ranked with the mixes
  EXPECT_TRUE(saw_pair);
  // A fixed depth or width keeps the P x D shapes only.
  spec.parallel.stages = 3;
  ASSERT_OK_AND_ASSIGN(set, PlanShapes(spec, p, req));
  for (const auto& plan : set.plans()) EXPECT_FALSE(plan.heterogeneous());
}

// With the schedule and micro-batch size searched too, on two nodes.
TEST(AutoConfigTest, HeterogeneousPlansWithEverythingAuto) {
  JobSpec spec = Gpt(10, 48);
  spec.parallel.schedule = "auto";
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  PlanRequest req{{4, 3}};
  req.heterogeneous = true;
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, p, req));
  int het = 0;
  for (const auto& plan : set.plans()) {
    if (!plan.heterogeneous()) continue;
    ++het;
    EXPECT_EQ(plan.slots(), 7);
    ASSERT_OK_AND_ASSIGN(Topology topo, Topology::Parse(plan.topology()));
    EXPECT_OK(topo.Validate(12, 48));
    EXPECT_EQ(48 % plan.micro_batch(), 0);
  }
  EXPECT_GT(het, 0);
  // Memory: a limit no stage fits rejects the mixes with the reason too.
  req.memory_per_slot = 1 << 10;
  EXPECT_THAT(PlanShapes(spec, p, req).status().message(), HasSubstr("memory"));
}

// parallel.pipelines: exactly that plan, simulated.
TEST(AutoConfigTest, FixedPipelinesSpecIsThatPlan) {
  JobSpec spec = Gpt(10, 16);
  spec.parallel.schedule = "1f1b";
  spec.parallel.micro_batch = 1;
  const v1::Profile p = Balanced(spec);
  PipelineEntrySpec two, one;
  two.stages = {{"embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.4"},
                {"blocks.5", "blocks.6", "blocks.7", "blocks.8", "blocks.9", "head"}};
  two.count = 2;
  two.microbatches = 6;
  one.stages = {{"embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.4", "blocks.5",
                 "blocks.6", "blocks.7", "blocks.8", "blocks.9", "head"}};
  one.microbatches = 4;
  spec.parallel.pipelines = {two, one};
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, p, {{8}}));
  ASSERT_EQ(set.plans_size(), 1);
  const v1::Plan& plan = set.plans(0);
  EXPECT_TRUE(plan.heterogeneous());
  EXPECT_EQ(plan.topology(), "0,6,12:6;0,6,12:6;0,12:4");
  EXPECT_EQ(plan.slots(), 5);
  EXPECT_EQ(plan.stages(), 2);
  EXPECT_EQ(plan.replicas(), 3);
  ASSERT_EQ(plan.pipelines_size(), 2);
  EXPECT_EQ(plan.pipelines(0).count(), 2);
  EXPECT_EQ(plan.pipelines(0).microbatches(), 6);
  EXPECT_EQ(plan.pipelines(1).microbatches(), 4);
  // 2 stages x 6: 6 x 18 + 18 = 126 ms; 1 stage x 4: 4 x 36 = 144 ms: the slowest counts.
  EXPECT_NEAR(plan.pipelines(0).step_s(), 0.126, 1e-3);
  EXPECT_NEAR(plan.pipelines(1).step_s(), 0.144, 1e-3);
  EXPECT_GE(plan.step_s(), 0.144);
  EXPECT_LT(plan.step_s(), 0.150);
  // Too few slots: nothing fits (a wait, not an error in the spec).
  auto st = PlanShapes(spec, p, {{4}}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("need 5 slots, 4 available"));
  // Samples that do not add up to the batch, or a template that is not the model's: errors.
  spec.train.global_batch = 20;
  EXPECT_EQ(PlanShapes(spec, p, {{8}}).status().code(), absl::StatusCode::kInvalidArgument);
  spec.train.global_batch = 16;
  spec.parallel.pipelines[1].stages[0].pop_back();
  EXPECT_THAT(PlanShapes(spec, p, {{8}}).status().message(),
              HasSubstr("The last stage must contain the head module"));
}

// 96 segments on 64 slots (8 nodes) with everything auto stays well under a few seconds.
TEST(AutoConfigTest, HeterogeneousPlanningIsFast) {
  JobSpec spec = Gpt(94, 512);
  spec.parallel.schedule = "auto";
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  PlanRequest req{{8, 8, 8, 8, 8, 8, 8, 8}};
  req.heterogeneous = true;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, p, req));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int het = 0;
  for (const auto& plan : set.plans()) het += plan.heterogeneous();
  std::cout << "64 slots, 96 segments: " << set.plans_size() << " plans (" << het
            << " heterogeneous) in " << s << " s; best " << set.plans(0).stages() << "x"
            << set.plans(0).replicas() << (set.plans(0).heterogeneous() ? " het " : " ")
            << set.plans(0).step_s() << " s\n";
  EXPECT_LT(s, 10.0);
}

TEST(AutoConfigTest, SeedApiGetMin) {
  JobSpec spec = Gpt(8, 64);
  ASSERT_OK_AND_ASSIGN(v1::Profile p, BuiltinProfile(spec));
  AutoConfig ac(8, 4, 64, p);
  ASSERT_OK_AND_ASSIGN(AutoConfig::Choice c, ac.GetMin());
  EXPECT_GE(c.stages, 1);
  EXPECT_LE(c.stages * c.replicas, 8);
  EXPECT_GT(c.step_s, 0);
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, ac.Plans());
  EXPECT_DOUBLE_EQ(set.plans(0).step_s(), c.step_s);
}

}  // namespace
}  // namespace varuna
