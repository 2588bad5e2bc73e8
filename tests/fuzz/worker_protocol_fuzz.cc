// The worker <-> agent protocol's codec (common/launch/worker_protocol.h). Input: lines, each
// parsed as a worker's event and as an agent's command. Besides never crashing: whatever
// parses serializes, and what that gives parses back to the same line (no event or command
// the reader accepts is one the writer cannot say).

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/launch/worker_protocol.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

template <typename Parse, typename Serialize>
void CheckRoundTrip(absl::string_view line, Parse parse, Serialize serialize) {
  auto parsed = parse(line);
  if (!parsed.ok()) return;
  auto once = serialize(*parsed);
  if (!once.ok()) std::abort();  // accepted by the reader, refused by the writer
  auto again = parse(*once);
  if (!again.ok()) std::abort();
  auto twice = serialize(*again);
  if (!twice.ok() || *twice != *once) std::abort();  // not canonical
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  varuna::fuzz::QuietLogging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  for (absl::string_view line : absl::StrSplit(input, '\n')) {
    CheckRoundTrip(line, varuna::ParseWorkerEvent, varuna::SerializeWorkerEvent);
    CheckRoundTrip(line, varuna::ParseAgentCommand, varuna::SerializeAgentCommand);
  }
  return 0;
}
