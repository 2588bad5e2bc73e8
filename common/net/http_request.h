#pragma once

// The request side of HTTP/1.1 as varuna's HTTP server reads it (Note [HTTP server] in
// common/net/http_server.cc): a GET request head, bounded and parsed without allocation
// surprises, with the path and query percent-decoded. Pure functions, fuzzed by
// tests/fuzz/http_request_fuzz.cc.

#include <cstddef>
#include <map>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace varuna {

// Limits of a request head: anything over them is refused before it is parsed.
inline constexpr size_t kMaxRequestHeadBytes = 8192;
inline constexpr size_t kMaxRequestHeaders = 64;

struct HttpRequestHead {
  std::string method;                          // "GET", "HEAD", ...
  std::string path;                            // percent-decoded, starts with '/'
  std::map<std::string, std::string> params;   // the query, decoded; the first of a repeated key
  std::map<std::string, std::string> headers;  // lower-case names; the first of a repeated name
  std::string Header(const std::string& lower_name) const;
};

// Where the head ends in `data` (the offset just past "\r\n\r\n"), or 0 if it has not ended
// yet. A lone "\n\n" also ends it (lenient, like every common server).
size_t RequestHeadEnd(absl::string_view data);

// Parses a complete head (as delimited by RequestHeadEnd). InvalidArgument names what is
// wrong: a malformed request line, a target that is not an origin path, bytes that a path
// cannot hold once decoded (NUL, control characters), a header line without a colon, too
// many headers, an HTTP version other than 1.0 / 1.1.
absl::StatusOr<HttpRequestHead> ParseRequestHead(absl::string_view head);

// The token of an "Authorization: Bearer TOKEN" value (the scheme case-insensitive); "" if
// the value is not one.
std::string BearerToken(absl::string_view authorization);

}  // namespace varuna
