#include "worker/engine/varuna.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/launch/launch_args.h"
#include "common/launch/slurm_env.h"
#include "common/pipeline/partition.h"
#include "worker/dist/comm.h"
#include "worker/dist/device.h"
#include "worker/dist/read_back.h"
#include "worker/dist/torch_status.h"
#include "worker/engine/fused_adamw.h"
#include "worker/engine/step_agreement.h"

namespace varuna {
namespace {

// Note [Host syncs]: reading a device tensor on the host waits for everything queued before
// it, so each read leaves the GPU idle while the host catches up (the loss per micro-batch,
// the norm, the agreement before and after its all-reduce cost four per step once). A step
// now reads back once: the agreement's result after its all-reduce, or, where the
// all-reduce runs on the host (gloo beside a GPU), the device's part of the vote before it.
// Every read the step makes goes through here and is counted (StepResult::host_syncs, each
// step's metrics line); engine_test holds the count at 1 for P=1 D=1. (A pipeline's
// activations through the host, gloo beside a GPU, are the transport's, not counted.)
torch::Tensor HostRead(const torch::Tensor& t, const ProcessGroups& groups, StepResult* result) {
  ++result->host_syncs;
  return ReadBack(t, groups.abort.get(), groups.timeout);  // Note [NCCL waits] in read_back.cc
}

constexpr int kMetaTag = 2, kTieTag = 3;

// Where boundary tensors and the engine's small collectives travel: the compute device when
// the group moves device tensors (NCCL), the host otherwise.
torch::Device TransferDevice(const ProcessGroups& groups, torch::Device device) {
  return groups.world->device_transfers() ? device : torch::Device(torch::kCPU);
}

// Ranks as threads (tests) share the process's default generator: building layers and seeding
// it is one step.
std::mutex& InitMutex() {
  static std::mutex mu;
  return mu;
}

// Note [Start-up agreement]: start-up has steps that can fail on one rank only (a bad layer, a
// misplaced tied weight, a dry run that throws). Every rank takes part in two tiny all-reduces
// of a failure flag (after the local checks, and at the end), so one rank's failure makes
// every rank fail at once with a message, instead of the others hanging until the timeout.
absl::Status AgreeOnStartup(const ProcessGroups& groups, torch::Device xfer,
                            const absl::Status& local) {
  std::vector<torch::Tensor> flag{
      ToDevice(torch::tensor({local.ok() ? 0.0 : 1.0}, torch::kDouble), xfer)};
  absl::Status reduced = AllReduceSum(groups.world, flag, groups.timeout);
  if (!local.ok()) return local;
  RETURN_IF_ERROR(reduced);
  double failed = 0;
  RETURN_IF_ERROR(TorchCall("the start-up agreement", [&] {
    failed = ReadBack(flag[0], groups.abort.get(), groups.timeout).item<double>();
  }));
  if (failed > 0) {
    return absl::AbortedError("another rank failed during start-up (its log names the problem)");
  }
  return absl::OkStatus();
}

// Makes the copies of each tied pair equal (Note [Tied weights] in gradient_reducer.cc): the
// second takes the first's value, locally or from stage 0 to the last stage over the tied
// group. Placement was checked on every rank in BuildLocal().
absl::Status TieAtStart(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                        const std::vector<std::pair<std::string, std::string>>& tied,
                        const ProcessGroups& groups, torch::Device xfer) {
  std::map<std::string, torch::Tensor> mine(params.begin(), params.end());
  for (const auto& [first, second] : tied) {
    const bool has_first = mine.count(first) > 0, has_second = mine.count(second) > 0;
    if (has_first && has_second) {
      torch::NoGradGuard g;
      mine[second].copy_(mine[first]);
    } else if (has_first) {
      RETURN_IF_ERROR(
          SendBlocking(groups.tied, ForTransfer(mine[first], xfer), 1, kTieTag, groups.timeout));
    } else if (has_second) {
      torch::Tensor& p = mine[second];
      torch::Tensor buf = torch::empty(p.sizes(), p.options().device(xfer));
      RETURN_IF_ERROR(RecvBlocking(groups.tied, buf, 0, kTieTag, groups.timeout));
      torch::NoGradGuard g;
      p.copy_(buf);
    }
  }
  return absl::OkStatus();
}

// Pipeline 0's per-stage busy and wait times, its bubble, and every rank's, from the step's
// agreement.
void SetStageTimes(const Topology& topo, const StepAgreement& agreed, StepResult* result) {
  const PipelineLayout& p0 = topo.pipeline(0);
  double busy = 0, longest = 0;
  for (int r = p0.first_rank; r < p0.first_rank + p0.stages(); ++r) {
    result->stage_busy_s.push_back(agreed.busy[r]);
    result->stage_wait_s.push_back(agreed.wait[r]);
    busy += agreed.busy[r];
    longest = std::max(longest, agreed.busy[r] + agreed.wait[r]);
  }
  result->bubble_ratio = longest > 0 ? std::max(0.0, 1.0 - busy / (p0.stages() * longest)) : 0;
  result->rank_busy_s = agreed.busy;
  result->rank_wait_s = agreed.wait;
}

}  // namespace

Varuna::Varuna(Model model, Topology topology, int rank, ProcessGroups groups, int chunk_size,
               torch::Device device, VarunaOptions options)
    : stage_(std::move(model), std::move(topology), rank, std::move(groups), chunk_size),
      device_(device),
      options_(options),
      train_(options.init_loss_scale, options.loss_scale_window),
      checkpointer_(stage_, train_, options_.faults) {
  checkpointer_.set_rolled_rescue(options_.rolled_rescue);
  checkpointer_.set_generation(options_.generation);
  checkpointer_.set_apply_update([this](const std::vector<torch::Tensor>& params,
                                        double grad_norm) { ApplyUpdate(params, grad_norm); });
}

absl::StatusOr<std::unique_ptr<Varuna>> Varuna::Create(Model model, Topology topology, int rank,
                                                       ProcessGroups groups,
                                                       const TensorMap& dummy_inputs,
                                                       int chunk_size, torch::Device device,
                                                       VarunaOptions options) {
  if (chunk_size < 1) return absl::InvalidArgumentError("chunk_size must be >= 1");
  if (rank < 0 || rank >= topology.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the world of size ", topology.world_size()));
  }
  RETURN_IF_ERROR(topology.Validate(model.num_segments(), topology.global_batch()));
  std::unique_ptr<Varuna> v(new Varuna(std::move(model), std::move(topology), rank,
                                       std::move(groups), chunk_size, device, options));
  RETURN_IF_ERROR(v->Build(dummy_inputs));
  return v;
}

absl::StatusOr<std::unique_ptr<Varuna>> Varuna::Create(
    Model model, StageMap map, int rank, ProcessGroups groups, const TensorMap& dummy_inputs,
    int64_t global_batch, int chunk_size, torch::Device device, VarunaOptions options) {
  ASSIGN_OR_RETURN(Topology topology,
                   Topology::Uniform(map.stages(), map.replicas(), global_batch));
  return Create(std::move(model), std::move(topology), rank, std::move(groups), dummy_inputs,
                chunk_size, device, options);
}

absl::StatusOr<std::unique_ptr<Varuna>> Varuna::Create(
    Model model, const std::string& stage_to_rank_map, const TensorMap& dummy_inputs,
    int64_t batch_size, int chunk_size, Precision precision, int local_rank, torch::Device device,
    const std::vector<std::pair<std::string, std::string>>& shared_weights, VarunaOptions options) {
  for (const auto& [a, b] : shared_weights) model.Tie(a, b);
  WorkerArgs args;
  // Either Varuna's map ("0,2;1,3;") or heterogeneous pipelines in Topology's text form
  // ("0,3,6:8;0,6:4", what the agent passes as --pipelines and VARUNA_PIPELINES).
  if (stage_to_rank_map.find(':') != std::string::npos) {
    args.pipelines = stage_to_rank_map;
  } else {
    args.stage_to_rank_map = stage_to_rank_map;
  }
  if (local_rank >= 0) args.local_rank = local_rank;
  args.chunk_size = chunk_size;
  JobSpec spec;
  spec.train.global_batch = batch_size;
  ASSIGN_OR_RETURN(WorkerTopology topo,
                   ResolveTopology(args, &spec, model.num_segments(), WithSlurmFallback(GetEnv)));
  if (device.is_cuda() && !device.has_index()) {
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(topo.local_rank));
  }
  RETURN_IF_ERROR(MakeCurrent(device));
  options.precision = precision;
  ASSIGN_OR_RETURN(ProcessGroups groups,
                   CreateProcessGroups(
                       topo, !model.tied().empty(),
                       std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1e3))));
  return Create(std::move(model), topo.topology, topo.rank, std::move(groups), dummy_inputs,
                topo.micro_batch, device, options);
}

