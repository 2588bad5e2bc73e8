#include "common/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/checkpoint/hf_weights.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

namespace fs = std::filesystem;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

// Made by tests/e2e/lib/hf_models.py (golden), an independent Python writer of the format.
const char* kGolden = VARUNA_SOURCE_DIR "/tests/common/checkpoint/testdata/golden.safetensors";

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("safetensors_test_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // A file with header `json` and `data` bytes after it.
  std::string WithHeader(const std::string& json, const std::string& data = "") {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    return Write("t.safetensors", out + json + data);
  }
  fs::path dir_;
};

TEST_F(SafetensorsTest, ReadsTheGoldenFile) {
  ASSERT_OK_AND_ASSIGN(SafetensorsReader r, SafetensorsReader::Open(kGolden));
  ASSERT_EQ(r.tensors().size(), 5u);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  const SafetensorsEntry* a = r.Find("a.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, "F32");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  float va[6];
  ASSERT_THAT(r.Read(*a, va), IsOk());
  EXPECT_EQ(va[0], 0.5f);
  EXPECT_EQ(va[1], -1.25f);
  EXPECT_EQ(va[5], 65504.0f);
  const SafetensorsEntry* b = r.Find("b.bf16");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, "BF16");
  uint16_t vb[4];
  ASSERT_THAT(r.Read(*b, vb), IsOk());
  EXPECT_EQ(vb[0], 0x3f80);  // bf16 1.0
  EXPECT_EQ(vb[1], 0xc020);  // bf16 -2.5
  const SafetensorsEntry* c = r.Find("c.f16");
  ASSERT_NE(c, nullptr);
  uint16_t vc[4];
  ASSERT_THAT(r.Read(*c, vc), IsOk());
  EXPECT_EQ(vc[0], 0x3c00);  // fp16 1.0
  EXPECT_EQ(vc[3], 0x7bff);  // fp16 65504
  EXPECT_TRUE(r.Find("d.scalar")->shape.empty());
  EXPECT_EQ(r.Find("e.empty")->bytes(), 0u);
}

TEST_F(SafetensorsTest, WriterReproducesTheGoldenFileByteForByte) {
  ASSERT_OK_AND_ASSIGN(SafetensorsReader golden, SafetensorsReader::Open(kGolden));
  std::vector<SafetensorsEntry> entries = golden.tensors();
  const std::string out = (dir_ / "mine.safetensors").string();
  ASSERT_OK_AND_ASSIGN(SafetensorsWriter w,
                       SafetensorsWriter::Create(out, entries, golden.metadata()));
  for (const SafetensorsEntry& e : golden.tensors()) {
    std::string bytes(e.bytes(), '\0');
    ASSERT_THAT(golden.Read(e, bytes.data()), IsOk());
    ASSERT_THAT(w.Append(e.name, bytes.data(), bytes.size()), IsOk());
  }
  ASSERT_THAT(w.Finish(), IsOk());
  EXPECT_EQ(ReadAll(out), ReadAll(kGolden));
}

// (Note [Writes at disk speed] in common/checkpoint/safetensors.cc) The CRC-32 and size the writer
// reports, taken as the bytes go out in 8 MB pieces, are the file's own (what VerifyCheckpoint
// recomputes from disk), for a tensor that spans several pieces and is appended in uneven parts.
// Two writers of one path in one process (ranks as threads) use distinct temporary names.
TEST_F(SafetensorsTest, WriterDigestIsTheFilesOwn) {
  std::vector<SafetensorsEntry> e(2);
  e[0].name = "big";
  e[0].dtype = "F32";
  e[0].shape = {5, 1 << 20};  // 20 MB: three pieces
  e[1].name = "step";
  e[1].dtype = "I64";
  std::string big(20 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 12));
  const int64_t step = 42;
  const std::string out = (dir_ / "layer.safetensors").string();
  ASSERT_OK_AND_ASSIGN(SafetensorsWriter w, SafetensorsWriter::Create(out, e, {}, /*writer=*/3));
  ASSERT_OK_AND_ASSIGN(SafetensorsWriter other,
                       SafetensorsWriter::Create(out, e, {}, /*writer=*/4));
  ASSERT_THAT(w.Append("big", big.data(), 7 << 20), IsOk());
  ASSERT_THAT(w.Append("big", big.data() + (7 << 20), big.size() - (7 << 20)), IsOk());
  ASSERT_THAT(w.Append("step", &step, sizeof step), IsOk());
  ASSERT_THAT(w.Finish(), IsOk());
  const FileDigest want = DigestBytes("layer.safetensors", ReadAll(out));
  EXPECT_EQ(w.size(), want.size);
  EXPECT_EQ(w.crc32(), want.crc32);
  ASSERT_OK_AND_ASSIGN(SafetensorsReader r, SafetensorsReader::Open(out));
  std::string back(r.tensors()[0].bytes(), '\0');
  ASSERT_THAT(r.Read(r.tensors()[0], back.data()), IsOk());
  EXPECT_TRUE(back == big);
}

