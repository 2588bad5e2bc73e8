#include "worker/varuna.h"

#include <ATen/autocast_mode.h>

#include <cmath>
#include <deque>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/partition.h"
#include "common/status_macros.h"
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
  torch::Tensor rng_state;
};

// Activations kept for a backward.
struct Graph {
  torch::Tensor input;
  torch::Tensor output;
};

torch::Tensor GetRngState() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetRngState(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", name, "'; expected fp32, bf16 or fp16"));
}

Varuna::Varuna(Model model, StageMap map, int rank, ProcessGroups groups, int64_t global_batch,
               int chunk_size, torch::Device device, VarunaOptions options)
    : model_(std::move(model)),
      map_(std::move(map)),
      rank_(rank),
      stage_(map_.StageOf(rank)),
      groups_(std::move(groups)),
      global_batch_(global_batch),
      chunk_size_(chunk_size),
      device_(device),
      options_(options),
      timeout_(groups_.timeout),
      scaler_(options.init_loss_scale, options.loss_scale_window) {}

Varuna::~Varuna() = default;

absl::StatusOr<std::unique_ptr<Varuna>> Varuna::Create(
    Model model, StageMap map, int rank, ProcessGroups groups, const TensorMap& dummy_inputs,
    int64_t global_batch, int chunk_size, torch::Device device, VarunaOptions options) {
  if (global_batch % map.replicas() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global batch ", global_batch, " is not divisible by ", map.replicas(), " replicas"));
  }
  if (chunk_size < 1) return absl::InvalidArgumentError("chunk_size must be >= 1");
  std::unique_ptr<Varuna> v(new Varuna(std::move(model), std::move(map), rank, std::move(groups),
                                       global_batch, chunk_size, device, options));
  RETURN_IF_ERROR(v->Build(dummy_inputs));
  return v;
}

absl::Status Varuna::Build(const TensorMap& dummy_inputs) {
  const auto segments = model_.Segments();
  ASSIGN_OR_RETURN(std::vector<int> bounds, PartitionByCost(model_.SegmentCosts(), map_.stages()));
  first_segment_ = bounds[stage_];
  last_segment_ = bounds[stage_ + 1];
  RETURN_IF_ERROR(TorchCall("building the stage", [&] {
    for (int s = first_segment_; s < last_segment_; ++s) {
      for (int layer : segments[s]) {
        const auto& def = model_.layers()[layer];
        // Note [Init]: one RNG stream per layer index, so initial weights do not depend on P.
        torch::manual_seed(options_.seed * 1000003ULL + static_cast<uint64_t>(layer));
        auto l = def.factory();
        l->to(device_);
        l->train();
        layers_.push_back(std::move(l));
        layer_names_.push_back(def.name);
      }
    }
    torch::manual_seed(options_.seed * 7919ULL + 104729ULL * static_cast<uint64_t>(rank_));
  }));
  LOG(INFO) << "rank=" << rank_ << " stage=" << stage_ << " segments=[" << first_segment_ << ","
            << last_segment_ << ") layers=" << absl::StrJoin(layer_names_, ",");
  RETURN_IF_ERROR(TieAtStart());
  const int P = map_.stages();
  const int me = rank_;
  if (stage_ < P - 1) {
    act_tx_ = std::make_unique<Sender>(groups_.world, me + 1, kActTag, timeout_);
    grad_rx_ = std::make_unique<Receiver>(groups_.world, me + 1, kGradTag, timeout_);
  }
  if (stage_ > 0) {
    act_rx_ = std::make_unique<Receiver>(groups_.world, me - 1, kActTag, timeout_);
    grad_tx_ = std::make_unique<Sender>(groups_.world, me - 1, kGradTag, timeout_);
  }
  return DryRun(dummy_inputs);
}

std::vector<std::pair<std::string, torch::Tensor>> Varuna::named_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (const auto& p : layers_[i]->named_parameters(/*recurse=*/true)) {
      out.emplace_back(absl::StrCat(layer_names_[i], ".", p.key()), p.value());
    }
  }
  return out;
}

