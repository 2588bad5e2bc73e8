#pragma once

#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"

namespace varuna::testing {

// A clock that moves only when the test says so.
class FakeClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'800'000'000);
};

}  // namespace varuna::testing
