#include "common/net/http_request.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace varuna {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX-decodes `in` ('+' is a space in a query). A '%' not followed by two hex digits stays.
std::string PercentDecode(absl::string_view in, bool plus_is_space) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%' && i + 2 < in.size()) {
      const int hi = HexValue(in[i + 1]), lo = HexValue(in[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += (plus_is_space && in[i] == '+') ? ' ' : in[i];
  }
  return out;
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f || absl::StrContains("()<>@,;:\\\"/[]?={}", c)) return false;
  }
  return true;
}

}  // namespace

std::string HttpRequestHead::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

size_t RequestHeadEnd(absl::string_view data) {
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    if (data[i] != '\n') continue;
    if (data[i + 1] == '\n') return i + 2;
    if (data[i + 1] == '\r' && i + 2 < data.size() && data[i + 2] == '\n') return i + 3;
  }
  return 0;
}

absl::StatusOr<HttpRequestHead> ParseRequestHead(absl::string_view head) {
  if (head.size() > kMaxRequestHeadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request head over ", kMaxRequestHeadBytes, " bytes"));
  }
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  for (auto& l : lines) l = absl::StripSuffix(l, "\r");
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return absl::InvalidArgumentError("empty request");
  std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3) {
    return absl::InvalidArgumentError("request line is not 'METHOD TARGET HTTP/1.x'");
  }
  HttpRequestHead req;
  if (!IsToken(parts[0])) return absl::InvalidArgumentError("bad method");
  req.method = std::string(parts[0]);
  if (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") {
    return absl::InvalidArgumentError("only HTTP/1.0 and HTTP/1.1 are served");
  }
  const absl::string_view target = parts[1];
  if (target.empty() || target[0] != '/') {
    return absl::InvalidArgumentError("the request target must be a path starting with '/'");
  }
  const size_t q = target.find('?');
  req.path = PercentDecode(target.substr(0, q), /*plus_is_space=*/false);
  for (char c : req.path) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      return absl::InvalidArgumentError("the path holds a control character once decoded");
    }
  }
  if (q != absl::string_view::npos) {
    for (absl::string_view kv : absl::StrSplit(target.substr(q + 1), '&', absl::SkipEmpty())) {
      const size_t eq = kv.find('=');
      std::string key = PercentDecode(kv.substr(0, eq), true);
      std::string value =
          eq == absl::string_view::npos ? std::string() : PercentDecode(kv.substr(eq + 1), true);
      req.params.emplace(std::move(key), std::move(value));
    }
  }
  if (lines.size() - 1 > kMaxRequestHeaders) {
    return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxRequestHeaders, " headers"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos || !IsToken(lines[i].substr(0, colon))) {
      return absl::InvalidArgumentError(absl::StrCat("header line ", i, " is not 'Name: value'"));
    }
    std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    absl::string_view value = absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
    req.headers.emplace(std::move(name), std::string(value));
  }
  return req;
}

std::string BearerToken(absl::string_view authorization) {
  authorization = absl::StripAsciiWhitespace(authorization);
  if (authorization.size() < 7 || !absl::EqualsIgnoreCase(authorization.substr(0, 7), "bearer ")) {
    return "";
  }
  return std::string(absl::StripAsciiWhitespace(authorization.substr(7)));
}

}  // namespace varuna
