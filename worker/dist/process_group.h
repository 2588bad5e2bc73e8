#pragma once

// Backend-neutral process groups (Note [Process groups]).
//
// The engine talks to its peers only through `ProcessGroup`: point-to-point send/recv and a
// sum all-reduce, each returning a `Work` that is waited on with a timeout. Three backends
// implement it:
//   - gloo (CPU tensors; any machine; what CI runs),
//   - NCCL (built only against a CUDA LibTorch with c10d NCCL: VARUNA_WITH_NCCL), used when
//     every rank of the job has a GPU of its own,
//   - threads (worker/dist/thread_process_group.h): ranks as threads of one process, for tests.
// A `ProcessGroupFactory` makes the groups of one backend; `CreateGroups` walks the groups of
// a topology in one global order with any factory, so no two ranks wait on each other.

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/launch/launch_args.h"
#include "common/pipeline/topology.h"

namespace varuna {

// An operation in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done; throws (c10::Error or std::runtime_error, mapped by TorchCall: "timed
  // out" -> DeadlineExceeded) on failure or when `timeout` passes first.
  virtual void Wait(std::chrono::milliseconds timeout) = 0;
  // Blocks the host until done, even where Wait only makes the calling thread's current stream
  // wait for the operation (NCCL): what a transfer thread calls, since its current stream is
  // the one compute runs on (Note [Transfer threads] in comm.cc). Throws as Wait does.
  virtual void WaitOnHost(std::chrono::milliseconds timeout) { Wait(timeout); }
  // Gives up on the operation: a later Wait returns or throws promptly, and the buffer is no
  // longer written.
  virtual void Abort() = 0;
  // Whether the operation has ended (done, failed or aborted): its group can then be destroyed
  // without waiting for it. Works that end within Wait say true.
  virtual bool Done() { return true; }
};
using WorkPtr = std::shared_ptr<Work>;

// Note [Aborting waits]: a morph in place (docs/morphing.md) keeps the process, so a rank
// blocked on a dead or frozen peer must get out of the wait now, not after timeout_s. One
// AbortSignal covers every group of one ProcessGroups: Abort() aborts its outstanding
// point-to-point works (gloo supports that) and makes every wait on its collectives throw
// within 50 ms (gloo's collectives cannot be aborted, so a wait is taken in slices and the
// operation is left to end on its own timeout; the groups are then kept alive until it does,
// never destroyed while it runs: Note [Retired groups] in worker/engine/regroup.cc). NCCL works
// are waited on the stream; the host's reads poll and abort (Note [NCCL waits] in
// worker/dist/read_back.cc).
class AbortSignal {
 public:
  void Abort();
  bool aborted() const { return aborted_.load(); }
  // Every work posted on the groups, held until it is Done (Note [Retired groups] in
  // worker/engine/regroup.cc); Abort() aborts those in flight.
  void Register(const WorkPtr& work);
  // No registered work is still in flight: the groups can be destroyed at once.
  bool Idle();

 private:
  void PruneLocked();
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::vector<WorkPtr> works_;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;  // within the group
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  // Whether Send/Recv/AllReduceSum take tensors on the compute device (NCCL) or only host
  // tensors (gloo point-to-point).
  virtual bool device_transfers() const = 0;
  // Messages between a pair with one tag match in the order they were posted.
  virtual WorkPtr Send(const torch::Tensor& t, int peer, int tag) = 0;
  virtual WorkPtr Recv(const torch::Tensor& t, int peer, int tag) = 0;
  // In-place sum over the group. Every member posts the group's collectives in the same order.
  virtual WorkPtr AllReduceSum(const torch::Tensor& t, std::chrono::milliseconds timeout) = 0;
};
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

enum class Backend { kGloo, kNccl, kThreads };
const char* BackendName(Backend b);

class ProcessGroupFactory {
 public:
  virtual ~ProcessGroupFactory() = default;
  virtual Backend backend() const = 0;
  // The group called `name` over the global ranks `members`, as seen by global rank `rank`
  // (a member). Collective over the members.
  virtual absl::StatusOr<ProcessGroupPtr> Create(const std::string& name,
                                                 const std::vector<int>& members, int rank) = 0;
};