// Issue 47: export followed a link planted at its temporary shard name and overwrote the
// file it pointed at (as root). The writer removes whatever sits at its temporary name and
// creates the file exclusively, never following a link (the write lands beside the target).
TEST_F(SafetensorsTest, WriterNeverFollowsALinkAtItsTemporaryName) {
  const std::string victim = Write("victim", "root's own bytes");
  const std::string out = (dir_ / "model.safetensors").string();
  const std::string tmp = absl::StrCat(out, ".tmp.", getpid(), ".0");
  fs::create_symlink(victim, tmp);
  std::vector<SafetensorsEntry> e(1);
  e[0].name = "w";
  e[0].dtype = "F32";
  e[0].shape = {2};
  const float w[2] = {1.5f, -2.0f};
  ASSERT_OK_AND_ASSIGN(SafetensorsWriter writer, SafetensorsWriter::Create(out, e, {}));
  ASSERT_THAT(writer.Append("w", w, sizeof w), IsOk());
  ASSERT_THAT(writer.Finish(), IsOk());
  EXPECT_EQ(ReadAll(victim), "root's own bytes");
  EXPECT_FALSE(fs::is_symlink(out));
  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp)));
  ASSERT_OK_AND_ASSIGN(SafetensorsReader r, SafetensorsReader::Open(out));
  float back[2] = {0, 0};
  ASSERT_THAT(r.Read(r.tensors()[0], back), IsOk());
  EXPECT_EQ(back[1], -2.0f);
}

TEST_F(SafetensorsTest, WriterRefusesMisuse) {
  std::vector<SafetensorsEntry> e(2);
  e[0].name = "x";
  e[0].dtype = "F32";
  e[0].shape = {2};
  e[1].name = "x";
  e[1].dtype = "F32";
  EXPECT_THAT(SafetensorsWriter::Create((dir_ / "a").string(), e, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "repeated"));
  e[1].name = "y";
  e[1].dtype = "F31";
  EXPECT_THAT(SafetensorsWriter::Create((dir_ / "a").string(), e, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "F31"));
  e[1].dtype = "BF16";
  ASSERT_OK_AND_ASSIGN(SafetensorsWriter w,
                       SafetensorsWriter::Create((dir_ / "a").string(), e, {}));
  float two[2] = {1, 2};
  EXPECT_THAT(w.Append("y", two, 2), StatusIs(absl::StatusCode::kFailedPrecondition, "order"));
  ASSERT_THAT(w.Append("x", two, 4), IsOk());  // a tensor may come in parts
  EXPECT_THAT(w.Append("x", two, 8),
              StatusIs(absl::StatusCode::kInvalidArgument, "gets 12 bytes; its header says 8"));
  ASSERT_THAT(w.Append("x", two + 1, 4), IsOk());
  EXPECT_THAT(w.Finish(), StatusIs(absl::StatusCode::kFailedPrecondition, "never written"));
  EXPECT_FALSE(fs::exists(dir_ / "a"));  // nothing half-written is left under the name
}

// Every lie a header can tell is DataLoss naming it; nothing is read out of range.
TEST_F(SafetensorsTest, HeadersThatLieAreRefused) {
  const std::string four(4, '\0');
  struct Case {
    std::string json, data, want;
  };
  const std::vector<Case> cases = {
      {"[1, 2]", "", "not a JSON object"},
      {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 8]}}", four,
       "outside the 4-byte data buffer"},
      {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", four, "need 8"},
      {"{\"a\": {\"dtype\": \"Q7\", \"shape\": [1], \"data_offsets\": [0, 4]}}", four,
       "not a safetensors dtype"},
      {"{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", four,
       "non-negative integer"},
      {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296], "
       "\"data_offsets\": [0, 4]}}",
       four, "too large"},
      {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
       "\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
       four, "gap or an overlap"},
      {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", four + four,
       "cover 4 of the 8"},
      {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", four, "outside"},
      {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", four, "lacks data_offsets"},
      {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], \"x\": 1}}", four,
       "unknown field"},
      {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
       "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
       four, "twice"},
      {"{\"__metadata__\": {\"k\": [1]}}", "", "must be a string"},
      {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 1.5]}}", four,
       "non-negative integer"},
      {"{\"a\": " + std::string(60, '[') + std::string(60, ']') + "}", "", "not an object"},
      {"{\"a\": {", "", "a.safetensors"},  // malformed JSON: named by the file
  };
  for (const Case& c : cases) {
    const std::string path = WithHeader(c.json, c.data);
    auto r = SafetensorsReader::Open(path);
    EXPECT_FALSE(r.ok()) << c.json;
    if (c.want != "a.safetensors") {
      EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kDataLoss, c.want)) << c.json;
    }
  }
  // The length prefix itself: past the file, past the limit, a file too short for it.
  std::string huge(8, '\xff');
  EXPECT_THAT(SafetensorsReader::Open(Write("h", huge)).status(),
              StatusIs(absl::StatusCode::kDataLoss, "the limit is"));
  std::string longer(8, '\0');
  longer[0] = 100;
  EXPECT_THAT(SafetensorsReader::Open(Write("l", longer + "{}")).status(),
              StatusIs(absl::StatusCode::kDataLoss, "claims 100 bytes"));
  EXPECT_THAT(SafetensorsReader::Open(Write("s", "abc")).status(),
              StatusIs(absl::StatusCode::kDataLoss, "shorter"));
}

