// varuna-ckpt: checkpoints from the command line.
//   varuna-ckpt list DIR           every varuna_ckpt_<step>: COMPLETE or the reason it is not
//   varuna-ckpt verify DIR [STEP]  exit 0 if STEP (default: newest) is complete and undamaged
//   varuna-ckpt export DIR [STEP] --format hf --out OUT [--dtype fp32|bf16|fp16]
//                      [--max_shard_size BYTES] [--tokenizer_dir DIR]
//                                  STEP (default: newest complete) as a Hugging Face model
// It lives beside the engine because layer files are LibTorch records (export reads them).

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/checkpoint/checkpoint_store.h"
#include "worker/models/hf.h"

namespace {

int Usage() {
  std::fprintf(
      stderr,
      "usage: varuna-ckpt list DIR\n"
      "       varuna-ckpt verify DIR [STEP]\n"
      "       varuna-ckpt export DIR [STEP] --format hf --out OUT [--dtype fp32|bf16|fp16]\n"
      "                          [--max_shard_size BYTES] [--tokenizer_dir DIR]\n");
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

int Export(const std::string& dir, const std::vector<int64_t>& steps, int argc, char** argv) {
  std::optional<int64_t> step;
  std::string format, out;
  varuna::HfExportOptions options;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](std::string* v) {
      if (i + 1 >= argc) return false;
      *v = argv[++i];
      return true;
    };
    std::string v;
    if (arg == "--format" && value(&format)) continue;
    if (arg == "--out" && value(&out)) continue;
    if (arg == "--tokenizer_dir" && value(&options.tokenizer_dir)) continue;
    if (arg == "--dtype" && value(&v)) {
      options.dtype = v == "fp32" ? "F32" : v == "bf16" ? "BF16" : v == "fp16" ? "F16" : v;
      continue;
    }
    if (arg == "--max_shard_size" && value(&v)) {
      if (!absl::SimpleAtoi(v, &options.max_shard_bytes) || options.max_shard_bytes == 0) {
        std::fprintf(stderr, "varuna-ckpt: error: --max_shard_size '%s' is not a byte count\n",
                     v.c_str());
        return 2;
      }
      continue;
    }
    int64_t s = 0;
    if (!step && absl::SimpleAtoi(arg, &s) && s >= 1) {
      step = s;
      continue;
    }
    std::fprintf(stderr, "varuna-ckpt: error: unexpected argument '%s'\n", arg.c_str());
    return Usage();
  }
  if (format != "hf" || out.empty()) {
    std::fprintf(stderr, "varuna-ckpt: error: export needs --format hf and --out OUT\n");
    return 2;
  }
  if (!step) {
    for (int64_t s : steps) {  // newest first
      if (varuna::VerifyCheckpoint(varuna::CheckpointPath(dir, s), /*checksums=*/false).ok()) {
        step = s;
        break;
      }
    }
    if (!step) {
      std::fprintf(stderr, "varuna-ckpt: error: no complete checkpoint in %s\n", dir.c_str());
      return 1;
    }
  }
  const std::string path = varuna::CheckpointPath(dir, *step);
  absl::StatusOr<varuna::HfExportStats> st = varuna::ExportHf(path, out, options);
  if (!st.ok()) {
    std::fprintf(stderr, "varuna-ckpt: error: %s\n", std::string(st.status().message()).c_str());
    return 1;
  }
  std::printf(
      "exported step %lld to %s: %d tensors, %.1f MB in %d shard%s, largest layer %.1f MB"
      "%s\n",
      static_cast<long long>(st->step), out.c_str(), st->tensors, st->bytes / 1e6, st->shards,
      st->shards == 1 ? "" : "s", st->largest_layer_bytes / 1e6,
      st->tokenizer_files > 0 ? absl::StrCat(", ", st->tokenizer_files, " tokenizer files").c_str()
                              : "");
  if (st->tokenizer_files > 0 && !st->tokenizer_from_checkpoint.empty()) {
    std::fprintf(stderr,
                 "varuna-ckpt: warning: the tokenizer files came from %s, the directory the "
                 "checkpoint names (the job's word); give --tokenizer_dir to choose it\n",
                 st->tokenizer_from_checkpoint.c_str());
  }
  return 0;
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
  if (verb == "export") return Export(dir, steps, argc, argv);
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
