#include "worker/varuna.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <cmath>
#include <deque>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/launch/launch_args.h"
#include "common/pipeline/partition.h"
#include "worker/device.h"
#include "worker/torch_status.h"

namespace varuna {
namespace {

constexpr int kActTag = 0, kGradTag = 1, kMetaTag = 2, kTieTag = 3;
constexpr int kMaxDims = 8;

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Meta layout for one boundary tensor seen at batch 1 and batch 2.
std::vector<int64_t> MakeMeta(const torch::Tensor& o1, const torch::Tensor& o2) {
  std::vector<int64_t> meta(2 + 2 * kMaxDims, 0);
  meta[0] = o1.dim();
  meta[1] = static_cast<int64_t>(o1.scalar_type());
  for (int i = 0; i < o1.dim(); ++i) {
    meta[2 + i] = o1.size(i);
    meta[2 + kMaxDims + i] = o2.size(i);
  }
  return meta;
}

// Stashed state for a recompute: the stage input and the RNG state before the forward.
struct Stash {
  int micro_batch;
  torch::Tensor input;
  RngState rng_state;
};

// Activations kept for a backward.
struct Graph {
  torch::Tensor input;
  torch::Tensor output;
};

// A boundary tensor as the transport takes it: on `to` (the host for gloo). Host copies of
// GPU tensors go through pinned memory.
torch::Tensor ForTransfer(const torch::Tensor& t, const torch::Device& to) {
  torch::Tensor d = t.detach();
  if (d.device() == to) return d.contiguous();
  if (d.is_cuda() && to.is_cpu()) {
    torch::Tensor host =
        torch::empty(d.sizes(), d.options().device(torch::kCPU).pinned_memory(true));
    host.copy_(d);
    return host;
  }
  return d.to(to).contiguous();
}

// Ranks as threads (tests) share the process's default generator: building layers and seeding
// it is one step.
std::mutex& InitMutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", name, "'; expected fp32, bf16 or fp16"));
}

Varuna::Varuna(Model model, Topology topology, int rank, ProcessGroups groups, int chunk_size,
               torch::Device device, VarunaOptions options)
    : model_(std::move(model)),
      topo_(std::move(topology)),
      rank_(rank),
      pipeline_(topo_.PipelineOf(rank)),
      stage_(topo_.StageOf(rank)),
      groups_(std::move(groups)),
      global_batch_(topo_.global_batch()),
      chunk_size_(chunk_size),
      device_(device),
      options_(options),
      timeout_(groups_.timeout),
      scaler_(options.init_loss_scale, options.loss_scale_window) {}

Varuna::~Varuna() {
  if (upload_.joinable()) upload_.join();
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
  ASSIGN_OR_RETURN(WorkerTopology topo, ResolveTopology(args, &spec, model.num_segments(), GetEnv));
  if (device.is_cuda() && !device.has_index()) {
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(topo.local_rank));
  }
  options.precision = precision;
  ASSIGN_OR_RETURN(ProcessGroups groups,
                   CreateProcessGroups(
                       topo, !model.tied().empty(),
                       std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1e3))));
  return Create(std::move(model), topo.topology, topo.rank, std::move(groups), dummy_inputs,
                topo.micro_batch, device, options);
}

// Note [Start-up agreement]: start-up has steps that can fail on one rank only (a bad layer, a
// misplaced tied weight, a dry run that throws). Every rank takes part in two tiny all-reduces
// of a failure flag (after the local checks, and at the end), so one rank's failure makes
// every rank fail at once with a message, instead of the others hanging until the timeout.
absl::Status Varuna::Build(const TensorMap& dummy_inputs) {
  if (!groups_.world || groups_.world->size() != topo_.world_size() ||
      groups_.world->rank() != rank_) {
    return absl::InvalidArgumentError(absl::StrCat("process groups do not match the topology '",
                                                   topo_.ToString(), "' for rank ", rank_,
                                                   " (create them with CreateProcessGroups)"));
  }
  xfer_device_ = groups_.world->device_transfers() ? device_ : torch::Device(torch::kCPU);
  absl::Status st = BuildLocal();
  RETURN_IF_ERROR(AgreeOnStartup(st));
  if (options_.overlap_allreduce)
    RETURN_IF_ERROR(TorchCall("gradient hooks", [&] { RegisterGradHooks(); }));
  const int P = stages();
  if (stage_ < P - 1) {
    act_tx_ = std::make_unique<Sender>(groups_.world, rank_ + 1, kActTag, timeout_);
    grad_rx_ =
        std::make_unique<Receiver>(groups_.world, rank_ + 1, kGradTag, timeout_, xfer_device_);
  }
  if (stage_ > 0) {
    act_rx_ = std::make_unique<Receiver>(groups_.world, rank_ - 1, kActTag, timeout_, xfer_device_);
    grad_tx_ = std::make_unique<Sender>(groups_.world, rank_ - 1, kGradTag, timeout_);
  }
  st = TieAtStart();
  absl::Status dry = DryRun(dummy_inputs, st.ok());
  if (st.ok()) st = dry;
  return AgreeOnStartup(st);
}

