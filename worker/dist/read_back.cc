#include "worker/dist/read_back.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <stdexcept>
#include <thread>

#include "absl/strings/str_cat.h"

namespace varuna {

// Note [NCCL waits]: c10d's blocking wait (TORCH_NCCL_BLOCKING_WAIT=1) spins the host on every
// NCCL collective until it ends (one report: 20% slower), and nothing can cut that spin short
// when a regroup starts. So NCCL works are waited on the stream (Work::synchronize: the current
// stream waits for the collective's end, the host goes on), and the host meets the device only
// where it must read a result: there it polls an event recorded behind the read, with the
// job's own timeout and the generation's abort signal (Note [Aborting waits] in
// process_group.h). On expiry it aborts the generation's works, which aborts their NCCL
// communicators (their kernels return, the stream drains), and fails naming the timeout; c10d's
// watchdog and monitor are told not to tear the process down themselves (Note [NCCL watchdog]
// in process_group.cc), since a survivor must live to be rescued or regrouped. The pipeline's
// transfer threads wait on the host instead (Note [Transfer threads] in comm.cc). Polling starts at
// 50 us and backs off to 1 ms: at most a millisecond added to a step that waited that long anyway.
void WaitPolling(const std::function<bool()>& done, AbortSignal* abort,
                 std::chrono::milliseconds timeout, const std::string& what,
                 std::chrono::microseconds max_pause) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  auto pause = std::min<std::chrono::microseconds>(std::chrono::microseconds(50), max_pause);
  while (!done()) {
    if (abort != nullptr && abort->aborted()) {
      throw std::runtime_error(absl::StrCat(what, ": wait aborted: the job is regrouping"));
    }
    if (Clock::now() >= deadline) {
      if (abort != nullptr) abort->Abort();
      throw std::runtime_error(absl::StrCat(
          what, ": timed out after ", timeout.count(),
          " ms (a collective waits for a peer that is gone or stuck; its groups were aborted)"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, max_pause);
  }
}

torch::Tensor ReadBack(const torch::Tensor& t, AbortSignal* abort,
                       std::chrono::milliseconds timeout) {
  if (!t.defined() || t.device().is_cpu()) return t.cpu();
  torch::Tensor host = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
  host.copy_(t, /*non_blocking=*/true);
  c10::impl::VirtualGuardImpl impl(t.device().type());
  c10::Event done(t.device().type(), c10::EventFlag::BACKEND_DEFAULT);
  done.record(impl.getStream(t.device()));
  WaitPolling([&] { return done.query(); }, abort, timeout, "reading a result from the device");
  return host;
}

torch::Tensor ToDevice(const torch::Tensor& host, torch::Device device) {
  if (!host.defined() || !device.is_cuda() || !host.device().is_cpu()) return host.to(device);
  // The caching host allocator takes the pinned buffer back only once the copy has run.
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace varuna