absl::Status Varuna::Build(const TensorMap& dummy_inputs) {
  if (!stage_.groups.world || stage_.groups.world->size() != stage_.topology.world_size() ||
      stage_.groups.world->rank() != stage_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("process groups do not match the topology '", stage_.topology.ToString(),
                     "' for rank ", stage_.rank, " (create them with CreateProcessGroups)"));
  }
  const torch::Device xfer = TransferDevice(stage_.groups, device_);
  stage_.tp = TensorParallelOf(stage_.groups, device_);
  absl::Status st = BuildLocal();
  RETURN_IF_ERROR(AgreeOnStartup(stage_.groups, xfer, st));
  StageConfig config;
  config.links = stage_.groups.links;
  config.rank = stage_.rank;
  config.stage = view().stage();
  config.stages = view().stages();
  config.chunk_size = stage_.chunk_size;
  config.schedule = options_.schedule;
  config.reorder = !stage_.tp.enabled();
  config.precision = options_.precision;
  config.device = device_;
  config.xfer_device = xfer;
  config.timeout = stage_.groups.timeout;
  st = TieAtStart(stage_.named_params, stage_.model.tied(), stage_.groups, xfer);
  absl::Status dry = DryRun(dummy_inputs, st.ok(), &config);
  if (st.ok()) st = dry;
  executor_ = std::make_unique<PipelineExecutor>(stage_.layers, std::move(config));
  return AgreeOnStartup(stage_.groups, xfer, st);
}

