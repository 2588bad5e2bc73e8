#include "worker/runtime/worker_main_lib.h"

#include <unistd.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/launch/launch_args.h"
#include "common/planner/profile.h"
#include "worker/dist/torch_status.h"
#include "worker/engine/profiler.h"
#include "worker/runtime/events.h"
#include "worker/runtime/worker_run.h"

namespace varuna {

// --profile_out (docs/autoconfig.md "Profiling"): every rank profiles the compute at once (as
// in training, every slot is busy), then the links between ranks; rank 0 writes the file and
// reports it in its progress file.
absl::Status RunProfiler(const JobSpec& spec, int64_t global_batch, Model model, TokenDataset& data,
                         const WorkerTopology& topo, const ProcessGroups& groups,
                         const std::string& out, std::chrono::milliseconds timeout,
                         torch::Device device) {
  ProfilerOptions po;
  po.model_key = ModelKey(spec.model);
  po.optimizer = spec.train.optimizer;
  po.seed = spec.train.seed;
  po.rank = topo.rank;
  po.world = groups.world;
  po.timeout = timeout;
  // Host identity: the agent's node name (VARUNA_NODE), else the host name.
  std::string me = GetEnv("VARUNA_NODE").value_or("");
  if (me.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    me = host;
  }
  RETURN_IF_ERROR(TorchCall("exchanging host names", [&] {
    groups.store->set(absl::StrCat("profile_host", topo.rank),
                      std::vector<uint8_t>(me.begin(), me.end()));
    for (int r = 0; r < topo.world_size; ++r) {
      auto v = groups.store->get(absl::StrCat("profile_host", r));
      po.hosts.emplace_back(v.begin(), v.end());
    }
  }));
  ASSIGN_OR_RETURN(Precision precision, ParsePrecision(spec.train.precision));
  std::vector<int> sizes;
  const int64_t cap = std::min<int64_t>(32, global_batch);
  for (int b = 1; b <= cap; b *= 2) sizes.push_back(b);
  Profiler profiler(std::move(model), device, precision, po);
  // The profiler asks for the first n samples, n up to `cap`: read them once (a bad token
  // is an error here, not in the profiler).
  ASSIGN_OR_RETURN(const TensorMap first, data.Batch(0, cap));
  auto get_batch = [&first](int n) {
    TensorMap out;
    for (const auto& [k, v] : first) out[k] = v.narrow(0, 0, n);
    return out;
  };
  RETURN_IF_ERROR(profiler.Initialize(get_batch));
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(v1::Profile profile, profiler.ProfileAll(get_batch, sizes, ""));
  if (topo.rank == 0) {
    RETURN_IF_ERROR(WriteProfileFile(out, profile));
    v1::WorkerEvent e;
    e.mutable_profile()->set_path(out);
    ReportToAgent(std::move(e));
    LOG(INFO) << "profile of " << profile.model_key() << " (" << profile.segments_size()
              << " segments, micro-batches " << absl::StrJoin(sizes, ",") << ") written to " << out
              << " in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
              << " s";
  }
  ReportToAgent(SavedEvent(/*rescued=*/false, 0));
  return absl::OkStatus();
}

absl::Status RunWorker(const std::vector<std::string>& argv) {
  WorkerRun run(argv);
  return run.Run();
}

}  // namespace varuna
