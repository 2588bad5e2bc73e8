#include "worker/engine/profiler.h"

#include <c10/core/Allocator.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/planner/profile.h"
#include "worker/dist/read_back.h"
#include "worker/dist/torch_status.h"
#include "worker/models/linear.h"

namespace varuna {
namespace {

using Clock = std::chrono::steady_clock;

// Note [Memory tracking]: on CPU the profiler swaps in an allocator that counts live bytes
// and the peak (c10::SetAllocator), so graph and peak bytes are measured, not estimated. Each
// block carries a 64-byte header with its size (64 keeps the default alignment), so the raw
// deleter works too.
class TrackingAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kHeader = 64;
  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override { return Allocate(n); }
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &RawDelete; }

  static int64_t current() { return current_.load(); }
  static int64_t peak() { return peak_.load(); }
  static void ResetPeak() { peak_.store(current_.load()); }

 private:
  c10::DataPtr Allocate(size_t n) const {
    void* p = Raw(n);
    return {p, p, &RawDelete, c10::Device(c10::DeviceType::CPU)};
  }
  void* Raw(size_t n) const {
    char* block = static_cast<char*>(base_->raw_allocate(n + kHeader));
    *reinterpret_cast<size_t*>(block) = n;
    *reinterpret_cast<c10::DeleterFnPtr*>(block + sizeof(size_t)) = base_->raw_deleter();
    const int64_t now = current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    return block + kHeader;
  }
  static void RawDelete(void* p) {
    if (p == nullptr) return;
    char* block = static_cast<char*>(p) - kHeader;
    current_.fetch_sub(static_cast<int64_t>(*reinterpret_cast<size_t*>(block)));
    (*reinterpret_cast<c10::DeleterFnPtr*>(block + sizeof(size_t)))(block);
  }

  c10::Allocator* base_;
  static std::atomic<int64_t> current_, peak_;
};
std::atomic<int64_t> TrackingAllocator::current_{0};
std::atomic<int64_t> TrackingAllocator::peak_{0};

// Installs the tracker for the profiler's lifetime on CPU (the tracker itself lives forever:
// tensors it allocated may outlive the profiler).
class TrackMemory {
 public:
  TrackMemory() : base_(c10::GetAllocator(c10::DeviceType::CPU)) {
    static TrackingAllocator* tracker = new TrackingAllocator(base_);
    c10::SetAllocator(c10::DeviceType::CPU, tracker, /*priority=*/1);
  }
  ~TrackMemory() { c10::SetAllocator(c10::DeviceType::CPU, base_, /*priority=*/1); }

