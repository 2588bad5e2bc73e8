// The planner library: simulator (hand-computed cases), profiles, AutoConfig.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include "common/autoconfig.h"
#include "common/partition.h"
#include "common/profile.h"
#include "common/simulator.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;

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
  for (auto policy : {SchedulePolicy::kGPipe, SchedulePolicy::k1F1B, SchedulePolicy::kVaruna}) {
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
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, p, {{4, 2}}));
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
