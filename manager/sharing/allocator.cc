#include "manager/sharing/allocator.h"

#include <algorithm>
#include <climits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace varuna {

// Note [Allocation]: every decision starts from nothing and gives slots in two rounds.
//  0. A running job that cannot bend (a fixed job without morphing or checkpoint.dir) keeps
//     what it holds: it is never resized or evicted.
//  1. Minimums, highest class first. Within a class, running jobs keep their minimum (their
//     width when pinned by min_interval_s or, without fair sharing, always), oldest first;
//     then pending jobs start at their minimum, evicted ones first, then the user furthest
//     below its weighted share, then the oldest. A lower class's running jobs are treated
//     after every higher class's pending jobs: that is how a higher class shrinks them toward
//     their minimum and then evicts them, youngest first. A user over quota, or a job whose
//     minimum does not fit, waits with the reason. A pending job that has waited starvation_s
//     (an evicted one: since its eviction) holds back every later start of its class and
//     below, and their growth, so freed slots gather for it.
//  2. Growth, highest class first, with what is left. Fair: one step at a time to the user
//     furthest below its weighted share (slots in this class over its weight), to that user's
//     job that gains the most speed-up per slot on its throughput curve (the planner's
//     simulation), within max and quota. A running job grows only when the gain, over
//     min_interval_s, is worth a morph (morph_cost_s). Queue: pending jobs in submission order
//     take up to their maximum; running ones keep their width.
// Higher-class growth never evicts a lower class's minimum; only a higher class's minimum does.

const UserShare& AllocPolicy::ShareOf(const std::string& user) const {
  auto it = users.find(user);
  return it == users.end() ? default_user : it->second;
}

double RateAt(const AllocJob& job, int w) {
  if (w <= 0) return 0;
  const int n = static_cast<int>(job.rate.size());
  if (w < n) return job.rate[w];  // 0: no shape runs on so few slots
  if (n >= 2 && job.rate[n - 1] > 0) return job.rate[n - 1] / (n - 1) * w;  // linear beyond
  return w;
}

namespace {

std::string Who(const std::string& user) {
  return user.empty() ? "the cluster's user" : absl::StrCat("user '", user, "'");
}

class Allocation {
 public:
  Allocation(const std::vector<AllocJob>& jobs, int capacity, const AllocPolicy& p)
      : jobs_(jobs), capacity_(capacity), remaining_(capacity), p_(p) {
    for (const AllocJob& j : jobs) d_.target[j.id] = 0;
  }

  AllocDecision Run() {
    for (const AllocJob& j : jobs_) {
      if (j.running && !j.bendable) Give(j, j.current);
    }
    const int classes = static_cast<int>(p_.classes.size());
    for (int c = 0; c < classes; ++c) Minimums(c);
    for (int c = 0; c < classes && c < blocked_class_; ++c) Growth(c);
    if (p_.fair) KeepWorthlessGrows();
    for (const std::string& id : waiting_) d_.queue.push_back(id);
    d_.user_slots = user_total_;
    return std::move(d_);
  }

 private:
  int MaxOf(const AllocJob& j) const { return j.max > 0 ? std::min(j.max, capacity_) : capacity_; }

  void Give(const AllocJob& j, int n) {
    d_.target[j.id] += n;
    remaining_ -= n;
    user_total_[j.user] += n;
    user_class_[{j.class_rank, j.user}] += n;
  }

  double Share(int c, const std::string& user) const {
    auto it = user_class_.find({c, user});
    const double w = std::max(1e-9, p_.ShareOf(user).weight);
    return (it == user_class_.end() ? 0 : it->second) / w;
  }

  bool OverQuota(const AllocJob& j, int more) const {
    const int q = p_.ShareOf(j.user).quota_slots;
    auto it = user_total_.find(j.user);
    return q > 0 && (it == user_total_.end() ? 0 : it->second) + more > q;
  }

  void Minimums(int c) {
    std::vector<const AllocJob*> running, pending;
    for (const AllocJob& j : jobs_) {
      if (j.class_rank != c) continue;
      if (j.running && j.bendable) running.push_back(&j);
      if (!j.running) pending.push_back(&j);
    }
    std::sort(running.begin(), running.end(),
              [](const AllocJob* a, const AllocJob* b) { return a->seq < b->seq; });
    const std::string& name = p_.classes[c];
    for (const AllocJob* j : running) {
      const int keep = std::clamp(j->pinned || !p_.fair ? j->current : j->min, j->min,
                                  std::max(j->min, MaxOf(*j)));
      if (keep <= remaining_) {
        Give(*j, keep);
      } else if (j->min <= remaining_) {
        d_.why[j->id] =
            absl::StrCat("shrunk to ", remaining_, " slots: jobs of a higher class than '", name,
                         "' need the rest");
        Give(*j, remaining_);
      } else {
        d_.why[j->id] =
            absl::StrCat("evicted: jobs of a higher class than '", name, "' need its slots (",
                         remaining_, " left for it, its minimum is ", j->min, ")");
      }
    }
    // Pending jobs, one pick at a time: evicted first, then a starving one, then the user
    // furthest below its share, then the oldest.
    auto before = [&](const AllocJob* a, const AllocJob* b) {
      if (a->evicted != b->evicted) return a->evicted;
      const bool sa = a->waiting_s >= p_.starvation_s, sb = b->waiting_s >= p_.starvation_s;
      if (sa != sb) return sa;
      if (p_.fair) {
        const double fa = Share(c, a->user), fb = Share(c, b->user);
        if (fa != fb) return fa < fb;
      }
      return a->seq < b->seq;
    };
    while (!pending.empty()) {
      auto next = std::min_element(pending.begin(), pending.end(), before);
      const AllocJob& j = **next;
      pending.erase(next);
      if (c >= blocked_class_) {
        d_.why[j.id] = absl::StrCat("held back for job ", blocker_, " (waiting longer than ",
                                    static_cast<int64_t>(p_.starvation_s), " s)");
        waiting_.push_back(j.id);
        continue;
      }
      if (OverQuota(j, j.min)) {
        d_.why[j.id] =
            absl::StrCat(Who(j.user), " is at its quota (", user_total_[j.user], " of ",
                         p_.ShareOf(j.user).quota_slots, " slots; this job needs ", j.min, ")");
        waiting_.push_back(j.id);
        continue;
      }
      if (j.min <= remaining_) {
        Give(j, j.min);
        d_.queue.push_back(j.id);
        continue;
      }
      d_.why[j.id] =
          absl::StrCat("needs ", j.min, " slots (its minimum); ", std::max(0, remaining_), " of ",
                       capacity_, " are left for class '", name, "'");
      waiting_.push_back(j.id);
      if (j.waiting_s >= p_.starvation_s && blocked_class_ == INT_MAX) {
        blocked_class_ = c;
        blocker_ = j.id;
      }
    }
  }

