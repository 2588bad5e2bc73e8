// varuna-worker: one rank of a pipeline + data-parallel training job.
// Usage: see WorkerUsage() (common/launch_args.cc) or `varuna-worker --help`.

#include <cstdio>
#include <string>
#include <vector>

#include "common/logging.h"
#include "worker/worker_main_lib.h"

int main(int argc, char** argv) {
  varuna::InitLogging(argv[0]);
  std::vector<std::string> args(argv, argv + argc);
  absl::Status st = varuna::RunWorker(args);
  if (!st.ok()) {
    std::fprintf(stderr, "varuna-worker: error: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
