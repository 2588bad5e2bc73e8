#include "worker/engine/pipeline_executor.h"

#include <ATen/autocast_mode.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/version.h>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/dist/device.h"
#include "worker/dist/torch_status.h"
#include "worker/models/linear.h"

namespace varuna {
namespace {

constexpr int kActTag = 0, kGradTag = 1;

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
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

// Turns autocast on `type` (kCPU or kCUDA) on or off; `dtype` is its lower precision.
void SetAutocast(at::DeviceType type, bool enabled, at::ScalarType dtype = at::kBFloat16) {
  at::autocast::set_autocast_enabled(type, enabled);
  if (enabled) at::autocast::set_autocast_dtype(type, dtype);
}

// Note [Input prefetch]: to a GPU, each input goes through pinned memory once, and every
// micro-batch's copy is queued on a side stream at the start of the step, each followed by an
// event the compute stream waits on before that micro-batch's forward: micro-batch m + 1's copy
// runs on the copy engine while micro-batch m computes, and no copy waits for the host (a
// pageable copy waits for the stream: a host sync per input). The copies are allocated from
// the side stream, so each is marked as used by the compute stream (record_stream), or the
// caching allocator could hand its memory to the next step's copies while the compute stream
// still reads it; the pinned host blocks are held by the allocator until their copies are done.
std::vector<TensorMap> Split(const TensorMap& inputs, int64_t chunk_size, torch::Device device,
                             std::vector<int64_t>* sizes, std::vector<c10::Event>* ready) {
  const int64_t n = inputs.begin()->second.size(0);
  const bool prefetch = device.is_cuda();
  TensorMap from = inputs;
  std::optional<c10::impl::VirtualGuardImpl> impl;
  std::optional<c10::Stream> compute, side;
  if (prefetch) {
    for (auto& [k, t] : from) {
      if (t.is_cpu()) t = t.contiguous().pin_memory();
    }
    impl.emplace(device.type());
    compute = impl->getStream(device);
    side = impl->getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  }
  std::vector<TensorMap> mbs;
  for (int64_t start = 0; start < n; start += chunk_size) {
    const int64_t len = std::min<int64_t>(chunk_size, n - start);
    TensorMap mb;
    if (prefetch) {
      c10::StreamGuard on_side(*side);
      for (const auto& [k, t] : from) {
        mb[k] = t.narrow(0, start, len).to(device, /*non_blocking=*/true);
        mb[k].record_stream(*compute);
      }
      ready->emplace_back(device.type());
      ready->back().record(*side);
    } else {
      for (const auto& [k, t] : from) mb[k] = t.narrow(0, start, len).to(device);
    }
    mbs.push_back(std::move(mb));
    sizes->push_back(len);
  }
  return mbs;
}

// Note [Autocast cache]: under autocast each weight is cast to the lower precision once and
// the cast is cached (per thread) until the cache is cleared; clearing it after every forward
// re-cast every weight in every micro-batch (about 1.8 ms a step per micro-batch at 1.3B,
// ../shared/reference/gpu-perf.md). The executor keeps the cache for a run (a step's
// micro-batches) and clears it at the run's end, before the update changes the weights under
// their cached casts (pipeline_executor_test: a run after an in-place change sees the new
// weights). A cast cached by a forward without grad (Varuna's schedule forwards so, then
// recomputes with grad) is reused by the recompute and still carries the gradient to its
// weight in LibTorch 2.11: engine_test's bf16 test, where every weight must move on every
// schedule, holds that.
void ClearAutocastCache() { at::autocast::clear_cache(); }

}  // namespace

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", name, "'; expected fp32, bf16 or fp16"));
}

torch::Tensor ForwardLayers(const std::vector<std::shared_ptr<Layer>>& layers,
                            const torch::Tensor& x, const TensorMap& inputs, Precision precision,
                            torch::Device device, bool keep_autocast_cache) {
  const bool bf16 = precision == Precision::kBf16;
  const bool cuda_fp16 = precision == Precision::kFp16 && device.is_cuda();
  if (bf16 && device.is_cpu()) {
    SetAutocast(at::kCPU, true, at::kBFloat16);
  } else if (bf16 || cuda_fp16) {
    SetAutocast(at::kCUDA, true, bf16 ? at::kBFloat16 : at::kHalf);
  }
  torch::Tensor h = x;
  for (const auto& l : layers) h = l->Forward(h, inputs);
  if (bf16 || cuda_fp16) {
    SetAutocast(at::kCPU, false);
    SetAutocast(at::kCUDA, false);
    if (!keep_autocast_cache) ClearAutocastCache();
  }
  return h;
}

