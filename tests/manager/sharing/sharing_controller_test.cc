// The sharing controller wired to the job and morph controllers, synchronously (fake clock,
// fake agents, the relaunch path): a resize is a morph of kind resize that the job's budget
// does not count, a pending job starts once its whole allocation is free, an eviction ends
// PENDING and the job starts again first, from its checkpoint.

#include "manager/sharing/sharing_controller.h"

#include <memory>
#include <string>
#include <vector>

#include "common/launch/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/manager/controller_fixture.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;

class SharingControllerTest : public testing::ControllerFixture {
 protected:
  void SetUp() override {
    ControllerFixture::SetUp();
    config_.sharing.enabled = true;
    config_.sharing.min_interval = absl::Seconds(30);
    Rebuild();
  }
  void Rebuild() {
    Build();
    sharing_ =
        std::make_unique<SharingController>(config_.sharing, &clock_, jobs_.get(), nodes_.get(),
                                            events_.get(), profiles_.get(), morph_.get());
    jobs_ctl_->set_morph(morph_.get(), sharing_.get());
  }

  // A model big enough that more replicas are faster on the built-in cost model (the
  // allocator gives a job only the widths its curve gains from), with a checkpoint.dir.
  std::string ElasticSpec(const std::string& extra) const {
    return absl::StrCat("name: t\nmodel: {kind: gpt, layers: 4, d_model: 256, heads: 2, ",
                        "seq_len: 8, vocab: 256}\ndata: {kind: text, path: ", data_,
                        "}\ntrain: {global_batch: 64, steps: 20}\ncheckpoint: {dir: ", dir_,
                        "/ckpt}\n", extra, "\n");
  }

  // Three two-slot nodes; a low-priority elastic job (one stage, batch 64) running on 4.
  std::string RunningLowJob(int min_slots) {
    for (const std::string n : {"a", "b", "c"}) AddNode(n, 2);
    const std::string id = Submit(ElasticSpec(absl::StrCat(
        "parallel: {stages: 1}\npriority: low\nresources: {min_slots: ", min_slots, "}")));
    AnswerLaunches();
    EXPECT_EQ(State(id), v1::RUNNING);
    EXPECT_EQ(Job(id).info().slots(), 4);  // 64 samples: 4 divides them, 6 does not
    EXPECT_EQ(Job(id).info().allocated_slots(), 4);
    Report(id, 6);
    return id;
  }
  // Every rank of `id` reports steps up to `step` (resumed after `from`).
  void Report(const std::string& id, int step, int from = 0) {
    for (const std::string n : {"a", "b", "c"}) {
      std::vector<v1::WorkerStatus> ws = RanksOn(id, n, true);
      for (auto& w : ws) {
        w.set_resumed_from(from);
        for (int s = from + 1; s <= step; ++s) w.add_steps()->set_step(s);
        w.mutable_progress()->set_step(step);
      }
      if (!ws.empty()) Beat(n, ws);
    }
  }
  void SaveAndExit(const std::string& id) {
    for (const std::string n : {"a", "b", "c"}) Beat(n, RanksOn(id, n, false, kExitRescued));
  }
  std::string Events() {
    v1::ListEventsRequest req;
    std::string out;
    const v1::ListEventsResponse resp = events_->List(req);
    for (const auto& e : resp.events()) out += e.kind() + ": " + e.message() + "\n";
    return out;
  }

  std::unique_ptr<SharingController> sharing_;
};

TEST_F(SharingControllerTest, AHigherClassShrinksALowerJobByAResizeMorph) {
  const std::string low = RunningLowJob(2);
  const std::string high = Submit(Spec("parallel: {stages: 2, replicas: 2}\npriority: high"));
  EXPECT_EQ(State(high), v1::PENDING);
  EXPECT_THAT(Job(high).info().reason(), HasSubstr("waiting for 2 of its 4 slots"));
  EXPECT_EQ(State(low), v1::RECONFIGURING);
  EXPECT_EQ(Job(low).rec.morph().record().kind(), "resize");
  EXPECT_EQ(Job(low).info().allocated_slots(), 2);
  EXPECT_THAT(Events(), HasSubstr("job_resized: resized 4 -> 2 slots for job " + high));
  agents_.AnswerCheckpoints();
  SaveAndExit(low);
  Tick();  // no coalescing window for a resize (Note [Coalescing window]): planned at once
  AnswerLaunches();
  EXPECT_EQ(Job(low).info().slots(), 2);
  EXPECT_EQ(Job(low).info().generation(), 2);
  Tick();  // the slots are free now: the high job starts on all of its allocation
  AnswerLaunches();
  EXPECT_EQ(State(high), v1::RUNNING);
  EXPECT_EQ(Job(high).info().slots(), 4);
  Report(low, 7, 6);
  ASSERT_EQ(Job(low).info().morphs_size(), 1);
  EXPECT_EQ(Job(low).info().morphs(0).kind(), "resize");
  EXPECT_EQ(Job(low).info().morphs(0).phases().at("coalesce"), 0);
  EXPECT_TRUE(RecentMorphs(Job(low), clock_.Now(), absl::Hours(1)).empty())
      << "the allocator's resizes do not count against max_morphs";
}

TEST_F(SharingControllerTest, AnEvictedJobGoesBackToPendingAndStartsFirstFromItsCheckpoint) {
  const std::string low = RunningLowJob(4);  // cannot shrink below 4: 4 + 4 > 6
  const std::string high = Submit(Spec("parallel: {stages: 2, replicas: 2}\npriority: high"));
  EXPECT_EQ(State(low), v1::RECONFIGURING);
  EXPECT_EQ(Job(low).rec.morph().record().kind(), "evict");
  EXPECT_TRUE(Job(low).rec.evicted());
  EXPECT_THAT(Events(), HasSubstr("job_evicted: evicted for job " + high));
  agents_.AnswerCheckpoints();
  SaveAndExit(low);
  Tick();
  EXPECT_EQ(State(low), v1::PENDING);
  EXPECT_THAT(Job(low).info().reason(), HasSubstr("needs 4 slots"));
  EXPECT_EQ(Job(low).info().slots(), 0);
  Tick();
  AnswerLaunches();
  EXPECT_EQ(State(high), v1::RUNNING);
  // A later, smaller low job backfills the 2 free slots (the evicted one is not starving), and
  // the evicted job stays first in the queue.
  const std::string later = Submit(ElasticSpec("parallel: {stages: 1}\npriority: low"));
  AnswerLaunches();
  EXPECT_EQ(State(later), v1::RUNNING);
  Tick();
  EXPECT_EQ(Job(low).info().queue_position(), 1);
  agents_.launches.clear();
  // The high job ends: the evicted one starts again, resuming from its checkpoint.
  for (const std::string n : {"a", "b", "c"}) Beat(n, RanksOn(high, n, false, 0));
  Tick();
  Tick();
  ASSERT_FALSE(agents_.launches.empty());
  EXPECT_EQ(agents_.launches.front().req.job_id(), low);
  EXPECT_EQ(agents_.launches.front().req.resume_step(), "auto");
  AnswerLaunches();
  EXPECT_EQ(State(low), v1::RUNNING);
  EXPECT_EQ(Job(low).info().generation(), 2);
  EXPECT_FALSE(Job(low).rec.evicted());
}

}  // namespace
}  // namespace varuna
