// Gloo process groups over loopback in one process: retired generations are destroyed once
// nothing runs on them (Note [Retired groups] in worker/engine/regroup.cc), and a collective
// still in flight keeps its generation until it ends.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"
#include "worker/dist/process_group.h"
#include "worker/dist/read_back.h"
#include "worker/engine/regroup.h"

namespace varuna {
namespace {

using ::varuna::testing::IsOk;

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t n = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  close(fd);
  return ntohs(a.sin_port);
}

WorkerTopology Topo(int rank, int port) {
  WorkerTopology t;
  t.rank = rank;
  t.world_size = 2;
  t.topology = *Topology::Uniform(2, 1, 4);
  t.master_port = port;
  return t;
}

// Both ranks' groups of one generation, made on two threads (creation is collective).
std::vector<ProcessGroups> Generation(std::chrono::milliseconds timeout) {
  const int port = FreePort();
  std::vector<absl::StatusOr<ProcessGroups>> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] { got[r] = CreateProcessGroups(Topo(r, port), false, timeout); });
  }
  for (auto& t : threads) t.join();
  std::vector<ProcessGroups> out;
  for (auto& g : got) {
    EXPECT_THAT(g.status(), IsOk());
    if (g.ok()) out.push_back(*std::move(g));
  }
  return out;
}

TEST(RetiredGroupsTest, TwentyGenerationsLeaveNoneAlive) {
  const std::chrono::milliseconds timeout(10000);
  for (int gen = 0; gen < 20; ++gen) {
    std::vector<ProcessGroups> g = Generation(timeout);
    ASSERT_EQ(g.size(), 2u);
    // On gloo the hand-over's host bytes take the world group itself (a gloo group of its own
    // beside NCCL).
    EXPECT_EQ(g[0].control, g[0].world);
    // Traffic on every kind of group: the world's all-reduce, a pipeline link.
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        torch::Tensor t = torch::ones({4});
        g[r].world->AllReduceSum(t, timeout)->Wait(timeout);
        EXPECT_EQ(t[0].item<float>(), 2);
        torch::Tensor m = torch::full({3}, 7.0);
        if (r == 0) {
          g[r].links.act_out->Send(m, 1, 0)->Wait(timeout);
        } else {
          torch::Tensor in = torch::zeros({3});
          g[r].links.act_in->Recv(in, 0, 0)->Wait(timeout);
          EXPECT_EQ(in[2].item<float>(), 7);
        }
      });
    }
    for (auto& t : threads) t.join();
    RetireGroups(std::move(g[0]));
    RetireGroups(std::move(g[1]));
    EXPECT_EQ(RetiredGroupsAlive(), 0) << "generation " << gen;
  }
}

TEST(RetiredGroupsTest, ACollectiveInFlightKeepsItsGenerationUntilItEnds) {
  const std::chrono::milliseconds timeout(1500);
  std::vector<ProcessGroups> g = Generation(timeout);
  ASSERT_EQ(g.size(), 2u);
  // Rank 0 posts an all-reduce rank 1 never joins (a frozen peer), and is retired.
  torch::Tensor t = torch::ones({4});
  WorkPtr stuck = g[0].world->AllReduceSum(t, timeout);
  RetireGroups(std::move(g[0]));
  EXPECT_EQ(RetiredGroupsAlive(), 1);
  stuck.reset();  // the waiter gave up; the group still holds the work until it ends
  EXPECT_EQ(RetiredGroupsAlive(), 1);
  // It ends on its own timeout (or when its peer goes); then the generation is destroyed.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (RetiredGroupsAlive() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(RetiredGroupsAlive(), 0);
  RetireGroups(std::move(g[1]));
  EXPECT_EQ(RetiredGroupsAlive(), 0);
}

// Note [NCCL waits] (worker/dist/read_back.cc): the host meets the device only where it reads
// a result, polling with the job's timeout; on expiry the generation's works are aborted (an
// NCCL communicator's kernels with them), and a regroup's abort ends the poll at once.
v1::ReconfigureCommand Reconfigure(int generation) {
  v1::ReconfigureCommand r;
  r.set_generation(generation);
  return r;
}

// A second failure while a morph in place hands over: the agent's reconfigure to generation 3
// arrives after the worker took 2's, before 2 is done. It must stay posted and cut 2's groups
// short, or the worker trains on with peers that moved on and waits out the timeout.
TEST(RegroupMailboxTest, AReconfigureForALaterGenerationSurvivesTheHandOver) {
  RegroupMailbox mb;
  mb.Start(/*in_place=*/true, 1);
  auto gen1 = std::make_shared<AbortSignal>();
  mb.SetCurrentAbort(gen1);
  mb.Post(Reconfigure(2));
  EXPECT_TRUE(gen1->aborted());
  // The hand-over into 2 runs; meanwhile 3 is posted (it aborts 2's predecessor's signal).
  auto gen2 = std::make_shared<AbortSignal>();
  mb.Post(Reconfigure(3));
  mb.SetCurrentAbort(gen2);
  EXPECT_FALSE(gen2->aborted());
  mb.Done(2);
  EXPECT_EQ(mb.generation(), 2);
  ASSERT_TRUE(mb.Pending()) << "the reconfigure to generation 3 was lost";
  std::atomic<bool> give_up{false};
  EXPECT_EQ(mb.Wait(1.0, give_up)->generation(), 3);
  EXPECT_TRUE(gen2->aborted()) << "generation 2's groups must fail their first wait";
  // The ordinary case: nothing newer, nothing posted, nothing aborted.
  auto gen3 = std::make_shared<AbortSignal>();
  mb.SetCurrentAbort(gen3);
  mb.Done(3);
  EXPECT_FALSE(mb.Pending());
  EXPECT_FALSE(gen3->aborted());
  mb.Post(Reconfigure(3));  // stale: ignored
  EXPECT_FALSE(mb.Pending());
}

TEST(WaitPollingTest, ReturnsOnceDoneAndNamesATimeoutAfterAbortingTheGroups) {
  auto abort = std::make_shared<AbortSignal>();
  int polls = 0;
  WaitPolling([&] { return ++polls >= 5; }, abort.get(), std::chrono::seconds(5), "a read");
  EXPECT_EQ(polls, 5);
  EXPECT_FALSE(abort->aborted());

  const auto t0 = std::chrono::steady_clock::now();
  try {
    WaitPolling([] { return false; }, abort.get(), std::chrono::milliseconds(100), "a read");
    ADD_FAILURE() << "a poll that never ends returned";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("a read: timed out after 100 ms"));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.1);
  EXPECT_LT(s, 2.0);
  EXPECT_TRUE(abort->aborted()) << "the groups were not aborted on expiry";

  // Aborted (a regroup): the next poll ends at once, whatever the timeout.
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_THROW(
      {
        try {
          WaitPolling([] { return false; }, abort.get(), std::chrono::minutes(5), "a read");
        } catch (const std::runtime_error& e) {
          EXPECT_THAT(e.what(), ::testing::HasSubstr("regrouping"));
          throw;
        }
      },
      std::runtime_error);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 1.0);
  // A host tensor is read as it is.
  const torch::Tensor t = torch::arange(3);
  EXPECT_TRUE(ReadBack(t, abort.get(), std::chrono::seconds(1)).equal(t));
}

}  // namespace
}  // namespace varuna
