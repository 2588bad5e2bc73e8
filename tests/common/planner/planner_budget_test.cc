// The planner's pruning and budgets (Note [Lower bound] and Note [Pruning] in
// common/planner/autoconfig.cc): the bound never exceeds the simulation, exact pruning keeps the
// best, a spent budget still returns the best simulated so far, per-width pruning keeps every
// width's best.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>

#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using Key = std::tuple<int, int, int, std::string>;  // P, D, micro-batch, schedule

JobSpec Gpt(int layers, int64_t global_batch) {
  JobSpec spec;
  spec.model.kind = "gpt";
  spec.model.layers = layers;
  spec.train.global_batch = global_batch;
  spec.parallel.schedule = "auto";
  return spec;
}

// The built-in profile with every cost scaled by a random factor in [0.3, 3] (fixed seed): uneven
// stages, a W part for zb-h1, and (optionally) contention between a host's slots.
v1::Profile Uneven(const JobSpec& spec, unsigned seed, double slowdown) {
  v1::Profile p = *BuiltinProfile(spec);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> f(0.3, 3.0);
  for (auto& seg : *p.mutable_segments()) {
    const double a = f(rng), b = f(rng), w = f(rng) / 6;
    seg.set_optimizer_s(seg.optimizer_s() * f(rng));
    for (auto& c : *seg.mutable_costs()) {
      c.set_forward_s(c.forward_s() * a);
      c.set_forward_nograd_s(c.forward_nograd_s() * a);
      c.set_recompute_s(c.recompute_s() * a);
      c.set_backward_s(c.backward_s() * b);
      c.set_weight_s(c.backward_s() * w);
    }
  }
  if (slowdown > 1) {
    p.set_compute_slowdown(slowdown);
    p.set_slots_per_host(2);
  }
  return p;
}

// Every plan of the set by shape, simulated ones only. With `variants`, a speed-balanced
// variant of a P x D shape (every pipeline P deep: Note [Speed-aware plans]) counts for that
// shape too, the faster of the two.
std::map<Key, double> Simulated(const v1::PlanSet& set, bool variants = false) {
  std::map<Key, double> out;
  for (const v1::Plan& p : set.plans()) {
    if (p.lower_bound()) continue;
    if (p.heterogeneous()) {
      bool uniform_depth = variants && p.pipelines_size() > 0;
      for (const auto& pp : p.pipelines()) uniform_depth &= pp.stages() == p.stages();
      if (!uniform_depth) continue;
    }
    const Key key{p.stages(), p.replicas(), p.micro_batch(), p.schedule()};
    auto [it, fresh] = out.emplace(key, p.step_s());
    if (!fresh) it->second = std::min(it->second, p.step_s());
  }
  return out;
}

PlanRequest Everything(std::vector<int> slots_per_node) {
  PlanRequest req;
  req.slots_per_node = std::move(slots_per_node);
  req.all = true;
  req.simulate_within = std::numeric_limits<double>::infinity();
  return req;
}

TEST(PlannerBudgetTest, TheLowerBoundNeverExceedsTheSimulation) {
  struct Case {
    JobSpec spec;
    v1::Profile profile;
    std::vector<int> slots;
    std::vector<double> speeds;
  };
  std::vector<Case> cases;
  const JobSpec small = Gpt(6, 24), deep = Gpt(10, 48);
  cases.push_back({small, *BuiltinProfile(small), {4, 4}, {}});
  cases.push_back({small, Uneven(small, 1, 1), {3, 3}, {}});
  cases.push_back({deep, Uneven(deep, 2, 1.6), {4, 4, 2}, {}});
  cases.push_back({deep, Uneven(deep, 3, 1), {4, 4}, {0.5, 2.0}});  // a node faster than normal
  cases.push_back({small, Uneven(small, 4, 1), {3, 3, 2}, {0.9, 1.0, 0.5}});
  int compared = 0;
  for (const Case& c : cases) {
    PlanRequest full = Everything(c.slots);
    full.node_speed = c.speeds;
    // With speeds, the planner also simulates each shape's speed-balanced variant (other cuts,
    // an uneven split): the bound must hold for it too.
    full.heterogeneous = !c.speeds.empty();
    ASSERT_OK_AND_ASSIGN(v1::PlanSet all, PlanShapes(c.spec, c.profile, full));
    const std::map<Key, double> simulated = Simulated(all, /*variants=*/true);
    // One task of budget: the first shape is simulated, every other one only bounded.
    PlanRequest bounds_only = full;
    bounds_only.max_simulated_tasks = 1;
    ASSERT_OK_AND_ASSIGN(v1::PlanSet bounded, PlanShapes(c.spec, c.profile, bounds_only));
    for (const v1::Plan& p : bounded.plans()) {
      if (!p.lower_bound()) continue;
      auto it = simulated.find({p.stages(), p.replicas(), p.micro_batch(), p.schedule()});
      ASSERT_NE(it, simulated.end()) << p.ShortDebugString();
      EXPECT_LE(p.step_s(), it->second * (1 + 1e-9)) << p.ShortDebugString();
      ++compared;
    }
  }
  EXPECT_GT(compared, 200);
}

