// varuna-ckpt: inspect checkpoints without LibTorch.
//   varuna-ckpt list DIR           every varuna_ckpt_<step>: COMPLETE or the reason it is not
//   varuna-ckpt verify DIR [STEP]  exit 0 if STEP (default: newest) is complete and undamaged

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/numbers.h"
#include "common/base/logging.h"
#include "common/checkpoint/checkpoint_store.h"

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: varuna-ckpt list DIR\n"
               "       varuna-ckpt verify DIR [STEP]\n");
  return 2;
}

uint64_t DirBytes(const std::string& path) {
  uint64_t total = 0;
  std::error_code ec;
  // increment(ec), not ++: an unreadable subdirectory must not throw.
  for (std::filesystem::recursive_directory_iterator it(path, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  varuna::InitLogging(argv[0]);
  if (argc < 3) return Usage();
  const std::string verb = argv[1], dir = argv[2];
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    std::fprintf(stderr, "varuna-ckpt: error: %s is not a directory\n", dir.c_str());
    return 1;
  }
  const auto steps = varuna::ListCheckpointSteps(dir);
  if (verb == "list" && argc == 3) {
    std::printf("%-10s %-12s %s\n", "STEP", "SIZE_MB", "STATUS");
    for (int64_t step : steps) {
      const std::string path = varuna::CheckpointPath(dir, step);
      absl::Status st = varuna::VerifyCheckpoint(path);
      std::printf("%-10lld %-12.1f %s\n", static_cast<long long>(step), DirBytes(path) / 1e6,
                  st.ok() ? "COMPLETE" : std::string(st.message()).c_str());
    }
    return 0;
  }
  if (verb == "verify" && (argc == 3 || argc == 4)) {
    int64_t step = steps.empty() ? -1 : steps.front();
    if (argc == 4 && !absl::SimpleAtoi(argv[3], &step)) return Usage();
    if (step < 0) {
      std::fprintf(stderr, "varuna-ckpt: error: no checkpoint in %s\n", dir.c_str());
      return 1;
    }
    const std::string path = varuna::CheckpointPath(dir, step);
    absl::Status st = varuna::VerifyCheckpoint(path);
    if (!st.ok()) {
      std::fprintf(stderr, "varuna-ckpt: %s: %s\n", path.c_str(),
                   std::string(st.message()).c_str());
      return 1;
    }
    std::printf("%s: COMPLETE\n", path.c_str());
    return 0;
  }
  return Usage();
}