  // The next width above `w` that is faster, and the speed-up per slot of the step to it
  // (0 when none is): flat stretches of a curve (shapes that need more slots) are crossed
  // in one step.
  std::pair<int, double> NextStep(const AllocJob& j, int w, double base) const {
    if (base <= 0) return {w, 0};
    const double now = RateAt(j, w);
    const int top = std::min(MaxOf(j), w + remaining_);
    for (int n = w + 1; n <= top; ++n) {
      const double r = RateAt(j, n);
      if (r > now * (1 + 1e-9)) return {n, (r - now) / base / (n - w)};
    }
    return {w, 0};
  }

  bool Growable(const AllocJob& j) const {
    return d_.target.at(j.id) > 0 && (!j.running || (j.bendable && !j.pinned && p_.fair));
  }

  void Growth(int c) {
    if (!p_.fair) {
      std::vector<const AllocJob*> order;
      for (const AllocJob& j : jobs_) {
        if (j.class_rank == c && !j.running && d_.target.at(j.id) > 0) order.push_back(&j);
      }
      std::sort(order.begin(), order.end(),
                [](const AllocJob* a, const AllocJob* b) { return a->seq < b->seq; });
      for (const AllocJob* j : order) {
        int more = std::min(MaxOf(*j) - d_.target.at(j->id), remaining_);
        const int q = p_.ShareOf(j->user).quota_slots;
        if (q > 0) more = std::min(more, q - user_total_[j->user]);
        if (more > 0) Give(*j, more);
      }
      return;
    }
    struct Open {
      const AllocJob* job;
      double base;      // speed-ups are relative to its slowest width that runs
      int to = -1;      // its next step (cached; -1: to be found)
      double gain = 0;  // speed-up per slot of that step
    };
    std::vector<Open> open;
    for (const AllocJob& j : jobs_) {
      if (j.class_rank != c || !Growable(j)) continue;
      double base = 0;
      for (int n = std::max(1, j.min); base <= 0 && n <= MaxOf(j); ++n) base = RateAt(j, n);
      open.push_back({&j, base});
    }
    while (remaining_ > 0 && !open.empty()) {
      // The user furthest below its share, then that user's best step.
      Open* pick = nullptr;
      double pick_share = 0;
      for (auto it = open.begin(); it != open.end();) {
        const AllocJob& j = *it->job;
        const int w = d_.target.at(j.id);
        if (it->to < 0 || it->to > w + remaining_) {
          std::tie(it->to, it->gain) = NextStep(j, w, it->base);
        }
        if (it->gain <= 0 || OverQuota(j, it->to - w)) {
          it = open.erase(it);  // nothing more it could use (or may have) this decision
          continue;
        }
        const double share = Share(c, j.user);
        if (pick == nullptr || share < pick_share ||
            (share == pick_share &&
             (it->gain > pick->gain || (it->gain == pick->gain && j.seq < pick->job->seq)))) {
          pick = &*it, pick_share = share;
        }
        ++it;
      }
      if (pick == nullptr) break;
      Give(*pick->job, pick->to - d_.target.at(pick->job->id));
      pick->to = -1;
    }
  }

  // A running job grows only when the speed-up, over min_interval_s, pays for the morph.
  void KeepWorthlessGrows() {
    for (const AllocJob& j : jobs_) {
      const int t = d_.target.at(j.id);
      if (!j.running || t <= j.current || j.current <= 0) continue;
      const double now = RateAt(j, j.current);
      if (now <= 0) continue;  // a width the curve has no shape for: any that runs is better
      const double gain = (RateAt(j, t) - now) / now;
      if (gain * p_.min_interval_s > p_.morph_cost_s) continue;
      d_.target[j.id] = j.current;
      remaining_ += t - j.current;
      user_total_[j.user] -= t - j.current;
      user_class_[{j.class_rank, j.user}] -= t - j.current;
    }
  }

  const std::vector<AllocJob>& jobs_;
  const int capacity_;
  int remaining_;
  const AllocPolicy& p_;
  AllocDecision d_;
  std::map<std::string, int> user_total_;
  std::map<std::pair<int, std::string>, int> user_class_;
  std::vector<std::string> waiting_;  // pending jobs that wait, in the order considered
  int blocked_class_ = INT_MAX;       // a starving job's class: no starts from it down
  std::string blocker_;
};

}  // namespace

AllocDecision Allocate(const std::vector<AllocJob>& jobs, int capacity, const AllocPolicy& policy) {
  return Allocation(jobs, std::max(0, capacity), policy).Run();
}

}  // namespace varuna
