#pragma once

// Time behind an interface so the daemons' state machines can run on a fake clock in tests.

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace varuna {

class Clock {
 public:
  virtual ~Clock() = default;
  // Returns the current time. Thread-safe.
  virtual absl::Time Now() const = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  // Returns a process-wide instance.
  static Clock* Get() {
    static RealClock clock;
    return &clock;
  }
};

}  // namespace varuna
