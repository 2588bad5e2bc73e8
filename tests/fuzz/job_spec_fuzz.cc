// The job spec parser: any bytes give a spec or an error, never a crash or an exception.

#include <cstdint>
#include <string>

#include "common/spec/job_spec.h"
#include "tests/fuzz/fuzz_util.h"

// Logging off: the code under test logs every refusal, which would drown the fuzzer.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  varuna::fuzz::QuietLogging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = varuna::ParseJobSpec(text);
  if (spec.ok()) {
    (void)spec->ValidateShape();
    (void)spec->Validate();
  }
  return 0;
}