std::vector<torch::Tensor> Varuna::parameters() const {
  std::vector<torch::Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

// Note [Tied weights]: the first parameter of a pair is the source of truth at start-up; its
// value is copied (locally, or from stage 0 to stage P-1 over the tied group) into the second.
// After every backward their gradients are summed, so both copies get identical updates.
absl::Status Varuna::TieAtStart() {
  std::map<std::string, torch::Tensor> mine;
  for (auto& [name, p] : named_parameters()) mine[name] = p;
  const int P = map_.stages();
  for (const auto& [first, second] : model_.tied()) {
    const bool has_first = mine.count(first) > 0, has_second = mine.count(second) > 0;
    if (has_first && has_second) {
      torch::NoGradGuard g;
      mine[second].copy_(mine[first]);
      tied_.push_back({mine[first], false, mine[second]});
      tied_.push_back({mine[second], true, mine[first]});
      continue;
    }
    if (!has_first && !has_second) continue;
    if (!(has_first ? stage_ == 0 : stage_ == P - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tied parameters '", first, "' and '", second,
          "' must live on the first and the last stage; this partition puts one on stage ",
          stage_));
    }
    torch::Tensor p = has_first ? mine[first] : mine[second];
    if (has_first) {
      RETURN_IF_ERROR(SendBlocking(groups_.tied, p.detach().contiguous(), 1, kTieTag, timeout_));
    } else {
      torch::Tensor buf = torch::empty_like(p);
      RETURN_IF_ERROR(RecvBlocking(groups_.tied, buf, 0, kTieTag, timeout_));
      torch::NoGradGuard g;
      p.copy_(buf);
    }
    tied_.push_back({p, !has_first, torch::Tensor()});
  }
  return absl::OkStatus();
}

torch::Tensor Varuna::StageForward(const torch::Tensor& x, const TensorMap& inputs) {
  const bool bf16 = options_.precision == Precision::kBf16;
  const bool cuda_fp16 = options_.precision == Precision::kFp16 && device_.is_cuda();
  if (bf16 && device_.is_cpu()) {
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  } else if (bf16 || cuda_fp16) {
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(bf16 ? at::kBFloat16 : at::kHalf);
  }
  torch::Tensor h = x;
  for (auto& l : layers_) h = l->Forward(h, inputs);
  if (bf16 || cuda_fp16) {
    at::autocast::set_cpu_enabled(false);
    at::autocast::set_enabled(false);
    at::autocast::clear_cache();
  }
  return h;
}

