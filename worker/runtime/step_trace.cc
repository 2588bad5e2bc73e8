#include "worker/runtime/step_trace.h"

#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "worker/dist/torch_status.h"

namespace varuna {

// Note [Step trace]: --trace_steps runs LibTorch's own profiler (Kineto, as torch.profiler
// does) over a few steps and keeps a summary, not the trace: the question it answers is which
// kind of work a step's time goes to, and whether that is the GEMMs it should be. On a GPU the
// summary is the device's: kernels by category, copies and sets with their time and count,
// and the host's waits for the device (the runtime's synchronize calls and synchronous
// copies). On a CPU operators nest (aten::linear calls aten::addmm), so each is charged its
// self time, its own less its children's on the same thread. Categories come from names
// (KernelCategory), the way one reads a profile by eye: cuBLAS/CUTLASS kernels and aten's
// matrix products are "gemm", flash and memory-efficient attention "attention", and so on.

namespace {

using torch::autograd::profiler::KinetoEvent;
namespace prof = torch::profiler::impl;

bool HasAny(const std::string& lower, std::initializer_list<const char*> parts) {
  for (const char* p : parts) {
    if (absl::StrContains(lower, p)) return true;
  }
  return false;
}

std::vector<TraceBucket> Sorted(const std::map<std::string, TraceBucket>& by_name, size_t keep) {
  std::vector<TraceBucket> v;
  for (const auto& [name, b] : by_name) v.push_back(b);
  std::sort(v.begin(), v.end(), [](const TraceBucket& a, const TraceBucket& b) {
    return a.time_s != b.time_s ? a.time_s > b.time_s : a.name < b.name;
  });
  if (v.size() > keep) v.resize(keep);
  return v;
}

void Add(std::map<std::string, TraceBucket>* m, const std::string& name, double s) {
  TraceBucket& b = (*m)[name];
  b.name = name;
  b.time_s += s;
  ++b.count;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string BucketJson(const TraceBucket& b) {
  return absl::StrFormat("{\"name\":%s,\"time_s\":%.6g,\"count\":%d}", JsonString(b.name), b.time_s,
                         b.count);
}

}  // namespace

std::string KernelCategory(const std::string& name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (HasAny(n, {"nccl", "gloo", "allreduce", "all_reduce", "allgather", "all_gather",
                 "reduce_scatter", "broadcast", "c10d::"})) {
    return "comm";
  }
  if (HasAny(n, {"flash", "fmha", "attention", "sdpa", "scaled_dot_product"})) return "attention";
  if (HasAny(n, {"adam", "sgd", "optimizer"})) return "optimizer";
  if (HasAny(n, {"norm"})) return "norm";
  if (HasAny(n,
             {"gemm", "cutlass", "xmma", "nvjet", "cublas", "aten::mm", "aten::addmm", "aten::bmm",
              "aten::baddbmm", "aten::matmul", "aten::linear", "aten::_addmm_activation"})) {
    return "gemm";
  }
  if (HasAny(n, {"softmax", "cross_entropy", "nll_loss", "log_softmax"})) return "softmax_loss";
  if (HasAny(n, {"memcpy", "copy", "aten::to", "aten::_to_copy", "contiguous", "clone"})) {
    return "copy";
  }
  if (HasAny(n, {"memset", "fill", "zero"})) return "memset";
  if (HasAny(n, {"elementwise", "vectorized", "reduce_kernel", "aten::add", "aten::mul",
                 "aten::div",   "aten::sub",  "gelu",          "silu",      "dropout",
                 "aten::where", "aten::cat",  "aten::stack",   "aten::sum", "aten::mean",
                 "aten::pow",   "aten::sqrt", "aten::rsqrt",   "aten::exp", "aten::neg",
                 "aten::tanh"})) {
    return "elementwise";
  }
  return "other";
}

TraceSummary Summarize(std::vector<TraceEvent> events) {
  TraceSummary s;
  bool device = false;
  for (const TraceEvent& e : events) {
    device |= e.kind == TraceEvent::Kind::kKernel || e.kind == TraceEvent::Kind::kCopy ||
              e.kind == TraceEvent::Kind::kMemset;
  }
  s.where = device ? "device" : "host";
  std::map<std::string, TraceBucket> categories, names;
  if (device) {
    for (const TraceEvent& e : events) {
      const double t = static_cast<double>(e.duration_ns) / 1e9;
      switch (e.kind) {
        case TraceEvent::Kind::kKernel:
          Add(&categories, KernelCategory(e.name), t);
          Add(&names, e.name, t);
          break;
        case TraceEvent::Kind::kCopy:
          Add(&categories, "copy", t);
          Add(&names, e.name, t);
          s.copies.time_s += t;
          ++s.copies.count;
          break;
        case TraceEvent::Kind::kMemset:
          Add(&categories, "memset", t);
          Add(&names, e.name, t);
          break;
        case TraceEvent::Kind::kRuntime: {
          // A host wait: an explicit synchronize, or a copy the host blocks on.
          const std::string n = absl::AsciiStrToLower(e.name);
          if (absl::StrContains(n, "synchronize") ||
              ((n == "cudamemcpy" || n == "cudamemcpy2d" || n == "cudamemset"))) {
            ++s.syncs;
          }
          break;
        }
        case TraceEvent::Kind::kHostOp:
          break;
      }
    }
  } else {
    // Self time: within a thread, by start (an enclosing operator first), each operator's
    // children are the operators that start inside it before it ends.
    std::vector<TraceEvent*> ops;
    for (TraceEvent& e : events) {
      if (e.kind == TraceEvent::Kind::kHostOp) ops.push_back(&e);
    }
    std::sort(ops.begin(), ops.end(), [](const TraceEvent* a, const TraceEvent* b) {
      if (a->thread != b->thread) return a->thread < b->thread;
      if (a->start_ns != b->start_ns) return a->start_ns < b->start_ns;
      return a->duration_ns > b->duration_ns;
    });
    std::vector<uint64_t> self(ops.size());
    std::vector<size_t> stack;
    for (size_t i = 0; i < ops.size(); ++i) {
      const TraceEvent& e = *ops[i];
      self[i] = e.duration_ns;
      while (!stack.empty()) {
        const TraceEvent& top = *ops[stack.back()];
        if (top.thread == e.thread && e.start_ns < top.start_ns + top.duration_ns) break;
        stack.pop_back();
      }
      if (!stack.empty()) {
        uint64_t& parent = self[stack.back()];
        parent -= std::min(parent, e.duration_ns);
      }
      stack.push_back(i);
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const std::string& name = ops[i]->name;
      const double t = static_cast<double>(self[i]) / 1e9;
      const std::string category = KernelCategory(name);
      Add(&categories, category, t);
      Add(&names, name, t);
      if (category == "copy") {
        s.copies.time_s += t;
        ++s.copies.count;
      }
      if (name == "aten::_local_scalar_dense") ++s.syncs;  // item()
    }
  }
  s.copies.name = "copies";
  for (const auto& [name, b] : categories) s.total_s += b.time_s;
  s.categories = Sorted(categories, categories.size());
  s.top = Sorted(names, 10);
  return s;
}

std::string TraceSummaryJson(const TraceSummary& s, int64_t first_step, int64_t steps,
                             int64_t asked) {
  std::vector<std::string> cats, top;
  for (const TraceBucket& b : s.categories) cats.push_back(BucketJson(b));
  for (const TraceBucket& b : s.top) top.push_back(BucketJson(b));
  return absl::StrFormat(
      "{\"trace\":{\"first_step\":%d,\"steps\":%d,\"asked\":%d,\"where\":%s,\"total_s\":%.6g,"
      "\"categories\":[%s],\"top\":[%s],\"copies\":{\"time_s\":%.6g,\"count\":%d},"
      "\"syncs\":%d}}",
      first_step, steps, asked, JsonString(s.where), s.total_s, absl::StrJoin(cats, ","),
      absl::StrJoin(top, ","), s.copies.time_s, s.copies.count, s.syncs);
}

absl::StatusOr<std::unique_ptr<StepTrace>> StepTrace::Start(torch::Device device) {
  std::unique_ptr<StepTrace> t(new StepTrace(device));
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (device.is_cuda()) activities.insert(prof::ActivityType::CUDA);
  RETURN_IF_ERROR(TorchCall("starting the profiler", [&] {
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  }));
  t->running_ = true;
  return t;
}

StepTrace::~StepTrace() {
  if (running_) {
    try {
      torch::autograd::profiler::disableProfiler();
    } catch (...) {
    }
  }
}

absl::StatusOr<TraceSummary> StepTrace::Stop(bool wait) {
  std::vector<TraceEvent> events;
  RETURN_IF_ERROR(TorchCall("stopping the profiler", [&] {
    if (wait && device_.is_cuda()) torch::cuda::synchronize(device_.index());
    running_ = false;
    std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
        torch::autograd::profiler::disableProfiler();
    for (const KinetoEvent& k : result->events()) {
      TraceEvent e;
      e.name = k.name();
      e.start_ns = k.startNs();
      e.duration_ns = k.durationNs();
      e.thread = k.startThreadId();
      switch (static_cast<libkineto::ActivityType>(k.activityType())) {
        case libkineto::ActivityType::CPU_OP:
          e.kind = TraceEvent::Kind::kHostOp;
          break;
        case libkineto::ActivityType::CONCURRENT_KERNEL:
          e.kind = TraceEvent::Kind::kKernel;
          break;
        case libkineto::ActivityType::GPU_MEMCPY:
          e.kind = TraceEvent::Kind::kCopy;
          break;
        case libkineto::ActivityType::GPU_MEMSET:
          e.kind = TraceEvent::Kind::kMemset;
          break;
        case libkineto::ActivityType::CUDA_RUNTIME:
        case libkineto::ActivityType::CUDA_DRIVER:
          e.kind = TraceEvent::Kind::kRuntime;
          break;
        default:
          continue;
      }
      events.push_back(std::move(e));
    }
  }));
  return Summarize(std::move(events));
}

}  // namespace varuna
