// SHA-256 against FIPS 180-4's examples, across block boundaries, and of a file.

#include "common/base/sha256.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace varuna {
namespace {

std::string Hex(const std::string& s) {
  Sha256 h;
  h.Update(s);
  return h.HexDigest();
}

TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, PiecesHashLikeTheWhole) {
  std::string text;
  for (int i = 0; i < 300; ++i) text.push_back(static_cast<char>(i * 7));
  for (size_t cut : {0, 1, 55, 56, 63, 64, 65, 128, 299}) {
    Sha256 h;
    h.Update(text.substr(0, cut));
    h.Update(text.substr(cut));
    EXPECT_EQ(h.HexDigest(), Hex(text)) << cut;
  }
}

TEST(Sha256Test, OfAFile) {
  const std::string path = std::filesystem::temp_directory_path() / "sha256_test.txt";
  std::ofstream(path) << "abc";
  auto h = Sha256OfFile(path);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*h, Hex("abc"));
  std::filesystem::remove(path);
  EXPECT_FALSE(Sha256OfFile(path).ok());
}

}  // namespace
}  // namespace varuna