absl::Status Varuna::InitWeights(
    const std::function<absl::Status(const std::string&, torch::nn::Module&)>& load) {
  const torch::Device xfer = TransferDevice(stage_.groups, device_);
  absl::Status st;
  for (size_t i = 0; i < stage_.layers.size() && st.ok(); ++i)
    st = load(stage_.layer_names[i], *stage_.layers[i]);
  RETURN_IF_ERROR(AgreeOnStartup(stage_.groups, xfer, st));
  st = TieAtStart(stage_.named_params, stage_.model.tied(), stage_.groups, xfer);
  return AgreeOnStartup(stage_.groups, xfer, st);
}

// Builds this stage's layers and its gradient reducer, and checks, without communicating,
// everything a later collective depends on.
absl::Status Varuna::BuildLocal() {
  const auto segments = stage_.model.Segments();
  const int n = static_cast<int>(segments.size());
  if (!stage_.topology.has_boundaries()) {
    std::vector<int> bounds = options_.boundaries;
    if (bounds.empty()) {
      ASSIGN_OR_RETURN(bounds, PartitionByCost(stage_.model.SegmentCosts(), view().stages()));
    }
    RETURN_IF_ERROR(stage_.topology.SetUniformBoundaries(bounds));
  }
  RETURN_IF_ERROR(stage_.topology.Validate(n, stage_.topology.global_batch()));
  const auto [first_segment, last_segment] = stage_.topology.SegmentsOf(stage_.rank);
  const int P = view().stages(), stage = view().stage();
  // The stage (of this rank's pipeline) owning each segment, and so each tied parameter
  // "<layer name>.<param>".
  const std::vector<int>& bounds = stage_.topology.pipeline(view().replica()).boundaries;
  std::vector<int> stage_of_segment(segments.size());
  for (int st = 0; st < P; ++st) {
    for (int sg = bounds[st]; sg < bounds[st + 1]; ++sg) stage_of_segment[sg] = st;
  }
  auto owner = [&](const std::string& param) -> int {
    size_t best = 0;
    int owner_stage = -1;
    for (size_t sg = 0; sg < segments.size(); ++sg) {
      for (int layer : segments[sg]) {
        const std::string& name = stage_.model.layers()[layer].name;
        if (name.size() > best && param.size() > name.size() &&
            param.compare(0, name.size(), name) == 0 && param[name.size()] == '.') {
          best = name.size();
          owner_stage = stage_of_segment[sg];
        }
      }
    }
    return owner_stage;
  };
  for (const auto& [first, second] : stage_.model.tied()) {
    const int a = owner(first), b = owner(second);
    if (a < 0 || b < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tied parameter '", a < 0 ? first : second,
                                                     "' does not name a parameter of any layer"));
    }
    if (a != b && !(a == 0 && b == P - 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tied parameters '", first, "' and '", second,
                       "' must be on the same stage or on the "
                       "first and last stage; this partition puts them on stages ",
                       a, " and ", b));
    }
    if (a != b && (stage == a || stage == b) && !stage_.groups.tied) {
      return absl::InvalidArgumentError("the model ties parameters but there is no tied group");
    }
  }
  const PipelineLinks& links = stage_.groups.links;
  if ((stage > 0 && (!links.act_in || !links.grad_out)) ||
      (stage < P - 1 && (!links.act_out || !links.grad_in))) {
    return absl::InvalidArgumentError(
        absl::StrCat("no pipeline link groups for stage ", stage, " of ", P,
                     " (create the groups with CreateProcessGroups on the same topology)"));
  }
  std::vector<int> layer_segment;  // segment of each of this stage's layers
  RETURN_IF_ERROR(TorchCall("building the stage", [&] {
    std::lock_guard<std::mutex> init(InitMutex());
    for (int s = first_segment; s < last_segment; ++s) {
      for (int layer : segments[s]) {
        stage_.layers.push_back(
            BuildLayer(stage_.model, layer, options_.seed, device_));  // Note [Init]
        stage_.layer_names.push_back(stage_.model.layers()[layer].name);
        layer_segment.push_back(s);
      }
    }
    torch::manual_seed(options_.seed * 7919ULL + 104729ULL * static_cast<uint64_t>(stage_.rank));
  }));
  LOG(INFO) << "rank=" << stage_.rank << " pipeline=" << view().replica() << " stage=" << stage
            << " segments=[" << first_segment << "," << last_segment
            << ") layers=" << absl::StrJoin(stage_.layer_names, ",");
  // Each parameter's gradient is all-reduced over its segment's holders (Note [Data-parallel
  // reduction] in gradient_reducer.cc).
  std::vector<ReducedParameter> reduced;
  for (size_t i = 0; i < stage_.layers.size(); ++i) {
    ProcessGroupPtr group;
    if (stage_.topology.num_pipelines() > 1) {
      const std::vector<int> holders = stage_.topology.Holders(layer_segment[i]);
      auto pg = stage_.groups.holders.find(holders);
      if (pg == stage_.groups.holders.end() || !pg->second) {
        return absl::InvalidArgumentError(
            absl::StrCat("no data-parallel process group for ranks ", absl::StrJoin(holders, ","),
                         " (create the groups with "
                         "CreateProcessGroups on the same topology)"));
      }
      group = pg->second;
    }
    for (const auto& p : stage_.layers[i]->named_parameters(/*recurse=*/true)) {
      stage_.named_params.emplace_back(absl::StrCat(stage_.layer_names[i], ".", p.key()),
                                       p.value());
      reduced.push_back({stage_.named_params.back().first, p.value(), group});
    }
    stage_.layer_shards.push_back(ShardsOf(*stage_.layers[i]));
  }
  for (const auto& [first, second] : stage_.model.tied()) {
    for (const std::string& name : {first, second}) {
      const int st = owner(name);
      bool found = false;
      for (auto& [n, p] : stage_.named_params) found |= n == name;
      if (st == stage && !found) {
        return absl::InvalidArgumentError(
            absl::StrCat("tied parameter '", name, "' does not exist on its layer"));
      }
    }
  }
  GradientReducerOptions reducer;
  reducer.bucket_bytes = options_.bucket_bytes;
  reducer.first_bucket_bytes = options_.first_bucket_bytes;
  reducer.overlap = options_.overlap_allreduce;
  reducer.device = device_;
  reducer.timeout = stage_.groups.timeout;
  ASSIGN_OR_RETURN(reducer_, GradientReducer::Create(std::move(reduced), stage_.model.tied(),
                                                     stage_.groups.tied, reducer));
  return absl::OkStatus();
}