std::vector<int64_t> MakeBoundaryMeta(const torch::Tensor& at1, const torch::Tensor& at2) {
  std::vector<int64_t> meta(kBoundaryMetaSize, 0);
  meta[0] = at1.dim();
  meta[1] = static_cast<int64_t>(at1.scalar_type());
  for (int i = 0; i < at1.dim(); ++i) {
    meta[2 + i] = at1.size(i);
    meta[2 + kMaxBoundaryDims + i] = at2.size(i);
  }
  return meta;
}

TensorSpec BoundarySpec(const std::vector<int64_t>& meta, int64_t batch) {
  TensorSpec s;
  s.dtype = static_cast<torch::ScalarType>(meta[1]);
  for (int i = 0; i < meta[0]; ++i) {
    const int64_t a = meta[2 + i], b = meta[2 + kMaxBoundaryDims + i];
    s.shape.push_back(a == 1 && b == 2 ? batch : a);
  }
  return s;
}

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

struct PipelineExecutor::RunState {
  explicit RunState(const PipelineRunOptions& o) : options(o) {}

  const PipelineRunOptions& options;
  std::vector<TensorMap> mbs;
  std::vector<int64_t> sizes;
  // What each micro-batch's loss is a mean over (Note [Masked-token weighting]).
  std::vector<double> units;
  // On a GPU, each micro-batch's inputs are on the device once its event has completed
  // (Note [Input prefetch]); cleared by its forward, which makes the compute stream wait.
  std::vector<c10::Event> inputs_ready;
  std::vector<bool> waited;
  std::vector<Task> tasks;
  std::deque<Stash> stash;
  std::map<int, Graph> graphs;
  // Split schedules: each micro-batch's recorded linears, from its forward to its W.
  std::map<int, WeightGradCapture> captures;
  torch::Tensor loss;  // a double on the device (PipelineResult::loss_sum)
  double wait_s = 0;
  int backwards = 0;
  int forwards = 0;
  int weight_passes = 0;
};

PipelineExecutor::PipelineExecutor(std::vector<std::shared_ptr<Layer>> layers, StageConfig config)
    : layers_(std::move(layers)), config_(std::move(config)) {
  // In each pair group the previous stage is group rank 0, the next one 1 (Note [Pipeline
  // links]).
  const PipelineLinks& l = config_.links;
  if (config_.stage < config_.stages - 1) {
    act_tx_ = std::make_unique<Sender>(l.act_out, 1, kActTag, config_.timeout);
    grad_rx_ =
        std::make_unique<Receiver>(l.grad_in, 1, kGradTag, config_.timeout, config_.xfer_device);
  }
  if (config_.stage > 0) {
    act_rx_ =
        std::make_unique<Receiver>(l.act_in, 0, kActTag, config_.timeout, config_.xfer_device);
    grad_tx_ = std::make_unique<Sender>(l.grad_out, 0, kGradTag, config_.timeout);
  }
}

absl::StatusOr<PipelineResult> PipelineExecutor::Run(const TensorMap& inputs,
                                                     const PipelineRunOptions& options) {
  if (inputs.empty()) return absl::InvalidArgumentError("no inputs");
  RunState s(options);
  RETURN_IF_ERROR(TorchCall("splitting the batch", [&] {
    s.mbs = Split(inputs, config_.chunk_size, config_.device, &s.sizes, &s.inputs_ready);
  }));
  s.waited.assign(s.inputs_ready.size(), false);
  const int M = static_cast<int>(s.mbs.size());
  // Note [Masked-token weighting]: a micro-batch's loss is a mean over its samples, or for a
  // masked language model over its predicted positions (the batch's loss_tokens, counted by
  // the data on the host). It is weighted by that count / options.weight_denominator (the
  // global batch's count), so the pipelines' weighted sums add up to the mean over the global
  // batch, as one model computing it whole would (BertForMaskedLM's loss).
  if (auto it = inputs.find("loss_tokens"); it != inputs.end()) {
    const torch::Tensor counts = it->second.to(torch::kCPU, torch::kLong).contiguous();
    const int64_t* c = counts.data_ptr<int64_t>();
    int64_t at = 0;
    for (int m = 0; m < M; ++m) {
      double sum = 0;
      for (int64_t i = 0; i < s.sizes[m]; ++i) sum += static_cast<double>(c[at + i]);
      at += s.sizes[m];
      s.units.push_back(sum);
    }
  } else {
    for (int m = 0; m < M; ++m) s.units.push_back(static_cast<double>(s.sizes[m]));
  }
  if (options.train) {
    s.tasks = MakeSchedule(config_.schedule, config_.stages, M, config_.stage);
  } else {
    for (int m = 0; m < M; ++m) s.tasks.push_back({TaskKind::kForward, m, false});
  }
  StartTransfers(s.sizes, options.train);
  const auto t_start = Clock::now();
  absl::Status st = TorchCall(absl::StrCat("pipeline on stage ", config_.stage),
                              [&]() -> absl::Status { return RunTasks(s); });
  ClearAutocastCache();  // before the update changes the weights (Note [Autocast cache])
  st = JoinTransfers(st, options.train);
  last_timing_ = {Seconds(t_start, Clock::now()), s.wait_s};
  RETURN_IF_ERROR(st);
  return PipelineResult{s.loss, last_timing_};
}

