// The pipeline transport's threads (worker/dist/comm.h) against a group whose waits order the
// caller's stream, as NCCL's do (Note [Transfer threads] in worker/dist/comm.cc).

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"
#include "worker/dist/comm.h"
#include "worker/dist/thread_process_group.h"

namespace varuna {
namespace {

using std::chrono::milliseconds;
using ::varuna::testing::IsOk;

// Which thread computes on a rank, and how often anything else called Wait there.
struct StreamLog {
  std::atomic<std::thread::id> compute;
  std::atomic<int> waits_off_compute{0};
};

// NCCL's semantics over a thread group: Wait stands for "the calling thread's current stream
// waits for the operation", which only the compute thread may ask for (on a transfer thread it
// is the compute stream too, and the schedule deadlocks); WaitOnHost blocks the host.
class StreamOrderedWork : public Work {
 public:
  StreamOrderedWork(WorkPtr inner, std::shared_ptr<StreamLog> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}
  void Wait(milliseconds timeout) override {
    if (std::this_thread::get_id() != log_->compute.load()) ++log_->waits_off_compute;
    inner_->Wait(timeout);
  }
  void WaitOnHost(milliseconds timeout) override { inner_->Wait(timeout); }
  void Abort() override { inner_->Abort(); }
  bool Done() override { return inner_->Done(); }

 private:
  WorkPtr inner_;
  std::shared_ptr<StreamLog> log_;
};

class StreamOrderedGroup : public ProcessGroup {
 public:
  StreamOrderedGroup(ProcessGroupPtr inner, std::shared_ptr<StreamLog> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return "stream-ordered"; }
  bool device_transfers() const override { return true; }
  WorkPtr Send(const torch::Tensor& t, int peer, int tag) override {
    return Wrap(inner_->Send(t, peer, tag));
  }
  WorkPtr Recv(const torch::Tensor& t, int peer, int tag) override {
    return Wrap(inner_->Recv(t, peer, tag));
  }
  WorkPtr AllReduceSum(const torch::Tensor& t, milliseconds timeout) override {
    return Wrap(inner_->AllReduceSum(t, timeout));
  }

 private:
  WorkPtr Wrap(WorkPtr w) { return std::make_shared<StreamOrderedWork>(std::move(w), log_); }
  ProcessGroupPtr inner_;
  std::shared_ptr<StreamLog> log_;
};

// Stage 0 sends 12 activations while stage 1 pre-posts its receives and takes them in order,
// as a step's transfers do; then a blocking send and receive on the compute threads, which may
// wait on the stream.
TEST(TransferThreadsTest, WaitOnTheHostNeverOnTheComputeStream) {
  auto world = std::make_shared<ThreadWorld>();
  ThreadFactory factory(world);
  constexpr int kMessages = 12;
  std::vector<std::shared_ptr<StreamLog>> logs = {std::make_shared<StreamLog>(),
                                                  std::make_shared<StreamLog>()};
  std::vector<ProcessGroupPtr> link(2);
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<ProcessGroupPtr> g = factory.Create("act:0>1", {0, 1}, r);
    ASSERT_THAT(g.status(), IsOk());
    link[r] = std::make_shared<StreamOrderedGroup>(*g, logs[r]);
  }
  std::vector<float> got;
  absl::Status sent, received, blocking;
  std::thread stage0([&] {
    logs[0]->compute = std::this_thread::get_id();
    Sender sender(link[0], 1, 0, milliseconds(10000));
    sender.Start(kMessages);
    for (int m = 0; m < kMessages; ++m) sender.Send(torch::full({3}, static_cast<float>(m)));
    sent = sender.Join();
    if (sent.ok()) sent = SendBlocking(link[0], torch::full({2}, 7.0f), 1, 0, milliseconds(10000));
  });
  std::thread stage1([&] {
    logs[1]->compute = std::this_thread::get_id();
    Receiver receiver(link[1], 0, 0, milliseconds(10000));
    receiver.Start(std::vector<TensorSpec>(kMessages, TensorSpec{{3}, torch::kFloat}));
    for (int m = 0; m < kMessages; ++m) {
      absl::StatusOr<torch::Tensor> t = receiver.Take();
      if (!t.ok()) {
        received = t.status();
        break;
      }
      got.push_back(t->index({0}).item<float>());
    }
    if (received.ok()) received = receiver.Join();
    torch::Tensor last = torch::empty({2});
    blocking = RecvBlocking(link[1], last, 0, 0, milliseconds(10000));
    if (blocking.ok()) got.push_back(last.index({1}).item<float>());
  });
  stage0.join();
  stage1.join();
  EXPECT_THAT(sent, IsOk());
  EXPECT_THAT(received, IsOk());
  EXPECT_THAT(blocking, IsOk());
  std::vector<float> want;
  for (int m = 0; m < kMessages; ++m) want.push_back(static_cast<float>(m));
  want.push_back(7.0f);
  EXPECT_EQ(got, want);
  EXPECT_EQ(logs[0]->waits_off_compute.load(), 0) << "the sender's thread waited on the stream";
  EXPECT_EQ(logs[1]->waits_off_compute.load(), 0) << "the receiver's thread waited on the stream";
}

}  // namespace
}  // namespace varuna