// Note [Dry run]: stage by stage along each pipeline, run the stage on 1 and 2 samples and pass
// the output shapes on. A dimension that is 1 then 2 is a batch dimension; this fixes the
// receive buffer shape for any micro-batch size, including a smaller last one.
absl::Status Varuna::DryRun(const TensorMap& dummy_inputs) {
  TensorMap one, two;
  for (const auto& [k, t] : dummy_inputs) {
    if (t.size(0) < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("dummy input '", k, "' needs at least 2 samples, has ", t.size(0)));
    }
    one[k] = t.narrow(0, 0, 1).to(device_);
    two[k] = t.narrow(0, 0, 2).to(device_);
  }
  const int P = map_.stages();
  auto meta_tensor = torch::zeros({2 + 2 * kMaxDims}, torch::kLong);
  torch::Tensor x1, x2;
  if (stage_ > 0) {
    RETURN_IF_ERROR(RecvBlocking(groups_.world, meta_tensor, rank_ - 1, kMetaTag, timeout_));
    in_meta_.assign(meta_tensor.data_ptr<int64_t>(),
                    meta_tensor.data_ptr<int64_t>() + meta_tensor.numel());
    const TensorSpec s1 = BoundarySpec(in_meta_, 1), s2 = BoundarySpec(in_meta_, 2);
    x1 = torch::zeros(s1.shape, torch::dtype(s1.dtype).device(device_));
    x2 = torch::zeros(s2.shape, torch::dtype(s2.dtype).device(device_));
  }
  torch::Tensor o1, o2;
  const auto rng = GetRngState();
  RETURN_IF_ERROR(TorchCall(absl::StrCat("dry run of stage ", stage_), [&] {
    torch::NoGradGuard g;
    o1 = StageForward(x1, one);
    o2 = StageForward(x2, two);
  }));
  SetRngState(rng);
  if (stage_ < P - 1) {
    if (o1.dim() > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", stage_, " output has ", o1.dim(),
                                                     " dims; at most ", kMaxDims, " supported"));
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
    auto t = torch::tensor(out_meta_, torch::kLong);
    RETURN_IF_ERROR(SendBlocking(groups_.world, t, rank_ + 1, kMetaTag, timeout_));
  } else if (o1.dim() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the last layer must return a scalar loss; got a tensor of ", o1.dim(), " dims"));
  }
  return absl::OkStatus();
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
  const int P = map_.stages(), M = static_cast<int>(mbs.size());
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
  auto take = [&](Receiver* rx) -> absl::StatusOr<torch::Tensor> {
    const auto t0 = Clock::now();
    auto r = rx->Take();
    wait_s += Seconds(t0, Clock::now());
    return r;
  };
  const auto t_start = Clock::now();
  absl::Status st = TorchCall(absl::StrCat("pipeline on stage ", stage_), [&]() -> absl::Status {
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].kind == TaskKind::kRecompute && !grad_rx_->Ready()) {
        for (size_t j = i + 1; j < tasks.size(); ++j) {
          if (tasks[j].kind != TaskKind::kForward) continue;
          if (!act_rx_ || act_rx_->Ready()) {
            std::rotate(tasks.begin() + i, tasks.begin() + j, tasks.begin() + j + 1);
          }
          break;
        }
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
            if (train) stash.push_back({m, x, GetRngState()});
            torch::NoGradGuard g;
            out = StageForward(x, mbs[m]);
          }
          if (last) {
            // Loss = mean over the global batch, each micro-batch weighted by its size.
            out = out * (static_cast<double>(sizes[m]) / weight_denominator);
            *loss_partial += out.item<double>();
            if (train) graphs[m] = {x, out * scale};
          } else {
            act_tx_->Send(out.detach().contiguous());
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
          const auto saved = GetRngState();
          SetRngState(s.rng_state);
          torch::Tensor x = s.input;
          if (x.defined()) x = x.detach().requires_grad_(true);
          torch::Tensor out = StageForward(x, mbs[m]);
          SetRngState(saved);
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
          if (last) {
            g.output.backward();
          } else {
            ASSIGN_OR_RETURN(torch::Tensor grad, take(grad_rx_.get()));
            g.output.backward(grad.to(device_));
          }
          if (grad_tx_) {
            torch::Tensor gx = g.input.grad();
            if (!gx.defined()) gx = torch::zeros_like(g.input);
            grad_tx_->Send(gx.contiguous());
          }
          break;
        }
      }
    }
    return absl::OkStatus();
  });
  // Join every comm thread even after an error, so none outlives the step.
  if (!st.ok()) {
    for (Receiver* rx : {act_rx_.get(), grad_rx_.get()}) {
      if (rx != nullptr) rx->Abort();
    }
    for (Sender* tx : {act_tx_.get(), grad_tx_.get()}) {
      if (tx != nullptr) tx->Abort();
    }
  }
  for (Receiver* rx : {act_rx_.get(), grad_rx_.get()}) {
    if (rx != nullptr) {
      absl::Status s = rx->Join();
      if (st.ok() && !s.ok()) st = s;
    }
  }
  for (Sender* tx : {act_tx_.get(), grad_tx_.get()}) {
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
    if (!t.param.grad().defined()) t.param.mutable_grad() = torch::zeros_like(t.param);
  }
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

