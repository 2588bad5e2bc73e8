#include "agent/probe.h"

#include <algorithm>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace varuna {

// Note [Speed probe]: an evicted straggler is re-admitted when it computes as fast as it did
// when its agent started. The probe is a fixed kernel (a 64 x 64 single-precision matrix
// product, repeated) timed by the wall clock, so what slows the node's workers slows it too:
// a CPU quota on the node's cgroup (it runs in the agent's, which the workers inherit), a
// noisy neighbour, a throttled CPU. Its score is kernels per second; the agent measures a
// baseline at start (HeartbeatRequest.probe_score) and the manager compares a later probe
// with it. The probe measures the host's CPU: a GPU slowed on its own (thermal throttling, a
// bad card) is not seen by it; its workers' step times are (Note [Straggler detection]).
double RunSpeedProbe(absl::Duration duration) {
  // One probe at a time: two at once (two jobs probing the node) would halve each other.
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  duration = std::clamp(duration, absl::Milliseconds(10), absl::Seconds(5));
  constexpr int kN = 64;
  std::vector<float> a(kN * kN), b(kN * kN), c(kN * kN);
  for (int i = 0; i < kN * kN; ++i) {
    a[i] = static_cast<float>((i * 7) % 13) / 13.0f;
    b[i] = static_cast<float>((i * 5) % 11) / 11.0f;
  }
  const absl::Time start = absl::Now();
  const absl::Time end = start + duration;
  int64_t kernels = 0;
  volatile float sink = 0;
  absl::Time now = start;
  while (now < end) {
    for (int i = 0; i < kN; ++i) {
      for (int j = 0; j < kN; ++j) c[i * kN + j] = 0;
      for (int k = 0; k < kN; ++k) {
        const float x = a[i * kN + k];
        for (int j = 0; j < kN; ++j) c[i * kN + j] += x * b[k * kN + j];
      }
    }
    sink = sink + c[(kernels * 31) % (kN * kN)];
    a[kernels % (kN * kN)] = sink * 1e-6f;  // the next product depends on this one
    ++kernels;
    now = absl::Now();
  }
  const double seconds = absl::ToDoubleSeconds(now - start);
  return seconds > 0 ? static_cast<double>(kernels) / seconds : 0;
}

}  // namespace varuna
