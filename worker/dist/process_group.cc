#include "worker/dist/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef VARUNA_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "worker/dist/read_back.h"
#include "worker/dist/torch_status.h"

namespace varuna {
namespace {

// Note [Process groups]: c10d's gloo and NCCL backends share the method names used here, so
// one adapter serves both.
//
// Note [Flight recorder]: every operation c10d posts is recorded by a process-wide flight
// recorder (one per event type: gloo's, NCCL's), which on its way in inserts the group into a
// map without holding its own lock (FlightRecorderDetail.hpp in LibTorch 2.11). A worker posts
// on several groups from several threads (a pipeline link's sender and the other link's
// receiver, a reduction), so two groups' first operations at once corrupt that map: a
// segfault in std::map insertion, seen one run in two in process_group_test. So the recorder
// is off unless the user asks for it (TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE set
// before the first group), and posts on gloo groups are taken one at a time in the process
// (an enqueue: nothing blocks inside). NCCL posts are not serialised (a first point-to-point
// may set up a communicator, which waits for the peer; one lock across groups could deadlock
// two stages), so with the recorder asked for on NCCL the upstream race remains.
void FlightRecorderOffUnlessAsked() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("TORCH_FR_BUFFER_SIZE") == nullptr &&
        std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE") == nullptr) {
      setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
    }
  });
}

