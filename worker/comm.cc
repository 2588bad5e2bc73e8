#include "worker/comm.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "worker/torch_status.h"

namespace varuna {
namespace {

std::shared_ptr<::gloo::transport::Device> MakeDevice(const std::string& master_addr) {
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

ProcessGroupPtr MakeGroup(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                          const std::vector<int>& members, int rank,
                          const std::shared_ptr<::gloo::transport::Device>& device,
                          std::chrono::milliseconds timeout) {
  int index = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == rank) index = static_cast<int>(i);
  }
  if (index < 0) return ProcessGroupPtr();
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(device);
  opts->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>(prefix, store), index,
      static_cast<int>(members.size()), opts);
}

}  // namespace

absl::StatusOr<ProcessGroups> CreateProcessGroups(const WorkerTopology& topo, bool has_tied,
                                                  std::chrono::milliseconds timeout) {
  ProcessGroups g;
  g.timeout = timeout;
  const std::string where = absl::StrCat("rendezvous at ", topo.master_addr, ":", topo.master_port);
  absl::Status st = TorchCall(where, [&] {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(topo.master_port);
    o.isServer = topo.rank == 0 && !topo.store_is_external;
    o.numWorkers =
        topo.store_is_external ? c10::nullopt : c10::optional<std::size_t>(topo.world_size);
    o.waitWorkers = false;
    o.timeout = timeout;
    c10::intrusive_ptr<c10d::Store> tcp = c10::make_intrusive<c10d::TCPStore>(topo.master_addr, o);
    // torchrun restarts workers against the same store: keys are per attempt, as in PyTorch.
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    g.store = c10::make_intrusive<c10d::PrefixStore>(
        absl::StrCat("varuna/attempt_", attempt != nullptr ? attempt : "0"), tcp);
    auto device = MakeDevice(topo.master_addr);
    const Topology& t = topo.topology;
    std::vector<int> all(topo.world_size);
    for (int i = 0; i < topo.world_size; ++i) all[i] = i;
    g.world = MakeGroup(g.store, "world", all, topo.rank, device, timeout);
    for (const std::vector<int>& ranks : t.HolderSets()) {
      ProcessGroupPtr pg = MakeGroup(g.store, absl::StrCat("dp:", absl::StrJoin(ranks, ",")), ranks,
                                     topo.rank, device, timeout);
      if (pg) g.holders[ranks] = pg;
    }
    for (int k = 0; has_tied && k < t.num_pipelines(); ++k) {
      const PipelineLayout& p = t.pipeline(k);
      if (p.stages() < 2) continue;
      g.tied = g.tied ? g.tied
                      : MakeGroup(g.store, absl::StrCat("tied", k),
                                  {p.first_rank, p.first_rank + p.stages() - 1}, topo.rank, device,
                                  timeout);
    }
  });
  if (!st.ok()) return st;
  return g;
}

void Receiver::Start(std::vector<TensorSpec> specs) {
  Join().IgnoreError();  // the previous step's error was already reported
  error_ = absl::OkStatus();
  ready_.clear();
  aborted_ = false;
  thread_ = std::thread([this, specs = std::move(specs)]() mutable { Run(std::move(specs)); });
}

void Receiver::Run(std::vector<TensorSpec> specs) {
  size_t next = 0;
  absl::Status st = TorchCall(absl::StrCat("receive from rank ", peer_), [&]() -> absl::Status {
    while (true) {
      c10::intrusive_ptr<c10d::Work> work;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (aborted_) return absl::CancelledError("receive aborted");
        while (next < specs.size() && static_cast<int>(inflight_.size()) < kWindow) {
          std::vector<torch::Tensor> buf{torch::empty(specs[next].shape, specs[next].dtype)};
          inflight_.emplace_back(buf[0], pg_->recv(buf, peer_, tag_));
          ++next;
        }
        if (inflight_.empty()) return absl::OkStatus();
        work = inflight_.front().second;
      }
      work->wait(timeout_);
      std::lock_guard<std::mutex> l(mu_);
      if (aborted_) return absl::CancelledError("receive aborted");
      ready_.push_back(inflight_.front().first);
      inflight_.pop_front();
      cv_.notify_all();
    }
  });
  std::lock_guard<std::mutex> l(mu_);
  if (!st.ok()) {
    // Outstanding receives would otherwise complete into freed buffers: abort them.
    for (auto& [t, w] : inflight_) w->abort();
    error_ = st;
  }
  inflight_.clear();
  cv_.notify_all();
}

void Receiver::Abort() {
  std::lock_guard<std::mutex> l(mu_);
  aborted_ = true;
  for (auto& [t, w] : inflight_) w->abort();
  cv_.notify_all();
}