absl::Status Varuna::AgreeOnStartup(const absl::Status& local) {
  std::vector<torch::Tensor> flag{
      torch::tensor({local.ok() ? 0.0 : 1.0}, torch::kDouble).to(xfer_device_)};
  absl::Status reduced = AllReduceSum(groups_.world, flag, timeout_);
  if (!local.ok()) return local;
  RETURN_IF_ERROR(reduced);
  if (flag[0].item<double>() > 0) {
    return absl::AbortedError("another rank failed during start-up (its log names the problem)");
  }
  return absl::OkStatus();
}

// Builds this stage's layers and checks, without communicating, everything a later collective
// depends on.
absl::Status Varuna::BuildLocal() {
  const auto segments = model_.Segments();
  const int n = static_cast<int>(segments.size());
  if (!topo_.has_boundaries()) {
    std::vector<int> bounds = options_.boundaries;
    if (bounds.empty()) {
      ASSIGN_OR_RETURN(bounds, PartitionByCost(model_.SegmentCosts(), stages()));
    }
    RETURN_IF_ERROR(topo_.SetUniformBoundaries(bounds));
  }
  RETURN_IF_ERROR(topo_.Validate(n, global_batch_));
  std::tie(first_segment_, last_segment_) = topo_.SegmentsOf(rank_);
  // The stage (of this rank's pipeline) owning each segment, and so each tied parameter
  // "<layer name>.<param>".
  const std::vector<int>& bounds = topo_.pipeline(pipeline_).boundaries;
  std::vector<int> stage_of_segment(segments.size());
  for (int st = 0; st < stages(); ++st) {
    for (int sg = bounds[st]; sg < bounds[st + 1]; ++sg) stage_of_segment[sg] = st;
  }
  auto owner = [&](const std::string& param) -> int {
    size_t best = 0;
    int stage = -1;
    for (size_t sg = 0; sg < segments.size(); ++sg) {
      for (int layer : segments[sg]) {
        const std::string& name = model_.layers()[layer].name;
        if (name.size() > best && param.size() > name.size() &&
            param.compare(0, name.size(), name) == 0 && param[name.size()] == '.') {
          best = name.size();
          stage = stage_of_segment[sg];
        }
      }
    }
    return stage;
  };
  const int P = stages();
  for (const auto& [first, second] : model_.tied()) {
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
    if (a != b && (stage_ == a || stage_ == b) && !groups_.tied) {
      return absl::InvalidArgumentError("the model ties parameters but there is no tied group");
    }
  }
  RETURN_IF_ERROR(TorchCall("building the stage", [&] {
    std::lock_guard<std::mutex> init(InitMutex());
    for (int s = first_segment_; s < last_segment_; ++s) {
      for (int layer : segments[s]) {
        layers_.push_back(BuildLayer(model_, layer, options_.seed, device_));  // Note [Init]
        layer_names_.push_back(model_.layers()[layer].name);
        layer_segment_.push_back(s);
      }
    }
    torch::manual_seed(options_.seed * 7919ULL + 104729ULL * static_cast<uint64_t>(rank_));
  }));
  LOG(INFO) << "rank=" << rank_ << " pipeline=" << pipeline_ << " stage=" << stage_ << " segments=["
            << first_segment_ << "," << last_segment_
            << ") layers=" << absl::StrJoin(layer_names_, ",");
  // Note [Data-parallel reduction]: a parameter's gradient is summed over the holders of its
  // segment (one rank per pipeline). Parameters are grouped by that holder set, in layer order.
  std::map<std::vector<int>, int> group_of;
  for (size_t i = 0; i < layers_.size(); ++i) {
    int group = -1;
    if (topo_.num_pipelines() > 1) {
      const std::vector<int> holders = topo_.Holders(layer_segment_[i]);
      auto it = group_of.find(holders);
      if (it == group_of.end()) {
        auto pg = groups_.holders.find(holders);
        if (pg == groups_.holders.end() || !pg->second) {
          return absl::InvalidArgumentError(
              absl::StrCat("no data-parallel process group for ranks ", absl::StrJoin(holders, ","),
                           " (create the groups with "
                           "CreateProcessGroups on the same topology)"));
        }
        it = group_of.emplace(holders, static_cast<int>(dp_groups_.size())).first;
        dp_groups_.emplace_back();
        dp_groups_.back().pg = pg->second;
      }
      group = it->second;
    }
    for (const auto& p : layers_[i]->named_parameters(/*recurse=*/true)) {
      named_params_.emplace_back(absl::StrCat(layer_names_[i], ".", p.key()), p.value());
      if (group >= 0) dp_groups_[group].params.push_back(static_cast<int>(params_.size()));
      params_.push_back(p.value());
    }
  }
  // Flat buckets per group, laid out once in launch order: the backward produces gradients
  // from the last layer to the first, so buckets are filled in that order (the first at most
  // first_bucket_bytes, the rest bucket_bytes). Tied parameters get buckets of their own,
  // posted last: their gradients are complete only after ReduceTiedGradients().
  std::vector<bool> tied(params_.size(), false);
  for (const auto& [first, second] : model_.tied()) {
    for (size_t i = 0; i < named_params_.size(); ++i) {
      if (named_params_[i].first == first || named_params_[i].first == second) tied[i] = true;
    }
  }
  bucket_of_param_.assign(params_.size(), {-1, -1});
  for (size_t gi = 0; gi < dp_groups_.size(); ++gi) {
    DpGroup& g = dp_groups_[gi];
    for (bool tied_pass : {false, true}) {
      int64_t numel = 0, cap = std::max<int64_t>(1, options_.first_bucket_bytes / 4);
      bool open = false;
      for (auto it = g.params.rbegin(); it != g.params.rend(); ++it) {
        const int i = *it;
        if (tied[i] != tied_pass) continue;
        if (!open || (numel > 0 && numel + params_[i].numel() > cap)) {
          if (open) cap = std::max<int64_t>(1, options_.bucket_bytes / 4);
          g.bucket_of.emplace_back();
          numel = 0;
          open = true;
        }
        g.bucket_of.back().push_back(i);
        // Tied buckets are never posted by the hooks (their count never reaches zero).
        if (!tied_pass) {
          bucket_of_param_[i] = {static_cast<int>(gi), static_cast<int>(g.bucket_of.size()) - 1};
        }
        numel += params_[i].numel();
      }
    }
    for (const auto& b : g.bucket_of) {
      int64_t n = 0;
      for (int i : b) n += params_[i].numel();
      g.buckets.push_back(torch::empty({n}, torch::dtype(torch::kFloat).device(device_)));
      g.missing.push_back(static_cast<int>(b.size()));
    }
  }
  for (const auto& [first, second] : model_.tied()) {
    for (const std::string& name : {first, second}) {
      const int st = owner(name);
      bool found = false;
      for (auto& [n, p] : named_params_) found |= n == name;
      if (st == stage_ && !found) {
        return absl::InvalidArgumentError(
            absl::StrCat("tied parameter '", name, "' does not exist on its layer"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, torch::Tensor>> Varuna::named_parameters() const {
  return named_params_;
}

std::vector<torch::Tensor> Varuna::parameters() const { return params_; }

// Note [Tied weights]: the first parameter of a pair is the source of truth at start-up; its
// value is copied (locally, or from stage 0 to stage P-1 over the tied group) into the second.
// After every backward their gradients are summed, so both copies get identical updates.
// Placement was checked on every rank in BuildLocal().
absl::Status Varuna::TieAtStart() {
  std::map<std::string, torch::Tensor> mine(named_params_.begin(), named_params_.end());
  for (const auto& [first, second] : model_.tied()) {
    const bool has_first = mine.count(first) > 0, has_second = mine.count(second) > 0;
    if (has_first && has_second) {
      torch::NoGradGuard g;
      mine[second].copy_(mine[first]);
      tied_.push_back({mine[first], false, mine[second]});
      tied_.push_back({mine[second], true, mine[first]});
      second_copies_.push_back(mine[second]);
      continue;
    }
    if (!has_first && !has_second) continue;
    torch::Tensor p = has_first ? mine[first] : mine[second];
    if (has_first) {
      RETURN_IF_ERROR(
          SendBlocking(groups_.tied, ForTransfer(p, xfer_device_), 1, kTieTag, timeout_));
    } else {
      torch::Tensor buf = torch::empty(p.sizes(), p.options().device(xfer_device_));
      RETURN_IF_ERROR(RecvBlocking(groups_.tied, buf, 0, kTieTag, timeout_));
      torch::NoGradGuard g;
      p.copy_(buf);
      second_copies_.push_back(p);
    }
    tied_.push_back({p, !has_first, torch::Tensor()});
  }
  return absl::OkStatus();
}

torch::Tensor ForwardLayers(const std::vector<std::shared_ptr<Layer>>& layers,
                            const torch::Tensor& x, const TensorMap& inputs, Precision precision,
                            torch::Device device) {
  const bool bf16 = precision == Precision::kBf16;
  const bool cuda_fp16 = precision == Precision::kFp16 && device.is_cuda();
  if (bf16 && device.is_cpu()) {
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  } else if (bf16 || cuda_fp16) {
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(bf16 ? at::kBFloat16 : at::kHalf);
  }
  torch::Tensor h = x;
  for (const auto& l : layers) h = l->Forward(h, inputs);
  if (bf16 || cuda_fp16) {
    at::autocast::set_cpu_enabled(false);
    at::autocast::set_enabled(false);
    at::autocast::clear_cache();
  }
  return h;
}

torch::Tensor Varuna::StageForward(const torch::Tensor& x, const TensorMap& inputs) {
  return ForwardLayers(layers_, x, inputs, options_.precision, device_);
}

// Note [Dry run]: stage by stage along each pipeline, run the stage on 1 and 2 samples and pass
// the output shapes on. A dimension that is 1 then 2 is a batch dimension; this fixes the
// receive buffer shape for any micro-batch size, including a smaller last one. A stage that
// fails (or whose upstream failed) still passes a meta with ndim = -1 on, so nobody waits.
absl::Status Varuna::DryRun(const TensorMap& dummy_inputs, bool ok_so_far) {
  const int P = stages();
  auto meta_tensor =
      torch::zeros({2 + 2 * kMaxDims}, torch::dtype(torch::kLong).device(xfer_device_));
  absl::Status st = ok_so_far ? absl::OkStatus() : absl::AbortedError("skipped dry run");
  if (stage_ > 0) {
    absl::Status r = RecvBlocking(groups_.world, meta_tensor, rank_ - 1, kMetaTag, timeout_);
    if (st.ok()) st = r;
    meta_tensor = meta_tensor.cpu();
    in_meta_.assign(meta_tensor.data_ptr<int64_t>(),
                    meta_tensor.data_ptr<int64_t>() + meta_tensor.numel());
    if (st.ok() && in_meta_[0] < 0) {
      st = absl::AbortedError(absl::StrCat("stage ", stage_ - 1, " failed its dry run"));
    }
  }
  if (st.ok()) {
    st = TorchCall(absl::StrCat("dry run of stage ", stage_), [&]() -> absl::Status {
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
      if (stage_ > 0) {
        const TensorSpec s1 = BoundarySpec(in_meta_, 1), s2 = BoundarySpec(in_meta_, 2);
        x1 = torch::zeros(s1.shape, torch::dtype(s1.dtype).device(device_));
        x2 = torch::zeros(s2.shape, torch::dtype(s2.dtype).device(device_));
      }
      const RngState rng = GetRngState(device_);
      torch::Tensor o1, o2;
      {
        torch::NoGradGuard g;
        o1 = StageForward(x1, one);
        o2 = StageForward(x2, two);
      }
      SetRngState(device_, rng);
      if (stage_ == P - 1) {
        if (o1.dim() != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the last layer must return a scalar loss; got a tensor of ", o1.dim(), " dims"));
        }
        return absl::OkStatus();
      }
      if (o1.dim() > kMaxDims || o1.dim() != o2.dim() || o1.scalar_type() != o2.scalar_type()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stage ", stage_, " output must have the same rank (at most ", kMaxDims,
            ") and dtype for any batch size; got ", o1.dim(), " and ", o2.dim(), " dims"));
      }
      for (int i = 0; i < o1.dim(); ++i) {
        const bool batch_dim = o1.size(i) == 1 && o2.size(i) == 2;
        if (!batch_dim && o1.size(i) != o2.size(i)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "stage ", stage_, " output dim ", i, " is ", o1.size(i), " for 1 sample and ",
              o2.size(i), " for 2: boundary tensors may vary only in batch dimensions"));
        }
      }
      out_meta_ = MakeMeta(o1, o2);
      return absl::OkStatus();
    });
  }
  if (stage_ < P - 1) {
    std::vector<int64_t> meta = st.ok() ? out_meta_ : std::vector<int64_t>(2 + 2 * kMaxDims, 0);
    if (!st.ok()) meta[0] = -1;
    absl::Status s = SendBlocking(groups_.world, torch::tensor(meta, torch::kLong).to(xfer_device_),
                                  rank_ + 1, kMetaTag, timeout_);
    if (st.ok()) st = s;
  }
  return st;
}

TensorSpec Varuna::BoundarySpec(const std::vector<int64_t>& meta, int64_t batch) const {
  TensorSpec s;
  s.dtype = static_cast<torch::ScalarType>(meta[1]);
  for (int i = 0; i < meta[0]; ++i) {
    const int64_t a = meta[2 + i], b = meta[2 + kMaxDims + i];
    s.shape.push_back(a == 1 && b == 2 ? batch : a);
  }
  return s;
}

std::vector<TensorMap> Varuna::Split(const TensorMap& inputs, std::vector<int64_t>* sizes) const {
  const int64_t n = inputs.begin()->second.size(0);
  std::vector<TensorMap> mbs;
  for (int64_t start = 0; start < n; start += chunk_size_) {
    const int64_t len = std::min<int64_t>(chunk_size_, n - start);
    TensorMap mb;
    for (const auto& [k, t] : inputs) mb[k] = t.narrow(0, start, len).to(device_);
    mbs.push_back(std::move(mb));
    sizes->push_back(len);
  }
  return mbs;
}

// Note [Pipeline execution]: runs this stage's static task list. Received activations and
// gradients arrive on background threads in schedule order. Runtime reordering (Varuna's
// opportunistic swap): when the next task is a recompute whose gradient has not arrived and a
// forward is still pending whose input is already here (or needs none, on stage 0), the forward
// runs first. Requiring the forward's input to be present keeps the swap from ever blocking.
absl::Status Varuna::RunPipeline(const std::vector<TensorMap>& mbs,
                                 const std::vector<int64_t>& sizes, double weight_denominator,
                                 bool train, double* loss_partial) {
  const int P = stages(), M = static_cast<int>(mbs.size());
  const bool last = stage_ == P - 1;
  std::vector<Task> tasks;
  if (train) {
    tasks = MakeSchedule(options_.schedule, P, M, stage_);
  } else {
    for (int m = 0; m < M; ++m) tasks.push_back({TaskKind::kForward, m, false});
  }
  if (act_rx_) {
    std::vector<TensorSpec> specs;
    for (int m = 0; m < M; ++m) specs.push_back(BoundarySpec(in_meta_, sizes[m]));
    act_rx_->Start(std::move(specs));
  }
  if (act_tx_) act_tx_->Start(M);
  if (train && grad_rx_) {
    std::vector<TensorSpec> specs;
    for (int m = 0; m < M; ++m) specs.push_back(BoundarySpec(out_meta_, sizes[m]));
    grad_rx_->Start(std::move(specs));
  }
  if (train && grad_tx_) grad_tx_->Start(M);

  const double scale = options_.precision == Precision::kFp16 ? scaler_.scale() : 1.0;
  std::deque<Stash> stash;
  std::map<int, Graph> graphs;
  double wait_s = 0;
  int backwards = 0;
  auto take = [&](Receiver* rx) -> absl::StatusOr<torch::Tensor> {
    const auto t0 = Clock::now();
    auto r = rx->Take();
    wait_s += Seconds(t0, Clock::now());
    return r;
  };
  const auto t_start = Clock::now();
  absl::Status st = TorchCall(absl::StrCat("pipeline on stage ", stage_), [&]() -> absl::Status {
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].kind == TaskKind::kRecompute) {
        const size_t j =
            RecomputeYieldsTo(tasks, i, grad_rx_->Ready(), !act_rx_ || act_rx_->Ready());
        std::rotate(tasks.begin() + i, tasks.begin() + j, tasks.begin() + j + 1);
      }
      const Task t = tasks[i];
      const int m = t.micro_batch;
      switch (t.kind) {
        case TaskKind::kForward: {
          torch::Tensor x;
          if (act_rx_) {
            ASSIGN_OR_RETURN(x, take(act_rx_.get()));
            x = x.to(device_);
          }
          torch::Tensor out;
          if (train && t.keep_graph) {
            if (x.defined()) x.requires_grad_(true);
            out = StageForward(x, mbs[m]);
          } else {
            if (train) stash.push_back({m, x, GetRngState(device_)});
            torch::NoGradGuard g;
            out = StageForward(x, mbs[m]);
          }
          if (last) {
            // Loss = mean over the global batch, each micro-batch weighted by its size.
            out = out * (static_cast<double>(sizes[m]) / weight_denominator);
            *loss_partial += out.item<double>();
            if (train) graphs[m] = {x, out * scale};
          } else {
            act_tx_->Send(ForTransfer(out, xfer_device_));
            if (train && t.keep_graph) graphs[m] = {x, out};
          }
          break;
        }
        case TaskKind::kRecompute: {
          Stash s = std::move(stash.front());
          stash.pop_front();
          if (s.micro_batch != m) {
            return absl::InternalError(absl::StrCat("recompute of micro-batch ", m,
                                                    " found the stash of ", s.micro_batch));
          }
          // Note [Recompute RNG]: replay the forward's CPU and CUDA streams (dropout masks).
          const RngState saved = GetRngState(device_);
          SetRngState(device_, s.rng_state);
          torch::Tensor x = s.input;
          if (x.defined()) x = x.detach().requires_grad_(true);
          torch::Tensor out = StageForward(x, mbs[m]);
          SetRngState(device_, saved);
          graphs[m] = {x, out};
          break;
        }
        case TaskKind::kBackward: {
          auto it = graphs.find(m);
          if (it == graphs.end()) {
            return absl::InternalError(
                absl::StrCat("backward of micro-batch ", m, " has no activations"));
          }
          Graph g = std::move(it->second);
          graphs.erase(it);
          // The step's last backward completes this stage's gradients: from here the
          // hooks post each data-parallel bucket as soon as its gradients are final.
          if (++backwards == M) {
            std::lock_guard<std::mutex> l(dp_mu_);
            armed_ = options_.overlap_allreduce;
          }
          if (last) {
            g.output.backward();
          } else {
            ASSIGN_OR_RETURN(torch::Tensor grad, take(grad_rx_.get()));
            g.output.backward(grad.to(device_));
          }
          if (grad_tx_) {
            torch::Tensor gx = g.input.grad();
            if (!gx.defined()) gx = torch::zeros_like(g.input);
            grad_tx_->Send(ForTransfer(gx, xfer_device_));
          }
          break;
        }
      }
    }
    return absl::OkStatus();
  });
  {
    std::lock_guard<std::mutex> l(dp_mu_);
    armed_ = false;
  }
  // Join every comm thread even after an error, so none outlives the step.
  if (!st.ok()) {
    for (Receiver* rx : {act_rx_.get(), grad_rx_.get()}) {
      if (rx != nullptr) rx->Abort();
    }
    for (Sender* tx : {act_tx_.get(), grad_tx_.get()}) {
      if (tx != nullptr) tx->Abort();
    }
  }
  Receiver* grad_rx = train ? grad_rx_.get() : nullptr;
  Sender* grad_tx = train ? grad_tx_.get() : nullptr;
  for (Receiver* rx : {act_rx_.get(), grad_rx}) {
    if (rx != nullptr) {
      absl::Status s = rx->Join();
      if (st.ok() && !s.ok()) st = s;
    }
  }
  for (Sender* tx : {act_tx_.get(), grad_tx}) {
    if (tx != nullptr) {
      absl::Status s = tx->Join();
      if (st.ok() && !s.ok()) st = s;
    }
  }
  last_pipeline_s_ = Seconds(t_start, Clock::now());
  last_wait_s_ = wait_s;
  return st;
}