// Note [Dry run]: stage by stage along each pipeline, run the stage on 1 and 2 samples and pass
// the output shapes on (MakeBoundaryMeta). A dimension that is 1 then 2 is a batch dimension;
// this fixes the receive buffer shape for any micro-batch size, including a smaller last one. A
// stage that fails (or whose upstream failed) still passes a meta with ndim = -1 on, so nobody
// waits. The metas end up in `config` for the pipeline executor.
absl::Status Varuna::DryRun(const TensorMap& dummy_inputs, bool ok_so_far, StageConfig* config) {
  const int P = config->stages, stage = config->stage;
  const torch::Device xfer = config->xfer_device;
  auto meta_tensor = torch::zeros({kBoundaryMetaSize}, torch::dtype(torch::kLong).device(xfer));
  absl::Status st = ok_so_far ? absl::OkStatus() : absl::AbortedError("skipped dry run");
  std::vector<int64_t>& in_meta = config->in_meta;
  if (stage > 0) {
    absl::Status r =
        RecvBlocking(stage_.groups.links.act_in, meta_tensor, 0, kMetaTag, stage_.groups.timeout);
    if (st.ok()) st = r;
    absl::Status read = TorchCall("the dry run's boundary shapes", [&] {
      meta_tensor = ReadBack(meta_tensor, stage_.groups.abort.get(), stage_.groups.timeout);
    });
    if (st.ok()) st = read;
    if (read.ok()) {
      in_meta.assign(meta_tensor.data_ptr<int64_t>(),
                     meta_tensor.data_ptr<int64_t>() + meta_tensor.numel());
    } else {
      // Not read back (on NCCL the tensor is still on the device): nothing to take from it.
      in_meta.assign(kBoundaryMetaSize, -1);
    }
    if (st.ok() && in_meta[0] < 0) {
      st = absl::AbortedError(absl::StrCat("stage ", stage - 1, " failed its dry run"));
    }
  }
  if (st.ok()) {
    st = TorchCall(absl::StrCat("dry run of stage ", stage), [&]() -> absl::Status {
      TensorMap one, two;
      for (const auto& [k, t] : dummy_inputs) {
        if (t.dim() < 1 || t.size(0) < 2) {
          return absl::InvalidArgumentError(
              absl::StrCat("dummy input '", k, "' needs at least 2 samples along dim 0"));
        }
        one[k] = t.narrow(0, 0, 1).to(device_);
        two[k] = t.narrow(0, 0, 2).to(device_);
      }
      torch::Tensor x1, x2;
      if (stage > 0) {
        const TensorSpec s1 = BoundarySpec(in_meta, 1), s2 = BoundarySpec(in_meta, 2);
        x1 = torch::zeros(s1.shape, torch::dtype(s1.dtype).device(device_));
        x2 = torch::zeros(s2.shape, torch::dtype(s2.dtype).device(device_));
      }
      const RngState rng = GetRngState(device_);
      torch::Tensor o1, o2;
      {
        torch::NoGradGuard g;
        o1 = ForwardLayers(stage_.layers, x1, one, options_.precision, device_);
        o2 = ForwardLayers(stage_.layers, x2, two, options_.precision, device_);
      }
      SetRngState(device_, rng);
      if (stage == P - 1) {
        if (o1.dim() != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the last layer must return a scalar loss; got a tensor of ", o1.dim(), " dims"));
        }
        return absl::OkStatus();
      }
      if (o1.dim() > kMaxBoundaryDims || o1.dim() != o2.dim() ||
          o1.scalar_type() != o2.scalar_type()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stage ", stage, " output must have the same rank (at most ", kMaxBoundaryDims,
            ") and dtype for any batch size; got ", o1.dim(), " and ", o2.dim(), " dims"));
      }
      for (int i = 0; i < o1.dim(); ++i) {
        const bool batch_dim = o1.size(i) == 1 && o2.size(i) == 2;
        if (!batch_dim && o1.size(i) != o2.size(i)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "stage ", stage, " output dim ", i, " is ", o1.size(i), " for 1 sample and ",
              o2.size(i), " for 2: boundary tensors may vary only in batch dimensions"));
        }
      }
      config->out_meta = MakeBoundaryMeta(o1, o2);
      return absl::OkStatus();
    });
  }
  if (stage < P - 1) {
    std::vector<int64_t> meta =
        st.ok() ? config->out_meta : std::vector<int64_t>(kBoundaryMetaSize, 0);
    if (!st.ok()) meta[0] = -1;
    absl::Status s =
        SendBlocking(stage_.groups.links.act_out, ToDevice(torch::tensor(meta, torch::kLong), xfer),
                     1, kMetaTag, stage_.groups.timeout);
    if (st.ok()) st = s;
  }
  return st;
}

