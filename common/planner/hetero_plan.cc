#include "common/planner/hetero_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/pipeline/partition.h"

namespace varuna {
namespace {

// A cut's score: the busiest stage's work, then the total work.
struct Score {
  double bottleneck = std::numeric_limits<double>::infinity();
  double total = std::numeric_limits<double>::infinity();
};

bool Better(const Score& a, const Score& b) {
  if (std::isinf(b.bottleneck)) return !std::isinf(a.bottleneck);  // unset
  if (std::isinf(a.bottleneck)) return false;
  const double tol = 1e-12 * std::max({std::abs(a.bottleneck), std::abs(b.bottleneck), 1e-300});
  if (std::abs(a.bottleneck - b.bottleneck) > tol) return a.bottleneck < b.bottleneck;
  const double ttol = 1e-12 * std::max({std::abs(a.total), std::abs(b.total), 1e-300});
  return a.total < b.total - ttol;
}

Score Extend(const Score& s, double stage) {
  return {std::max(s.bottleneck, stage), s.total + stage};
}

}  // namespace

std::vector<std::vector<int>> PipelineTemplates(const std::vector<double>& work,
                                                const std::vector<double>& last_work,
                                                int max_stages) {
  const int S = static_cast<int>(work.size());
  const int K = std::min(max_stages, S);
  std::vector<std::vector<int>> out;
  if (K < 1) return out;
  std::vector<double> W(S + 1, 0), L(S + 1, 0);  // prefix sums
  for (int g = 0; g < S; ++g) {
    W[g + 1] = W[g] + work[g];
    L[g + 1] = L[g] + last_work[g];
  }
  // best[k][j], arg[k][j]: segments [0, j) in k non-last stages (k = 1 .. K-1); the last
  // stage of that prefix starts at arg.
  std::vector<std::vector<Score>> best(K);
  std::vector<std::vector<int>> arg(K);
  for (int k = 1; k < K; ++k) {
    best[k].assign(S + 1, Score{});
    arg[k].assign(S + 1, -1);
    for (int j = k; j < S; ++j) {  // the last stage needs a segment of its own
      if (k == 1) {
        best[k][j] = {W[j], W[j]};
        arg[k][j] = 0;
        continue;
      }
      for (int i = k - 1; i < j; ++i) {
        const Score cand = Extend(best[k - 1][i], W[j] - W[i]);
        if (Better(cand, best[k][j])) {
          best[k][j] = cand;
          arg[k][j] = i;
        }
      }
    }
  }
  for (int n = 1; n <= K; ++n) {
    int last_start = 0;
    if (n > 1) {
      Score top;
      for (int i = n - 1; i < S; ++i) {
        const Score cand = Extend(best[n - 1][i], L[S] - L[i]);
        if (Better(cand, top)) {
          top = cand;
          last_start = i;
        }
      }
    }
    std::vector<int> bounds(n + 1);
    bounds[n] = S;
    bounds[n - 1] = last_start;
    for (int k = n - 1, j = last_start; k >= 1; --k) {
      j = arg[k][j];
      bounds[k - 1] = j;
    }
    out.push_back(std::move(bounds));
  }
  return out;
}

// Note [Fast partition] in common/planner/autoconfig.cc.
absl::StatusOr<std::vector<int>> SplitByBisection(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  if (stages < 1 || stages > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot split ", n, " segments into ", stages, " stages"));
  }
  double lo = 0, hi = 0;
  for (double c : costs) {
    lo = std::max(lo, c);
    hi += c;
  }
  auto needed = [&](double cap) {
    int count = 1;
    double cur = 0;
    for (double c : costs) {
      if (cur + c > cap && cur > 0) {
        ++count;
        cur = 0;
      }
      cur += c;
    }
    return count;
  };
  for (int i = 0; i < 100 && hi - lo > 1e-12 * std::max(1.0, hi); ++i) {
    const double mid = (lo + hi) / 2;
    (needed(mid) <= stages ? hi : lo) = mid;
  }
  std::vector<int> bounds = {0};
  double cur = 0;
  for (int i = 0; i < n; ++i) {
    const int open = static_cast<int>(bounds.size());  // stages started, the current included
    const bool nonempty = i > bounds.back();
    if (nonempty && (cur + costs[i] > hi || n - i == stages - open)) {
      bounds.push_back(i);
      cur = 0;
    }
    cur += costs[i];
  }
  bounds.push_back(n);
  if (static_cast<int>(bounds.size()) != stages + 1) {
    // Cannot happen (needed(hi) <= stages); the exact split as a fallback.
    return PartitionByCost(costs, stages);
  }
  return bounds;
}

int64_t EnumerateMixes(const std::vector<int>& depths, int slots, const MixLimits& limits,
                       const std::function<bool(const Mix& partial, int free_slots)>& prune,
                       const std::function<bool(const Mix& mix)>& visit) {
  std::vector<int> d = depths;
  std::sort(d.begin(), d.end(), std::greater<int>());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  while (!d.empty() && d.back() < 1) d.pop_back();
  int64_t visits = 0;
  bool stop = false;
  Mix mix;
  // Adds parts of depths d[from..] to `mix`, `free` slots left and `pipes` pipelines so far.
  std::function<void(size_t, int, int64_t)> grow = [&](size_t from, int free, int64_t pipes) {
    for (size_t i = from; i < d.size() && !stop; ++i) {
      const int depth = d[i];
      if (depth > free) continue;
      for (int c = 1; c * depth <= free && !stop; ++c) {
        if (pipes + c > limits.max_pipelines) break;
        if (++visits > limits.max_visits) {
          stop = true;
          break;
        }
        mix.push_back({depth, c});
        const int left = free - c * depth;
        if (left == 0) {
          if (mix.size() >= 2 && !visit(mix)) stop = true;
        } else if (static_cast<int>(mix.size()) < limits.max_distinct &&
                   !(prune && prune(mix, left))) {
          grow(i + 1, left, pipes + c);
        }
        mix.pop_back();
      }
    }
  };
  if (slots > 0) grow(0, slots, 0);
  return visits;
}

namespace {

double Slope(const LinearTime& t) { return std::max(t.per_mb_s, 1e-300); }

}  // namespace

double WaterLevel(const Mix& mix, const std::vector<LinearTime>& times, double total) {
  const size_t k = mix.size();
  std::vector<bool> held(k, false);  // held at one micro-batch
  double z = 0;
  for (size_t round = 0; round <= k; ++round) {
    double fixed = 0, num = 0, den = 0;
    for (size_t t = 0; t < k; ++t) {
      if (held[t]) {
        fixed += mix[t].count;
      } else {
        num += mix[t].count * times[t].fill_s / Slope(times[t]);
        den += mix[t].count / Slope(times[t]);
      }
    }
    z = den > 0 ? (total - fixed + num) / den : 0;
    bool changed = false;
    for (size_t t = 0; t < k; ++t) {
      if (!held[t] && (den == 0 || (z - times[t].fill_s) / Slope(times[t]) < 1)) {
        held[t] = true;
        changed = true;
      }
    }
    if (!changed) break;
  }
  for (size_t t = 0; t < k; ++t) {
    if (held[t]) z = std::max(z, times[t].At(1));
  }
  return z;
}

std::vector<int64_t> SplitBatch(const Mix& mix, const std::vector<LinearTime>& times,
                                int64_t total) {
  const size_t k = mix.size();
  if (k == 0) return {};
  const double z = WaterLevel(mix, times, static_cast<double>(total));
  int64_t window = 2;
  int64_t min_rest = 0;  // micro-batches the parts need at least
  for (const MixPart& p : mix) {
    window = std::max<int64_t>(window, p.count + 2);
    min_rest += p.count;
  }
  window = std::min<int64_t>(window, 64);
  std::vector<int64_t> cur(k), best;
  double best_time = std::numeric_limits<double>::infinity();
  // Part t onwards share `left` micro-batches; `need` is what parts t.. need at least.
  std::function<void(size_t, int64_t, int64_t, double)> search = [&](size_t t, int64_t left,
                                                                     int64_t need, double worst) {
    if (worst >= best_time) return;
    const int64_t count = mix[t].count;
    if (t + 1 == k) {
      if (left % count != 0 || left / count < 1) return;
      cur[t] = left / count;
      const double w = std::max(worst, times[t].At(static_cast<double>(cur[t])));
      if (w < best_time) {
        best_time = w;
        best = cur;
      }
      return;
    }
    const double ideal = std::max(1.0, (z - times[t].fill_s) / Slope(times[t]));
    const int64_t centre = static_cast<int64_t>(std::floor(ideal));
    const int64_t rest_need = need - count;
    const int64_t hi = std::min(centre + window + 1, (left - rest_need) / count);
    for (int64_t b = std::max<int64_t>(1, centre - window); b <= hi; ++b) {
      cur[t] = b;
      search(t + 1, left - b * count, rest_need,
             std::max(worst, times[t].At(static_cast<double>(b))));
    }
  };
  if (total >= min_rest) search(0, total, min_rest, 0.0);
  return best;
}

}  // namespace varuna