TEST_F(SafetensorsTest, ShardIndexThatLiesIsRefused) {
  fs::copy_file(kGolden, dir_ / "model-00001-of-00001.safetensors");
  auto index = [&](const std::string& map) {
    std::ofstream(dir_ / "model.safetensors.index.json")
        << "{\"metadata\": {\"total_size\": 44}, \"weight_map\": {" << map << "}}";
  };
  const std::string all =
      "\"a.f32\": \"model-00001-of-00001.safetensors\", \"b.bf16\": "
      "\"model-00001-of-00001.safetensors\", \"c.f16\": \"model-00001-of-00001.safetensors\", "
      "\"d.scalar\": \"model-00001-of-00001.safetensors\", \"e.empty\": "
      "\"model-00001-of-00001.safetensors\"";
  index(all);
  ASSERT_OK_AND_ASSIGN(HfWeights w, HfWeights::Open(dir_.string()));
  const SafetensorsReader* shard = nullptr;
  ASSERT_NE(w.Find("b.bf16", &shard), nullptr);
  EXPECT_EQ(w.Names().size(), 5u);
  index(all + ", \"z\": \"model-00001-of-00001.safetensors\"");
  EXPECT_THAT(HfWeights::Open(dir_.string()).status(),
              StatusIs(absl::StatusCode::kDataLoss, "'z' is mapped to"));
  index("\"a.f32\": \"../etc/passwd\"");
  EXPECT_THAT(HfWeights::Open(dir_.string()).status(),
              StatusIs(absl::StatusCode::kDataLoss, "not a file of the directory"));
  index("\"a.f32\": \"model-00001-of-00001.safetensors\"");
  EXPECT_THAT(HfWeights::Open(dir_.string()).status(),
              StatusIs(absl::StatusCode::kDataLoss, "the index says nothing"));
  EXPECT_THAT(HfIndexJson(44, {{"a", "f"}}), ::testing::HasSubstr("\"total_size\": 44"));
}

// Note [Files of a model directory] in common/checkpoint/hf_weights.cc: links are followed
// within the directory, or within a cached repository for a snapshot, never out of it.
TEST_F(SafetensorsTest, ModelFilesLinkOnlyWithinTheirDirectoryOrCachedRepository) {
  // Hugging Face's cache: snapshots/REV/model.safetensors -> ../../blobs/SHA.
  const fs::path repo = dir_ / "models--org--tiny";
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots" / "abc");
  fs::copy_file(kGolden, repo / "blobs" / "f00d");
  fs::create_symlink("../../blobs/f00d", repo / "snapshots" / "abc" / "model.safetensors");
  ASSERT_OK_AND_ASSIGN(HfWeights cached, HfWeights::Open((repo / "snapshots" / "abc").string()));
  EXPECT_EQ(cached.Names().size(), 5u);

  // A plain directory whose shard links elsewhere (a secret of whoever runs the tool).
  const fs::path plain = dir_ / "plain", secret = dir_ / "secret";
  fs::create_directories(plain);
  fs::copy_file(kGolden, secret);
  fs::create_symlink(secret, plain / "model.safetensors");
  EXPECT_THAT(HfWeights::Open(plain.string()).status(),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       "'model.safetensors' of " + plain.string() + " links outside"));
  // A link inside the directory is fine.
  fs::remove(plain / "model.safetensors");
  fs::copy_file(kGolden, plain / "real.safetensors");
  fs::create_symlink("real.safetensors", plain / "model.safetensors");
  EXPECT_THAT(HfWeights::Open(plain.string()).status(), IsOk());
  // The same rule for any file a tool copies out of one (a tokenizer's).
  fs::create_symlink("/etc/shadow", plain / "tokenizer.json");
  EXPECT_THAT(OpenModelFile(plain.string(), "tokenizer.json", "tokenizer file").status(),
              StatusIs(absl::StatusCode::kPermissionDenied, "links outside"));
  EXPECT_THAT(OpenModelFile(plain.string(), "../secret", "tokenizer file").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a file of the directory"));
}

}  // namespace
}  // namespace varuna