absl::Status Varuna::CheckInputs(const TensorMap& inputs, int64_t want) const {
  if (broken_) {
    return absl::FailedPreconditionError(
        "an earlier step failed; messages may be in flight, so this engine cannot continue");
  }
  return CheckBatch(inputs, want);
}

absl::Status Varuna::CheckBatch(const TensorMap& inputs, int64_t want) {
  if (inputs.empty()) return absl::InvalidArgumentError("no inputs");
  const int64_t n = inputs.begin()->second.dim() >= 1 ? inputs.begin()->second.size(0) : -1;
  for (const auto& [k, t] : inputs) {
    if (!t.defined() || t.dim() < 1 || t.size(0) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", k, "' must have the batch (", n, " samples) along dim 0"));
    }
  }
  if (want > 0 && n != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step() needs this replica's share of the global batch: ", want, " samples, got ", n));
  }
  return absl::OkStatus();
}

// Local squared norm; the second copy of a tied pair is not counted twice. With tensor
// parallelism a sharded parameter's square is summed over the tp group, a replicated one
// (equal on every tp rank) counted once; the stop request joins that sum, so the tp slices,
// whose agreements are separate, decide alike. One _foreach_norm per list (a multi-tensor
// kernel on a GPU) instead of three kernels per parameter, and nothing read back.
torch::Tensor Varuna::LocalGradNormSq(torch::Tensor* stop, int64_t* local_params) {
  std::vector<torch::Tensor> whole, sharded;
  for (size_t i = 0; i < stage_.layers.size(); ++i) {
    const auto& shards = stage_.layer_shards[i];
    for (const auto& np : stage_.layers[i]->named_parameters(/*recurse=*/true)) {
      const torch::Tensor& p = np.value();
      if (reducer_->IsSecondCopy(p)) continue;
      const bool split = shards.count(np.key()) > 0;
      (split ? sharded : whole).push_back(p.grad());
      *local_params += p.numel() * (split ? stage_.tp.size : 1);
    }
  }
  const auto sum_of_squares = [this](const std::vector<torch::Tensor>& grads) {
    if (grads.empty()) return torch::zeros({}, torch::dtype(torch::kDouble).device(device_));
    return torch::stack(at::_foreach_norm(grads, 2)).to(torch::kDouble).pow(2).sum();
  };
  torch::Tensor norm_sq = sum_of_squares(whole);
  if (stage_.tp.enabled()) {
    torch::Tensor v =
        ReduceFromTensorParallel(torch::stack({sum_of_squares(sharded), *stop}), stage_.tp);
    norm_sq = norm_sq + v[0];
    *stop = (v[1] > 0).to(torch::kDouble);
  }
  return norm_sq;
}

