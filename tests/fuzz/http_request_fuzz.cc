// The HTTP request path (common/net/http_request.h) as every daemon's HTTP port reads it from
// whoever connects (Note [HTTP server] in common/net/http_server.cc). An input is the bytes a
// peer sends. Besides never crashing: a head the parser accepts ends where RequestHeadEnd says,
// holds a path that starts with '/' and has no control characters once decoded, at most
// kMaxRequestHeaders headers, and lower-case header names.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "common/net/http_request.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  varuna::fuzz::QuietLogging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t end = varuna::RequestHeadEnd(input);
  if (end > input.size()) std::abort();
  // The server parses only a delimited head; the parser must also survive anything else.
  for (absl::string_view head : {input.substr(0, end), input}) {
    auto r = varuna::ParseRequestHead(head);
    if (!r.ok()) continue;
    if (r->path.empty() || r->path[0] != '/') std::abort();
    for (char c : r->path) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) std::abort();
    }
    if (r->headers.size() > varuna::kMaxRequestHeaders) std::abort();
    for (const auto& [name, value] : r->headers) {
      for (char c : name) {
        if (c >= 'A' && c <= 'Z') std::abort();
      }
      (void)varuna::BearerToken(value);
    }
  }
  return 0;
}
