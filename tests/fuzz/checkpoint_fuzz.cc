// Checkpoint metadata and verification: common.json, a writer's manifest and a layer file as
// the input gives them (parts: common.json | manifest.rank0.json | layers/<name>.pt bytes |
// name of the layer file). Verify, list, resolve and read must refuse or accept, never crash
// or hang (a 10 s timeout per input in bench/fuzz.sh). Paths are kept inside by construction
// (OpenRegularFileBeneath); checkpoint_store_test holds that with '..', absolute paths and
// links.

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/checkpoint/checkpoint_store.h"
#include "tests/fuzz/fuzz_util.h"

// Logging off: the code under test logs every refusal, which would drown the fuzzer.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  varuna::fuzz::QuietLogging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = varuna::fuzz::Split(data, size, 4);
  const std::string dir = varuna::fuzz::ScratchDir() + "/ckpt";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  const std::string ck = varuna::CheckpointPath(dir, 1);
  varuna::fuzz::WriteFile(ck + "/common.json", parts[0]);
  varuna::fuzz::WriteFile(ck + "/manifest.rank0.json", parts[1]);
  varuna::fuzz::WriteFile(ck + "/complete.rank0", "");
  std::string layer = parts[3].empty() ? "head" : parts[3].substr(0, 64);
  if (layer.find('/') != std::string::npos || layer.find('\0') != std::string::npos ||
      layer == "." || layer == "..") {
    layer = "head";
  }
  varuna::fuzz::WriteFile(ck + "/layers/" + layer + ".pt", parts[2]);
  (void)varuna::ReadCheckpointCommon(ck);
  (void)varuna::VerifyCheckpoint(ck, true);
  (void)varuna::VerifyCheckpoint(ck, false);
  const std::vector<std::string> layers = {"embed", "block0", "head"};
  (void)varuna::VerifyCheckpoint(ck, true, &layers);
  (void)varuna::ResolveResumeStep(dir, std::nullopt);
  (void)varuna::ResolveResumeStep(dir, 1);
  (void)varuna::PruneCheckpoints(dir, 1);
  return 0;
}
