#pragma once

// The allocator (docs/operations.md "Sharing a cluster"): how many slots each job of a shared
// cluster should hold, decided for all of them together. A pure function of its inputs: no
// clock, no tables, no planner; the sharing controller (sharing_controller.h) feeds it and
// applies what it decides. Note [Allocation] in allocator.cc gives the rules.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace varuna {

// One job as the allocator sees it.
struct AllocJob {
  std::string id;
  std::string user;      // the token name ("" without tokens)
  int class_rank = 0;    // index into AllocPolicy::classes: 0 is the highest
  bool running = false;  // it holds slots now (STARTING, RUNNING, RECONFIGURING)
  int current = 0;       // slots it holds now (running) or 0
  int min = 1;           // never fewer (gang); a fixed shape has min == max
  int max = 0;           // never more; 0 = as many as there are
  bool bendable = true;  // may be resized or evicted while running (morphs, has a checkpoint)
  bool pinned = false;   // resized within min_interval_s: kept at `current` if room allows
  bool evicted = false;  // evicted before: first of its class to start again
  double waiting_s = 0;  // pending: how long it has waited (evicted: since its eviction)
  int64_t seq = 0;       // submission order
  // rate[w]: samples per second at w slots (index 0 unused), from the planner's simulation;
  // shorter than w or empty: linear in w beyond what is given.
  std::vector<double> rate;
};

struct UserShare {
  int quota_slots = 0;  // 0 = no quota
  double weight = 1;    // fair-share weight within a class
};

struct AllocPolicy {
  // false: today's queue plus priorities (running jobs keep their width unless a higher
  // class needs their slots; pending jobs, highest class first, each take what they can in
  // submission order). true: fair share and the throughput curves decide every width.
  bool fair = false;
  std::vector<std::string> classes = {"high", "normal", "low"};  // highest first
  UserShare default_user;
  std::map<std::string, UserShare> users;
  double starvation_s = 600;  // a pending job waiting this long holds back the jobs behind it
  // A grow must gain more than its morph costs: the relative speed-up times min_interval_s
  // must exceed morph_cost_s.
  double min_interval_s = 60;
  double morph_cost_s = 2;
  const UserShare& ShareOf(const std::string& user) const;
};

struct AllocDecision {
  std::map<std::string, int> target;       // every job: the slots it should hold (0: none)
  std::map<std::string, std::string> why;  // a job that waits or is shrunk or evicted: why
  std::vector<std::string> queue;          // pending jobs, in the order they will start
  std::map<std::string, int> user_slots;   // slots allocated to each user
};

AllocDecision Allocate(const std::vector<AllocJob>& jobs, int capacity, const AllocPolicy& policy);

// The rate a job gets at `w` slots (AllocJob::rate, linear beyond what it gives).
double RateAt(const AllocJob& job, int w);

}  // namespace varuna