void PipelineExecutor::StartTransfers(const std::vector<int64_t>& sizes, bool train) {
  const int M = static_cast<int>(sizes.size());
  if (act_rx_) {
    std::vector<TensorSpec> specs;
    for (int m = 0; m < M; ++m) specs.push_back(BoundarySpec(config_.in_meta, sizes[m]));
    act_rx_->Start(std::move(specs));
  }
  if (act_tx_) act_tx_->Start(M);
  if (train && grad_rx_) {
    std::vector<TensorSpec> specs;
    for (int m = 0; m < M; ++m) specs.push_back(BoundarySpec(config_.out_meta, sizes[m]));
    grad_rx_->Start(std::move(specs));
  }
  if (train && grad_tx_) grad_tx_->Start(M);
}

// Note [Pipeline execution]: runs this stage's static task list. Received activations and
// gradients arrive on background threads in schedule order. Runtime reordering (Varuna's
// opportunistic swap): when the next task is a recompute whose gradient has not arrived and a
// forward is still pending whose input is already here (or needs none, on stage 0), the forward
// runs first. Requiring the forward's input to be present keeps the swap from ever blocking.
absl::Status PipelineExecutor::RunTasks(RunState& s) {
  std::vector<Task>& tasks = s.tasks;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (tasks[i].kind == TaskKind::kRecompute && config_.reorder) {
      const size_t j = RecomputeYieldsTo(tasks, i, grad_rx_->Ready(), !act_rx_ || act_rx_->Ready());
      std::rotate(tasks.begin() + i, tasks.begin() + j, tasks.begin() + j + 1);
    }
    const Task t = tasks[i];
    switch (t.kind) {
      case TaskKind::kForward:
        RETURN_IF_ERROR(Forward(t, s));
        if (++s.forwards == 1 && s.options.after_first_forward) s.options.after_first_forward();
        break;
      case TaskKind::kRecompute:
        RETURN_IF_ERROR(Recompute(t.micro_batch, s));
        break;
      case TaskKind::kBackward:
        RETURN_IF_ERROR(Backward(t.micro_batch, s));
        break;
      case TaskKind::kWeight:
        RETURN_IF_ERROR(WeightPass(t.micro_batch, s));
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::Forward(const Task& t, RunState& s) {
  const int m = t.micro_batch;
  const bool train = s.options.train;
  torch::Tensor x;
  if (act_rx_) {
    ASSIGN_OR_RETURN(x, Take(act_rx_.get(), s));
    x = x.to(config_.device);
  }
  if (m < static_cast<int>(s.waited.size()) && !s.waited[m]) {
    s.inputs_ready[m].block(c10::impl::VirtualGuardImpl(config_.device.type())
                                .getStream(config_.device));  // Note [Input prefetch]
    s.waited[m] = true;
  }
  std::optional<StepTimeline::Scope> timed;
  timed.emplace(s.options.timeline, StepPhase::kForward);
  torch::Tensor out;
  if (train && t.keep_graph) {
    if (x.defined()) x.requires_grad_(true);
    const bool split = SplitsBackward(config_.schedule);
    ScopedWeightGradCapture capture(split ? &s.captures[m] : nullptr);
    out = ForwardLayers(layers_, x, s.mbs[m], config_.precision, config_.device,
                        /*keep_autocast_cache=*/true);
  } else {
    if (train) s.stash.push_back({m, x, GetRngState(config_.device)});
    torch::NoGradGuard g;
    out = ForwardLayers(layers_, x, s.mbs[m], config_.precision, config_.device,
                        /*keep_autocast_cache=*/true);
  }
  if (is_last_stage()) {
    // Loss = mean over the global batch, each micro-batch weighted by its size (Note
    // [Masked-token weighting]).
    out = out * (s.units[m] / s.options.weight_denominator);
    const torch::Tensor l = out.detach().to(torch::kDouble);
    s.loss = s.loss.defined() ? s.loss + l : l;
    if (train) s.graphs[m] = {x, out * s.options.loss_scale};
  } else {
    timed.reset();
    act_tx_->Send(ForTransfer(out, config_.xfer_device));
    if (train && t.keep_graph) s.graphs[m] = {x, out};
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::Recompute(int m, RunState& s) {
  Stash stash = std::move(s.stash.front());
  s.stash.pop_front();
  if (stash.micro_batch != m) {
    return absl::InternalError(
        absl::StrCat("recompute of micro-batch ", m, " found the stash of ", stash.micro_batch));
  }
  // Note [Recompute RNG]: replay the forward's CPU and CUDA streams (dropout masks).
  const RngState saved = GetRngState(config_.device);
  SetRngState(config_.device, stash.rng_state);
  torch::Tensor x = stash.input;
  if (x.defined()) x = x.detach().requires_grad_(true);
  StepTimeline::Scope timed(s.options.timeline, StepPhase::kForward);
  torch::Tensor out = ForwardLayers(layers_, x, s.mbs[m], config_.precision, config_.device,
                                    /*keep_autocast_cache=*/true);
  SetRngState(config_.device, saved);
  s.graphs[m] = {x, out};
  return absl::OkStatus();
}

absl::Status PipelineExecutor::Backward(int m, RunState& s) {
  auto it = s.graphs.find(m);
  if (it == s.graphs.end()) {
    return absl::InternalError(absl::StrCat("backward of micro-batch ", m, " has no activations"));
  }
  Graph g = std::move(it->second);
  s.graphs.erase(it);
  // The step's last backward completes this stage's gradients.
  if (++s.backwards == static_cast<int>(s.mbs.size()) && s.options.before_last_backward) {
    s.options.before_last_backward();
  }
  torch::Tensor grad;
  if (!is_last_stage()) {
    ASSIGN_OR_RETURN(grad, Take(grad_rx_.get(), s));
    grad = grad.to(config_.device);
  }
  std::optional<StepTimeline::Scope> timed;
  timed.emplace(s.options.timeline, StepPhase::kBackward);
  auto it_capture = s.captures.find(m);
  if (it_capture == s.captures.end()) {
    g.output.backward(grad);
  } else {
    // B of a split backward: the input gradient and every parameter but the recorded
    // weights, whose gradients W adds (Note [Deferred weight gradients] in linear.cc).
    std::vector<torch::Tensor> inputs;
    if (g.input.defined()) inputs.push_back(g.input);
    for (const auto& layer : layers_) {
      for (const torch::Tensor& p : layer->parameters()) {
        if (p.requires_grad() && !it_capture->second.Defers(p)) inputs.push_back(p);
      }
    }
    if (!inputs.empty()) {
      torch::autograd::backward({g.output}, {grad}, /*keep_graph=*/false,
                                /*create_graph=*/false, inputs);
    }
  }
  timed.reset();
  if (grad_tx_) {
    torch::Tensor gx = g.input.grad();
    if (!gx.defined()) gx = torch::zeros_like(g.input);
    grad_tx_->Send(ForTransfer(gx, config_.xfer_device));
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::WeightPass(int m, RunState& s) {
  auto it = s.captures.find(m);
  if (it == s.captures.end()) {
    return absl::InternalError(absl::StrCat("W of micro-batch ", m, " has no recorded linears"));
  }
  std::vector<torch::Tensor> done;
  {
    StepTimeline::Scope timed(s.options.timeline, StepPhase::kBackward);
    done = it->second.Apply();
  }
  s.captures.erase(it);
  if (++s.weight_passes == static_cast<int>(s.mbs.size()) && s.options.after_last_weight_pass) {
    s.options.after_last_weight_pass(done);
  }
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> PipelineExecutor::Take(Receiver* rx, RunState& s) {
  const auto t0 = Clock::now();
  auto r = rx->Take();
  s.wait_s += Seconds(t0, Clock::now());
  return r;
}

// Joins every transfer thread even after an error, so none outlives the step.
absl::Status PipelineExecutor::JoinTransfers(absl::Status st, bool train) {
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
      absl::Status j = rx->Join();
      if (st.ok() && !j.ok()) st = j;
    }
  }
  for (Sender* tx : {act_tx_.get(), grad_tx}) {
    if (tx != nullptr) {
      absl::Status j = tx->Join();
      if (st.ok() && !j.ok()) st = j;
    }
  }
  return st;
}

}  // namespace varuna
