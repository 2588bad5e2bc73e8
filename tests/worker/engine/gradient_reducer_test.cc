// The gradient reducer with ranks as threads (worker/dist/thread_process_group.h): data-parallel
// sums over a group, the overlapped path's bit-identity with the plain one, and tied
// parameters summed across their holders.

#include "worker/engine/gradient_reducer.h"

#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"
#include "worker/dist/thread_process_group.h"

namespace varuna {
namespace {

using ::varuna::testing::IsOk;

constexpr std::chrono::milliseconds kTimeout{20000};

// Runs fn(rank) on one thread per rank.
void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Small buckets, so parameters spread over several of them.
GradientReducerOptions SmallBuckets(bool overlap) {
  GradientReducerOptions o;
  o.bucket_bytes = 4 * 20;
  o.first_bucket_bytes = 4 * 10;
  o.overlap = overlap;
  o.timeout = kTimeout;
  return o;
}

// Shapes of a toy stage's parameters, in layer order.
const std::vector<std::vector<int64_t>> kShapes = {{4, 3}, {3}, {3, 5}, {5}, {5}};

TEST(GradientReducerTest, FinishSumsEachGradientOverTheGroup) {
  constexpr int kRanks = 3;
  // Gradients are drawn up front: the generator is shared by the rank threads.
  std::vector<std::vector<torch::Tensor>> grads(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    for (const auto& shape : kShapes) grads[r].push_back(torch::randn(shape));
  }
  auto world = std::make_shared<ThreadWorld>();
  std::vector<std::vector<torch::Tensor>> got(kRanks);
  std::vector<int> buckets(kRanks);
  OnRanks(kRanks, [&](int r) {
    ThreadFactory factory(world);
    ProcessGroupPtr dp = *factory.Create("dp", {0, 1, 2}, r);
    std::vector<ReducedParameter> params;
    for (size_t i = 0; i < kShapes.size(); ++i) {
      torch::Tensor p = torch::zeros(kShapes[i]).requires_grad_(true);
      p.mutable_grad() = grads[r][i].clone();
      params.push_back({absl::StrCat("layer", i, ".w"), p, dp});
    }
    auto reducer = GradientReducer::Create(params, {}, nullptr, SmallBuckets(false));
    ASSERT_THAT(reducer.status(), IsOk());
    ASSERT_THAT((*reducer)->ReduceTied(), IsOk());
    ASSERT_THAT((*reducer)->Finish(), IsOk());
    buckets[r] = (*reducer)->num_buckets();
    EXPECT_EQ((*reducer)->last_early_buckets(), 0);
    for (auto& p : params) got[r].push_back(p.tensor.grad().clone());
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_GT(buckets[r], 2) << "rank " << r;
    ASSERT_EQ(got[r].size(), kShapes.size());
    for (size_t i = 0; i < kShapes.size(); ++i) {
      // Thread groups sum in member order: exactly this.
      const torch::Tensor want = grads[0][i] + grads[1][i] + grads[2][i];
      EXPECT_TRUE(torch::equal(got[r][i], want)) << "rank " << r << " parameter " << i;
    }
  }
}

// One step of a toy stage on `kRanks` data-parallel ranks, each on its own input: the
// parameters' gradients after Finish(), and how many buckets were posted early.
struct ToyStep {
  std::vector<std::vector<torch::Tensor>> grads;  // [rank][parameter]
  std::vector<int> early, buckets;
  std::vector<int> storages;  // [rank]: distinct storages of the gradients after Finish()
};

// `views`: PrepareStep() first, so the gradients are views of the buckets (Note [Gradients as
// bucket views]); else they are the backward's own tensors and the reducer copies.
ToyStep RunToyStep(bool overlap, bool tie_last_two, bool views = false) {
  constexpr int kRanks = 2;
  torch::manual_seed(7);
  std::vector<torch::Tensor> init;
  for (const auto& shape : kShapes) init.push_back(torch::randn(shape));
  std::vector<torch::Tensor> inputs;
  for (int r = 0; r < kRanks; ++r) inputs.push_back(torch::randn({2, 4}));
  auto world = std::make_shared<ThreadWorld>();
  ToyStep out;
  out.grads.resize(kRanks);
  out.early.resize(kRanks);
  out.buckets.resize(kRanks);
  out.storages.resize(kRanks);
  std::vector<std::pair<std::string, std::string>> tied;
  if (tie_last_two) tied.emplace_back("layer3.w", "layer4.w");
  OnRanks(kRanks, [&](int r) {
    ThreadFactory factory(world);
    ProcessGroupPtr dp = *factory.Create("dp", {0, 1}, r);
    std::vector<ReducedParameter> params;
    for (size_t i = 0; i < init.size(); ++i) {
      params.push_back({absl::StrCat("layer", i, ".w"), init[i].clone().requires_grad_(true), dp});
    }
    auto reducer = GradientReducer::Create(params, tied, nullptr, SmallBuckets(overlap));
    ASSERT_THAT(reducer.status(), IsOk());
    const std::vector<torch::Tensor> w = [&] {
      std::vector<torch::Tensor> v;
      for (auto& p : params) v.push_back(p.tensor);
      return v;
    }();
    if (views) (*reducer)->PrepareStep();
    // Two micro-batches; the hooks post only during the last backward.
    for (int mb = 0; mb < 2; ++mb) {
      torch::Tensor x = inputs[r] * (mb + 1);
      torch::Tensor h = torch::tanh(x.matmul(w[0]) + w[1]);
      torch::Tensor y = h.matmul(w[2]) + w[3] + 0.5 * w[4];
      torch::Tensor loss = y.pow(2).mean();
      if (mb == 1) (*reducer)->Arm();
      loss.backward();
    }
    ASSERT_THAT((*reducer)->ReduceTied(), IsOk());
    ASSERT_THAT((*reducer)->Finish(), IsOk());
    out.early[r] = (*reducer)->last_early_buckets();
    out.buckets[r] = (*reducer)->num_buckets();
    std::set<const void*> storages;
    for (auto& p : w) {
      out.grads[r].push_back(p.grad().clone());
      storages.insert(p.grad().storage().data());
    }
    out.storages[r] = static_cast<int>(storages.size());
  });
  return out;
}

// Note [Overlapped all-reduce] in gradient_reducer.cc: buckets posted from the backward's
// hooks hold exactly what the plain path copies after it.
TEST(GradientReducerTest, EarlyPostedBucketsGiveTheSameSums) {
  for (bool tie : {false, true}) {
    SCOPED_TRACE(tie ? "tied" : "untied");
    const ToyStep plain = RunToyStep(/*overlap=*/false, tie);
    const ToyStep early = RunToyStep(/*overlap=*/true, tie);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(plain.grads[r].size(), kShapes.size());
      ASSERT_EQ(early.grads[r].size(), kShapes.size());
      EXPECT_EQ(plain.early[r], 0);
      EXPECT_GT(early.early[r], 1) << "rank " << r;
      if (tie) {
        EXPECT_LT(early.early[r], early.buckets[r]) << "tied buckets wait for ReduceTied()";
      } else {
        EXPECT_EQ(early.early[r], early.buckets[r]);
      }
      for (size_t i = 0; i < kShapes.size(); ++i) {
        EXPECT_TRUE(torch::equal(plain.grads[r][i], early.grads[r][i]))
            << "rank " << r << " parameter " << i;
        EXPECT_TRUE(torch::equal(early.grads[r][i], early.grads[0][i]))
            << "replicas differ: rank " << r << " parameter " << i;
      }
      if (tie) EXPECT_TRUE(torch::equal(early.grads[r][3], early.grads[r][4]));
    }
  }
}

// Note [Gradients as bucket views] in gradient_reducer.cc: after PrepareStep the backward
// accumulates into the buckets themselves (one storage per bucket, nothing copied), and the
// sums are bit for bit the copying path's, overlapped or not, tied or not.
TEST(GradientReducerTest, GradientsThatAreBucketViewsGiveTheSameSums) {
  for (bool tie : {false, true}) {
    for (bool overlap : {false, true}) {
      SCOPED_TRACE(absl::StrCat(tie ? "tied" : "untied", overlap ? ", overlapped" : ""));
      const ToyStep copied = RunToyStep(overlap, tie);
      const ToyStep viewed = RunToyStep(overlap, tie, /*views=*/true);
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(copied.storages[r], static_cast<int>(kShapes.size())) << "rank " << r;
        EXPECT_EQ(viewed.storages[r], viewed.buckets[r]) << "rank " << r;
        EXPECT_LT(viewed.buckets[r], static_cast<int>(kShapes.size()));
        for (size_t i = 0; i < kShapes.size(); ++i) {
          EXPECT_TRUE(torch::equal(copied.grads[r][i], viewed.grads[r][i]))
              << "rank " << r << " parameter " << i;
        }
      }
    }
  }
}

// Note [Tied weights] in gradient_reducer.cc: a pair split between the first and the last
// stage is summed over the tied group; a pair on one stage, locally.
TEST(GradientReducerTest, TiedGradientsAreSummedAcrossTheirHolders) {
  const torch::Tensor g_embed = torch::randn({6, 4}), g_head = torch::randn({6, 4});
  const torch::Tensor g_norm = torch::randn({4});
  const std::vector<std::pair<std::string, std::string>> tied = {{"embed.wte", "head.lm_head"},
                                                                 {"head.scale", "head.scale_copy"}};
  auto world = std::make_shared<ThreadWorld>();
  std::vector<torch::Tensor> got(2);
  std::vector<bool> second(2);
  torch::Tensor local_first, local_second;
  bool local_first_is_second = true, local_second_is_second = false;
  OnRanks(2, [&](int r) {
    ThreadFactory factory(world);
    ProcessGroupPtr tied_group = *factory.Create("tied", {0, 1}, r);
    std::vector<ReducedParameter> params;
    torch::Tensor p = torch::zeros({6, 4}).requires_grad_(true);
    p.mutable_grad() = (r == 0 ? g_embed : g_head).clone();
    params.push_back({r == 0 ? "embed.wte" : "head.lm_head", p, nullptr});
    torch::Tensor a, b;
    if (r == 1) {
      a = torch::zeros({4}).requires_grad_(true);
      b = torch::zeros({4}).requires_grad_(true);
      a.mutable_grad() = g_norm.clone();
      b.mutable_grad() = torch::ones({4});
      params.push_back({"head.scale", a, nullptr});
      params.push_back({"head.scale_copy", b, nullptr});
    }
    GradientReducerOptions o;
    o.timeout = kTimeout;
    auto reducer = GradientReducer::Create(params, tied, tied_group, o);
    ASSERT_THAT(reducer.status(), IsOk());
    ASSERT_THAT((*reducer)->ReduceTied(), IsOk());
    ASSERT_THAT((*reducer)->Finish(), IsOk());
    got[r] = p.grad().clone();
    second[r] = (*reducer)->IsSecondCopy(p);
    if (r == 1) {
      local_first = a.grad().clone();
      local_second = b.grad().clone();
      local_first_is_second = (*reducer)->IsSecondCopy(a);
      local_second_is_second = (*reducer)->IsSecondCopy(b);
    }
  });
  EXPECT_TRUE(torch::equal(got[0], g_embed + g_head));
  EXPECT_TRUE(torch::equal(got[1], g_embed + g_head));
  EXPECT_FALSE(second[0]);
  EXPECT_TRUE(second[1]);
  EXPECT_TRUE(torch::equal(local_first, g_norm + 1));
  EXPECT_TRUE(torch::equal(local_second, g_norm + 1));
  EXPECT_FALSE(local_first_is_second);
  EXPECT_TRUE(local_second_is_second);
}

// Abort() after a failed backward disarms the hooks: the next backward posts nothing early,
// and Finish() still reduces everything.
TEST(GradientReducerTest, AbortDisarmsTheHooks) {
  auto world = std::make_shared<ThreadWorld>();
  ThreadFactory factory(world);
  ProcessGroupPtr alone = *factory.Create("dp", {0}, 0);
  torch::Tensor p = torch::ones({3}).requires_grad_(true);
  auto reducer = GradientReducer::Create({{"l.w", p, alone}}, {}, nullptr, SmallBuckets(true));
  ASSERT_THAT(reducer.status(), IsOk());
  EXPECT_EQ((*reducer)->num_buckets(), 1);
  (*reducer)->Arm();
  (*reducer)->Abort();
  (p * 2).sum().backward();
  ASSERT_THAT((*reducer)->Finish(), IsOk());
  EXPECT_EQ((*reducer)->last_early_buckets(), 0);
  EXPECT_TRUE(torch::equal(p.grad(), torch::full({3}, 2.0)));
  (*reducer)->Arm();
  (p * 2).sum().backward();
  ASSERT_THAT((*reducer)->Finish(), IsOk());
  EXPECT_EQ((*reducer)->last_early_buckets(), 1);
  EXPECT_TRUE(torch::equal(p.grad(), torch::full({3}, 4.0)));
}

}  // namespace
}  // namespace varuna
