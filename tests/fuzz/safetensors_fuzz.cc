// safetensors files (common/checkpoint/safetensors.h): the input is the whole file. Opening
// must refuse a header that lies (sizes, offsets, gaps, overlaps, dtypes, nesting) with a
// status, and every tensor an accepted header lists must read within the file: ASan would
// catch an out-of-range read, the size check below a wrong span. Then the same file as a
// Hugging Face directory's model.safetensors (HfWeights).

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/checkpoint/hf_weights.h"
#include "common/checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  varuna::fuzz::QuietLogging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = varuna::fuzz::ScratchDir() + "/hf";
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  varuna::fuzz::WriteFile(dir + "/model.safetensors", bytes);
  auto r = varuna::SafetensorsReader::Open(dir + "/model.safetensors");
  if (r.ok()) {
    uint64_t covered = 0;
    for (const varuna::SafetensorsEntry& e : r->tensors()) {
      if (e.end > size || e.begin > e.end) __builtin_trap();  // accepted but out of range
      std::vector<char> buf(e.bytes());
      if (!r->Read(e, buf.data()).ok()) __builtin_trap();
      if (!buf.empty() && std::memcmp(buf.data(), data + e.begin, buf.size()) != 0) {
        __builtin_trap();
      }
      covered += e.bytes();
    }
    if (covered + (r->tensors().empty() ? 0 : r->tensors().front().begin) > size) __builtin_trap();
  }
  auto w = varuna::HfWeights::Open(dir);
  if (w.ok()) (void)w->Names();
  return 0;
}
