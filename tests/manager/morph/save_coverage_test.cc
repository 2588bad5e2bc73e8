// The morph room's pure decisions as tables: what survivors saved (manager/morph/
// save_coverage.h: the exits of a stopped generation in, the stages no saver covers and the
// newest step every stage has out) and whether a job grows onto joined slots (GrowthCause).

#include "manager/morph/save_coverage.h"

#include "manager/morph/morph_controller.h"

#include <string>
#include <vector>

#include "common/launch/exit_codes.h"
#include "gtest/gtest.h"

namespace varuna {
namespace {

struct Exit {
  int rank;
  int code;
  int64_t saved;
  int64_t pending = 0;  // the next step its rescue wrote pending layers for
  int64_t committed = 0;
  int signal = 0;
};

Job MakeJob(int stages, const std::string& pipelines, int tp, const std::vector<Exit>& exits,
            int64_t stopped_after = 0) {
  Job job;
  job.info().set_stages(stages);
  job.info().set_pipelines(pipelines);
  if (tp > 1) job.info().set_tp_size(tp);
  for (const Exit& x : exits) {
    v1::RankExit* e = job.rec.add_exits();
    e->set_rank(x.rank);
    e->set_exit_code(x.code);
    e->set_signal(x.signal);
    e->set_saved_step(x.saved);
    e->set_pending_step(x.pending);
    e->set_committed_step(x.committed);
  }
  job.gen.stopped_after = stopped_after;
  return job;
}

constexpr int R = kExitRescued;

TEST(SaveCoverageTest, TheTable) {
  struct Row {
    const char* what;
    Job job;
    std::vector<int> missing;
    int64_t common;
    int64_t newest;
  } rows[] = {
      // 2 stages x 2 replicas: ranks 0,2 hold stage 0; 1,3 stage 1.
      {"every stage rescued at one step", MakeJob(2, "", 1, {{0, R, 7}, {1, R, 7}}), {}, 7, 7},
      {"the stages at different steps: none common",
       MakeJob(2, "", 1, {{0, R, 7}, {1, R, 8}}),
       {},
       -1,
       8},
      // Note [Rolled rescue] in checkpoint_store.cc. Rank 0 is at 7 with 8 pending, rank 1
      // applied 8.
      {"pending layers make the next step common",
       MakeJob(2, "", 1, {{0, R, 7, /*pending=*/8}, {1, R, 8}}),
       {},
       8,
       8},
      {"... only where a saver has that step (nobody has 8's update)",
       MakeJob(2, "", 1, {{0, R, 7, /*pending=*/8}, {1, R, 7, /*pending=*/8}}),
       {},
       7,
       7},
      {"a rank at step 0 with step 1 pending",
       MakeJob(2, "", 1, {{0, R, 0, /*pending=*/1}, {1, R, 1}}),
       {},
       1,
       1},
      {"stage 1 saved by nobody", MakeJob(2, "", 1, {{0, R, 7}, {2, R, 7}}), {1}, -1, 7},
      {"a killed rank saves nothing",
       MakeJob(2, "", 1, {{0, R, 7}, {1, 0, 7, 0, 0, 9}}),
       {1},
       -1,
       7},
      {"a clean exit counts only after a stop on request",
       MakeJob(2, "", 1, {{0, 0, 5}, {1, 0, 5}}),
       {0, 1},
       -1,
       0},
      {"... and does after one",
       MakeJob(2, "", 1, {{0, 0, 5}, {1, 0, 5}}, /*stopped_after=*/5),
       {},
       5,
       5},
      // tp 2: processes 0,1 are position 0 (stage 0), 2,3 position 1 (stage 1).
      {"tensor parallel: processes are positions",
       MakeJob(2, "", 2, {{1, R, 4}, {2, R, 4}}),
       {},
       4,
       4},
      // A 2-stage pipeline (segments 0-2, 3-5) and a 1-stage one (all six) beside it.
      {"heterogeneous: the 1-stage pipeline covers both stages",
       MakeJob(0, "0,3,6:4;0,6:4", 1, {{2, R, 9}}),
       {},
       9,
       9},
      {"heterogeneous: one stage's segments only",
       MakeJob(0, "0,3,6:4;0,6:4", 1, {{0, R, 9}}),
       {1},
       -1,
       9},
  };
  for (Row& row : rows) {
    const SaveCoverage c = CoverageOf(row.job);
    EXPECT_EQ(c.missing, row.missing) << row.what;
    EXPECT_EQ(c.common_step, row.common) << row.what;
    EXPECT_EQ(c.newest_saved, row.newest) << row.what;
  }
}

TEST(SaveCoverageTest, KeepsEachSaverAndTheNewestCommittedStep) {
  const SaveCoverage c =
      CoverageOf(MakeJob(2, "", 1, {{0, R, 8, 0, /*committed=*/7}, {1, R, 7, 8, 6}}));
  ASSERT_EQ(c.saved.size(), 3u);
  EXPECT_EQ(c.saved[0].rank(), 0);
  EXPECT_EQ(c.saved[0].step(), 8);
  EXPECT_EQ(c.saved[1].rank(), 1);
  EXPECT_EQ(c.saved[1].step(), 7);
  EXPECT_EQ(c.saved[2].step(), 8);  // its pending layers of step 8
  EXPECT_EQ(c.committed, 7);
}

JobPlan Plan(int stages, int replicas, int slots, int micro_batch = 2) {
  JobPlan p;
  p.stages = stages;
  p.replicas = replicas;
  p.micro_batch = micro_batch;
  p.ranks.resize(slots);
  return p;
}

TEST(GrowthCauseTest, GrowsOnlyToMoreSlotsAndAnotherShape) {
  v1::JobInfo info;  // running 2 x 2 on 4 slots, micro-batch 2
  info.set_stages(2);
  info.set_replicas(2);
  info.set_micro_batch(2);
  info.set_slots(4);
  struct Row {
    const char* what;
    JobPlan plan;
    bool grows;
  } rows[] = {
      {"2 x 3 on 6 slots", Plan(2, 3, 6), true},
      {"the same shape", Plan(2, 2, 4), false},
      {"fewer slots", Plan(1, 2, 2), false},
      {"more slots but the same shape (the rest idle)", Plan(2, 2, 6), false},
      {"a new micro-batch on more slots", Plan(2, 2, 6, 4), true},
  };
  for (const Row& row : rows) {
    const std::optional<Cause> c = GrowthCause(info, row.plan, "c,d");
    EXPECT_EQ(c.has_value(), row.grows) << row.what;
    if (c) {
      EXPECT_EQ(c->kind, "join");
      EXPECT_TRUE(c->graceful);
      EXPECT_NE(c->reason.find("node(s) c,d joined: "), std::string::npos) << c->reason;
    }
  }
}

}  // namespace
}  // namespace varuna
