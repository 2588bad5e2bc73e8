// The stage map and the worker's launcher arguments and environment. Input parts:
// stage_to_rank_map | worker argv (one per line) | environment (KEY=VALUE lines) | job yaml.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/launch/launch_args.h"
#include "common/pipeline/stage_map.h"
#include "tests/fuzz/fuzz_util.h"

// Logging off: the code under test logs every refusal, which would drown the fuzzer.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  varuna::fuzz::QuietLogging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = varuna::fuzz::Split(data, size, 4);
  auto map = varuna::StageMap::Parse(parts[0]);
  if (map.ok()) {
    (void)map->ValidateWorldSize(map->world_size());
    (void)map->ToString();
    for (int r = 0; r < map->world_size() && r < 64; ++r) {
      (void)map->StageOf(r);
      (void)map->ReplicaOf(r);
    }
  }
  std::vector<std::string> argv = {"varuna-worker"};
  for (absl::string_view a : absl::StrSplit(parts[1], '\n', absl::SkipEmpty())) {
    argv.emplace_back(a);
  }
  std::map<std::string, std::string> env;
  for (absl::string_view kv : absl::StrSplit(parts[2], '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    env[p.first] = p.second;
  }
  auto args = varuna::ParseWorkerArgs(argv);
  auto spec = varuna::ParseJobSpec(parts[3].empty() ? "data: {path: /x}\n" : parts[3]);
  if (args.ok() && spec.ok()) {
    auto getter = [&](const std::string& k) -> std::optional<std::string> {
      auto it = env.find(k);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
    (void)varuna::ResolveTopology(*args, &*spec, 8, getter);
  }
  return 0;
}
