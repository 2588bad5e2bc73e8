// AppendJsonString: what a safetensors header or a Hugging Face index may hold in a name.

#include "common/base/json_text.h"

#include "gtest/gtest.h"

namespace varuna {
namespace {

TEST(JsonTextTest, EscapesQuotesBackslashesAndControlCharacters) {
  std::string out;
  AppendJsonString(&out, std::string("a\"b\\c\n\x01\x1f\x7f\xc3\xa9", 11));
  EXPECT_EQ(out, "\"a\\\"b\\\\c\\u000a\\u0001\\u001f\x7f\xc3\xa9\"");
  out.clear();
  AppendJsonString(&out, "");
  EXPECT_EQ(out, "\"\"");
}

}  // namespace
}  // namespace varuna