absl::StatusOr<torch::Tensor> Receiver::Take() {
  std::unique_lock<std::mutex> l(mu_);
  // The receiving thread enforces the timeout on each message; the extra margin here only
  // guards against a thread that never reports.
  if (!cv_.wait_for(l, timeout_ + std::chrono::seconds(5),
                    [&] { return !ready_.empty() || !error_.ok(); })) {
    return absl::DeadlineExceededError(
        absl::StrCat("timed out waiting for a tensor from rank ", peer_));
  }
  if (ready_.empty()) return error_;
  torch::Tensor t = ready_.front();
  ready_.pop_front();
  return t;
}

bool Receiver::Ready() {
  std::lock_guard<std::mutex> l(mu_);
  return !ready_.empty() || !error_.ok();
}

absl::Status Receiver::Join() {
  if (thread_.joinable()) thread_.join();
  return error_;
}

void Sender::Start(int count) {
  Join().IgnoreError();  // the previous step's error was already reported
  error_ = absl::OkStatus();
  queue_.clear();
  aborted_ = false;
  thread_ = std::thread([this, count] { Run(count); });
}

void Sender::Send(torch::Tensor t) {
  std::lock_guard<std::mutex> l(mu_);
  queue_.push_back(std::move(t));
  cv_.notify_all();
}

void Sender::Run(int count) {
  absl::Status st = TorchCall(absl::StrCat("send to rank ", peer_), [&]() -> absl::Status {
    for (int sent = 0; sent < count; ++sent) {
      torch::Tensor t;
      {
        // No timeout here: how long compute takes to produce the next tensor is not a
        // communication failure; RunPipeline aborts the sender on any error.
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return !queue_.empty() || aborted_; });
        if (aborted_) return absl::CancelledError("send aborted");
        t = std::move(queue_.front());
        queue_.pop_front();
        std::vector<torch::Tensor> buf{t};
        inflight_.push_back(pg_->send(buf, peer_, tag_));
      }
      c10::intrusive_ptr<c10d::Work> oldest;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (static_cast<int>(inflight_.size()) < kWindow) continue;
        oldest = inflight_.front();
      }
      oldest->wait(timeout_);
      std::lock_guard<std::mutex> l(mu_);
      inflight_.pop_front();
    }
    while (true) {
      c10::intrusive_ptr<c10d::Work> w;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (inflight_.empty() || aborted_) break;
        w = inflight_.front();
      }
      w->wait(timeout_);
      std::lock_guard<std::mutex> l(mu_);
      inflight_.pop_front();
    }
    return absl::OkStatus();
  });
  std::lock_guard<std::mutex> l(mu_);
  if (!st.ok()) {
    for (auto& w : inflight_) w->abort();
    error_ = st;
  }
  inflight_.clear();
}

void Sender::Abort() {
  std::lock_guard<std::mutex> l(mu_);
  aborted_ = true;
  for (auto& w : inflight_) w->abort();
  cv_.notify_all();
}

absl::Status Sender::Join() {
  if (thread_.joinable()) thread_.join();
  return error_;
}

absl::Status SendBlocking(const ProcessGroupPtr& pg, torch::Tensor t, int peer, int tag,
                          std::chrono::milliseconds timeout) {
  return TorchCall(absl::StrCat("send to rank ", peer), [&] {
    std::vector<torch::Tensor> buf{t.contiguous()};
    pg->send(buf, peer, tag)->wait(timeout);
  });
}

absl::Status RecvBlocking(const ProcessGroupPtr& pg, torch::Tensor& t, int peer, int tag,
                          std::chrono::milliseconds timeout) {
  return TorchCall(absl::StrCat("receive from rank ", peer), [&] {
    std::vector<torch::Tensor> buf{t};
    pg->recv(buf, peer, tag)->wait(timeout);
  });
}

absl::Status AllReduceSum(const ProcessGroupPtr& pg, std::vector<torch::Tensor>& tensors,
                          std::chrono::milliseconds timeout) {
  std::vector<std::pair<ProcessGroupPtr, std::vector<torch::Tensor>*>> one{{pg, &tensors}};
  return AllReduceSumGroups(one, timeout);
}

absl::Status AllReduceSumGroups(
    const std::vector<std::pair<ProcessGroupPtr, std::vector<torch::Tensor>*>>& groups,
    std::chrono::milliseconds timeout) {
  return TorchCall("all-reduce", [&] {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (const auto& [pg, tensors] : groups) {
      for (auto& t : *tensors) {
        std::vector<torch::Tensor> one{t};
        c10d::AllreduceOptions opts;
        opts.timeout = timeout;
        works.push_back(pg->allreduce(one, opts));
      }
    }
    for (auto& w : works) w->wait(timeout);
  });
}

}  // namespace varuna