 private:
  c10::Allocator* base_;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Waits for the device's queued work, so a time covers it (a no-op off CUDA).
void Sync(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// Note [Timed transfers]: on NCCL the blocking helpers' waits only order the stream (Note [NCCL
// waits] in read_back.cc), so a host clock around them would time the enqueue and a barrier
// would hold nobody. Reading one element of the result back (polled, with the timeout) ends
// the wait on the host. A no-op for a host tensor.
absl::Status Settled(const torch::Tensor& t, std::chrono::milliseconds timeout) {
  if (!t.is_cuda()) return absl::OkStatus();
  return TorchCall("waiting for a timed transfer",
                   [&] { (void)ReadBack(t.reshape({-1}).narrow(0, 0, 1), nullptr, timeout); });
}

TensorMap ToDevice(const TensorMap& in, torch::Device device) {
  TensorMap out;
  for (const auto& [k, t] : in) out[k] = t.to(device);
  return out;
}

std::vector<torch::Tensor> ParamsOf(const std::vector<std::shared_ptr<Layer>>& layers) {
  std::vector<torch::Tensor> out;
  for (const auto& l : layers) {
    for (auto& p : l->parameters(/*recurse=*/true)) out.push_back(p);
  }
  return out;
}

}  // namespace

Profiler::Profiler(Model model, torch::Device device, Precision precision, ProfilerOptions options)
    : model_(std::move(model)),
      device_(device),
      precision_(precision),
      options_(std::move(options)) {}

absl::Status Profiler::Initialize(const GetBatch& get_batch) {
  const auto segments = model_.Segments();
  RETURN_IF_ERROR(TorchCall("building the model for profiling", [&] {
    segments_.clear();
    layer_names_.clear();
    for (const auto& seg : segments) {
      std::vector<std::shared_ptr<Layer>> built;
      std::vector<std::string> names;
      for (int layer : seg) {
        built.push_back(BuildLayer(model_, layer, options_.seed, device_));
        names.push_back(model_.layers()[layer].name);
      }
      segments_.push_back(std::move(built));
      layer_names_.push_back(std::move(names));
    }
  }));
  // One forward + backward end to end: the model runs, and lazy allocations happen now.
  return TorchCall("profiling warm-up", [&] {
    TensorMap batch = ToDevice(get_batch(2), device_);
    torch::Tensor h;
    for (auto& seg : segments_) h = ForwardLayers(seg, h, batch, precision_, device_);
    h.backward();
  });
}

// One micro-batch size's samples, per segment (Note [Profiling passes]).
struct Profiler::Samples {
  std::vector<std::vector<double>> fwd, fwd_ng, rec, bwd, wgt, graph, peak;
  std::vector<double> act_bytes;
};

// Times every segment at each size, then its optimizer update, then the step overhead.
absl::Status Profiler::ProfileSegments(const GetBatch& get_batch, const std::vector<int>& sizes,
                                       v1::Profile* out) {
  const int n = static_cast<int>(segments_.size());
  const int rounds = options_.warmup + options_.repeats;
  const bool track = device_.is_cpu();
  std::optional<TrackMemory> tracking;
  if (track) tracking.emplace();
  AddSegments(out);
  // Note [Profiling passes]: segments are timed inside whole-model passes, in execution
  // order (a forward pass over every segment, then the backwards in reverse), never one
  // segment in a loop: a segment repeated alone keeps its weights in cache and looks faster
  // than it runs in a step.
  // Rounds go over every size in turn, so a slow spell of the machine (a noisy neighbour)
  // touches a sample or two of each size rather than every sample of one.
  std::vector<Samples> samples(sizes.size());
  for (auto& sm : samples) {
    for (auto* v : {&sm.fwd, &sm.fwd_ng, &sm.rec, &sm.bwd, &sm.wgt, &sm.graph, &sm.peak}) {
      v->assign(n, {});
    }
    sm.act_bytes.assign(n, 0);
  }
  std::vector<TensorMap> batches;
  for (int mb : sizes) batches.push_back(ToDevice(get_batch(mb), device_));
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      RETURN_IF_ERROR(TorchCall(absl::StrCat("profiling micro-batch ", sizes[k]), [&] {
        ProfilePass(batches[k], /*keep=*/r >= options_.warmup, &samples[k]);
      }));
    }
  }
  WriteSegmentCosts(sizes, samples, track, out);
  RETURN_IF_ERROR(ProfileOptimizer(out));
  ProfileStepOverhead(get_batch, sizes.back(), out);
  return absl::OkStatus();
}

// Adds every segment to `out`: its index, its layers' names and its parameter bytes.
void Profiler::AddSegments(v1::Profile* out) const {
  for (int s = 0; s < static_cast<int>(segments_.size()); ++s) {
    auto* seg = out->add_segments();
    seg->set_index(s);
    seg->set_layers(absl::StrJoin(layer_names_[s], ","));
    double bytes = 0;
    for (const auto& p : ParamsOf(segments_[s])) bytes += p.numel() * 4.0;
    seg->set_param_bytes(bytes);
  }
}

// One whole-model pass at one micro-batch size (Note [Profiling passes]); its times and bytes
// go into *sm when `keep` (past the warm-up).
void Profiler::ProfilePass(const TensorMap& batch, bool keep, Samples* sm) {
  const int n = static_cast<int>(segments_.size());
  std::vector<torch::Tensor> acts(n + 1);  // acts[s]: input of segment s
  TimeForwardNoGraph(batch, keep, &acts, &sm->fwd_ng);
  TimeStagePasses(batch, acts, keep, sm);
  TimeRecompute(batch, acts, keep, &sm->rec);
  for (int s = 0; s < n; ++s) {
    for (auto& p : ParamsOf(segments_[s])) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    if (s + 1 < n) sm->act_bytes[s] = acts[s + 1].numel() * acts[s + 1].element_size();
  }
}

