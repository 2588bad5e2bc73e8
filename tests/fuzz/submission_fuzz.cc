// The submission path as varunactl runs it: a job file, --set overrides, an env_file and an
// experiment (--configs) file. Input parts: job yaml | --set lines | env file | configs file.

#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/spec/submission.h"
#include "tests/fuzz/fuzz_util.h"

// Logging off: the code under test logs every refusal, which would drown the fuzzer.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  varuna::fuzz::QuietLogging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = varuna::fuzz::Split(data, size, 4);
  const std::string dir = varuna::fuzz::ScratchDir();
  varuna::fuzz::WriteFile(dir + "/job.yaml", parts[0]);
  varuna::fuzz::WriteFile(dir + "/job.env", parts[2]);
  varuna::SubmitOptions opts;
  opts.check_files = false;
  for (absl::string_view line : absl::StrSplit(parts[1], '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "env:")) {
      opts.env.emplace_back(line.substr(4));
    } else {
      opts.sets.emplace_back(line);
    }
  }
  if (!parts[2].empty()) opts.env_file = dir + "/job.env";
  (void)varuna::PrepareSubmission(dir + "/job.yaml", opts);
  (void)varuna::ParseEnvFile(parts[2], "fuzz.env");
  (void)varuna::ParseExperimentFile(parts[3], "fuzz.configs");
  (void)varuna::SplitCommandLine(parts[3]);
  return 0;
}
