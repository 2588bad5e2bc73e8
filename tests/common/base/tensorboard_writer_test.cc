// Event files as TensorBoard reads them: CRC-32C against its published check value, every
// record's framing and checksums, the first events (file version, session start), a scalar's
// tag and value, and a directory that cannot be made. TensorBoard's own reader reads these
// files in tests/e2e/validation_e2e.py.

#include "common/base/tensorboard_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace varuna {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> ReadRecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  std::vector<std::string> out;
  size_t at = 0;
  auto u32 = [&](size_t i) {
    uint32_t v;
    std::memcpy(&v, data.data() + i, 4);
    return v;
  };
  while (at < data.size()) {
    EXPECT_GE(data.size() - at, 16u);
    uint64_t len;
    std::memcpy(&len, data.data() + at, 8);
    EXPECT_EQ(u32(at + 8), MaskedCrc32c(absl::string_view(data.data() + at, 8)));
    const std::string payload = data.substr(at + 12, len);
    EXPECT_EQ(u32(at + 12 + len), MaskedCrc32c(payload));
    out.push_back(payload);
    at += 16 + len;
  }
  return out;
}

TEST(TensorBoardWriterTest, Crc32cCheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // CRC-32C's check value (RFC 3720, B.4)
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(TensorBoardWriterTest, RecordsAreFramedAndHoldTheEvents) {
  const fs::path dir = fs::path(testing::TempDir()) / "tb_records" / "nested";
  fs::remove_all(dir.parent_path());
  auto w = TensorBoardWriter::Open(dir.string(), 7);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_NE((*w)->path().find("events.out.tfevents."), std::string::npos);
  ASSERT_TRUE((*w)->Scalar("train/loss", 7, 2.5).ok());
  ASSERT_TRUE((*w)->Text("generation", 7, "1x2 because node lost").ok());
  ASSERT_TRUE((*w)->SessionStart(5).ok());
  ASSERT_TRUE((*w)->Flush().ok());
  const std::vector<std::string> records = ReadRecords((*w)->path());
  ASSERT_EQ(records.size(), 5u);
  EXPECT_EQ(records[4].substr(9), std::string("\x10\x05\x3a\x02\x08\x01", 6));
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  // Event.step = 7 (field 2, varint) right after the 9-byte wall time.
  EXPECT_EQ(records[1].substr(9, 2), std::string("\x10\x07", 2));
  EXPECT_EQ(records[1].substr(11), std::string("\x3a\x02\x08\x01", 4));  // SessionLog START
  EXPECT_NE(records[2].find("train/loss"), std::string::npos);
  const float want = 2.5f;
  EXPECT_NE(records[2].find(std::string("\x15", 1) +
                            std::string(reinterpret_cast<const char*>(&want), 4)),
            std::string::npos);
  EXPECT_NE(records[3].find("1x2 because node lost"), std::string::npos);
  EXPECT_NE(records[3].find("text"), std::string::npos);
}

TEST(TensorBoardWriterTest, UncreatableDirectoryIsAnError) {
  const fs::path file = fs::path(testing::TempDir()) / "tb_plain_file";
  std::ofstream(file.string()) << "x";
  auto w = TensorBoardWriter::Open((file / "sub").string(), 1);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(std::string(w.status().message()).find("tensorboard_dir"), std::string::npos)
      << w.status();
}

}  // namespace
}  // namespace varuna