// Note [Data-parallel reduction]: gradients of this stage are packed into flat buckets and
// sum-all-reduced over the stage's replicas (the loss was already divided by the global batch,
// so the sum is the mean gradient). The last stage appends its partial loss to the last
// bucket, so the replicas' losses are summed by the same collective.
absl::Status Varuna::ReduceDataParallel(double* loss_partial) {
  if (!groups_.data_parallel) return absl::OkStatus();
  auto params = parameters();
  const bool last = is_last_stage();
  return TorchCall("data-parallel all-reduce", [&]() -> absl::Status {
    std::vector<std::vector<int>> groups(1);
    std::vector<int64_t> numels(1, 0);
    const int64_t max_elems = std::max<int64_t>(1, options_.bucket_bytes / 4);
    for (int i = 0; i < static_cast<int>(params.size()); ++i) {
      if (numels.back() > 0 && numels.back() + params[i].numel() > max_elems) {
        groups.emplace_back();
        numels.push_back(0);
      }
      groups.back().push_back(i);
      numels.back() += params[i].numel();
    }
    if (last) numels.back() += 1;
    if (buckets_.size() != groups.size()) buckets_.assign(groups.size(), torch::Tensor());
    for (size_t b = 0; b < groups.size(); ++b) {
      if (!buckets_[b].defined() || buckets_[b].numel() != numels[b]) {
        buckets_[b] = torch::empty({numels[b]}, torch::dtype(torch::kFloat).device(device_));
      }
      int64_t off = 0;
      for (int i : groups[b]) {
        const int64_t n = params[i].numel();
        buckets_[b].narrow(0, off, n).copy_(params[i].grad().reshape({-1}));
        off += n;
      }
      if (last && b + 1 == groups.size()) buckets_[b][off] = *loss_partial;
    }
    RETURN_IF_ERROR(AllReduceSum(groups_.data_parallel, buckets_, timeout_));
    for (size_t b = 0; b < groups.size(); ++b) {
      int64_t off = 0;
      for (int i : groups[b]) {
        const int64_t n = params[i].numel();
        params[i].mutable_grad().copy_(buckets_[b].narrow(0, off, n).view_as(params[i]));
        off += n;
      }
      if (last && b + 1 == groups.size()) *loss_partial = buckets_[b][off].item<double>();
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<StepResult> Varuna::step(const TensorMap& inputs) {
  if (!optimizer_) return absl::FailedPreconditionError("step() before set_optimizer()");
  const int64_t per_replica = global_batch_ / map_.replicas();
  if (inputs.empty() || inputs.begin()->second.size(0) != per_replica) {
    return absl::InvalidArgumentError(
        absl::StrCat("step() needs this replica's share of the global batch: ", per_replica,
                     " samples, got ", inputs.empty() ? 0 : inputs.begin()->second.size(0)));
  }
  std::vector<int64_t> sizes;
  const auto mbs = Split(inputs, &sizes);
  double loss = 0;
  RETURN_IF_ERROR(RunPipeline(mbs, sizes, static_cast<double>(global_batch_), true, &loss));
  auto params = parameters();
  for (auto& p : params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  }
  RETURN_IF_ERROR(ReduceTiedGradients());
  RETURN_IF_ERROR(ReduceDataParallel(&loss));

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
      for (auto& t : tied_) second_copy |= t.second && t.param.is_same(p);
      if (!second_copy) squares.push_back(p.grad().pow(2).sum().to(torch::kDouble));
    }
    const double norm_sq = squares.empty() ? 0.0 : torch::stack(squares).sum().item<double>();
    const bool local_overflow = !std::isfinite(norm_sq);
    auto meta = torch::tensor(
        {local_overflow ? 1.0 : 0.0, local_overflow ? 0.0 : norm_sq, is_last_stage() ? loss : 0.0},
        torch::kDouble);
    if (groups_.pipeline) {
      std::vector<torch::Tensor> v{meta};
      RETURN_IF_ERROR(AllReduceSum(groups_.pipeline, v, timeout_));
    }
    result.overflow = meta[0].item<double>() > 0;
    result.grad_norm = std::sqrt(meta[1].item<double>());
    result.loss = meta[2].item<double>();
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
    return absl::OkStatus();
  });
  RETURN_IF_ERROR(st);
  ++iteration_;
  return result;
}

absl::StatusOr<double> Varuna::evaluate(const TensorMap& inputs) {
  if (inputs.empty()) return absl::InvalidArgumentError("evaluate() needs inputs");
  for (auto& l : layers_) l->eval();
  std::vector<int64_t> sizes;
  const auto mbs = Split(inputs, &sizes);
  const double denominator = static_cast<double>(inputs.begin()->second.size(0)) * map_.replicas();
  double loss = 0;
  absl::Status st = RunPipeline(mbs, sizes, denominator, false, &loss);
  for (auto& l : layers_) l->train();
  RETURN_IF_ERROR(st);
  auto t = torch::tensor({is_last_stage() ? loss : 0.0}, torch::kDouble);
  std::vector<torch::Tensor> v{t};
  if (groups_.data_parallel && is_last_stage()) {
    RETURN_IF_ERROR(AllReduceSum(groups_.data_parallel, v, timeout_));
  }
  if (groups_.pipeline) RETURN_IF_ERROR(AllReduceSum(groups_.pipeline, v, timeout_));
  return v[0].item<double>();
}

}  // namespace varuna