// Step 1 of a pass: forward without the graph (a stashing stage), whole model; fills acts.
void Profiler::TimeForwardNoGraph(const TensorMap& batch, bool keep,
                                  std::vector<torch::Tensor>* acts,
                                  std::vector<std::vector<double>>* fwd_ng) {
  const int n = static_cast<int>(segments_.size());
  torch::NoGradGuard g;
  torch::Tensor x;
  for (int s = 0; s < n; ++s) {
    const auto t0 = Clock::now();
    x = ForwardLayers(segments_[s], x, batch, precision_, device_);
    Sync(device_);
    if (keep) (*fwd_ng)[s].push_back(Since(t0));
    (*acts)[s + 1] = x;
  }
}

// Steps 2 and 3 of a pass: every segment as a stage runs it (forward with the graph, then
// the backward as B and W), timed, with the bytes the graph holds and the peak.
void Profiler::TimeStagePasses(const TensorMap& batch, const std::vector<torch::Tensor>& acts,
                               bool keep, Samples* sm) {
  const int n = static_cast<int>(segments_.size());
  // 2. Forward with the graph, each segment on its own detached input (as a stage).
  // The linears are recorded (Note [Deferred weight gradients]) so step 3 can time the
  // backward as zb-h1 runs it: B, then W.
  std::vector<torch::Tensor> ins(n), outs(n);
  std::vector<WeightGradCapture> captures(n);
  std::vector<int64_t> held(n), fwd_peak(n);
  for (int s = 0; s < n; ++s) {
    ins[s] = acts[s].defined() ? acts[s].detach().requires_grad_(true) : torch::Tensor();
    const int64_t base = TrackingAllocator::current();
    TrackingAllocator::ResetPeak();
    const auto t0 = Clock::now();
    ScopedWeightGradCapture capture(&captures[s]);
    outs[s] = ForwardLayers(segments_[s], ins[s], batch, precision_, device_);
    Sync(device_);
    if (keep) sm->fwd[s].push_back(Since(t0));
    held[s] = TrackingAllocator::current() - base;
    fwd_peak[s] = TrackingAllocator::peak() - base;
  }
  // 3. Backward, last segment first, each fed the gradient of its output.
  for (int s = n - 1; s >= 0; --s) {
    torch::Tensor grad = s == n - 1 ? torch::Tensor() : ins[s + 1].grad();
    if (s < n - 1 && !grad.defined()) grad = torch::zeros_like(outs[s]);
    const int64_t base = TrackingAllocator::current();
    TrackingAllocator::ResetPeak();
    const auto t0 = Clock::now();
    std::vector<torch::Tensor> inputs;
    if (ins[s].defined()) inputs.push_back(ins[s]);
    for (const auto& p : ParamsOf(segments_[s])) {
      if (p.requires_grad() && !captures[s].Defers(p)) inputs.push_back(p);
    }
    if (!inputs.empty()) {
      torch::autograd::backward({outs[s]}, {grad}, /*keep_graph=*/false,
                                /*create_graph=*/false, inputs);
    }
    Sync(device_);
    const auto t1 = Clock::now();
    captures[s].Apply();
    Sync(device_);
    if (keep) {
      sm->bwd[s].push_back(Since(t0));
      sm->wgt[s].push_back(Since(t1));
    }
    const int64_t transient = TrackingAllocator::peak() - base;
    outs[s] = torch::Tensor();
    if (s + 1 < n) ins[s + 1] = torch::Tensor();
    if (keep) {
      sm->graph[s].push_back(static_cast<double>(std::max<int64_t>(0, held[s])));
      sm->peak[s].push_back(
          static_cast<double>(std::max<int64_t>({0, fwd_peak[s], held[s] + transient})));
    }
  }
  ins.clear();
}

// Step 4 of a pass: recompute, i.e. restore the RNG state the stash saved and forward with
// the graph, each segment on its stashed input.
void Profiler::TimeRecompute(const TensorMap& batch, const std::vector<torch::Tensor>& acts,
                             bool keep, std::vector<std::vector<double>>* rec) {
  const int n = static_cast<int>(segments_.size());
  auto gen = at::detail::getDefaultCPUGenerator();
  for (int s = 0; s < n; ++s) {
    torch::Tensor x = acts[s].defined() ? acts[s].detach().requires_grad_(true) : torch::Tensor();
    const auto t0 = Clock::now();
    const at::Tensor state = gen.get_state();
    gen.set_state(state);
    torch::Tensor o = ForwardLayers(segments_[s], x, batch, precision_, device_);
    Sync(device_);
    if (keep) (*rec)[s].push_back(Since(t0));
  }
}

