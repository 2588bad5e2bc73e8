#include "manager/api/tokens.h"

#include <map>
#include <utility>
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
  std::map<std::string, std::pair<Role, int>> roles;  // name -> role, its first line
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
    if (words.size() < 2 || words.size() > 4) {
      return bad("expected 'NAME TOKEN [USER|-] [admin|user]'");
    }
    if (words[1].size() < 16) return bad("token is shorter than 16 characters");
    Caller caller{words[0], words.size() >= 3 && words[2] != "-" ? words[2] : "", Role::kUser};
    if (!caller.unix_user.empty() && !IsUnixUserName(caller.unix_user)) {
      return bad(absl::StrCat("'", caller.unix_user,
                              "' is not a Unix user name ([a-z_][a-z0-9_-]*, at most 32) or '-'"));
    }
    if (words.size() == 4) {
      if (words[3] == "admin") {
        caller.role = Role::kAdmin;
        t.roles_ = true;
      } else if (words[3] != "user") {
        return bad(absl::StrCat("role '", words[3], "' is neither admin nor user"));
      }
    }
    auto [named, fresh] = roles.emplace(caller.name, std::make_pair(caller.role, line_no));
    if (!fresh && named->second.first != caller.role) {
      return bad(absl::StrCat("'", caller.name, "' is ",
                              caller.role == Role::kAdmin ? "an admin" : "a user",
                              " here but not on line ", named->second.second,
                              " (every line of one name has the same role)"));
    }
    if (!t.by_token_.emplace(words[1], std::move(caller)).second) return bad("token listed twice");
  }
  if (t.by_token_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tokens file ", name, " has no tokens"));
  }
  if (!t.roles_) {
    for (auto& [token, caller] : t.by_token_) caller.role = Role::kAdmin;
  }
  return t;
}

absl::Status TokenTable::AssignTenantUids(const UidRange& range) {
  std::map<uint32_t, std::string> owner;  // uid -> tenant
  for (auto& [token, caller] : by_token_) {
    caller.uid = 0;
    if (range.empty() || !caller.unix_user.empty()) continue;
    caller.uid = TenantUid(caller.name, range);
    auto [it, fresh] = owner.emplace(caller.uid, caller.name);
    if (!fresh && it->second != caller.name) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tenants '", it->second, "' and '", caller.name, "' would share uid ", caller.uid,
          " of tenant_uids ", range.ToString(),
          ": rename one of them in the tokens file, or give tenant_uids another range"));
    }
  }
  return absl::OkStatus();
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

std::optional<TokenTable::Caller> TokenTable::ByName(const std::string& name) const {
  for (const auto& [t, caller] : by_token_) {
    if (caller.name == name) return caller;
  }
  return std::nullopt;
}

}  // namespace varuna
