// The fused AdamW (Note [Fused AdamW] in worker/engine/fused_adamw.cc) against the C++
// frontend's AdamW: the same updates, each resuming the other's state, the gradient scale.

#include "worker/engine/fused_adamw.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace varuna {
namespace {

// A matrix with weight decay and a vector without, as MakeOptimizer groups them.
std::vector<torch::Tensor> Params(uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({16, 8}).requires_grad_(), torch::randn({8}).requires_grad_()};
}

template <typename Opt>
std::unique_ptr<Opt> Make(const std::vector<torch::Tensor>& p, bool amsgrad = false) {
  auto o = torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1).amsgrad(amsgrad);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p[0]},
                      std::make_unique<torch::optim::AdamWOptions>(o));
  groups.emplace_back(
      std::vector<torch::Tensor>{p[1]},
      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(o).weight_decay(0)));
  return std::make_unique<Opt>(groups, o);
}

// Gradients of step `s` (the same for both runs), times `factor`.
void SetGrads(const std::vector<torch::Tensor>& p, int s, double factor = 1) {
  torch::manual_seed(1000 + s);
  for (const auto& t : p) t.mutable_grad() = torch::randn(t.sizes()) * factor;
}

double MaxDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  }
  return d;
}

// The state LoadOptimizerState (worker/engine/checkpoint.cc) would rebuild from a checkpoint.
void CopyState(torch::optim::Optimizer& from, const std::vector<torch::Tensor>& from_p,
               torch::optim::Optimizer& to, const std::vector<torch::Tensor>& to_p) {
  for (size_t i = 0; i < from_p.size(); ++i) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(
        *from.state().at(from_p[i].unsafeGetTensorImpl()));
    auto t = std::make_unique<torch::optim::AdamWParamState>();
    t->step(s.step()).exp_avg(s.exp_avg().clone()).exp_avg_sq(s.exp_avg_sq().clone());
    to.state()[to_p[i].unsafeGetTensorImpl()] = std::move(t);
  }
}

TEST(FusedAdamWTest, EqualsTheFrontendsAdamWOverTwentySteps) {
  for (bool amsgrad : {false, true}) {
    auto a = Params(1), b = Params(1);
    auto ref = Make<torch::optim::AdamW>(a, amsgrad);
    auto fused = Make<FusedAdamW>(b, amsgrad);
    for (int s = 1; s <= 20; ++s) {
      SetGrads(a, s);
      SetGrads(b, s);
      if (s == 10) {  // a schedule's new learning rate reaches both
        for (auto* o : {static_cast<torch::optim::Optimizer*>(ref.get()),
                        static_cast<torch::optim::Optimizer*>(fused.get())}) {
          for (auto& g : o->param_groups()) g.options().set_lr(5e-3);
        }
      }
      ref->step();
      fused->step();
    }
    EXPECT_LT(MaxDiff(a, b), 1e-6) << "amsgrad " << amsgrad;
    auto& s =
        static_cast<torch::optim::AdamWParamState&>(*fused->state().at(b[0].unsafeGetTensorImpl()));
    EXPECT_EQ(s.step(), 20);  // the host count a checkpoint saves
  }
}

TEST(FusedAdamWTest, EachResumesTheOthersState) {
  // 10 steps by one, its state handed over as a checkpoint load does, 10 by the other: as 20
  // by the frontend alone. Both directions.
  auto whole = Params(2);
  auto ref = Make<torch::optim::AdamW>(whole);
  for (int s = 1; s <= 20; ++s) {
    SetGrads(whole, s);
    ref->step();
  }
  for (bool fused_first : {true, false}) {
    auto x = Params(2), y = Params(2);
    std::unique_ptr<torch::optim::AdamW> first, second;
    if (fused_first) {
      first = Make<FusedAdamW>(x);
    } else {
      first = Make<torch::optim::AdamW>(x);
    }
    for (int s = 1; s <= 10; ++s) {
      SetGrads(x, s);
      first->step();
    }
    {
      torch::NoGradGuard g;
      for (size_t i = 0; i < x.size(); ++i) y[i].copy_(x[i]);
    }
    if (fused_first) {
      second = Make<torch::optim::AdamW>(y);
    } else {
      second = Make<FusedAdamW>(y);
    }
    CopyState(*first, x, *second, y);
    for (int s = 11; s <= 20; ++s) {
      SetGrads(y, s);
      second->step();
    }
    EXPECT_LT(MaxDiff(whole, y), 1e-6) << "fused first " << fused_first;
  }
}

TEST(FusedAdamWTest, TheGradientScaleDividesTheNextStepsGradientsOnly) {
  auto a = Params(3), b = Params(3);
  auto ref = Make<torch::optim::AdamW>(a);
  auto fused = Make<FusedAdamW>(b);
  for (int s = 1; s <= 4; ++s) {
    SetGrads(a, s, s == 2 ? 0.25 : 1.0);
    SetGrads(b, s);
    if (s == 2) fused->set_next_grad_scale(torch::full({}, 4.0f));
    ref->step();
    fused->step();
  }
  EXPECT_LT(MaxDiff(a, b), 1e-6);
}

TEST(FusedAdamWTest, ParametersWithoutGradientsAreLeftAlone) {
  auto p = Params(4);
  const torch::Tensor before = p[1].detach().clone();
  auto fused = Make<FusedAdamW>(p);
  SetGrads(p, 1);
  p[1].mutable_grad() = torch::Tensor();
  fused->step();
  EXPECT_TRUE(torch::equal(p[1], before));
  EXPECT_EQ(fused->state().count(p[1].unsafeGetTensorImpl()), 0u);
  EXPECT_FALSE(torch::equal(p[0], Params(4)[0]));
}

}  // namespace
}  // namespace varuna
