#include "common/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

constexpr SchedulePolicy kPolicies[] = {SchedulePolicy::kVaruna, SchedulePolicy::kGPipe,
                                        SchedulePolicy::k1F1B, SchedulePolicy::kZbH1};

std::string Schedule(SchedulePolicy policy, int stages, int micro_batches, int stage) {
  return FormatSchedule(MakeSchedule(policy, stages, micro_batches, stage));
}

TEST(SchedulePolicyTest, ParseAndName) {
  for (SchedulePolicy p : kPolicies) {
    absl::StatusOr<SchedulePolicy> parsed = ParseSchedulePolicy(SchedulePolicyName(p));
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_EQ(SchedulePolicyName(SchedulePolicy::kVaruna), "varuna");
  EXPECT_EQ(SchedulePolicyName(SchedulePolicy::kGPipe), "gpipe");
  EXPECT_EQ(SchedulePolicyName(SchedulePolicy::k1F1B), "1f1b");
  EXPECT_EQ(SchedulePolicyName(SchedulePolicy::kZbH1), "zb-h1");
  EXPECT_THAT(ParseSchedulePolicy("pipedream"),
              StatusIs(absl::StatusCode::kInvalidArgument, "\"pipedream\""));
  EXPECT_THAT(ParseSchedulePolicy(""),
              StatusIs(absl::StatusCode::kInvalidArgument, "varuna, gpipe, 1f1b, zb-h1"));
}

TEST(FormatScheduleTest, Formats) {
  EXPECT_EQ(FormatSchedule({}), "");
  EXPECT_EQ(FormatSchedule({{TaskKind::kForward, 0},
                            {TaskKind::kForward, 1},
                            {TaskKind::kRecompute, 0},
                            {TaskKind::kBackward, 0}}),
            "F0 F1 R0 B0");
}

TEST(VarunaScheduleTest, FourStagesEightMicroBatches) {
  EXPECT_EQ(Schedule(SchedulePolicy::kVaruna, 4, 8, 0),
            "F0 F1 F2 F3 F4 F5 F6 F7 R0 B0 R1 B1 R2 B2 R3 B3 R4 B4 R5 B5 R6 B6 R7 B7");
  EXPECT_EQ(Schedule(SchedulePolicy::kVaruna, 4, 8, 1),
            "F0 F1 F2 F3 F4 F5 R0 B0 R1 B1 R2 B2 F6 F7 R3 B3 R4 B4 R5 B5 R6 B6 R7 B7");
  EXPECT_EQ(Schedule(SchedulePolicy::kVaruna, 4, 8, 2),
            "F0 F1 F2 R0 B0 R1 B1 R2 B2 F3 F4 F5 R3 B3 R4 B4 R5 B5 F6 F7 R6 B6 R7 B7");
  EXPECT_EQ(Schedule(SchedulePolicy::kVaruna, 4, 8, 3),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
}

TEST(VarunaScheduleTest, ThreeStagesSixMicroBatches) {
  EXPECT_EQ(Schedule(SchedulePolicy::kVaruna, 3, 6, 0),
            "F0 F1 F2 F3 F4 F5 R0 B0 R1 B1 R2 B2 R3 B3 R4 B4 R5 B5");
  EXPECT_EQ(Schedule(SchedulePolicy::kVaruna, 3, 6, 1),
            "F0 F1 F2 R0 B0 R1 B1 R2 B2 F3 F4 F5 R3 B3 R4 B4 R5 B5");
  EXPECT_EQ(Schedule(SchedulePolicy::kVaruna, 3, 6, 2), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
}

TEST(VarunaScheduleTest, KeepGraphOnlyOnLastStage) {
  for (int s = 0; s < 4; ++s) {
    for (const Task& t : MakeSchedule(SchedulePolicy::kVaruna, 4, 8, s)) {
      if (t.kind == TaskKind::kForward) {
        EXPECT_EQ(t.keep_graph, s == 3) << "stage " << s;
      }
    }
  }
}

TEST(GPipeScheduleTest, AllForwardsThenAllBackwards) {
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(Schedule(SchedulePolicy::kGPipe, 3, 4, s), "F0 F1 F2 F3 B0 B1 B2 B3");
  }
}

TEST(OneFOneBScheduleTest, WarmupSteadyDrain) {
  EXPECT_EQ(Schedule(SchedulePolicy::k1F1B, 4, 6, 0), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(Schedule(SchedulePolicy::k1F1B, 4, 6, 1), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(Schedule(SchedulePolicy::k1F1B, 4, 6, 3), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than warm-up slots.
  EXPECT_EQ(Schedule(SchedulePolicy::k1F1B, 4, 2, 0), "F0 F1 B0 B1");
}

TEST(ZbH1ScheduleTest, WeightPassesFillTheBubble) {
  // 1F1B's F and B; stage s runs W(m) after B(m + s).
  EXPECT_EQ(Schedule(SchedulePolicy::kZbH1, 2, 4, 0), "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3");
  EXPECT_EQ(Schedule(SchedulePolicy::kZbH1, 2, 4, 1), "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3");
  EXPECT_EQ(Schedule(SchedulePolicy::kZbH1, 3, 4, 2), "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3");
  EXPECT_EQ(Schedule(SchedulePolicy::kZbH1, 1, 2, 0), "F0 B0 W0 F1 B1 W1");
  for (const Task& t : MakeSchedule(SchedulePolicy::kZbH1, 4, 8, 0)) {
    if (t.kind == TaskKind::kForward) EXPECT_TRUE(t.keep_graph);
  }
  EXPECT_TRUE(SplitsBackward(SchedulePolicy::kZbH1));
  EXPECT_FALSE(SplitsBackward(SchedulePolicy::k1F1B));
}

// In flight (forward done, W not done) never exceeds 1F1B's peak over its stages, min(P, M).
TEST(ZbH1ScheduleTest, ActivationMemoryOf1F1B) {
  for (int stages = 1; stages <= 6; ++stages) {
    for (int mbs = 1; mbs <= 12; ++mbs) {
      for (int s = 0; s < stages; ++s) {
        int live = 0, peak = 0, peak_1f1b = 0;
        for (const Task& t : MakeSchedule(SchedulePolicy::kZbH1, stages, mbs, s)) {
          live += t.kind == TaskKind::kForward ? 1 : t.kind == TaskKind::kWeight ? -1 : 0;
          peak = std::max(peak, live);
        }
        live = 0;
        for (const Task& t : MakeSchedule(SchedulePolicy::k1F1B, stages, mbs, s)) {
          live += t.kind == TaskKind::kForward ? 1 : t.kind == TaskKind::kBackward ? -1 : 0;
          peak_1f1b = std::max(peak_1f1b, live);
        }
        EXPECT_LE(peak, std::min(stages, mbs)) << "P=" << stages << " M=" << mbs << " stage " << s;
        if (s == 0) EXPECT_EQ(peak_1f1b, std::min(stages, mbs));
      }
    }
  }
}

TEST(ScheduleTest, SingleStageIsForwardBackwardPairs) {
  for (SchedulePolicy p : kPolicies) {
    if (SplitsBackward(p)) continue;  // F0 B0 W0 ...: ZbH1ScheduleTest
    const std::vector<Task> tasks = MakeSchedule(p, 1, 3, 0);
    EXPECT_EQ(FormatSchedule(tasks), "F0 B0 F1 B1 F2 B2") << SchedulePolicyName(p);
    for (const Task& t : tasks) {
      if (t.kind == TaskKind::kForward) {
        EXPECT_TRUE(t.keep_graph);
      }
    }
  }
}

// The invariants documented in schedule.h, for every policy and shape.
TEST(ScheduleTest, Invariants) {
  for (SchedulePolicy p : kPolicies) {
    for (int stages = 1; stages <= 6; ++stages) {
      for (int mbs = 1; mbs <= 12; ++mbs) {
        for (int s = 0; s < stages; ++s) {
          const std::vector<Task> tasks = MakeSchedule(p, stages, mbs, s);
          SCOPED_TRACE(SchedulePolicyName(p) + " P=" + std::to_string(stages) +
                       " M=" + std::to_string(mbs) + " stage=" + std::to_string(s) + ": " +
                       FormatSchedule(tasks));
          std::vector<int> f_at(mbs, -1), r_at(mbs, -1), b_at(mbs, -1), w_at(mbs, -1);
          std::vector<bool> keep(mbs, false);
          std::map<TaskKind, int> next = {{TaskKind::kForward, 0},
                                          {TaskKind::kRecompute, 0},
                                          {TaskKind::kBackward, 0},
                                          {TaskKind::kWeight, 0}};
          for (int i = 0; i < static_cast<int>(tasks.size()); ++i) {
            const Task& t = tasks[i];
            ASSERT_TRUE(t.micro_batch >= 0 && t.micro_batch < mbs);
            std::vector<int>& at = t.kind == TaskKind::kForward     ? f_at
                                   : t.kind == TaskKind::kRecompute ? r_at
                                   : t.kind == TaskKind::kWeight    ? w_at
                                                                    : b_at;
            ASSERT_EQ(at[t.micro_batch], -1) << "duplicate task " << i;
            at[t.micro_batch] = i;
            if (t.kind == TaskKind::kForward) {
              keep[t.micro_batch] = t.keep_graph;
              // Only Varuna's non-last stages drop the graph.
              EXPECT_EQ(t.keep_graph, p != SchedulePolicy::kVaruna || s == stages - 1);
            }
            // Forwards and backwards in micro-batch order (recomputes too, being tied to them).
            EXPECT_EQ(t.micro_batch, next[t.kind]++) << "task " << i << " out of order";
          }
          for (int m = 0; m < mbs; ++m) {
            ASSERT_NE(f_at[m], -1) << "missing F" << m;
            ASSERT_NE(b_at[m], -1) << "missing B" << m;
            EXPECT_LT(f_at[m], b_at[m]);
            if (SplitsBackward(p)) {
              ASSERT_NE(w_at[m], -1) << "missing W" << m;
              EXPECT_LT(b_at[m], w_at[m]);
            } else {
              EXPECT_EQ(w_at[m], -1) << "W" << m << " without a split backward";
            }
            if (keep[m]) {
              EXPECT_EQ(r_at[m], -1) << "R" << m << " after a graph-keeping forward";
            } else {
              ASSERT_NE(r_at[m], -1) << "missing R" << m;
              EXPECT_LT(f_at[m], r_at[m]);
              EXPECT_LT(r_at[m], b_at[m]);
            }
          }
        }
      }
    }
  }
}

// Executes all stages' lists together, each strictly in order: F(m) on stage i needs F(m) done
// on stage i-1; B(m) on stage i < P-1 needs B(m) done on stage i+1. Everything must finish.
TEST(ScheduleTest, DeadlockFree) {
  for (SchedulePolicy p : kPolicies) {
    for (int stages = 1; stages <= 6; ++stages) {
      for (int mbs = 1; mbs <= 12; ++mbs) {
        SCOPED_TRACE(SchedulePolicyName(p) + " P=" + std::to_string(stages) +
                     " M=" + std::to_string(mbs));
        std::vector<std::vector<Task>> lists;
        for (int s = 0; s < stages; ++s) lists.push_back(MakeSchedule(p, stages, mbs, s));
        std::vector<size_t> pc(stages, 0);
        std::vector<std::vector<bool>> f_done(stages, std::vector<bool>(mbs, false));
        std::vector<std::vector<bool>> b_done = f_done;
        for (bool progress = true; progress;) {
          progress = false;
          for (int s = 0; s < stages; ++s) {
            if (pc[s] == lists[s].size()) continue;
            const Task& t = lists[s][pc[s]];
            const int m = t.micro_batch;
            if (t.kind == TaskKind::kForward && s > 0 && !f_done[s - 1][m]) continue;
            if (t.kind == TaskKind::kBackward && s < stages - 1 && !b_done[s + 1][m]) continue;
            if (t.kind == TaskKind::kForward) f_done[s][m] = true;
            if (t.kind == TaskKind::kBackward) b_done[s][m] = true;
            ++pc[s];
            progress = true;
          }
        }
        for (int s = 0; s < stages; ++s) {
          EXPECT_EQ(pc[s], lists[s].size())
              << "stage " << s << " stuck at task " << pc[s] << " of " << FormatSchedule(lists[s]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace varuna