std::mutex& GlooPostMutex() {
  static auto* mu = new std::mutex();  // never destroyed: groups may post at exit
  return *mu;
}
class C10dWork : public Work {
 public:
  // `abort` null: plain waits. `sliced`: a collective whose wait is taken in slices so that
  // `abort` can end it (Note [Aborting waits]). `on_stream`: an NCCL work, waited on by the
  // current stream, not the host (Note [NCCL waits] in read_back.cc).
  C10dWork(c10::intrusive_ptr<c10d::Work> w, std::shared_ptr<AbortSignal> abort, bool sliced,
           bool on_stream)
      : w_(std::move(w)), abort_(std::move(abort)), sliced_(sliced), on_stream_(on_stream) {}
  void Wait(std::chrono::milliseconds timeout) override {
    if (abort_ && abort_->aborted()) {
      Abort();
      throw std::runtime_error("wait aborted: the job is regrouping");
    }
    if (on_stream_) {
      w_->synchronize();  // with a timeout, c10d's wait would block the host
      return;
    }
    if (!sliced_) {
      w_->wait(timeout);
      return;
    }
    using std::chrono::steady_clock;
    const auto deadline = steady_clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady_clock::now());
      try {
        w_->wait(
            std::max(std::chrono::milliseconds(1), std::min(left, std::chrono::milliseconds(50))));
        return;
      } catch (const std::exception&) {
        // Done between the slice's timeout and now: its own outcome (result or error).
        if (w_->isCompleted()) {
          w_->wait(std::chrono::milliseconds(1));
          return;
        }
        if (steady_clock::now() >= deadline) throw;
      }
      if (abort_->aborted()) throw std::runtime_error("wait aborted: the job is regrouping");
    }
  }
  void WaitOnHost(std::chrono::milliseconds timeout) override {
    if (!on_stream_) {
      Wait(timeout);
      return;
    }
    // An event query per poll, backing off to 20 us: a pipeline message's latency is on the
    // schedule's critical path (Note [Transfer threads] in comm.cc).
    WaitPolling([this] { return w_->isCompleted(); }, abort_.get(), timeout,
                "a point-to-point transfer", std::chrono::microseconds(20));
    if (std::exception_ptr e = w_->exception()) std::rethrow_exception(e);
  }
  void Abort() override {
    // Gloo's point-to-point works can be aborted; its collectives throw "not implemented"
    // (they end on their own timeout): nothing more to do for those.
    try {
      w_->abort();
    } catch (const std::exception&) {
    }
  }
  bool Done() override {
    try {
      return w_->isCompleted();
    } catch (const std::exception&) {
      return true;
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> w_;
  const std::shared_ptr<AbortSignal> abort_;
  const bool sliced_;
  const bool on_stream_;
};

template <typename PG>
class C10dGroup : public ProcessGroup {
 public:
  C10dGroup(c10::intrusive_ptr<PG> pg, std::string backend, bool device_transfers,
            std::shared_ptr<AbortSignal> abort)
      : pg_(std::move(pg)),
        backend_(std::move(backend)),
        device_(device_transfers),
        abort_(std::move(abort)) {}
  int rank() const override { return pg_->getRank(); }
  int size() const override { return pg_->getSize(); }
  std::string backend() const override { return backend_; }
  bool device_transfers() const override { return device_; }
  WorkPtr Send(const torch::Tensor& t, int peer, int tag) override {
    OnItsDevice(t);
    std::vector<torch::Tensor> buf{t};
    return Registered(Post([&] { return pg_->send(buf, peer, tag); }), false);
  }
  WorkPtr Recv(const torch::Tensor& t, int peer, int tag) override {
    OnItsDevice(t);
    std::vector<torch::Tensor> buf{t};
    return Registered(Post([&] { return pg_->recv(buf, peer, tag); }), false);
  }
  WorkPtr AllReduceSum(const torch::Tensor& t, std::chrono::milliseconds timeout) override {
    OnItsDevice(t);
    std::vector<torch::Tensor> buf{t};
    c10d::AllreduceOptions opts;
    opts.timeout = timeout;
    return Registered(Post([&] { return pg_->allreduce(buf, opts); }),
                      /*sliced=*/abort_ != nullptr && backend_ == "gloo");
  }

 private:
  // A host tensor on a device group (NCCL) is a bug of ours, named here rather than deep in
  // c10d; host bytes go on ProcessGroups::control.
  void OnItsDevice(const torch::Tensor& t) const {
    if (device_ && !t.is_cuda()) {
      throw std::invalid_argument(absl::StrCat("a ", t.device().str(), " tensor on the ", backend_,
                                               " group, which carries device tensors only"));
    }
  }
  // Gloo's posts one at a time in the process (Note [Flight recorder]).
  template <typename F>
  c10::intrusive_ptr<c10d::Work> Post(F post) {
    if (backend_ != "gloo") return post();
    std::lock_guard<std::mutex> l(GlooPostMutex());
    return post();
  }
  WorkPtr Registered(c10::intrusive_ptr<c10d::Work> w, bool sliced) {
    WorkPtr out = std::make_shared<C10dWork>(std::move(w), abort_, sliced, backend_ == "nccl");
    if (abort_) abort_->Register(out);
    return out;
  }

  c10::intrusive_ptr<PG> pg_;
  std::string backend_;
  bool device_;
  std::shared_ptr<AbortSignal> abort_;
};

std::shared_ptr<::gloo::transport::Device> MakeGlooDevice(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (master_addr == "localhost" || master_addr.rfind("127.", 0) == 0) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  // Under varuna-agent: the address this machine is known by. The hostname may resolve to
  // another interface (or to nothing) on multi-homed VMs.
  if (const char* addr = std::getenv("VARUNA_NODE_ADDR");
      addr != nullptr && *addr && std::string(addr) != "0.0.0.0" && std::string(addr) != "::") {
    std::shared_ptr<::gloo::transport::Device> device;
    const absl::Status s = TorchCall("gloo device for VARUNA_NODE_ADDR", [&] {
      device = c10d::ProcessGroupGloo::createDeviceForHostname(addr);
    });
    if (s.ok()) return device;
    // E.g. a NAT'd advertise_host that is not an address of this machine.
    LOG(WARNING) << s.message() << "; using the hostname's address instead";
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

int IndexIn(const std::vector<int>& members, int rank) {
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == rank) return static_cast<int>(i);
  }
  return -1;
}

class GlooFactory : public ProcessGroupFactory {
 public:
  GlooFactory(c10::intrusive_ptr<c10d::Store> store, std::string master_addr,
              std::chrono::milliseconds timeout, std::shared_ptr<AbortSignal> abort)
      : store_(std::move(store)),
        master_addr_(std::move(master_addr)),
        timeout_(timeout),
        abort_(std::move(abort)) {}
  Backend backend() const override { return Backend::kGloo; }
  absl::StatusOr<ProcessGroupPtr> Create(const std::string& name, const std::vector<int>& members,
                                         int rank) override {
    ProcessGroupPtr out;
    RETURN_IF_ERROR(TorchCall(absl::StrCat("gloo group ", name), [&] {
      if (!device_) device_ = MakeGlooDevice(master_addr_);
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
      opts->devices.push_back(device_);
      opts->threads = 2;
      out = std::make_shared<C10dGroup<c10d::ProcessGroupGloo>>(
          c10::make_intrusive<c10d::ProcessGroupGloo>(
              c10::make_intrusive<c10d::PrefixStore>(name, store_), IndexIn(members, rank),
              static_cast<int>(members.size()), opts),
          "gloo", /*device_transfers=*/false, abort_);
    }));
    return out;
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string master_addr_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<AbortSignal> abort_;
  std::shared_ptr<::gloo::transport::Device> device_;
};

#ifdef VARUNA_WITH_NCCL
// Note [NCCL watchdog]: no blocking wait: works are waited on the stream, and the host's reads
// of results poll with the job's timeout and abort the communicators on expiry (Note [NCCL
// waits] in read_back.cc), so nothing of c10d's may tear the process down first: a survivor is
// rescued or regrouped. Three switches, set before the first group and only where the user has
// not set them: TORCH_NCCL_ASYNC_ERROR_HANDLING=0 (the watchdog does not abort and exit on a
// failed work), TORCH_NCCL_DUMP_ON_TIMEOUT=0 (a timed-out or aborted work, which our own
// abort() makes, does not signal every rank through the store to dump and terminate) and
// TORCH_NCCL_ENABLE_MONITORING=0 (the heartbeat monitor does not kill a process whose watchdog
// it thinks stuck). c10d's own timeout is twice the job's, so the host's polled timeout always
// comes first and c10d's only backs it up. And TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_
// WARNING=false: point-to-point on an eagerly made communicator is serialised with the group's
// other operations, which a pipeline link (one direction) wants anyway.
void NcclWatchdogLeavesTheProcessAlone() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_DUMP_ON_TIMEOUT",
                             "TORCH_NCCL_ENABLE_MONITORING"}) {
      const char* set = std::getenv(name);
      if (set == nullptr) {
        setenv(name, "0", /*overwrite=*/0);
      } else if (std::string(set) != "0") {
        LOG(WARNING) << name << "=" << set << " is set: c10d may end this process on a "
                     << "timeout or abort, so a survivor cannot be rescued or regrouped "
                        "(Note [NCCL watchdog])";
      }
    }
    setenv("TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING", "false", /*overwrite=*/0);
  });
}

