#include "manager/tokens.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/safe_file.h"

namespace varuna {
namespace {

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<TokenTable> TokenTable::Parse(const std::string& text, const std::string& name) {
  TokenTable t;
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens file ", name, " line ", line_no, ": ", why));
    };
    if (words.size() != 2) return bad("expected 'NAME TOKEN'");
    if (words[1].size() < 16) return bad("token is shorter than 16 characters");
    if (!t.by_token_.emplace(words[1], words[0]).second) return bad("token listed twice");
  }
  if (t.by_token_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tokens file ", name, " has no tokens"));
  }
  return t;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  auto text = ReadRegularFile(path, 1 << 20, "tokens file");
  if (!text.ok()) return text.status();
  return Parse(*text, path);
}

std::optional<std::string> TokenTable::Lookup(const std::string& token) const {
  std::optional<std::string> found;
  for (const auto& [t, name] : by_token_) {
    if (ConstantTimeEqual(t, token)) found = name;
  }
  return found;
}

std::string BearerToken(const std::string& header) {
  if (header.size() < 7 || !absl::EqualsIgnoreCase(header.substr(0, 7), "bearer ")) return "";
  return std::string(absl::StripAsciiWhitespace(header.substr(7)));
}

}  // namespace varuna
