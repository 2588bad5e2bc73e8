#pragma once

// Reading a device's result back to the host without ever blocking on it (Note [NCCL waits]
// in read_back.cc): the step's one host read, the start-up agreement's, the rescue's copies.

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <string>

#include "worker/dist/process_group.h"

namespace varuna {

// Polls `done` until it is true. Throws std::runtime_error naming `what` when `abort` is
// aborted (a regroup: "wait aborted"), or when `timeout` passes ("timed out"), after aborting
// `abort` itself: that ends the groups' works, an NCCL communicator's kernels with them, so
// the stream behind a collective that waits for a dead peer moves again. `abort` may be null.
// The pause between polls starts at 50 us (at most `max_pause`) and doubles up to `max_pause`.
void WaitPolling(const std::function<bool()>& done, AbortSignal* abort,
                 std::chrono::milliseconds timeout, const std::string& what,
                 std::chrono::microseconds max_pause = std::chrono::milliseconds(1));

// `t` on the host. A host tensor is returned as it is; a device tensor is copied into pinned
// memory behind an event on the current stream, and the event is polled (WaitPolling).
torch::Tensor ReadBack(const torch::Tensor& t, AbortSignal* abort,
                       std::chrono::milliseconds timeout);

// A host value on `device`, the host never waiting: through pinned memory, non-blocking. A
// plain copy from pageable memory makes the host wait for everything queued on the stream
// before it (on NCCL the step's collectives too), with no timeout (Note [NCCL waits]).
torch::Tensor ToDevice(const torch::Tensor& host, torch::Device device);

}  // namespace varuna
