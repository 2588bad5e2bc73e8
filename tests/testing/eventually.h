#pragma once

// Polls `pred` (real time) until it holds or 10 s pass: RPCs between the daemons are
// asynchronous, so tests wait for their effect rather than sleeping a guessed time.

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace varuna::testing {

template <typename P>
bool Eventually(P pred) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return pred();
}

}  // namespace varuna::testing
