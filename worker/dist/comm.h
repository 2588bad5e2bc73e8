#pragma once

// Pipeline transport and collectives over a ProcessGroup (worker/dist/process_group.h).
//
// Note [Transport]: activations go stage i -> i+1 (tag 0), gradients i+1 -> i (tag 1), each
// direction on a group of its own (Note [Pipeline links] in process_group.h). Each direction
// has a per-step receiver thread that pre-posts irecvs (a window of kWindow in flight) for
// buffers whose shapes are known from the dry run, and a sender thread that posts isends, so
// the compute thread never waits on a send. Messages between a pair in one direction match in
// FIFO order, which the schedule guarantees (forwards and backwards run in micro-batch order on
// every stage). Every wait has the job's timeout, so a dead peer yields
// DeadlineExceeded/Unavailable, not a hang.

#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/dist/process_group.h"

namespace varuna {

// A buffer description for a pre-posted receive.
struct TensorSpec {
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat;
};

// Receives a known sequence of tensors from one peer, in order.
class Receiver {
 public:
  static constexpr int kWindow = 4;
  // Buffers are allocated on `device` (the host unless the group transfers device tensors).
  Receiver(ProcessGroupPtr pg, int peer, int tag, std::chrono::milliseconds timeout,
           torch::Device device = torch::kCPU)
      : pg_(std::move(pg)), peer_(peer), tag_(tag), timeout_(timeout), device_(device) {}
  // Aborts what is outstanding first: destroyed mid-step (an exception unwinding its owner),
  // it must not wait for tensors nobody will take.
  ~Receiver() {
    Abort();
    Join().IgnoreError();
  }

  // Starts receiving `specs.size()` tensors on a background thread.
  void Start(std::vector<TensorSpec> specs);
  // Returns the next tensor in order, waiting up to the timeout.
  absl::StatusOr<torch::Tensor> Take();
  // True if the next tensor has arrived (or the receiver failed).
  bool Ready();
  // Waits for the thread; returns its error, if any.
  absl::Status Join();
  // Cancels outstanding receives (after a local error) so Join() returns promptly.
  void Abort();

 private:
  void Run(std::vector<TensorSpec> specs);

  ProcessGroupPtr pg_;
  int peer_, tag_;
  std::chrono::milliseconds timeout_;
  torch::Device device_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<torch::Tensor> ready_;
  std::deque<std::pair<torch::Tensor, WorkPtr>> inflight_;
  bool aborted_ = false;
  absl::Status error_;
};

// Sends tensors to one peer in order from a background thread.
class Sender {
 public:
  static constexpr int kWindow = 4;
  Sender(ProcessGroupPtr pg, int peer, int tag, std::chrono::milliseconds timeout)
      : pg_(std::move(pg)), peer_(peer), tag_(tag), timeout_(timeout) {}
  // Aborts first: destroyed mid-step, its thread would wait forever for tensors that the
  // unwound owner will never queue.
  ~Sender() {
    Abort();
    Join().IgnoreError();
  }

  // Starts a thread that will send exactly `count` tensors.
  void Start(int count);
  // Queues a tensor (must be contiguous; kept alive until sent).
  void Send(torch::Tensor t);
  // Waits until every send completed; returns the first error.
  absl::Status Join();
  // Stops waiting for tensors that will never come (after a local error).
  void Abort();

 private:
  void Run(int count);

  ProcessGroupPtr pg_;
  int peer_, tag_;
  std::chrono::milliseconds timeout_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<torch::Tensor> queue_;
  std::deque<WorkPtr> inflight_;
  bool aborted_ = false;
  absl::Status error_;
};

// Blocking helpers used at start-up and in evaluation.
absl::Status SendBlocking(const ProcessGroupPtr& pg, torch::Tensor t, int peer, int tag,
                          std::chrono::milliseconds timeout);
absl::Status RecvBlocking(const ProcessGroupPtr& pg, torch::Tensor& t, int peer, int tag,
                          std::chrono::milliseconds timeout);
// In-place sum all-reduce of `tensors` (one collective per tensor, all in flight at once).
absl::Status AllReduceSum(const ProcessGroupPtr& pg, std::vector<torch::Tensor>& tensors,
                          std::chrono::milliseconds timeout);
// The same over several groups: every collective is posted before any is waited on.
absl::Status AllReduceSumGroups(
    const std::vector<std::pair<ProcessGroupPtr, std::vector<torch::Tensor>*>>& groups,
    std::chrono::milliseconds timeout);

}  // namespace varuna