// Note [Committed step]: a step is committed when every rank has applied it or can restore it.
// The agreement all-reduce of step N completes on a rank only after every rank contributed,
// that is, after every rank applied step N-1: so a rank that completed N's agreement knows N-1
// is committed, but not N (a link cut in the collective's last phase can leave a peer without
// the result, so it never applies N: the split of issue 24). Survivors therefore hold at most
// two consecutive steps, X and X+1, and every rank still at X has posted X+1's agreement: its
// reduced gradients of X+1 are on its parameters. Two ways keep a failure from costing more
// than the step in flight:
// - In place (the default), nothing is copied per step: each rank keeps the agreed vector of
//   its newest step (a few doubles) and marks a posted agreement pending until it completes; in
//   the hand-over a rank at X with X+1 pending applies X+1 with a survivor's vector (Note [Roll
//   forward] in regroup.cc), so every survivor holds X+1 when any saw it complete.
// - On the relaunch path (morph_in_place off, or a hand-over that failed) a rescue has no peer
//   to ask: each survivor writes the step it has, and one at X with X+1 pending also writes
//   its layers with X+1's gradients into X+1's checkpoint, while one at X+1 records X+1's vote
//   there; X+1 is then complete when every stage has a survivor, and the next generation's
//   loader applies the update (Note [Rolled rescue] in common/checkpoint/checkpoint_store.cc).
//   With nobody at X+1 nobody has the vote and X, which every survivor wrote, is the resume
//   point. The manager compares the saves (Note [Saved steps] in
//   manager/morph/morph_controller.cc) and records them in the morph.
// Neither copies anything per step: a step's only extra work is a few doubles of record.
void Varuna::ApplyUpdate(const std::vector<torch::Tensor>& params, double grad_norm) {
  if (options_.clip_grad_norm > 0) {
    const double coef = options_.clip_grad_norm / (grad_norm + 1e-6);
    if (coef < 1) {
      // The fused AdamW divides the gradients by a scale as it reads them: the clip costs no
      // pass of its own (Note [Fused AdamW] in fused_adamw.cc).
      if (auto* fused = dynamic_cast<FusedAdamW*>(train_.optimizer.get())) {
        fused->set_next_grad_scale(
            torch::full({}, 1.0 / coef, torch::dtype(torch::kFloat32).device(device_)));
      } else {
        std::vector<torch::Tensor> grads;
        for (const auto& p : params) grads.push_back(p.grad());
        at::_foreach_mul_(grads, coef);
      }
    }
  }
  if (lr_fn_) {
    const double lr = lr_fn_(train_.iteration + 1);
    for (auto& group : train_.optimizer->param_groups()) group.options().set_lr(lr);
  }
  train_.optimizer->step();
}

absl::Status Varuna::ReduceGradients(const std::vector<torch::Tensor>& params, int64_t taking) {
  StepTimeline::Scope timed(options_.timeline, StepPhase::kComm);
  absl::Status tied = TorchCall("gradients", [&] {
    for (auto& p : params) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    }
  });
  if (tied.ok()) tied = reducer_->ReduceTied();
  if (!tied.ok()) {
    reducer_->Abort();
    return tied;
  }
  options_.faults.Hit(FaultPoint::kDpAllreduce, taking);
  return reducer_->Finish();
}

