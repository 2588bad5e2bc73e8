// varuna-worker: one rank of a pipeline + data-parallel training job.
// Usage: see WorkerUsage() (common/launch/launch_args.cc) or `varuna-worker --help`.
// Exit codes: common/launch/exit_codes.h.

#include <cstdio>
#include <string>
#include <vector>

#include "common/base/logging.h"
#include "common/launch/exit_codes.h"
#include "worker/runtime/standby.h"
#include "worker/runtime/worker_main_lib.h"

int main(int argc, char** argv) {
  varuna::InitLogging(argv[0]);
  std::vector<std::string> args(argv, argv + argc);
  // Note [Standby workers] in worker/runtime/standby.cc: started by the agent ahead of a launch.
  absl::Status st =
      args.size() == 2 && args[1] == "--standby" ? varuna::RunStandby() : varuna::RunWorker(args);
  if (!st.ok()) {
    const std::string msg(st.message());
    std::fprintf(stderr, "varuna-worker: error: %s\n", msg.c_str());
    const bool bad_input = varuna::IsBadInput(st);
    varuna::v1::WorkerEvent e;  // the agent's copy of how it ended
    e.mutable_error()->set_message(msg);
    e.mutable_error()->set_bad_input(bad_input);
    varuna::ReportToAgent(std::move(e));
    return bad_input ? varuna::kExitBadInput : 1;
  }
  return 0;
}