absl::Status Varuna::ReduceTiedGradients() {
  std::vector<torch::Tensor> remote;
  for (auto& t : tied_) {
    if (t.local_partner.defined()) {
      if (!t.second) {
        t.param.mutable_grad().add_(t.local_partner.grad());
        t.local_partner.mutable_grad().copy_(t.param.grad());
      }
    } else {
      remote.push_back(t.param.grad());
    }
  }
  if (remote.empty()) return absl::OkStatus();
  return AllReduceSum(groups_.tied, remote, timeout_);
}

// Note [Overlapped all-reduce]: a post-hook on each parameter's gradient accumulator (what
// DDP hooks) fires once the backward has added that parameter's gradient. While armed (the
// last micro-batch's backward of the step), it counts the bucket's missing gradients down;
// buckets are posted strictly in their launch order, the same on every member of the group,
// so collectives match. Posting copies the gradients into the bucket: they are final, so the
// bucket holds exactly what the non-overlapped path would copy after the pipeline, and the
// sum is bit-identical. Tied parameters' buckets wait for ReduceTiedGradients().
void Varuna::RegisterGradHooks() {
  for (const DpGroup& g : dp_groups_) {
    for (int i : g.params) {
      auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
      if (!acc) continue;
      acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, i](const torch::autograd::variable_list& outputs,
                    const torch::autograd::variable_list&) {
            OnGradReady(i);
            return outputs;
          }));
      grad_accs_.push_back(std::move(acc));
    }
  }
}

