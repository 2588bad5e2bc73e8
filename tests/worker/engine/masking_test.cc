// Note [Masking] in worker/engine/data.cc: a sample is masked by its identity alone (the same
// in any batch that holds it), about 15% of positions predicted, 80% of those shown as [MASK],
// the rest real tokens; LossTokens counts what Batch predicts without reading tokens; labels
// are -100 elsewhere; a micro-batch's weight is its count (Note [Masked-token weighting] in
// pipeline_executor.cc).

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "worker/engine/data.h"

namespace varuna {
namespace {

TEST(MaskingTest, DeterministicByIdentityAndCountedAhead) {
  const std::string path = std::string(testing::TempDir()) + "/masking_corpus.txt";
  {
    std::ofstream f(path);
    for (int i = 0; i < 4000; ++i) f << static_cast<char>('a' + i % 23);
  }
  DataSpec spec;
  spec.kind = "text";
  spec.path = path;
  constexpr int kSeq = 32, kMask = 3;
  auto ds = TokenDataset::Open(spec, kSeq, 256, 11);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ds->set_masked_lm(kMask, 256);
  auto whole = ds->Batch(0, 64);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const torch::Tensor ids = whole->at("input_ids"), labels = whole->at("labels");
  const torch::Tensor predicted = labels != -100;
  const int64_t n = predicted.sum().item<int64_t>();
  EXPECT_EQ(whole->at("loss_tokens").sum().item<int64_t>(), n);
  EXPECT_EQ(ds->LossTokens(0, 64), n);
  EXPECT_NEAR(static_cast<double>(n) / (64 * kSeq), 0.15, 0.03);
  const double shown_mask =
      static_cast<double>((ids.masked_select(predicted) == kMask).sum().item<int64_t>()) / n;
  EXPECT_NEAR(shown_mask, 0.8, 0.06);
  EXPECT_EQ((ids.masked_select(~predicted) == kMask).sum().item<int64_t>(), 0);
  // The labels are the text's tokens: 'a' + position mod 23 somewhere in the file.
  EXPECT_TRUE((labels.masked_select(predicted) >= 'a').all().item<bool>());
  // The same samples in another batch (another replica's slice) are masked alike.
  auto part = ds->Batch(40, 8);
  ASSERT_TRUE(part.ok());
  EXPECT_TRUE(torch::equal(part->at("input_ids"), ids.narrow(0, 40, 8)));
  EXPECT_TRUE(torch::equal(part->at("labels"), labels.narrow(0, 40, 8)));
  EXPECT_EQ(ds->LossTokens(40, 8), part->at("loss_tokens").sum().item<int64_t>());
  // Another seed masks otherwise.
  auto other = TokenDataset::Open(spec, kSeq, 256, 12);
  ASSERT_TRUE(other.ok());
  other->set_masked_lm(kMask, 256);
  auto o = other->Batch(0, 64);
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(torch::equal(o->at("labels"), labels));
  // Without masking: no loss_tokens, labels are the next tokens, LossTokens counts them all.
  auto plain = TokenDataset::Open(spec, kSeq, 256, 11);
  ASSERT_TRUE(plain.ok());
  auto p = plain->Batch(0, 2);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->count("loss_tokens"), 0u);
  EXPECT_EQ(plain->LossTokens(0, 2), 2 * kSeq);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace varuna