// Writes each segment's cost at each size: the median of its samples (bytes on CPU only,
// Note [Memory tracking]).
void Profiler::WriteSegmentCosts(const std::vector<int>& sizes, const std::vector<Samples>& samples,
                                 bool track, v1::Profile* out) const {
  const int n = static_cast<int>(segments_.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    const Samples& sm = samples[k];
    for (int s = 0; s < n; ++s) {
      auto* c = out->mutable_segments(s)->add_costs();
      c->set_micro_batch(sizes[k]);
      c->set_forward_s(Median(sm.fwd[s]));
      c->set_forward_nograd_s(Median(sm.fwd_ng[s]));
      c->set_recompute_s(Median(sm.rec[s]));
      c->set_backward_s(Median(sm.bwd[s]));
      c->set_weight_s(Median(sm.wgt[s]));
      c->set_activation_bytes(sm.act_bytes[s]);
      c->set_graph_bytes(track ? Median(sm.graph[s]) : 0.0);
      c->set_peak_bytes(track ? Median(sm.peak[s]) : 0.0);
    }
  }
}

// Times the update of each segment's parameters alone: norm, optimizer step, zeroing.
absl::Status Profiler::ProfileOptimizer(v1::Profile* out) {
  const int n = static_cast<int>(segments_.size());
  for (int s = 0; s < n; ++s) {
    RETURN_IF_ERROR(TorchCall("profiling the optimizer", [&] {
      std::vector<torch::Tensor> params = ParamsOf(segments_[s]);
      for (auto& p : params) p.mutable_grad() = torch::full_like(p, 1e-3);
      std::unique_ptr<torch::optim::Optimizer> opt;
      if (options_.optimizer == "sgd") {
        opt = std::make_unique<torch::optim::SGD>(params,
                                                  torch::optim::SGDOptions(1e-9).momentum(0.9));
      } else {
        opt = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-9));
      }
      std::vector<double> times;
      for (int r = 0; r < options_.warmup + options_.repeats; ++r) {
        const auto t0 = Clock::now();
        {
          torch::NoGradGuard g;
          double sq = 0;
          for (auto& p : params) sq += p.grad().pow(2).sum().item<double>();
          (void)sq;
          opt->step();
          for (auto& p : params) p.mutable_grad().zero_();
          for (auto& p : params) p.mutable_grad().fill_(1e-3);
        }
        if (r >= options_.warmup) times.push_back(Since(t0));
      }
      out->mutable_segments(s)->set_optimizer_s(Median(times));
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
    }));
  }
  return absl::OkStatus();
}

// Times the per-step work outside the pipeline that does not depend on the shape: loading a
// batch (of `size` samples).
void Profiler::ProfileStepOverhead(const GetBatch& get_batch, int size, v1::Profile* out) const {
  std::vector<double> loads;
  for (int r = 0; r < options_.repeats; ++r) {
    const auto t0 = Clock::now();
    (void)get_batch(size);
    loads.push_back(Since(t0));
  }
  out->set_step_overhead_s(Median(loads));
}