absl::StatusOr<StepResult> Varuna::step(const TensorMap& inputs, double loss_denominator) {
  if (!train_.optimizer) return absl::FailedPreconditionError("step() before set_optimizer()");
  RETURN_IF_ERROR(CheckInputs(inputs, stage_.topology.pipeline(view().replica()).samples));
  // Any failure below leaves peers and in-flight messages in an unknown state.
  broken_ = true;
  const int64_t taking = train_.iteration + 1;  // the step being taken
  const FaultInjector& faults = options_.faults;
  if (train_.iteration == train_.commit.start()) faults.Hit(FaultPoint::kFirstStep, taking);
  faults.Hit(FaultPoint::kForward, taking);
  const bool fp16 = options_.precision == Precision::kFp16;
  PipelineRunOptions run;
  run.weight_denominator =
      loss_denominator > 0 ? loss_denominator : static_cast<double>(stage_.topology.global_batch());
  run.loss_scale = fp16 ? train_.scaler.scale() : 1.0;
  run.timeline = options_.timeline;
  run.before_last_backward = [this, &faults, taking] {
    faults.Hit(FaultPoint::kBackward, taking);
    reducer_->Arm();
  };
  run.after_last_weight_pass = [this](const std::vector<torch::Tensor>& weights) {
    reducer_->DeferredGradientsReady(weights);
  };
  if (!faults.empty()) {
    run.after_first_forward = [&faults, taking] { faults.Hit(FaultPoint::kPipeline, taking); };
  }
  RETURN_IF_ERROR(TorchCall("zeroing the gradient buckets", [&] { reducer_->PrepareStep(); }));
  absl::StatusOr<PipelineResult> piped = executor_->Run(inputs, run);
  if (!piped.ok()) {
    reducer_->Abort();
    return piped.status();
  }
  const std::vector<torch::Tensor> params = view().parameters();
  RETURN_IF_ERROR(ReduceGradients(params, taking));
  const double stop =
      (stop_requested_.load() || (options_.stop_flag && options_.stop_flag->load())) ? 1.0 : 0.0;

  StepResult result;
  result.pipeline_s = piped->timing.pipeline_s;
  result.wait_s = piped->timing.wait_s;
  result.early_buckets = reducer_->last_early_buckets();
  result.buckets = reducer_->num_buckets();
  absl::Status st = TorchCall("optimizer step", [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    std::optional<StepTimeline::Scope> phase;
    phase.emplace(options_.timeline, StepPhase::kNorm);
    if (fp16) {
      for (auto& p : params) p.mutable_grad().div_(train_.scaler.scale());
    }
    int64_t local_params = 0;
    const auto on_device = torch::dtype(torch::kDouble).device(device_);
    torch::Tensor stop_t = torch::full({}, stop, on_device);
    const torch::Tensor norm_sq = LocalGradNormSq(&stop_t, &local_params);
    // Note [Step agreement] in step_agreement.h: one world sum of every rank's vote. What the
    // host knows (parameters, times) is packed on the host; what the device computed (the
    // overflow, the norm, the loss, a tp group's stop) is added to it on the device.
    const int W = stage_.topology.world_size();
    StepVote vote;
    vote.params = view().replica() == 0 ? local_params : 0;
    vote.busy.assign(W, 0.0);
    vote.wait.assign(W, 0.0);
    vote.busy[stage_.rank] = std::max(0.0, piped->timing.pipeline_s - piped->timing.wait_s);
    vote.wait[stage_.rank] = piped->timing.wait_s;
    const torch::Tensor finite = torch::isfinite(norm_sq);
    const torch::Tensor zero = torch::zeros({}, on_device);
    const torch::Tensor computed = torch::stack(
        {torch::logical_not(finite).to(torch::kDouble),
         view().replica() == 0 ? torch::where(finite, norm_sq, zero) : zero,
         view().is_last_stage() && piped->loss_sum.defined() ? piped->loss_sum : zero, stop_t});
    const torch::Device xfer = TransferDevice(stage_.groups, device_);
    // From pinned memory: a pageable copy would make the host wait, untimed, for the
    // data-parallel reductions Finish() queued (Note [NCCL waits]).
    torch::Tensor meta = ToDevice(torch::tensor(vote.Pack(W), torch::kDouble), xfer);
    // On a device the step reads back once, here or after the all-reduce (Note [Host syncs]).
    meta.narrow(0, 0, 4).add_(xfer == device_ ? computed
                                              : HostRead(computed, stage_.groups, &result));
    {
      std::lock_guard<std::mutex> state(train_.mu);
      train_.commit.Posted(taking);  // from here it can roll forward (Note [Committed step])
      MarkGradientsReady(train_, device_);
    }
    const bool split = faults.Hit(FaultPoint::kAgreement, taking);
    phase.emplace(options_.timeline, StepPhase::kComm);
    if (stage_.topology.world_size() > 1) {
      std::vector<torch::Tensor> v{meta};
      RETURN_IF_ERROR(AllReduceSum(stage_.groups.world, v, stage_.groups.timeout));
    }
    if (split) {  // the others got the result; this rank acts as if not (Note [Faults])
      return absl::AbortedError(
          absl::StrCat("VARUNA_FAULT split at step ", taking, "'s agreement"));
    }
    phase.reset();
    faults.Hit(FaultPoint::kAfterAgreement, taking);
    // From here on only local state changes (scaler, parameters, optimizer, iteration):
    // a rescue on another thread sees all of this step or none of it (Note [Rescue]).
    if (xfer == device_) meta = HostRead(meta, stage_.groups, &result);
    const double* v = meta.data_ptr<double>();
    std::lock_guard<std::mutex> state(train_.mu);
    return ApplyAgreed(params, std::vector<double>(v, v + meta.numel()), taking, &result);
  });
  RETURN_IF_ERROR(st);
  broken_ = false;
  return result;
}