// Note [Pipeline links]: a pipeline's traffic between adjacent stages a -> b = a + 1 travels on
// two groups of the pair, one per direction: "act:a>b" carries only a's activations to b,
// "grad:b>a" only b's gradients to a (and at start-up the dry run's boundary shapes go on the
// activation link). On each end of a link one thread at a time posts, in schedule order, one
// kind of operation: a's sender and b's receiver on the activation link, b's sender and a's
// receiver on the gradient link. NCCL gives each group its own communicator and stream for a
// pair (ProcessGroupNCCL keys point-to-point by the pair), so on one shared group a stage's
// pre-posted gradient receives would queue ahead of its own activation sends on the one stream
// and wait for gradients the next stage cannot compute without those activations. With a
// group per direction neither can block the other, and no communicator is driven by two
// threads at once. engine_test records every operation of every group and holds all of this.
// In a pair group the earlier stage is group rank 0, the later one group rank 1.
struct PipelineLinks {
  // With the previous stage of this rank's pipeline; null on its first stage.
  ProcessGroupPtr act_in, grad_out;
  // With the next stage; null on its last stage.
  ProcessGroupPtr act_out, grad_in;
};

// The groups one rank takes part in. Groups it is not a member of are absent or null.
struct ProcessGroups {
  c10::intrusive_ptr<c10d::Store> store;  // the rendezvous store (absent for threads)
  ProcessGroupPtr world;
  // Data-parallel groups, keyed by their ranks: one per holder set of the topology that
  // contains this rank (Topology::HolderSets). A segment's gradient is all-reduced over the
  // group of its holders. Empty with a single pipeline.
  std::map<std::vector<int>, ProcessGroupPtr> holders;
  ProcessGroupPtr tied;  // first + last stage of this rank's pipeline (only on those, depth > 1)
  // The tensor-parallel ranks of this rank's position (Note [Tensor parallelism] in
  // worker/models/tensor_parallel.cc); null without tensor parallelism.
  ProcessGroupPtr tp;
  PipelineLinks links;  // Note [Pipeline links]
  // Host tensors among every rank of the world (the morph-in-place hand-over's bytes): a gloo
  // group beside an NCCL world, which refuses host tensors; the world group itself otherwise.
  ProcessGroupPtr control;
  std::chrono::milliseconds timeout{300000};
  // Aborts every wait on these groups (Note [Aborting waits]); null for thread groups.
  std::shared_ptr<AbortSignal> abort;
};

// Creates, with `factory`, every group of `topology` that global rank `rank` belongs to. Every
// rank walks the same list (world, holder sets, tied pairs, pipeline links) in the same order
// and joins those it belongs to. `has_tied` says whether the model ties parameters.
//
// With tp_size > 1, `topology` places positions and `rank` is the caller's process rank
// (position x tp_size + tp rank): the groups above are those of the caller's tp slice (the
// processes with its tp rank, one per position; group ranks are positions), then `tp` joins
// the tp_size processes of its position.
absl::StatusOr<ProcessGroups> CreateGroups(ProcessGroupFactory& factory, const Topology& topology,
                                           int rank, bool has_tied,
                                           std::chrono::milliseconds timeout, int tp_size = 1);

// The backend for a job whose ranks compute on `device`: NCCL when it is a GPU, the build has
// NCCL, and no two ranks on this machine share a GPU (`local_world_size` <= `gpus`); gloo
// otherwise (CPU runs, several ranks per GPU). VARUNA_BACKEND=gloo|nccl overrides (nccl
// without a CUDA build is an error).
absl::StatusOr<Backend> ChooseBackend(const torch::Device& device, int local_world_size, int gpus);

// Rendezvous at MASTER_ADDR:MASTER_PORT (rank 0 hosts the TCPStore unless the launcher's agent
// does) and creates the groups of topo.topology on `backend`. NCCL groups are bound to
// `device`, this rank's GPU (ProcessGroupNCCL's bound device: its communicators are made
// there, never on GPU 0 by default).
absl::StatusOr<ProcessGroups> CreateProcessGroups(const WorkerTopology& topo, bool has_tied,
                                                  std::chrono::milliseconds timeout,
                                                  Backend backend = Backend::kGloo,
                                                  torch::Device device = torch::kCPU);

}  // namespace varuna
