#include "worker/dist/comm.h"

#include "absl/strings/str_cat.h"
#include "worker/dist/torch_status.h"

namespace varuna {

// Note [Transfer threads]: the receiver and sender threads wait for their works on the host
// (Work::WaitOnHost), never with Wait. On NCCL, Wait makes the calling thread's current stream
// wait for the transfer (Note [NCCL waits] in read_back.cc), and a transfer thread's current
// stream is the device's default stream, the one compute runs on. A receiver pre-posts its
// window at the start of the step, so waiting that way would queue "wait for gradient 0"
// ahead of the forwards whose activations the next stage needs to compute gradient 0: the
// device would stop at P >= 2 until the timeout, every step. Each sender wait would likewise
// hold compute until its send completed. Waiting on the host (an event query, polled at most
// 20 us apart) hands a tensor over only once it has arrived, so the compute stream needs no
// wait at all, Ready() tells the truth, and the windows bound what is in flight.
// dist/comm_test.cc holds this with a group whose Wait may be called only by compute.

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
      WorkPtr work;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (aborted_) return absl::CancelledError("receive aborted");
        while (next < specs.size() && static_cast<int>(inflight_.size()) < kWindow) {
          torch::Tensor buf =
              torch::empty(specs[next].shape, torch::dtype(specs[next].dtype).device(device_));
          inflight_.emplace_back(buf, pg_->Recv(buf, peer_, tag_));
          ++next;
        }
        if (inflight_.empty()) return absl::OkStatus();
        work = inflight_.front().second;
      }
      work->WaitOnHost(timeout_);  // Note [Transfer threads]
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
    for (auto& [t, w] : inflight_) w->Abort();
    error_ = st;
  }
  inflight_.clear();
  cv_.notify_all();
}

void Receiver::Abort() {
  std::lock_guard<std::mutex> l(mu_);
  aborted_ = true;
  for (auto& [t, w] : inflight_) w->Abort();
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
        inflight_.push_back(pg_->Send(t, peer_, tag_));
      }
      WorkPtr oldest;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (static_cast<int>(inflight_.size()) < kWindow) continue;
        oldest = inflight_.front();
      }
      oldest->WaitOnHost(timeout_);  // Note [Transfer threads]
      std::lock_guard<std::mutex> l(mu_);
      inflight_.pop_front();
    }
    while (true) {
      WorkPtr w;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (inflight_.empty() || aborted_) break;
        w = inflight_.front();
      }
      w->WaitOnHost(timeout_);
      std::lock_guard<std::mutex> l(mu_);
      inflight_.pop_front();
    }
    return absl::OkStatus();
  });
  std::lock_guard<std::mutex> l(mu_);
  if (!st.ok()) {
    for (auto& w : inflight_) w->Abort();
    error_ = st;
  }
  inflight_.clear();
}

void Sender::Abort() {
  std::lock_guard<std::mutex> l(mu_);
  aborted_ = true;
  for (auto& w : inflight_) w->Abort();
  cv_.notify_all();
}

absl::Status Sender::Join() {
  if (thread_.joinable()) thread_.join();
  return error_;
}

absl::Status SendBlocking(const ProcessGroupPtr& pg, torch::Tensor t, int peer, int tag,
                          std::chrono::milliseconds timeout) {
  return TorchCall(absl::StrCat("send to rank ", peer),
                   [&] { pg->Send(t.contiguous(), peer, tag)->Wait(timeout); });
}

absl::Status RecvBlocking(const ProcessGroupPtr& pg, torch::Tensor& t, int peer, int tag,
                          std::chrono::milliseconds timeout) {
  return TorchCall(absl::StrCat("receive from rank ", peer),
                   [&] { pg->Recv(t, peer, tag)->Wait(timeout); });
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
    std::vector<WorkPtr> works;
    for (const auto& [pg, tensors] : groups) {
      for (auto& t : *tensors) works.push_back(pg->AllReduceSum(t, timeout));
    }
    for (auto& w : works) w->Wait(timeout);
  });
}

}  // namespace varuna