absl::Status Varuna::ApplyAgreed(const std::vector<torch::Tensor>& params,
                                 std::vector<double> vector, int64_t taking, StepResult* result) {
  const int W = stage_.topology.world_size();
  if (vector.size() != static_cast<size_t>(StepAgreement::Size(W))) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", taking, "'s agreed vector has ", vector.size(), " values, not ",
                     static_cast<size_t>(StepAgreement::Size(W)), " (a world of ", W, ")"));
  }
  const StepAgreement agreed = StepAgreement::Unpack(vector.data(), W);
  result->overflow = agreed.overflow;
  result->grad_norm = std::sqrt(agreed.norm_sq);
  result->loss = agreed.loss;
  result->stop = agreed.stop;
  result->model_parameters = agreed.params;
  SetStageTimes(stage_.topology, agreed, result);
  const bool fp16 = options_.precision == Precision::kFp16;
  const bool skip = fp16 ? train_.scaler.Update(result->overflow) : result->overflow;
  // The vote (Note [Committed step]), and what it decided for a peer rolling forward.
  train_.commit.Agreed(taking, std::move(vector), {skip, skip ? 0.0 : result->grad_norm});
  StepTimeline::Scope phase(options_.timeline, StepPhase::kOptimizer);
  if (!skip) {
    options_.faults.Hit(FaultPoint::kUpdate, taking);
    ApplyUpdate(params, result->grad_norm);
  }
  // Undefined, not zeroed: the next backward's first gradient is then taken as it is instead
  // of added to zeros (a memset and an add per parameter saved); a parameter left without
  // one is given zeros after the pipeline, before the reductions. Gradients that are views of
  // a data-parallel bucket stay (Note [Gradients as bucket views] in gradient_reducer.cc).
  reducer_->ReleaseGradients();
  ++train_.iteration;
  MarkStateChanged(train_, device_);  // Note [Rescue copies] in checkpoint.cc
  return absl::OkStatus();
}

absl::Status Varuna::RollForward(int64_t step, const std::vector<double>& vector) {
  std::lock_guard<std::mutex> state(train_.mu);
  if (train_.commit.pending() != step || train_.iteration != step - 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", stage_.rank, " cannot roll forward to step ", step, ": it is at step ",
        train_.iteration, " with ",
        train_.commit.pending() > 0 ? absl::StrCat("step ", train_.commit.pending(), "'s")
                                    : std::string("no"),
        " agreement pending"));
  }
  StepResult ignored;
  return TorchCall(absl::StrCat("rolling forward to step ", step), [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    return ApplyAgreed(view().parameters(), vector, step, &ignored);
  });
}

// Note [Validation]: each pipeline runs its share of the held-out samples forward, in rounds of
// at most a training step's rows, its last stage summing loss x samples on the device; one
// world sum of [loss, samples] then gives every rank the mean over all of them. A pipeline
// whose share is empty runs nothing and adds zeros, so the figure does not depend on the shape
// (up to the order of a floating-point sum).
absl::StatusOr<double> Varuna::evaluate(
    int64_t rounds, const std::function<absl::StatusOr<TensorMap>(int64_t)>& round) {
  if (broken_) return CheckInputs({}, 0);  // names the earlier failure
  broken_ = true;
  for (auto& l : stage_.layers) l->eval();
  torch::Tensor loss_sum;
  double n = 0;
  absl::Status run;
  for (int64_t r = 0; r < rounds; ++r) {
    absl::StatusOr<TensorMap> read = round(r);
    run = read.ok() ? CheckBatch(*read, 0) : read.status();
    if (!run.ok()) break;
    const TensorMap& inputs = *read;
    PipelineRunOptions options;
    options.train = false;
    absl::StatusOr<PipelineResult> piped = executor_->Run(inputs, options);
    if (!piped.ok()) {
      run = piped.status();
      break;
    }
    if (piped->loss_sum.defined()) {
      loss_sum = loss_sum.defined() ? loss_sum + piped->loss_sum : piped->loss_sum;
    }
    // Each micro-batch's loss is weighted by its samples or predicted positions (Note
    // [Masked-token weighting] in pipeline_executor.cc): the mean is over the same.
    auto units = inputs.find("loss_tokens");
    n += units != inputs.end() ? static_cast<double>(units->second.sum().item<int64_t>())
                               : static_cast<double>(inputs.begin()->second.size(0));
  }
  for (auto& l : stage_.layers) l->train();
  RETURN_IF_ERROR(run);
  double loss = 0;
  RETURN_IF_ERROR(TorchCall("the evaluation loss", [&] {
    if (loss_sum.defined()) {
      loss = ReadBack(loss_sum, stage_.groups.abort.get(), stage_.groups.timeout).item<double>();
    }
  }));
  const bool last = view().is_last_stage();
  auto t = ToDevice(torch::tensor({last ? loss : 0.0, last ? n : 0.0}, torch::kDouble),
                    TransferDevice(stage_.groups, device_));
  std::vector<torch::Tensor> v{t};
  if (stage_.topology.world_size() > 1)
    RETURN_IF_ERROR(AllReduceSum(stage_.groups.world, v, stage_.groups.timeout));
  double mean = 0;
  RETURN_IF_ERROR(TorchCall("the evaluation's sum", [&] {
    const torch::Tensor sum = ReadBack(v[0], stage_.groups.abort.get(), stage_.groups.timeout);
    // Nothing to average (no masked position in any sample): NaN says so.
    mean = sum[1].item<double>() > 0 ? sum[0].item<double>() / sum[1].item<double>()
                                     : std::numeric_limits<double>::quiet_NaN();
  }));
  broken_ = false;
  return mean;
}

}  // namespace varuna
