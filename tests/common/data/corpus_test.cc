// Corpora (common/data): the shard formats and their damage, the keyed permutation, Megatron's
// blending, epochs and the stream position (Note [Sample stream] in common/data/corpus.h).
// The formats are also read from files an independent Python writer made
// (tests/e2e/corpus_e2e.py).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "common/data/corpus.h"
#include "common/data/manifest.h"
#include "common/data/sample_log.h"
#include "common/data/token_shard.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::varuna::testing::StatusIs;

class CorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("corpus_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  template <typename T>
  static void Put(std::string* s, T v) {
    s->append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  static void Write(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
  }

  // A Megatron shard of uint16 (code 8) or int32 (code 4) tokens: one sequence per document;
  // `gap` bytes of padding before each sequence make it non-contiguous.
  std::string Indexed(const std::string& name, const std::vector<std::vector<int64_t>>& docs,
                      int code = 8, int gap = 0) {
    const std::string prefix = (dir_ / name).string();
    const int w = code == 8 ? 2 : 4;
    std::string bin, idx("MMIDIDX\0\0", 9);
    std::vector<int64_t> ptrs;
    for (const auto& d : docs) {
      bin.append(gap, '\xee');
      ptrs.push_back(static_cast<int64_t>(bin.size()));
      for (int64_t t : d) {
        if (w == 2) Put<uint16_t>(&bin, static_cast<uint16_t>(t));
        if (w == 4) Put<int32_t>(&bin, static_cast<int32_t>(t));
      }
    }
    Put<uint64_t>(&idx, 1);
    Put<uint8_t>(&idx, static_cast<uint8_t>(code));
    Put<uint64_t>(&idx, docs.size());
    Put<uint64_t>(&idx, docs.size() + 1);
    for (const auto& d : docs) Put<int32_t>(&idx, static_cast<int32_t>(d.size()));
    for (int64_t p : ptrs) Put<int64_t>(&idx, p);
    for (size_t i = 0; i <= docs.size(); ++i) Put<int64_t>(&idx, static_cast<int64_t>(i));
    Write(prefix + ".bin", bin);
    Write(prefix + ".idx", idx);
    return prefix;
  }

  std::string Llmc(const std::string& name, const std::vector<int64_t>& tokens, bool v7) {
    const std::string path = (dir_ / name).string();
    std::string s;
    std::vector<int32_t> header(256, 0);
    header[0] = v7 ? 20240801 : 20240520;
    header[1] = v7 ? 7 : 1;
    header[2] = static_cast<int32_t>(tokens.size());
    for (int32_t h : header) Put<int32_t>(&s, h);
    for (int64_t t : tokens) {
      if (v7)
        Put<uint32_t>(&s, static_cast<uint32_t>(t));
      else
        Put<uint16_t>(&s, static_cast<uint16_t>(t));
    }
    Write(path, s);
    return path;
  }

  static std::vector<int64_t> Range(int64_t from, int64_t n) {
    std::vector<int64_t> v(n);
    std::iota(v.begin(), v.end(), from);
    return v;
  }

  CorpusOptions Options(std::vector<CorpusSource> sources, int seq_len = 4) {
    CorpusOptions o;
    o.sources = std::move(sources);
    o.seq_len = seq_len;
    o.vocab = 1 << 20;
    o.seed = 7;
    return o;
  }

  std::filesystem::path dir_;
};

TEST(PermutedIndexTest, IsABijectionForEveryLengthAndKey) {
  for (int64_t n : {1, 2, 3, 5, 16, 17, 100, 1000, 4097}) {
    for (uint64_t key : {0ULL, 1ULL, 0xdeadbeefULL}) {
      std::set<int64_t> seen;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t p = PermutedIndex(key, n, i);
        ASSERT_GE(p, 0);
        ASSERT_LT(p, n);
        seen.insert(p);
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << n << " " << key;
    }
  }
  // Different keys, different orders.
  int same = 0;
  for (int64_t i = 0; i < 1000; ++i) same += PermutedIndex(1, 1000, i) == PermutedIndex(2, 1000, i);
  EXPECT_LT(same, 20);
}

TEST_F(CorpusTest, ReadsIndexedShardsContiguousOrNot) {
  for (int gap : {0, 3}) {
    for (int code : {8, 4}) {
      const std::string p = Indexed("s" + std::to_string(gap) + std::to_string(code),
                                    {Range(0, 3), Range(100, 5), {}, Range(200, 2)}, code, gap);
      ASSERT_OK_AND_ASSIGN(auto shard, TokenShard::OpenIndexed(p));
      EXPECT_EQ(shard->tokens(), 10);
      EXPECT_EQ(shard->documents(), 4);
      std::vector<int64_t> out(10);
      shard->Read(0, 10, out.data());
      EXPECT_THAT(out, ::testing::ElementsAre(0, 1, 2, 100, 101, 102, 103, 104, 200, 201));
      shard->Read(2, 3, out.data());  // across a sequence boundary
      EXPECT_THAT(std::vector<int64_t>(out.begin(), out.begin() + 3),
                  ::testing::ElementsAre(2, 100, 101));
    }
  }
}

TEST_F(CorpusTest, ReadsBothLlmcVersions) {
  for (bool v7 : {false, true}) {
    const std::vector<int64_t> tokens = {50256, 1, 2, 65535, 3};
    std::vector<int64_t> want = tokens;
    if (v7) want[3] = 128000;
    ASSERT_OK_AND_ASSIGN(auto shard,
                         TokenShard::OpenLlmc(Llmc(v7 ? "v7.bin" : "v1.bin", want, v7)));
    EXPECT_EQ(shard->tokens(), 5);
    EXPECT_EQ(shard->token_bytes(), v7 ? 4 : 2);
    std::vector<int64_t> out(5);
    shard->Read(0, 5, out.data());
    EXPECT_EQ(out, want);
  }
}

TEST_F(CorpusTest, DamagedShardsAreErrorsNamingTheFile) {
  const std::string good = Indexed("good", {Range(0, 8)});
  EXPECT_THAT(TokenShard::OpenIndexed((dir_ / "missing").string()),
              StatusIs(absl::StatusCode::kNotFound, "missing.idx"));
  // The index claims a longer sequence than the .bin holds.
  std::string idx;
  {
    std::ifstream in(good + ".idx", std::ios::binary);
    idx.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string lying = idx;
  const int32_t big = 1000;
  std::memcpy(&lying[34], &big, 4);
  Write((dir_ / "lying.idx").string(), lying);
  std::filesystem::copy_file(good + ".bin", dir_ / "lying.bin");
  EXPECT_THAT(TokenShard::OpenIndexed((dir_ / "lying").string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "lying.idx: sequence 0 (1000 tokens at byte 0) lies outside"));
  // Counts beyond the index's own size.
  std::string counts = idx;
  const uint64_t many = 1ULL << 40;
  std::memcpy(&counts[18], &many, 8);
  Write((dir_ / "counts.idx").string(), counts);
  std::filesystem::copy_file(good + ".bin", dir_ / "counts.bin");
  EXPECT_THAT(TokenShard::OpenIndexed((dir_ / "counts").string()),
              StatusIs(absl::StatusCode::kInvalidArgument, "counts.idx: the index claims"));
  Write((dir_ / "magic.idx").string(), "not an index at all, really not");
  std::filesystem::copy_file(good + ".bin", dir_ / "magic.bin");
  EXPECT_THAT(TokenShard::OpenIndexed((dir_ / "magic").string()),
              StatusIs(absl::StatusCode::kInvalidArgument, "magic.idx: not a Megatron"));
  // llm.c: a count that disagrees with the size, an unknown header.
  std::string f;
  {
    const std::string path = Llmc("short.bin", Range(0, 10), false);
    std::ifstream in(path, std::ios::binary);
    f.assign(std::istreambuf_iterator<char>(in), {});
  }
  Write((dir_ / "cut.bin").string(), f.substr(0, f.size() - 2));
  EXPECT_THAT(TokenShard::OpenLlmc((dir_ / "cut.bin").string()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "cut.bin: the header says 10 tokens of 2 bytes"));
  std::string other = f;
  const int32_t v = 3;
  std::memcpy(&other[4], &v, 4);
  Write((dir_ / "other.bin").string(), other);
  EXPECT_THAT(TokenShard::OpenLlmc((dir_ / "other.bin").string()),
              StatusIs(absl::StatusCode::kInvalidArgument, "other.bin: llm.c header"));
}

TEST_F(CorpusTest, BadSourcesAndTokensAreClearErrors) {
  const std::string a = Indexed("a", {Range(0, 20)});
  EXPECT_THAT(Corpus::Open(Options({{{a}, 0}, {{a}, 0}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "weights sum to zero"));
  EXPECT_THAT(Corpus::Open(Options({{{a}, -1}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "data.sources[0].weight"));
  EXPECT_THAT(Corpus::Open(Options({{{}, 1}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "has no shards"));
  const std::string tiny = Indexed("tiny", {Range(0, 3)});
  EXPECT_THAT(Corpus::Open(Options({{{tiny}, 1}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "fewer than one sample"));
  // A token beyond the vocabulary: found when its sample is read, naming the shard.
  const std::string high = Indexed("high", {{1, 2, 3, 4, 999, 5, 6, 7, 8, 9}});
  CorpusOptions o = Options({{{high}, 1}});
  o.vocab = 500;
  ASSERT_OK_AND_ASSIGN(auto corpus, Corpus::Open(o));
  std::vector<int64_t> out(5);
  absl::Status bad;
  for (int64_t s = 0; s < corpus->samples(0); ++s) {
    absl::Status st = corpus->Tokens({0, 0, s}, out.data());
    if (!st.ok()) bad = st;
  }
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument,
                            "high.bin: token 999 at position 4 is outside the model's "
                            "vocabulary (500)"));
}

TEST_F(CorpusTest, SamplesAreWindowsAcrossShardsAndTheTailIsDropped) {
  // 9 + 6 = 15 tokens, seq_len 4: samples at 0, 4, 8 (the last needs tokens 8..12); 3 left over.
  const std::string a = Indexed("a", {Range(0, 5), Range(5, 4)});
  const std::string b = Indexed("b", {Range(9, 6)});
  ASSERT_OK_AND_ASSIGN(auto corpus, Corpus::Open(Options({{{a, b}, 1}})));
  EXPECT_EQ(corpus->tokens(0), 15);
  EXPECT_EQ(corpus->samples(0), 3);
  std::vector<int64_t> out(5);
  ASSERT_THAT(corpus->Tokens({0, 0, 2}, out.data()), ::varuna::testing::IsOk());
  EXPECT_THAT(out, ::testing::ElementsAre(8, 9, 10, 11, 12));  // crosses from a into b
  ASSERT_THAT(corpus->Tokens({0, 0, 1}, out.data()), ::varuna::testing::IsOk());
  EXPECT_THAT(out, ::testing::ElementsAre(4, 5, 6, 7, 8));  // overlaps the next by one token
}

TEST_F(CorpusTest, BlendingIsMegatronsAndEpochsCoverEverySampleOnce) {
  const std::string a = Indexed("a", {Range(0, 41)});   // 10 samples of 4 + 1
  const std::string b = Indexed("b", {Range(0, 201)});  // 50 samples
  ASSERT_OK_AND_ASSIGN(auto corpus, Corpus::Open(Options({{{a}, 0.3}, {{b}, 0.7}})));
  StreamPosition pos = corpus->Start();
  const std::vector<SampleRef> refs = corpus->Next(&pos, 100);
  // Megatron's order: sample n goes to argmax(w x max(n, 1) - taken).
  std::vector<int> want;
  {
    std::vector<double> taken(2, 0);
    const double w[2] = {0.3, 0.7};
    for (int n = 0; n < 100; ++n) {
      const double x = std::max(n, 1);
      const int i = w[1] * x - taken[1] > w[0] * x - taken[0] ? 1 : 0;
      want.push_back(i);
      ++taken[i];
    }
  }
  std::vector<int> got;
  for (const SampleRef& r : refs) got.push_back(r.source);
  EXPECT_EQ(got, want);
  EXPECT_EQ(pos.taken, (std::vector<int64_t>{30, 70}));
  // Source 0's first epoch (its first 10 samples) covers 0..9 once; the next one too, in
  // another order.
  std::vector<int64_t> e0, e1;
  for (const SampleRef& r : refs) {
    if (r.source != 0) continue;
    (r.epoch == 0 ? e0 : e1).push_back(r.sample);
  }
  ASSERT_EQ(e0.size(), 10u);
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), 10u);
  ASSERT_GE(e1.size(), 10u);
  EXPECT_NE(std::vector<int64_t>(e1.begin(), e1.begin() + 10), e0);
}

TEST_F(CorpusTest, TheStreamIsTheSameInAnyChunksAndFromAnyPosition) {
  const std::string a = Indexed("a", {Range(0, 81)});
  const std::string b = Indexed("b", {Range(0, 33)});
  ASSERT_OK_AND_ASSIGN(auto corpus, Corpus::Open(Options({{{a}, 2}, {{b}, 1}})));
  StreamPosition whole = corpus->Start();
  const std::vector<SampleRef> all = corpus->Next(&whole, 96);
  StreamPosition chunked = corpus->Start();
  std::vector<SampleRef> parts;
  for (int step : {8, 8, 16, 4, 60}) {
    for (const SampleRef& r : corpus->Next(&chunked, step)) parts.push_back(r);
  }
  ASSERT_EQ(parts.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(parts[i].source, all[i].source);
    EXPECT_EQ(parts[i].sample, all[i].sample);
    EXPECT_EQ(parts[i].epoch, all[i].epoch);
  }
  EXPECT_EQ(chunked, whole);
  // A saved position (what a checkpoint keeps) continues the same stream.
  StreamPosition at40 = corpus->PositionAt(40);
  const std::vector<SampleRef> rest = corpus->Next(&at40, 56);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i].sample, all[40 + i].sample);
  EXPECT_EQ(at40, whole);
  // Another seed, another order.
  CorpusOptions o = Options({{{a}, 2}, {{b}, 1}});
  o.seed = 8;
  ASSERT_OK_AND_ASSIGN(auto reseeded, Corpus::Open(o));
  StreamPosition p = reseeded->Start();
  const std::vector<SampleRef> other = reseeded->Next(&p, 96);
  int same = 0;
  for (size_t i = 0; i < all.size(); ++i) same += other[i].sample == all[i].sample;
  EXPECT_LT(same, 48);
}

TEST_F(CorpusTest, ManifestsAreCheckedAgainstTheJob) {
  const std::string a = Indexed("a", {Range(0, 20)});
  const std::string b = Indexed("b", {Range(0, 20)});
  ASSERT_OK_AND_ASSIGN(int64_t none, CheckManifests({a, b}, 256, -1, ""));
  EXPECT_EQ(none, -1);  // no manifest: nothing to check, no token named
  const std::filesystem::path tok = dir_ / "tok";
  std::filesystem::create_directories(tok);
  Write((tok / "tokenizer.json").string(), "{}");
  ASSERT_OK_AND_ASSIGN(const std::string sha, TokenizerSha256(tok.string()));
  auto manifest = [&](const std::string& shard, int vocab, int eod, const std::string& hash) {
    Write(ManifestPath(shard),
          "{\"tokens\": 20, \"documents\": 1, \"vocab_size\": " + std::to_string(vocab) +
              ", \"eod_token\": " + std::to_string(eod) + ", \"tokenizer_sha256\": \"" + hash +
              "\", \"format\": \"indexed\"}");
  };
  manifest(a, 200, 0, sha);
  manifest(b, 200, 0, sha);
  ASSERT_OK_AND_ASSIGN(int64_t eod, CheckManifests({a, b}, 256, -1, tok.string()));
  EXPECT_EQ(eod, 0);
  EXPECT_THAT(CheckManifests({a, b}, 100, -1, ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "a.manifest.json: vocab_size 200 is larger than model.vocab 100"));
  EXPECT_THAT(CheckManifests({a}, 256, 5, ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "a.manifest.json: eod_token 0 but data.eod_token says 5"));
  manifest(b, 200, 1, sha);
  EXPECT_THAT(CheckManifests({a, b}, 256, -1, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, "b.manifest.json: eod_token 1 but"));
  manifest(b, 200, 0, std::string(64, '0'));
  EXPECT_THAT(
      CheckManifests({a, b}, 256, -1, tok.string()),
      StatusIs(absl::StatusCode::kInvalidArgument, "b.manifest.json: made with another tokenizer"));
  Write(ManifestPath(b), "{\"tokens\": 20}");
  EXPECT_THAT(CheckManifests({b}, 256, -1, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, "b.manifest.json: no vocab_size"));
  EXPECT_EQ(ManifestPath("/d/x.bin"), "/d/x.manifest.json");
  EXPECT_EQ(ManifestPath("/d/x"), "/d/x.manifest.json");
}

TEST_F(CorpusTest, TheSampleLogWritesAHeaderAndALinePerSample) {
  SampleLog log;
  ASSERT_THAT(log.Open((dir_ / "log").string(), 3, 2, 10), ::varuna::testing::IsOk());
  ASSERT_THAT(log.Append(11, {{0, 0, 5}, {1, 2, 7}}), ::varuna::testing::IsOk());
  std::ifstream in(dir_ / "log" / "rank-3.gen-2.jsonl");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text,
            "{\"generation\": 2, \"resumed_from\": 10}\n"
            "{\"step\": 11, \"source\": 0, \"sample\": 5, \"epoch\": 0}\n"
            "{\"step\": 11, \"source\": 1, \"sample\": 7, \"epoch\": 2}\n");
  SampleLog bad;
  Write((dir_ / "file").string(), "x");
  EXPECT_THAT(bad.Open((dir_ / "file").string(), 0, 1, 0),
              StatusIs(absl::StatusCode::kUnavailable, "data.sample_log: cannot open"));
}

}  // namespace
}  // namespace varuna
