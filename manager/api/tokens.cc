#include "manager/api/tokens.h"

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

bool IsUnixUserName(const std::string& s) {
  if (s.empty() || s.size() > 32) return false;
  if (!(absl::ascii_islower(s[0]) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '_' || c == '-')) return false;
  }
  return true;
}

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
    if (words.size() != 2 && words.size() != 3) return bad("expected 'NAME TOKEN [USER]'");
    if (words[1].size() < 16) return bad("token is shorter than 16 characters");
    Caller caller{words[0], words.size() == 3 ? words[2] : ""};
    if (words.size() == 3 && !IsUnixUserName(caller.unix_user)) {
      return bad(absl::StrCat("'", caller.unix_user,
                              "' is not a Unix user name ([a-z_][a-z0-9_-]*, at most 32)"));
    }
    if (!t.by_token_.emplace(words[1], std::move(caller)).second) return bad("token listed twice");
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

std::optional<TokenTable::Caller> TokenTable::Find(const std::string& token) const {
  std::optional<Caller> found;
  for (const auto& [t, caller] : by_token_) {
    if (ConstantTimeEqual(t, token)) found = caller;
  }
  return found;
}

}  // namespace varuna