void Varuna::OnGradReady(int param) {
  std::lock_guard<std::mutex> l(dp_mu_);
  if (!armed_) return;
  const auto [gi, b] = bucket_of_param_[param];
  if (gi < 0) return;
  DpGroup& g = dp_groups_[gi];
  --g.missing[b];
  LaunchReadyBuckets();
}

void Varuna::LaunchReadyBuckets() {
  torch::NoGradGuard no_grad;
  for (DpGroup& g : dp_groups_) {
    while (g.next < g.bucket_of.size() && g.missing[g.next] <= 0) {
      const size_t b = g.next++;
      int64_t off = 0;
      for (int i : g.bucket_of[b]) {
        const int64_t n = params_[i].numel();
        g.buckets[b].narrow(0, off, n).copy_(params_[i].grad().reshape({-1}));
        off += n;
      }
      g.works.push_back(g.pg->AllReduceSum(g.buckets[b], timeout_));
    }
  }
}

// Note [Data-parallel reduction] (continued): each group's gradients are packed into flat
// buckets and sum-all-reduced over the group's ranks (the loss was already divided by the
// global batch, so the sum is the mean gradient). Whatever the hooks did not post (everything,
// without overlap; tied parameters; parameters without a gradient) is posted here, in order;
// a rank's groups are all different process groups, so no order between them can deadlock.
absl::Status Varuna::ReduceDataParallel() {
  if (dp_groups_.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> l(dp_mu_);
  absl::Status st = TorchCall("data-parallel all-reduce", [&]() -> absl::Status {
    last_early_buckets_ = 0;
    for (DpGroup& g : dp_groups_) last_early_buckets_ += static_cast<int>(g.next);
    for (DpGroup& g : dp_groups_) std::fill(g.missing.begin(), g.missing.end(), 0);
    LaunchReadyBuckets();
    for (DpGroup& g : dp_groups_) {
      for (auto& w : g.works) w->Wait(timeout_);
    }
    torch::NoGradGuard no_grad;
    for (DpGroup& g : dp_groups_) {
      for (size_t b = 0; b < g.bucket_of.size(); ++b) {
        int64_t off = 0;
        for (int i : g.bucket_of[b]) {
          const int64_t n = params_[i].numel();
          params_[i].mutable_grad().copy_(g.buckets[b].narrow(0, off, n).view_as(params_[i]));
          off += n;
        }
      }
    }
    return absl::OkStatus();
  });
  for (DpGroup& g : dp_groups_) {
    if (!st.ok()) {
      for (auto& w : g.works) w->Abort();
    }
    g.works.clear();
    g.next = 0;
    g.missing.clear();
    for (const auto& b : g.bucket_of) g.missing.push_back(static_cast<int>(b.size()));
  }
  return st;
}

absl::Status Varuna::CheckInputs(const TensorMap& inputs, int64_t want) const {
  if (broken_) {
    return absl::FailedPreconditionError(
        "an earlier step failed; messages may be in flight, so this engine cannot continue");
  }
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

absl::StatusOr<StepResult> Varuna::step(const TensorMap& inputs) {
  if (!optimizer_) return absl::FailedPreconditionError("step() before set_optimizer()");
  RETURN_IF_ERROR(CheckInputs(inputs, topo_.pipeline(pipeline_).samples));
  // Any failure below leaves peers and in-flight messages in an unknown state.
  broken_ = true;
  std::vector<int64_t> sizes;
  std::vector<TensorMap> mbs;
  RETURN_IF_ERROR(TorchCall("splitting the batch", [&] { mbs = Split(inputs, &sizes); }));
  double loss = 0;
  RETURN_IF_ERROR(RunPipeline(mbs, sizes, static_cast<double>(global_batch_), true, &loss));
  const auto& params = params_;
  RETURN_IF_ERROR(TorchCall("gradients", [&] {
    for (auto& p : params) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    }
  }));
  RETURN_IF_ERROR(ReduceTiedGradients());
  const double stop =
      (stop_requested_.load() || (options_.stop_flag && options_.stop_flag->load())) ? 1.0 : 0.0;
  RETURN_IF_ERROR(ReduceDataParallel());

  StepResult result;
  absl::Status st = TorchCall("optimizer step", [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    const bool fp16 = options_.precision == Precision::kFp16;
    if (fp16) {
      for (auto& p : params) p.mutable_grad().div_(scaler_.scale());
    }
    // Local squared norm; the second copy of a tied pair is not counted twice.
    std::vector<torch::Tensor> squares;
    for (auto& p : params) {
      bool second_copy = false;
      for (auto& c : second_copies_) second_copy |= c.is_same(p);
      if (!second_copy) squares.push_back(p.grad().pow(2).sum().to(torch::kDouble));
    }
    const double norm_sq = squares.empty() ? 0.0 : torch::stack(squares).sum().item<double>();
    int64_t local_params = 0;
    for (auto& p : params) {
      bool second_copy = false;
      for (auto& c : second_copies_) second_copy |= c.is_same(p);
      if (!second_copy) local_params += p.numel();
    }
    const bool local_overflow = !std::isfinite(norm_sq);
    // Note [Step agreement]: one world sum of [overflow, squared norm, loss, stop]. Pipeline 0
    // holds every layer once, so its ranks alone contribute the norm; every last stage adds
    // its pipeline's share of the loss; any rank's overflow or stop request counts. Every rank
    // then makes the same decision after the same step.
    // Then pipeline 0's parameter count, and each rank's busy and wait time in its own slots
    // (Note [Step timing]).
    const int W = topo_.world_size();
    std::vector<double> values(5 + 2 * W, 0.0);
    values[0] = local_overflow ? 1.0 : 0.0;
    values[1] = local_overflow || pipeline_ != 0 ? 0.0 : norm_sq;
    values[2] = is_last_stage() ? loss : 0.0;
    values[3] = stop;
    values[4] = pipeline_ == 0 ? static_cast<double>(local_params) : 0.0;
    values[5 + rank_] = std::max(0.0, last_pipeline_s_ - last_wait_s_);
    values[5 + W + rank_] = last_wait_s_;
    auto meta = torch::tensor(values, torch::kDouble).to(xfer_device_);
    if (topo_.world_size() > 1) {
      std::vector<torch::Tensor> v{meta};
      RETURN_IF_ERROR(AllReduceSum(groups_.world, v, timeout_));
    }
    // From here on only local state changes (scaler, parameters, optimizer, iteration):
    // rescue() on another thread sees all of this step or none of it (Note [Rescue]).
    meta = meta.cpu();
    std::lock_guard<std::mutex> state(state_mu_);
    result.overflow = meta[0].item<double>() > 0;
    result.grad_norm = std::sqrt(meta[1].item<double>());
    result.loss = meta[2].item<double>();
    result.stop = meta[3].item<double>() > 0;
    result.model_parameters = static_cast<int64_t>(meta[4].item<double>());
    {
      const double* m = meta.data_ptr<double>();
      const PipelineLayout& p0 = topo_.pipeline(0);
      double busy = 0, longest = 0;
      for (int r = p0.first_rank; r < p0.first_rank + p0.stages(); ++r) {
        result.stage_busy_s.push_back(m[5 + r]);
        result.stage_wait_s.push_back(m[5 + W + r]);
        busy += m[5 + r];
        longest = std::max(longest, m[5 + r] + m[5 + W + r]);
      }
      result.bubble_ratio = longest > 0 ? std::max(0.0, 1.0 - busy / (p0.stages() * longest)) : 0;
    }
    const bool skip = fp16 ? scaler_.Update(result.overflow) : result.overflow;
    if (!skip) {
      if (options_.clip_grad_norm > 0) {
        const double coef = options_.clip_grad_norm / (result.grad_norm + 1e-6);
        if (coef < 1) {
          for (auto& p : params) p.mutable_grad().mul_(coef);
        }
      }
      if (lr_fn_) {
        const double lr = lr_fn_(iteration_ + 1);
        for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
      }
      optimizer_->step();
    }
    for (auto& p : params) p.mutable_grad().zero_();
    ++iteration_;
    return absl::OkStatus();
  });
  RETURN_IF_ERROR(st);
  broken_ = false;
  return result;
}

absl::StatusOr<double> Varuna::evaluate(const TensorMap& inputs) {
  RETURN_IF_ERROR(CheckInputs(inputs, 0));
  broken_ = true;
  for (auto& l : layers_) l->eval();
  std::vector<int64_t> sizes;
  std::vector<TensorMap> mbs;
  absl::Status st = TorchCall("splitting the batch", [&] { mbs = Split(inputs, &sizes); });
  // Each last stage sums loss x samples over its pipeline's inputs; one world sum of
  // [loss, samples] gives the mean over every pipeline's inputs.
  double loss = 0;
  if (st.ok()) st = RunPipeline(mbs, sizes, 1.0, false, &loss);
  for (auto& l : layers_) l->train();
  RETURN_IF_ERROR(st);
  const double n = static_cast<double>(inputs.begin()->second.size(0));
  auto t = torch::tensor({is_last_stage() ? loss : 0.0, is_last_stage() ? n : 0.0}, torch::kDouble)
               .to(xfer_device_);
  std::vector<torch::Tensor> v{t};
  if (topo_.world_size() > 1) RETURN_IF_ERROR(AllReduceSum(groups_.world, v, timeout_));
  v[0] = v[0][0] / v[0][1];
  broken_ = false;
  return v[0].item<double>();
}

}  // namespace varuna