absl::Status Profiler::ProfileLinks(double max_bytes, double max_param_bytes, v1::Profile* out) {
  const auto& pg = options_.world;
  const int world = pg->size();
  const int me = options_.rank;
  const auto& hosts = options_.hosts;
  const torch::Device xfer = pg->device_transfers() ? device_ : torch::Device(torch::kCPU);
  auto barrier = [&]() -> absl::Status {
    std::vector<torch::Tensor> t{torch::zeros({1}, torch::device(xfer))};
    RETURN_IF_ERROR(AllReduceSum(pg, t, options_.timeout));
    return Settled(t[0], options_.timeout);  // Note [Timed transfers]
  };
  // One pair per locality: rank 0 and the first rank on its host / on another host.
  int same = -1, cross = -1;
  for (int r = 1; r < world; ++r) {
    const bool same_host = hosts.size() == static_cast<size_t>(world) && hosts[r] == hosts[0];
    if (same_host && same < 0) same = r;
    if (!same_host && cross < 0) cross = r;
  }
  std::vector<double> sizes = {4096, 65536, 1 << 20, 4 << 20};
  const double top = std::min(64.0 * (1 << 20), std::max(8.0 * (1 << 20), 2 * max_bytes));
  sizes.push_back(top);
  for (int pass = 0; pass < 2; ++pass) {
    const int peer = pass == 0 ? same : cross;
    if (peer < 0) continue;
    auto* samples = pass == 0 ? out->mutable_p2p_same_host() : out->mutable_p2p_cross_host();
    for (double bytes : sizes) {
      torch::Tensor buf = torch::zeros({static_cast<int64_t>(bytes / 4)}, torch::device(xfer));
      std::vector<double> rtts;
      for (int r = 0; r < options_.warmup + options_.repeats; ++r) {
        const auto t0 = Clock::now();
        if (me == 0) {
          RETURN_IF_ERROR(SendBlocking(pg, buf, peer, 7, options_.timeout));
          RETURN_IF_ERROR(RecvBlocking(pg, buf, peer, 7, options_.timeout));
        } else if (me == peer) {
          RETURN_IF_ERROR(RecvBlocking(pg, buf, 0, 7, options_.timeout));
          RETURN_IF_ERROR(SendBlocking(pg, buf, 0, 7, options_.timeout));
        }
        RETURN_IF_ERROR(Settled(buf, options_.timeout));
        if (r >= options_.warmup) rtts.push_back(Since(t0));
      }
      auto* s = samples->Add();
      s->set_bytes(bytes);
      s->set_seconds(Median(rtts) / 2);
      RETURN_IF_ERROR(barrier());
    }
  }
  // All-reduce over every rank (the data-parallel group's collective), by size.
  auto* ar = out->add_allreduce();
  ar->set_group_size(world);
  ar->set_cross_host(cross >= 0);
  std::vector<double> ar_sizes = {4096, 262144, 4 << 20};
  ar_sizes.push_back(std::min(128.0 * (1 << 20), std::max(16.0 * (1 << 20), max_param_bytes)));
  for (double bytes : ar_sizes) {
    std::vector<double> times;
    for (int r = 0; r < options_.warmup + options_.repeats; ++r) {
      std::vector<torch::Tensor> t{
          torch::zeros({static_cast<int64_t>(bytes / 4)}, torch::device(xfer))};
      const auto t0 = Clock::now();
      RETURN_IF_ERROR(AllReduceSum(pg, t, options_.timeout));
      RETURN_IF_ERROR(Settled(t[0], options_.timeout));
      if (r >= options_.warmup) times.push_back(Since(t0));
    }
    auto* s = ar->add_samples();
    s->set_bytes(bytes);
    s->set_seconds(Median(times));
  }
  return barrier();
}

