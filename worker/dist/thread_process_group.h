#pragma once

// Ranks as threads of one process (Note [Process groups]): a ProcessGroupFactory whose groups
// pass tensors through shared memory, so the engine runs P x D "ranks" inside a unit test.
//
//   auto world = std::make_shared<ThreadWorld>();
//   // on thread r, for every rank r of the topology:
//   ThreadFactory f(world);
//   auto groups = CreateGroups(f, topology, r, has_tied, timeout);
//
// Sums are taken in member order, so results are deterministic. A rank that stops taking
// part (a "dead peer") makes its peers' waits fail with "timed out" after their timeout, or
// at once after ThreadWorld::Kill.

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "worker/dist/process_group.h"

namespace varuna {

class ThreadWorld {
 public:
  // Makes every pending and future wait fail with "peer killed" (a dead machine).
  void Kill();

 private:
  friend class ThreadGroup;
  friend class ThreadRecvWork;
  friend class ThreadReduceWork;
  struct Reduction {
    std::vector<torch::Tensor> parts;  // by member index
    int posted = 0, taken = 0;
    torch::Tensor sum;
  };
  // (group, src, dst, tag) -> sequence -> message
  using Channel = std::tuple<std::string, int, int, int>;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Channel, std::map<int64_t, torch::Tensor>> mail_;
  std::map<std::pair<std::string, int64_t>, Reduction> reductions_;
  bool killed_ = false;
};

class ThreadFactory : public ProcessGroupFactory {
 public:
  explicit ThreadFactory(std::shared_ptr<ThreadWorld> world) : world_(std::move(world)) {}
  Backend backend() const override { return Backend::kThreads; }
  absl::StatusOr<ProcessGroupPtr> Create(const std::string& name, const std::vector<int>& members,
                                         int rank) override;

 private:
  std::shared_ptr<ThreadWorld> world_;
};

}  // namespace varuna