class NcclFactory : public ProcessGroupFactory {
 public:
  NcclFactory(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds timeout,
              std::shared_ptr<AbortSignal> abort, torch::Device device)
      : store_(std::move(store)), timeout_(timeout), abort_(std::move(abort)), device_(device) {
    NcclWatchdogLeavesTheProcessAlone();
  }
  Backend backend() const override { return Backend::kNccl; }
  absl::StatusOr<ProcessGroupPtr> Create(const std::string& name, const std::vector<int>& members,
                                         int rank) override {
    ProcessGroupPtr out;
    RETURN_IF_ERROR(TorchCall(absl::StrCat("nccl group ", name), [&] {
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = 2 * timeout_;  // Note [NCCL watchdog]
      auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>(name, store_), IndexIn(members, rank),
          static_cast<int>(members.size()), opts);
      if (device_.is_cuda()) {
        // This rank's GPU, not the current device at first use (GPU 0 without set_device).
        pg->setBoundDeviceId(device_);
        // The communicator now, not at the first operation: every rank creates its groups in
        // one global order (CreateGroups), so these waits cannot cross, whereas first
        // operations posted in schedule or hook order by two ranks in several holder groups
        // could each wait on a different group; a peer that never comes fails the rendezvous.
        // c10d then runs the group's point-to-point on that communicator, serialised with its
        // other operations: a pipeline link carries one direction (Note [Pipeline links]).
        pg->eagerConnectSingleDevice(device_);
      }
      out = std::make_shared<C10dGroup<c10d::ProcessGroupNCCL>>(std::move(pg), "nccl",
                                                                /*device_transfers=*/true, abort_);
    }));
    return out;
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<AbortSignal> abort_;
  torch::Device device_;
};
#endif

}  // namespace