absl::StatusOr<v1::Profile> Profiler::ProfileAll(const GetBatch& get_batch,
                                                 const std::vector<int>& micro_batch_sizes,
                                                 const std::string& out_folder) {
  if (segments_.empty()) return absl::FailedPreconditionError("ProfileAll() before Initialize()");
  if (micro_batch_sizes.empty()) return absl::InvalidArgumentError("no micro-batch sizes");
  for (size_t i = 0; i < micro_batch_sizes.size(); ++i) {
    if (micro_batch_sizes[i] < 1 || (i > 0 && micro_batch_sizes[i] <= micro_batch_sizes[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("micro-batch sizes must be positive and ascending, got ",
                       absl::StrJoin(micro_batch_sizes, ",")));
    }
  }
  v1::Profile p;
  p.set_version(kProfileVersion);
  p.set_model_key(options_.model_key);
  p.set_precision(precision_ == Precision::kBf16   ? "bf16"
                  : precision_ == Precision::kFp16 ? "fp16"
                                                   : "fp32");
  p.set_device(device_.is_cuda() ? "cuda" : "cpu");
  p.set_optimizer(options_.optimizer);
  p.set_created_at(absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()));
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  p.set_host(host);
  for (int b : micro_batch_sizes) p.add_micro_batches(b);
  const bool distributed = options_.world && options_.world->size() > 1;
  // Compute is measured by rank 0 alone (the others wait), so one busy slot is the baseline;
  // the slowdown when every slot of a host computes at once is measured next.
  const auto long_wait =
      std::max<std::chrono::milliseconds>(options_.timeout, std::chrono::hours(2));
  auto barrier = [&]() -> absl::Status {
    const bool on_device = options_.world->device_transfers();
    std::vector<torch::Tensor> t{
        torch::zeros({1}, torch::device(on_device ? device_ : torch::kCPU))};
    RETURN_IF_ERROR(AllReduceSum(options_.world, t, long_wait));
    return Settled(t[0], long_wait);  // Note [Timed transfers]
  };
  if (options_.rank == 0) RETURN_IF_ERROR(ProfileSegments(get_batch, micro_batch_sizes, &p));
  if (distributed) RETURN_IF_ERROR(barrier());
  {
    // The costliest segment at the largest size, forward + backward in a loop.
    const int mb = micro_batch_sizes.back();
    const int seg = static_cast<int>(segments_.size()) / 2;
    TensorMap batch;
    torch::Tensor x;
    RETURN_IF_ERROR(TorchCall("preparing the contention test", [&] {
      batch = ToDevice(get_batch(mb), device_);
      torch::NoGradGuard g;
      for (int s = 0; s < seg; ++s) x = ForwardLayers(segments_[s], x, batch, precision_, device_);
    }));
    auto loop = [&](double* out) {
      return TorchCall("contention test", [&] {
        std::vector<double> t;
        for (int r = 0; r < options_.warmup + options_.repeats; ++r) {
          const auto t0 = Clock::now();
          torch::Tensor in = x.defined() ? x.detach().requires_grad_(true) : torch::Tensor();
          torch::Tensor o = ForwardLayers(segments_[seg], in, batch, precision_, device_);
          o.backward(torch::ones_like(o));
          Sync(device_);
          if (r >= options_.warmup) t.push_back(Since(t0));
        }
        *out = Median(t);
      });
    };
    // Solo and together alternate a few times; the median ratio resists a noisy neighbour.
    std::vector<double> ratios;
    int on_host = 1;
    if (distributed) {
      for (size_t r = 1; r < options_.hosts.size(); ++r)
        on_host += options_.hosts[r] == options_.hosts[0];
      for (int round = 0; round < 3; ++round) {
        double solo = 0, together = 0;
        if (options_.rank == 0) RETURN_IF_ERROR(loop(&solo));
        RETURN_IF_ERROR(barrier());
        RETURN_IF_ERROR(loop(&together));
        RETURN_IF_ERROR(barrier());
        if (solo > 0) ratios.push_back(together / solo);
      }
    }
    p.set_slots_per_host(on_host);
    p.set_compute_slowdown(ratios.empty() ? 1.0 : std::max(1.0, Median(ratios)));
  }
  // Tied parameters (embedding <-> head) are summed across the first and last stage.
  double tied = 0;
  for (const auto& pair : model_.tied()) {
    for (size_t s = 0; s < segments_.size(); ++s) {
      for (size_t i = 0; i < segments_[s].size(); ++i) {
        for (const auto& param : segments_[s][i]->named_parameters(/*recurse=*/true)) {
          if (absl::StrCat(layer_names_[s][i], ".", param.key()) == pair.first) {
            tied += param.value().numel() * 4.0;
          }
        }
      }
    }
  }
  p.set_tied_bytes(tied);
  if (options_.world && options_.world->size() > 1) {
    // Sizes every rank can compute alike (only rank 0 has the segment costs).
    double params = 0;
    for (const auto& seg : segments_) {
      for (const auto& t : ParamsOf(seg)) params += t.numel() * 4.0;
    }
    RETURN_IF_ERROR(ProfileLinks(8 << 20, params, &p));
  }
  if (options_.rank != 0) return p;  // rank 0 holds the result
  RETURN_IF_ERROR(ValidateProfile(p));
  if (!out_folder.empty()) {
    const std::string path = absl::StrCat(out_folder, "/profile.json");
    RETURN_IF_ERROR(WriteProfileFile(path, p));
  }
  return p;
}

}  // namespace varuna