TEST(PlannerBudgetTest, ExactPruningKeepsTheBestAndSimulatesLess) {
  const JobSpec spec = Gpt(10, 48);
  for (unsigned seed : {4u, 5u, 6u}) {
    const v1::Profile p = Uneven(spec, seed, seed == 5 ? 1.5 : 1);
    ASSERT_OK_AND_ASSIGN(v1::PlanSet all, PlanShapes(spec, p, Everything({4, 4, 4})));
    PlanRequest exact;
    exact.slots_per_node = {4, 4, 4};
    exact.simulate_within = 1;
    ASSERT_OK_AND_ASSIGN(v1::PlanSet pruned, PlanShapes(spec, p, exact));
    EXPECT_EQ(pruned.plans(0).step_s(), all.plans(0).step_s()) << seed;
    EXPECT_EQ(pruned.plans(0).stages(), all.plans(0).stages());
    EXPECT_EQ(pruned.plans(0).replicas(), all.plans(0).replicas());
    EXPECT_EQ(pruned.plans(0).micro_batch(), all.plans(0).micro_batch());
    EXPECT_LT(Simulated(pruned).size(), Simulated(all).size() / 2);
  }
}

TEST(PlannerBudgetTest, ASpentBudgetReturnsTheBestSoFarAndSaysSo) {
  const JobSpec spec = Gpt(10, 48);
  const v1::Profile p = Uneven(spec, 7, 1);
  for (int kind = 0; kind < 2; ++kind) {
    PlanRequest req;
    req.slots_per_node = {4, 4};
    if (kind == 0) req.max_simulated_tasks = 1;
    if (kind == 1) req.budget_s = 1e-9;
    ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, p, req));
    ASSERT_GT(set.plans_size(), 1);
    EXPECT_FALSE(set.plans(0).lower_bound());  // one shape is always simulated, and leads
    EXPECT_EQ(Simulated(set).size(), 1u);
    EXPECT_THAT(set.notes(), ::testing::Contains(HasSubstr("budget ran out"))) << kind;
  }
  // Within budget: no note.
  PlanRequest plenty;
  plenty.slots_per_node = {4, 4};
  ASSERT_OK_AND_ASSIGN(v1::PlanSet set, PlanShapes(spec, p, plenty));
  EXPECT_THAT(set.notes(), ::testing::Not(::testing::Contains(HasSubstr("budget ran out"))));
}

TEST(PlannerBudgetTest, PerWidthPruningKeepsEveryWidthsBest) {
  const JobSpec spec = Gpt(8, 48);
  const v1::Profile p = Uneven(spec, 8, 1);
  ASSERT_OK_AND_ASSIGN(v1::PlanSet all, PlanShapes(spec, p, Everything({4, 4})));
  PlanRequest curve;
  curve.slots_per_node = {4, 4};
  curve.all = true;
  curve.best_per_width = true;
  curve.simulate_within = 1;
  ASSERT_OK_AND_ASSIGN(v1::PlanSet pruned, PlanShapes(spec, p, curve));
  auto best_by_width = [](const v1::PlanSet& set) {
    std::map<int, double> best;
    for (const v1::Plan& plan : set.plans()) {
      if (plan.lower_bound() || plan.heterogeneous()) continue;
      auto [it, fresh] = best.emplace(plan.slots(), plan.step_s());
      if (!fresh) it->second = std::min(it->second, plan.step_s());
    }
    return best;
  };
  const std::map<int, double> want = best_by_width(all);
  EXPECT_GE(want.size(), 6u);
  const std::map<int, double> got = best_by_width(pruned);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [width, step] : want) EXPECT_DOUBLE_EQ(got.at(width), step) << width;
  EXPECT_LT(Simulated(pruned).size(), Simulated(all).size());
}

TEST(PlannerBudgetTest, TheManagersRequestPlansOnlyTheBest) {
  const PlanRequest req = ManagerPlanRequest();
  EXPECT_EQ(req.simulate_within, 1);
  EXPECT_TRUE(req.heterogeneous);
  EXPECT_GT(req.budget_s, 0);
  EXPECT_LE(req.budget_s, 1);
  EXPECT_LT(req.max_simulated_tasks, PlanRequest().max_simulated_tasks);
}

}  // namespace
}  // namespace varuna
