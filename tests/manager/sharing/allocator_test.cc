// The allocator as a pure decision (Note [Allocation] in manager/sharing/allocator.cc): table
// tests of classes, quotas, fair share, minimums, hysteresis, starvation and curves.

#include "manager/sharing/allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "manager/sharing/sharing_options.h"

namespace varuna {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

AllocJob Job(const std::string& id, const std::string& user, int class_rank, int min, int max,
             int64_t seq) {
  AllocJob j;
  j.id = id;
  j.user = user;
  j.class_rank = class_rank;
  j.min = min;
  j.max = max;
  j.seq = seq;
  return j;
}

AllocJob Running(AllocJob j, int current) {
  j.running = true;
  j.current = current;
  return j;
}

// A curve with diminishing returns: rate(w) = w / (1 + 0.1 (w - 1)).
std::vector<double> Concave(int n) {
  std::vector<double> r(n + 1, 0);
  for (int w = 1; w <= n; ++w) r[w] = w / (1 + 0.1 * (w - 1));
  return r;
}

AllocPolicy Fair() {
  AllocPolicy p;
  p.fair = true;
  return p;
}

TEST(AllocatorTest, HigherClassShrinksLowerToItsMinimumThenStarts) {
  // Alice's low elastic job holds all 6; Bob's high job needs 4.
  const std::vector<AllocJob> jobs = {Running(Job("a", "alice", 2, 2, 6, 1), 6),
                                      Job("b", "bob", 0, 4, 4, 2)};
  const AllocDecision d = Allocate(jobs, 6, Fair());
  EXPECT_EQ(d.target.at("b"), 4);
  EXPECT_EQ(d.target.at("a"), 2);
  EXPECT_THAT(d.queue, ElementsAre("b"));
  EXPECT_EQ(d.user_slots.at("alice"), 2);
}

TEST(AllocatorTest, LowerClassGrowsBackWhenTheHigherJobEnds) {
  const std::vector<AllocJob> jobs = {Running(Job("a", "alice", 2, 2, 6, 1), 2)};
  EXPECT_EQ(Allocate(jobs, 6, Fair()).target.at("a"), 6);
}

TEST(AllocatorTest, EvictsTheYoungestLowerJobWhenMinimumsDoNotFit) {
  const std::vector<AllocJob> jobs = {Running(Job("old", "alice", 2, 3, 3, 1), 3),
                                      Running(Job("young", "carol", 2, 3, 6, 2), 3),
                                      Job("b", "bob", 0, 3, 3, 3)};
  const AllocDecision d = Allocate(jobs, 6, Fair());
  EXPECT_EQ(d.target.at("b"), 3);
  EXPECT_EQ(d.target.at("old"), 3);
  EXPECT_EQ(d.target.at("young"), 0);
  EXPECT_THAT(d.why.at("young"), HasSubstr("evicted"));
}

TEST(AllocatorTest, NeverMovesAJobThatCannotBend) {
  AllocJob fixed = Running(Job("f", "alice", 2, 4, 4, 1), 4);
  fixed.bendable = false;
  const AllocDecision d = Allocate({fixed, Job("b", "bob", 0, 4, 4, 2)}, 6, Fair());
  EXPECT_EQ(d.target.at("f"), 4);
  EXPECT_EQ(d.target.at("b"), 0);
  EXPECT_THAT(d.why.at("b"), HasSubstr("needs 4 slots"));
}

TEST(AllocatorTest, EqualUsersConvergeToAnEqualSplit) {
  AllocJob a = Running(Job("a", "alice", 1, 1, 0, 1), 8);
  AllocJob b = Job("b", "bob", 1, 1, 0, 2);
  a.rate = b.rate = Concave(8);
  const AllocDecision d = Allocate({a, b}, 8, Fair());
  EXPECT_EQ(d.target.at("a"), 4);
  EXPECT_EQ(d.target.at("b"), 4);
}

TEST(AllocatorTest, WeightsSplitInProportion) {
  AllocPolicy p = Fair();
  p.users["alice"].weight = 3;
  AllocJob a = Job("a", "alice", 1, 1, 0, 1), b = Job("b", "bob", 1, 1, 0, 2);
  const AllocDecision d = Allocate({a, b}, 8, p);
  EXPECT_EQ(d.target.at("a"), 6);
  EXPECT_EQ(d.target.at("b"), 2);
}

TEST(AllocatorTest, AUserOverQuotaWaitsWithTheReason) {
  AllocPolicy p = Fair();
  p.users["alice"].quota_slots = 4;
  const std::vector<AllocJob> jobs = {Running(Job("a1", "alice", 1, 4, 4, 1), 4),
                                      Job("a2", "alice", 1, 2, 2, 2), Job("b", "bob", 1, 2, 2, 3)};
  const AllocDecision d = Allocate(jobs, 8, p);
  EXPECT_EQ(d.target.at("a2"), 0);
  EXPECT_THAT(d.why.at("a2"), HasSubstr("quota (4 of 4 slots"));
  EXPECT_EQ(d.target.at("b"), 2);
  EXPECT_THAT(d.queue, ElementsAre("b", "a2"));
}

TEST(AllocatorTest, QuotaCapsGrowth) {
  AllocPolicy p = Fair();
  p.default_user.quota_slots = 3;
  const AllocDecision d = Allocate({Job("a", "alice", 1, 1, 0, 1)}, 8, p);
  EXPECT_EQ(d.target.at("a"), 3);
}

TEST(AllocatorTest, MinimumsBeforeGrowthAndMaxRespected) {
  const std::vector<AllocJob> jobs = {Job("a", "alice", 1, 2, 3, 1), Job("b", "alice", 1, 5, 0, 2)};
  const AllocDecision d = Allocate(jobs, 8, Fair());
  EXPECT_EQ(d.target.at("a"), 3);
  EXPECT_EQ(d.target.at("b"), 5);
}

TEST(AllocatorTest, HysteresisKeepsAPinnedJobAtItsWidth) {
  AllocJob a = Running(Job("a", "alice", 1, 1, 0, 1), 6);
  a.pinned = true;
  const AllocDecision d = Allocate({a, Job("b", "bob", 1, 1, 0, 2)}, 8, Fair());
  EXPECT_EQ(d.target.at("a"), 6);
  EXPECT_EQ(d.target.at("b"), 2);
  // A higher class still takes what it needs from a pinned job.
  const AllocDecision high = Allocate({a, Job("h", "bob", 0, 6, 6, 2)}, 8, Fair());
  EXPECT_EQ(high.target.at("a"), 2);
}

TEST(AllocatorTest, AGrowThatDoesNotPayForItsMorphIsSkipped) {
  AllocPolicy p = Fair();
  p.min_interval_s = 60;
  p.morph_cost_s = 30;
  AllocJob a = Running(Job("a", "alice", 1, 1, 5, 1), 4);
  a.rate = {0, 1, 2, 3, 4, 4.1};  // 4 -> 5 gains 2.5%: 1.5 s over a minute, the morph costs 30
  EXPECT_EQ(Allocate({a}, 5, p).target.at("a"), 4);
  a.rate = {0, 1, 2, 3, 4, 5};  // 25%: 15 s of work, still below 30
  EXPECT_EQ(Allocate({a}, 5, p).target.at("a"), 4);
  p.morph_cost_s = 2;
  EXPECT_EQ(Allocate({a}, 5, p).target.at("a"), 5);
}

TEST(AllocatorTest, AJobAtAWidthItsCurveDoesNotKnowStillGrows) {
  // The planner bounded or rejected the 2-slot shape (rate 0): growing is never "worthless".
  AllocJob a = Running(Job("a", "alice", 2, 2, 6, 1), 2);
  a.rate = {0, 0, 0, 0, 4552, 4552, 5618};
  EXPECT_EQ(Allocate({a}, 6, Fair()).target.at("a"), 6);
}

TEST(AllocatorTest, AStarvingJobHoldsBackLaterStarts) {
  AllocPolicy p = Fair();
  p.starvation_s = 100;
  AllocJob big = Job("big", "alice", 1, 6, 6, 1);
  big.waiting_s = 200;
  const std::vector<AllocJob> jobs = {Running(Job("r", "carol", 1, 4, 4, 0), 4), big,
                                      Job("small", "bob", 1, 2, 2, 2),
                                      Job("lower", "bob", 2, 1, 1, 3)};
  const AllocDecision d = Allocate(jobs, 8, p);
  EXPECT_EQ(d.target.at("big"), 0);
  EXPECT_EQ(d.target.at("small"), 0);
  EXPECT_EQ(d.target.at("lower"), 0);
  EXPECT_THAT(d.why.at("small"), HasSubstr("held back for job big"));
  // Not yet starving: the small job backfills.
  big.waiting_s = 10;
  const AllocDecision early = Allocate({jobs[0], big, jobs[2], jobs[3]}, 8, p);
  EXPECT_EQ(early.target.at("small"), 2);
}

TEST(AllocatorTest, AJobWhoseMinimumExceedsTheClusterIsNeverUndefined) {
  // Capacity below a running job's minimum (nodes were lost): it is evicted, not clamped into
  // nonsense.
  const AllocDecision d = Allocate({Running(Job("a", "alice", 1, 4, 8, 1), 4)}, 2, Fair());
  EXPECT_EQ(d.target.at("a"), 0);
  const AllocDecision q = Allocate({Running(Job("a", "alice", 1, 4, 8, 1), 4)}, 2, AllocPolicy());
  EXPECT_EQ(q.target.at("a"), 0);
}

TEST(AllocatorTest, EvictedJobsStartFirst) {
  AllocJob e = Job("e", "alice", 1, 4, 4, 5);
  e.evicted = true;
  const AllocDecision d = Allocate({Job("n", "bob", 1, 4, 4, 1), e}, 4, Fair());
  EXPECT_EQ(d.target.at("e"), 4);
  EXPECT_EQ(d.target.at("n"), 0);
}

TEST(AllocatorTest, CurvesSendSlotsWhereTheyGainMost) {
  // One user, two jobs: one scales linearly, one triples at 2 slots and is flat beyond.
  AllocJob lin = Job("lin", "alice", 1, 1, 0, 1), flat = Job("flat", "alice", 1, 1, 0, 2);
  lin.rate = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  flat.rate = {0, 1, 3, 3, 3, 3, 3, 3, 3};
  const AllocDecision d = Allocate({lin, flat}, 8, Fair());
  EXPECT_EQ(d.target.at("flat"), 2);
  EXPECT_EQ(d.target.at("lin"), 6);
}

TEST(AllocatorTest, NoProfileMeansLinear) {
  AllocJob a = Job("a", "alice", 1, 1, 0, 1);
  EXPECT_DOUBLE_EQ(RateAt(a, 5), 5);
  a.rate = {0, 2, 4};
  EXPECT_DOUBLE_EQ(RateAt(a, 4), 8);
  EXPECT_EQ(Allocate({a}, 7, Fair()).target.at("a"), 7);
}

TEST(AllocatorTest, QueueModeKeepsRunningWidthsAndFillsInOrder) {
  AllocPolicy q;  // fair = false
  const std::vector<AllocJob> jobs = {Running(Job("r", "alice", 1, 1, 0, 1), 3),
                                      Job("p1", "bob", 1, 1, 4, 2), Job("p2", "bob", 1, 1, 0, 3),
                                      Job("h", "carol", 0, 1, 0, 4)};
  const AllocDecision d = Allocate(jobs, 8, q);
  EXPECT_EQ(d.target.at("r"), 3);
  EXPECT_EQ(d.target.at("h"), 3);  // highest class first: what is left after the minimums
  EXPECT_EQ(d.target.at("p1"), 1);
  EXPECT_EQ(d.target.at("p2"), 1);
}

TEST(AllocatorTest, NothingToGiveMeansEveryoneWaits) {
  const AllocDecision d = Allocate({Job("a", "alice", 1, 1, 0, 1)}, 0, Fair());
  EXPECT_EQ(d.target.at("a"), 0);
  EXPECT_THAT(d.why.at("a"), HasSubstr("0 of 0"));
}

TEST(SharingOptionsTest, BadInputIsRefusedByName) {
  SharingOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.classes = {"normal", "high", "low"};
  EXPECT_THAT(std::string(o.Validate().message()), HasSubstr("high, normal and low in that order"));
  o.classes = {"high", "urgent", "normal", "low", "urgent"};
  EXPECT_THAT(std::string(o.Validate().message()), HasSubstr("names 'urgent' twice"));
  o.classes = {"high", "Urgent!", "normal", "low"};
  EXPECT_THAT(std::string(o.Validate().message()), HasSubstr("'Urgent!'"));
  o = SharingOptions();
  o.users["bob"].weight = 0;
  EXPECT_THAT(std::string(o.Validate().message()), HasSubstr("sharing.users.bob weight"));
  o = SharingOptions();
  o.default_user.quota_slots = -1;
  EXPECT_THAT(std::string(o.Validate().message()), HasSubstr("default_user quota_slots"));
}

TEST(SharingOptionsTest, WhoMaySubmitAboveNormal) {
  SharingOptions o;
  o.classes = {"urgent", "high", "normal", "low", "scavenger"};
  o.submit_above_normal = {"ops"};
  EXPECT_TRUE(o.MaySubmit("normal", "bob", false));
  EXPECT_TRUE(o.MaySubmit("scavenger", "bob", false));
  EXPECT_FALSE(o.MaySubmit("high", "bob", false));
  EXPECT_FALSE(o.MaySubmit("urgent", "bob", false));
  EXPECT_TRUE(o.MaySubmit("high", "ops", false));
  EXPECT_TRUE(o.MaySubmit("urgent", "bob", true));
  EXPECT_EQ(o.ClassRank("scavenger"), 4);
  EXPECT_EQ(o.ClassRank("nope"), -1);
}

}  // namespace
}  // namespace varuna
