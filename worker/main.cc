// varuna-worker: one rank of a pipeline + data-parallel training job.
// Usage: see WorkerUsage() (common/launch_args.cc) or `varuna-worker --help`.
// Exit codes: common/exit_codes.h.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "worker/worker_main_lib.h"

int main(int argc, char** argv) {
  varuna::InitLogging(argv[0]);
  std::vector<std::string> args(argv, argv + argc);
  absl::Status st = varuna::RunWorker(args);
  if (!st.ok()) {
    const std::string msg(st.message());
    std::fprintf(stderr, "varuna-worker: error: %s\n", msg.c_str());
    const bool bad_input = varuna::IsBadInput(st);
    std::string escaped;
    for (char c : msg.substr(0, 1000)) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
    }
    varuna::AppendProgress(absl::StrFormat("{\"error\": \"%s\", \"bad_input\": %s}", escaped,
                                           bad_input ? "true" : "false"));
    return bad_input ? varuna::kExitBadInput : 1;
  }
  return 0;
}
