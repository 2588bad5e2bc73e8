#include "worker/dist/thread_process_group.h"

#include <atomic>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace varuna {

class DoneWork : public Work {
 public:
  void Wait(std::chrono::milliseconds) override {}
  void Abort() override {}
};

class ThreadRecvWork : public Work {
 public:
  ThreadRecvWork(std::shared_ptr<ThreadWorld> w, ThreadWorld::Channel c, int64_t seq,
                 torch::Tensor buf)
      : w_(std::move(w)), c_(std::move(c)), seq_(seq), buf_(std::move(buf)) {}
  void Wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> l(w_->mu_);
    auto& box = w_->mail_[c_];
    if (!w_->cv_.wait_for(l, timeout, [&] { return aborted_ || w_->killed_ || box.count(seq_); })) {
      throw std::runtime_error(absl::StrCat("receive from rank ", std::get<1>(c_), " timed out"));
    }
    if (aborted_) throw std::runtime_error("receive aborted");
    if (!box.count(seq_)) throw std::runtime_error("Connection closed: peer killed");
    torch::Tensor t = std::move(box[seq_]);
    box.erase(seq_);
    l.unlock();
    if (t.sizes() != buf_.sizes() || t.scalar_type() != buf_.scalar_type()) {
      throw std::runtime_error("receive: message does not match the buffer's shape or dtype");
    }
    torch::NoGradGuard g;
    buf_.copy_(t);
  }
  void Abort() override {
    std::lock_guard<std::mutex> l(w_->mu_);
    aborted_ = true;
    w_->cv_.notify_all();
  }

 private:
  std::shared_ptr<ThreadWorld> w_;
  ThreadWorld::Channel c_;
  int64_t seq_;
  torch::Tensor buf_;
  bool aborted_ = false;
};

class ThreadReduceWork : public Work {
 public:
  ThreadReduceWork(std::shared_ptr<ThreadWorld> w, std::pair<std::string, int64_t> key, int size,
                   torch::Tensor buf)
      : w_(std::move(w)), key_(std::move(key)), size_(size), buf_(std::move(buf)) {}
  void Wait(std::chrono::milliseconds timeout) override {
    if (done_) return;
    std::unique_lock<std::mutex> l(w_->mu_);
    auto pending = [&] { return w_->reductions_[key_].posted < size_; };
    if (!w_->cv_.wait_for(l, timeout, [&] { return aborted_ || w_->killed_ || !pending(); })) {
      throw std::runtime_error(absl::StrCat("all-reduce on ", key_.first, " timed out"));
    }
    if (aborted_) throw std::runtime_error("all-reduce aborted");
    if (pending()) throw std::runtime_error("Connection closed: peer killed");
    ThreadWorld::Reduction& r = w_->reductions_[key_];
    if (!r.sum.defined()) {
      // In member order, the same for every member: deterministic.
      r.sum = r.parts[0].clone();
      for (int i = 1; i < size_; ++i) r.sum.add_(r.parts[i]);
    }
    torch::Tensor sum = r.sum;
    if (++r.taken == size_) w_->reductions_.erase(key_);
    l.unlock();
    torch::NoGradGuard g;
    buf_.copy_(sum);
    done_ = true;
  }
  void Abort() override {
    std::lock_guard<std::mutex> l(w_->mu_);
    aborted_ = true;
    w_->cv_.notify_all();
  }

 private:
  std::shared_ptr<ThreadWorld> w_;
  std::pair<std::string, int64_t> key_;
  int size_;
  torch::Tensor buf_;
  bool aborted_ = false, done_ = false;
};

class ThreadGroup : public ProcessGroup {
 public:
  ThreadGroup(std::shared_ptr<ThreadWorld> w, std::string name, int rank, int size)
      : w_(std::move(w)), name_(std::move(name)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "threads"; }
  bool device_transfers() const override { return true; }
  WorkPtr Send(const torch::Tensor& t, int peer, int tag) override {
    CheckPeer(peer);
    ThreadWorld::Channel c{name_, rank_, peer, tag};
    torch::Tensor copy = t.detach().clone();
    std::lock_guard<std::mutex> l(w_->mu_);
    w_->mail_[c][sent_[c]++] = std::move(copy);
    w_->cv_.notify_all();
    return std::make_shared<DoneWork>();
  }
  WorkPtr Recv(const torch::Tensor& t, int peer, int tag) override {
    CheckPeer(peer);
    ThreadWorld::Channel c{name_, peer, rank_, tag};
    std::lock_guard<std::mutex> l(w_->mu_);
    return std::make_shared<ThreadRecvWork>(w_, c, received_[c]++, t);
  }
  WorkPtr AllReduceSum(const torch::Tensor& t, std::chrono::milliseconds) override {
    std::pair<std::string, int64_t> key{name_, reductions_++};
    torch::Tensor part = t.detach().clone();
    std::lock_guard<std::mutex> l(w_->mu_);
    ThreadWorld::Reduction& r = w_->reductions_[key];
    if (r.parts.empty()) r.parts.resize(size_);
    r.parts[rank_] = std::move(part);
    ++r.posted;
    w_->cv_.notify_all();
    return std::make_shared<ThreadReduceWork>(w_, key, size_, t);
  }

 private:
  void CheckPeer(int peer) const {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw std::runtime_error(absl::StrCat("invalid peer ", peer, " in a group of ", size_));
    }
  }
  std::shared_ptr<ThreadWorld> w_;
  std::string name_;
  int rank_, size_;
  // Per-channel sequence numbers of this member (under the world's lock): the engine posts
  // from its compute, sender, receiver and autograd threads.
  std::map<ThreadWorld::Channel, int64_t> sent_, received_;
  std::atomic<int64_t> reductions_{0};
};

void ThreadWorld::Kill() {
  std::lock_guard<std::mutex> l(mu_);
  killed_ = true;
  cv_.notify_all();
}

absl::StatusOr<ProcessGroupPtr> ThreadFactory::Create(const std::string& name,
                                                      const std::vector<int>& members, int rank) {
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == rank) {
      return std::make_shared<ThreadGroup>(world_, name, static_cast<int>(i),
                                           static_cast<int>(members.size()));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in group ", name));
}

}  // namespace varuna