// Note [Aborting together]: NCCL wants the communicators of one device aborted together (c10d
// brackets its own aborts of a group's communicators with ncclGroupStart/End). A communicator
// aborted alone frees its device memory, and that free waits for every kernel on the GPU, among
// them another communicator's kernel that waits for the dead peer and ends only when its own
// abort runs: the survivor hangs, untimed. So the works are aborted on threads of their own,
// all at once, and joined: while one abort's free waits, the others raise their own flags, so
// every stuck kernel returns and every free ends.
void AbortSignal::Abort() {
  aborted_.store(true);
  std::vector<WorkPtr> works;
  {
    std::lock_guard<std::mutex> l(mu_);
    works = works_;
  }
  if (works.size() <= 1) {
    for (auto& w : works) w->Abort();
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(works.size());
  for (auto& w : works) threads.emplace_back([w] { w->Abort(); });
  for (auto& t : threads) t.join();
}

void AbortSignal::PruneLocked() {
  works_.erase(
      std::remove_if(works_.begin(), works_.end(), [](const WorkPtr& w) { return w->Done(); }),
      works_.end());
}

void AbortSignal::Register(const WorkPtr& work) {
  std::lock_guard<std::mutex> l(mu_);
  // Pruned at every post: a done work still holds its buffer (an activation on a GPU), which
  // the allocator cannot reuse while it is held here.
  PruneLocked();
  works_.push_back(work);
}

bool AbortSignal::Idle() {
  std::lock_guard<std::mutex> l(mu_);
  PruneLocked();
  return works_.empty();
}

namespace {

// Until something accepts a TCP connection at host:port, or `timeout` passes (then TCPStore
// reports the failure itself).
void WaitForListener(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool connected = false;
  while (!connected && std::chrono::steady_clock::now() < deadline) {
    for (addrinfo* a = found; a != nullptr && !connected; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
      close(fd);
    }
    if (!connected) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  freeaddrinfo(found);
}

}  // namespace

const char* BackendName(Backend b) {
  switch (b) {
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
    case Backend::kThreads:
      return "threads";
  }
  return "?";
}

absl::StatusOr<ProcessGroups> CreateGroups(ProcessGroupFactory& factory, const Topology& t,
                                           int process_rank, bool has_tied,
                                           std::chrono::milliseconds timeout, int tp_size) {
  ProcessGroups g;
  g.timeout = timeout;
  // Positions -> this tp slice's processes (Note [Tensor parallelism]).
  const int tp_rank = process_rank % tp_size, rank = process_rank / tp_size;
  auto processes = [&](const std::vector<int>& positions) {
    std::vector<int> out;
    for (int p : positions) out.push_back(p * tp_size + tp_rank);
    return out;
  };
  const std::string slice = tp_size > 1 ? absl::StrCat("/tp", tp_rank) : "";
  std::vector<int> all(t.world_size());
  for (int i = 0; i < t.world_size(); ++i) all[i] = i;
  ASSIGN_OR_RETURN(g.world, factory.Create("world" + slice, processes(all), process_rank));
  g.control = g.world;  // CreateProcessGroups adds a gloo one beside NCCL
  for (const std::vector<int>& ranks : t.HolderSets()) {
    if (IndexIn(ranks, rank) < 0) continue;
    ASSIGN_OR_RETURN(g.holders[ranks],
                     factory.Create(absl::StrCat("dp:", absl::StrJoin(ranks, ","), slice),
                                    processes(ranks), process_rank));
  }
  for (int k = 0; has_tied && k < t.num_pipelines(); ++k) {
    const PipelineLayout& p = t.pipeline(k);
    if (p.stages() < 2) continue;
    const std::vector<int> pair{p.first_rank, p.first_rank + p.stages() - 1};
    if (IndexIn(pair, rank) < 0) continue;
    ASSIGN_OR_RETURN(g.tied,
                     factory.Create(absl::StrCat("tied", k, slice), processes(pair), process_rank));
  }
  for (int k = 0; k < t.num_pipelines(); ++k) {  // Note [Pipeline links]
    const PipelineLayout& p = t.pipeline(k);
    for (int a = p.first_rank; a + 1 < p.first_rank + p.stages(); ++a) {
      const int b = a + 1;
      if (rank != a && rank != b) continue;
      const std::vector<int> pair = processes({a, b});
      ASSIGN_OR_RETURN(ProcessGroupPtr act,
                       factory.Create(absl::StrCat("act:", a, ">", b, slice), pair, process_rank));
      ASSIGN_OR_RETURN(ProcessGroupPtr grad,
                       factory.Create(absl::StrCat("grad:", b, ">", a, slice), pair, process_rank));
      if (rank == a) {
        g.links.act_out = std::move(act);
        g.links.grad_in = std::move(grad);
      } else {
        g.links.act_in = std::move(act);
        g.links.grad_out = std::move(grad);
      }
    }
  }
  if (tp_size > 1) {
    std::vector<int> members;
    for (int r = 0; r < tp_size; ++r) members.push_back(rank * tp_size + r);
    ASSIGN_OR_RETURN(g.tp, factory.Create(absl::StrCat("tp", rank), members, process_rank));
  }
  return g;
}

absl::StatusOr<Backend> ChooseBackend(const torch::Device& device, int local_world_size, int gpus) {
#ifdef VARUNA_WITH_NCCL
  constexpr bool kHaveNccl = true;
#else
  constexpr bool kHaveNccl = false;
#endif
  if (const char* env = std::getenv("VARUNA_BACKEND"); env != nullptr && *env) {
    const std::string b = env;
    if (b == "gloo") return Backend::kGloo;
    if (b == "nccl") {
      if (!kHaveNccl) {
        return absl::FailedPreconditionError(
            "VARUNA_BACKEND=nccl, but this varuna-worker was built against a LibTorch without "
            "NCCL (build against a CUDA LibTorch: docs/gpu.md)");
      }
      if (!device.is_cuda()) {
        return absl::FailedPreconditionError("VARUNA_BACKEND=nccl needs a CUDA device");
      }
      return Backend::kNccl;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("VARUNA_BACKEND='", b, "': expected gloo or nccl"));
  }
  if (kHaveNccl && device.is_cuda() && local_world_size <= gpus) return Backend::kNccl;
  return Backend::kGloo;
}

absl::StatusOr<ProcessGroups> CreateProcessGroups(const WorkerTopology& topo, bool has_tied,
                                                  std::chrono::milliseconds timeout,
                                                  Backend backend, torch::Device device) {
  FlightRecorderOffUnlessAsked();  // Note [Flight recorder]
  c10::intrusive_ptr<c10d::Store> store;
  const std::string where = absl::StrCat("rendezvous at ", topo.master_addr, ":", topo.master_port);
  // A client that connects before the server listens backs off for a second inside TCPStore;
  // waiting here for the port in 10 ms steps takes that second off every launch and regroup.
  if (topo.process_rank() != 0 || topo.store_is_external) {
    WaitForListener(topo.master_addr, topo.master_port, timeout);
  }
  RETURN_IF_ERROR(TorchCall(where, [&] {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(topo.master_port);
    o.isServer = topo.process_rank() == 0 && !topo.store_is_external;
    if (!topo.store_is_external) o.numWorkers = topo.processes();
    o.waitWorkers = false;
    o.timeout = timeout;
    c10::intrusive_ptr<c10d::Store> tcp = c10::make_intrusive<c10d::TCPStore>(topo.master_addr, o);
    // torchrun restarts workers against the same store: keys are per attempt, as in PyTorch.
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    store = c10::make_intrusive<c10d::PrefixStore>(
        absl::StrCat("varuna/attempt_", attempt != nullptr ? attempt : "0"), tcp);
  }));
  auto abort = std::make_shared<AbortSignal>();
  std::unique_ptr<ProcessGroupFactory> factory;
  switch (backend) {
    case Backend::kGloo:
      factory = std::make_unique<GlooFactory>(store, topo.master_addr, timeout, abort);
      break;
    case Backend::kNccl:
#ifdef VARUNA_WITH_NCCL
      factory = std::make_unique<NcclFactory>(store, timeout, abort, device);
      break;
#else
      (void)device;
      return absl::FailedPreconditionError("this build has no NCCL");
#endif
    case Backend::kThreads:
      return absl::InvalidArgumentError(
          "thread process groups are made with ThreadWorld, not a rendezvous");
  }
  absl::StatusOr<ProcessGroups> g =
      CreateGroups(*factory, topo.topology, topo.process_rank(), has_tied, timeout, topo.tp_size);
  if (g.ok() && backend == Backend::kNccl) {
    // Host bytes (the hand-over of a morph in place) travel on gloo beside NCCL.
    GlooFactory gloo(store, topo.master_addr, timeout, abort);
    std::vector<int> members;
    for (int p = 0; p < topo.world_size; ++p) members.push_back(p * topo.tp_size + topo.tp_rank);
    absl::StatusOr<ProcessGroupPtr> control = gloo.Create(
        topo.tp_size > 1 ? absl::StrCat("control/tp", topo.tp_rank) : std::string("control"),
        members, topo.process_rank());
    if (control.ok()) {
      g->control = *std::move(control);
    } else {
      g = control.status();
    }
  }
  if (!g.ok())
    return absl::Status(g.status().code(), absl::StrCat(where, ": ", g.status().message()));
  g->store = store;
  g->abort = abort;
  LOG(INFO) << "rank=" << topo.rank << " process groups on " << BackendName(backend);
  return g;
}

}  // namespace varuna
