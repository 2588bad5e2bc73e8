// The fused causal attention the built-in models use (Note [Fused attention] in
// worker/models/attention.cc) against the explicit computation.

#include "worker/models/attention.h"

#include <gtest/gtest.h>

namespace varuna {
namespace {

double MaxDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST(AttentionTest, FusedEqualsExplicitWithAndWithoutGroupedQueries) {
  for (int kv : {4, 2, 1}) {  // multi-head, grouped-query, multi-query
    SCOPED_TRACE(kv);
    torch::manual_seed(kv);
    auto q = torch::randn({2, 4, 7, 8}, torch::requires_grad());
    auto k = torch::randn({2, kv, 7, 8}, torch::requires_grad());
    auto v = torch::randn({2, kv, 7, 8}, torch::requires_grad());
    auto qe = q.detach().clone().requires_grad_(), ke = k.detach().clone().requires_grad_(),
         ve = v.detach().clone().requires_grad_();
    auto fused = CausalAttention(q, k, v, 0.0);
    auto explicit_ = ExplicitCausalAttention(qe, ke, ve);
    ASSERT_EQ(fused.sizes(), explicit_.sizes());
    EXPECT_LT(MaxDiff(fused, explicit_), 1e-6);
    auto w = torch::randn(fused.sizes());
    (fused * w).sum().backward();
    (explicit_ * w).sum().backward();
    EXPECT_LT(MaxDiff(q.grad(), qe.grad()), 1e-5);
    EXPECT_LT(MaxDiff(k.grad(), ke.grad()), 1e-5);
    EXPECT_LT(MaxDiff(v.grad(), ve.grad()), 1e-5);
  }
}

TEST(AttentionTest, EachPositionSeesOnlyItsPast) {
  auto q = torch::randn({1, 2, 5, 4}), k = torch::randn({1, 2, 5, 4}),
       v = torch::randn({1, 2, 5, 4});
  const auto before = CausalAttention(q, k, v, 0.0);
  k.select(2, 4).fill_(100);  // the last position's key and value change
  v.select(2, 4).fill_(100);
  const auto after = CausalAttention(q, k, v, 0.0);
  EXPECT_TRUE(torch::equal(before.narrow(2, 0, 4), after.narrow(2, 0, 4)));
  EXPECT_FALSE(torch::equal(before.narrow(2, 4, 1), after.narrow(2, 4, 1)));
}

TEST(AttentionTest, NamesTheBackendItRuns) {
  auto q = torch::randn({1, 2, 5, 4});
  const std::string backend = AttentionBackend(q, q, q, 0.0);
  EXPECT_NE(backend, "none");
  EXPECT_FALSE(backend.empty());
}

}  // namespace
}  // namespace varuna
