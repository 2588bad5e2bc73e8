// The morph state machine on its own, synchronously: every phase, timer and trigger path,
// with a fake clock and fake agents (docs/morphing.md).

#include "manager/morph/morph_controller.h"

#include "absl/strings/str_cat.h"
#include "common/launch/exit_codes.h"
#include "common/planner/profile.h"
#include "common/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/manager/controller_fixture.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;

class MorphControllerTest : public testing::ControllerFixture {
 protected:
  // Four one-slot nodes running a 4-replica job (one stage): any node can go.
  std::string RunningJob(const std::string& extra = "parallel: {stages: 1}") {
    for (const std::string n : {"a", "b", "c", "d"}) AddNode(n, 1);
    const std::string id = Submit(MorphSpec(extra));
    AnswerLaunches();
    EXPECT_EQ(State(id), v1::RUNNING);
    // Every rank reports steps up to 6.
    EXPECT_EQ(Job(id).info().slots(), 4);
    for (const std::string n : {"a", "b", "c", "d"}) {
      std::vector<v1::WorkerStatus> ws = RanksOn(id, n, true);
      for (auto& w : ws) {
        w.set_resumed_from(0);
        for (int s = 1; s <= 6; ++s) w.add_steps()->set_step(s);
        w.mutable_progress()->set_step(6);
      }
      Beat(n, ws);
    }
    return id;
  }

  // The survivors on `nodes` save their last step and exit (kExitRescued).
  void SaveAndExit(const std::string& id, const std::vector<std::string>& nodes) {
    for (const auto& n : nodes) Beat(n, RanksOn(id, n, false, kExitRescued));
  }

  // The new generation's workers report ready (resumed after `step`) and one more step.
  void Resume(const std::string& id, int64_t step) {
    std::set<std::string> nodes;
    for (const auto& p : Job(id).info().placement()) nodes.insert(p.node());
    for (const auto& n : nodes) {
      std::vector<v1::WorkerStatus> ws = RanksOn(id, n, true);
      for (auto& w : ws) {
        w.set_resumed_from(step);
        w.add_steps()->set_step(step + 1);
        w.mutable_progress()->set_step(step + 1);
      }
      Beat(n, ws);
    }
  }
};

TEST_F(MorphControllerTest, LostNodeGoesThroughEveryPhaseAndRecordsTheMorph) {
  config_.morph_coalesce = absl::Seconds(5);  // so PLANNING is seen before the re-plan
  Build();
  const std::string id = RunningJob();
  // d stops heartbeating: DEAD after dead_after_missed periods.
  for (int i = 0; i < 11; ++i) {
    Advance(absl::Seconds(1));
    for (const std::string n : {"a", "b", "c"}) Beat(n, RanksOn(id, n, true));
    Tick();
  }
  EXPECT_EQ(State(id), v1::RECONFIGURING);
  EXPECT_EQ(Phase(id), v1::MorphState::SAVING);
  EXPECT_THAT(Job(id).info().reason(), HasSubstr("node d lost"));
  // The survivors were asked to abort the step and save (not graceful: a peer is gone).
  ASSERT_EQ(agents_.checkpoints.size(), 3u);
  EXPECT_TRUE(agents_.checkpoints[0].req.abort_step());
  agents_.AnswerCheckpoints();
  SaveAndExit(id, {"a", "b", "c"});
  Tick();
  EXPECT_EQ(Phase(id), v1::MorphState::PLANNING);  // through STOPPING: nothing left running
  Advance(config_.morph_coalesce + absl::Seconds(1));
  for (const std::string n : {"a", "b", "c"}) Beat(n, {});
  Tick();
  EXPECT_EQ(Phase(id), v1::MorphState::LAUNCHING);
  EXPECT_EQ(Job(id).info().generation(), 2);
  EXPECT_GE(Job(id).info().slots(), 1);
  EXPECT_LE(Job(id).info().slots(), 3);
  for (const auto& p : Job(id).info().placement()) EXPECT_NE(p.node(), "d");
  AnswerLaunches();
  EXPECT_EQ(State(id), v1::RUNNING);
  EXPECT_EQ(Phase(id), v1::MorphState::RESUMING);
  Resume(id, 6);
  EXPECT_FALSE(Job(id).morphing());
  ASSERT_EQ(Job(id).info().morphs_size(), 1);
  const v1::MorphRecord& r = Job(id).info().morphs(0);
  EXPECT_EQ(r.resumed_from(), 6);
  EXPECT_EQ(r.steps_lost(), 0);
  EXPECT_EQ(r.from().replicas(), 4);
  EXPECT_EQ(r.to().replicas(), Job(id).info().replicas());
  for (const char* phase : {"save", "plan", "launch", "rendezvous", "first_step", "total"}) {
    EXPECT_TRUE(r.phases().count(phase)) << phase;
  }
  // The window's wait is its own phase (Note [Coalescing window] in morph_controller.cc);
  // "plan" is the rest. The window (5 s) counts from the trigger, a second before PLANNING
  // began (the loop above ran on), so 4 s of it are left; the test waited 6 s, and the
  // planner takes no fake time.
  EXPECT_NEAR(r.phases().at("coalesce"), 4.0, 1e-6);
  EXPECT_NEAR(r.phases().at("plan"), 2.0, 1e-6);
}

TEST_F(MorphControllerTest, GracefulSaveTimesOutToAbortThenToStop) {
  const std::string id = RunningJob();
  ASSERT_TRUE(nodes_->Drain("d", false).ok());
  loop_.Run();
  EXPECT_EQ(Phase(id), v1::MorphState::SAVING);
  EXPECT_TRUE(Job(id).rec.morph().graceful());
  ASSERT_EQ(agents_.checkpoints.size(), 4u);  // a draining node still saves its ranks
  EXPECT_FALSE(agents_.checkpoints[0].req.abort_step());
  agents_.AnswerCheckpoints();
  // Nobody checkpoints within morph_save_timeout: the step is aborted instead.
  Advance(config_.morph_save_timeout + absl::Seconds(1));
  for (const std::string n : {"a", "b", "c", "d"}) Beat(n, RanksOn(id, n, true));
  Tick();
  EXPECT_EQ(Phase(id), v1::MorphState::SAVING);
  EXPECT_FALSE(Job(id).rec.morph().graceful());
  ASSERT_EQ(agents_.checkpoints.size(), 4u);
  EXPECT_TRUE(agents_.checkpoints[0].req.abort_step());
  agents_.AnswerCheckpoints();
  // Still nothing: the workers are stopped.
  Advance(config_.morph_save_timeout + absl::Seconds(1));
  for (const std::string n : {"a", "b", "c", "d"}) Beat(n, RanksOn(id, n, true));
  Tick();
  EXPECT_EQ(Phase(id), v1::MorphState::STOPPING);
  Advance(absl::Seconds(1));
  for (const std::string n : {"a", "b", "c", "d"}) Beat(n, RanksOn(id, n, true));
  Tick();
  EXPECT_EQ(Phase(id), v1::MorphState::STOPPING);
  EXPECT_FALSE(agents_.stops.empty());  // SIGTERM, then SIGKILL after the grace
  // Past the stop grace the morph re-plans; the next generation's launch kills what remains.
  Advance(config_.stop_grace + absl::Seconds(6));
  for (const std::string n : {"a", "b", "c", "d"}) Beat(n, RanksOn(id, n, true));
  Tick();
  EXPECT_EQ(Phase(id), v1::MorphState::LAUNCHING);
  for (const auto& p : Job(id).info().placement()) EXPECT_NE(p.node(), "d");
}

// A rank frozen during the morph (SIGSTOP in its rescue save: Note [Frozen workers] in
// agent/in_place.cc) will save nothing: once every other rank has saved and exited, the morph
// moves on at once instead of waiting out morph_save_timeout, and the frozen rank is still
// stopped (SIGTERM, SIGKILL after the grace) before the relaunch.
TEST_F(MorphControllerTest, AFrozenRankDoesNotHoldTheSave) {
  const std::string id = RunningJob();
  for (int i = 0; i < 11; ++i) {  // d is lost: a, b, c are asked to save
    Advance(absl::Seconds(1));
    for (const std::string n : {"a", "b", "c"}) Beat(n, RanksOn(id, n, true));
    Tick();
  }
  ASSERT_EQ(Phase(id), v1::MorphState::SAVING);
  agents_.AnswerCheckpoints();
  std::vector<v1::WorkerStatus> frozen = RanksOn(id, "c", true);
  ASSERT_EQ(frozen.size(), 1u);
  frozen[0].set_frozen(true);
  Beat("c", frozen);
  SaveAndExit(id, {"a", "b"});
  Tick();
  EXPECT_NE(Phase(id), v1::MorphState::SAVING) << "waits for a rank that cannot save";
  const size_t stops_before = agents_.stops.size();
  Advance(absl::Seconds(6));
  for (const std::string n : {"a", "b"}) Beat(n, {});
  Beat("c", frozen);
  Tick();
  EXPECT_EQ(Phase(id), v1::MorphState::STOPPING);  // c still runs: it is stopped first
  EXPECT_GT(agents_.stops.size(), stops_before);
  bool stopped_c = false;
  for (const auto& s : agents_.stops) stopped_c = stopped_c || s.address == "c:7071";
  EXPECT_TRUE(stopped_c);
  Beat("c", {Worker(id, frozen[0].rank(), false, 0, 9)});  // the agent killed it
  Tick();
  Advance(config_.morph_coalesce + absl::Seconds(1));
  Tick();
  EXPECT_EQ(Phase(id), v1::MorphState::LAUNCHING);
  EXPECT_LT(Job(id).rec.morph().record().phases().at("save"),
            absl::ToDoubleSeconds(config_.morph_save_timeout));
}

TEST_F(MorphControllerTest, SecondTriggerJoinsTheMorphAndTheHigherPriorityReasonWins) {
  const std::string id = RunningJob();
  // a's rank saved after losing a peer (priority 1) ...
  Beat("a", RanksOn(id, "a", false, kExitRescued));
  EXPECT_EQ(Phase(id), v1::MorphState::SAVING);
  EXPECT_THAT(Job(id).rec.morph().record().reason(), HasSubstr("lost a peer mid-step"));
  // ... then node b is drained (a node event, priority 3): one morph, b's reason, b excluded.
  ASSERT_TRUE(nodes_->Drain("b", false).ok());
  loop_.Run();
  EXPECT_EQ(Phase(id), v1::MorphState::SAVING);
  EXPECT_THAT(Job(id).rec.morph().record().reason(), HasSubstr("b"));
  EXPECT_THAT(Job(id).rec.morph().lost_nodes(), ::testing::Contains("b"));
  SaveAndExit(id, {"b", "c", "d"});
  Advance(absl::Seconds(2));
  for (const std::string n : {"a", "c", "d"}) Beat(n, {});
  Tick();
  Tick();
  EXPECT_EQ(Phase(id), v1::MorphState::LAUNCHING);
  for (const auto& p : Job(id).info().placement()) EXPECT_NE(p.node(), "b");
}

TEST_F(MorphControllerTest, PlanningWaitsForSlotsThenGivesUpAfterMaxWait) {
  const std::string id =
      RunningJob("parallel: {stages: 1}\nresources: {min_slots: 4, max_wait_s: 30}");
  ASSERT_TRUE(nodes_->Drain("d", false).ok());
  loop_.Run();
  SaveAndExit(id, {"a", "b", "c", "d"});
  Advance(absl::Seconds(2));
  Tick();
  EXPECT_EQ(Phase(id), v1::MorphState::PLANNING);
  EXPECT_THAT(Job(id).info().reason(), HasSubstr("waiting for slots"));
  Advance(absl::Seconds(20));
  for (const std::string n : {"a", "b", "c", "d"}) Beat(n, {});
  Tick();
  EXPECT_EQ(State(id), v1::RECONFIGURING);
  Advance(absl::Seconds(15));
  for (const std::string n : {"a", "b", "c", "d"}) Beat(n, {});
  Tick();
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_THAT(Job(id).info().reason(), HasSubstr("gave up after waiting"));
}

TEST_F(MorphControllerTest, RestartBudgetFailsTheJobWithItsHistory) {
  config_.max_morphs = 1;
  Build();
  const std::string id = RunningJob();
  Beat("a", RanksOn(id, "a", false, 1));  // rank 0 fails: morph 1
  EXPECT_EQ(Phase(id), v1::MorphState::SAVING);
  SaveAndExit(id, {"b", "c", "d"});
  Advance(absl::Seconds(2));
  Beat("a", {});
  Tick();
  Tick();
  AnswerLaunches();
  Resume(id, 6);
  ASSERT_FALSE(Job(id).morphing());
  Beat("b", RanksOn(id, "b", false, 1));  // and again, within the window
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_THAT(Job(id).info().reason(), HasSubstr("not morphing again: 1 morphs within"));
}

TEST_F(MorphControllerTest, JobGrowsOntoAJoinedNodeAfterTheScaleUpDelay) {
  AddNode("a", 1);
  AddNode("b", 1);
  const std::string id = Submit(MorphSpec("parallel: {stages: 1}"));
  AnswerLaunches();
  ASSERT_EQ(Job(id).info().slots(), 2);
  AddNode("c", 1);
  AddNode("d", 1);
  Tick();
  EXPECT_FALSE(Job(id).morphing());  // not before scale_up_delay
  Advance(config_.scale_up_delay + absl::Seconds(1));
  for (const std::string n : {"a", "b", "c", "d"}) Beat(n, RanksOn(id, n, true));
  Tick();
  EXPECT_EQ(Phase(id), v1::MorphState::SAVING);
  EXPECT_TRUE(Job(id).rec.morph().graceful());
  EXPECT_THAT(Job(id).rec.morph().record().reason(), HasSubstr("joined"));
}

TEST_F(MorphControllerTest, JobWithoutCheckpointDirFailsInsteadOfMorphing) {
  AddNode("a", 1);
  AddNode("b", 1);
  const std::string id = Submit(Spec());
  AnswerLaunches();
  EXPECT_FALSE(morph_->Allowed(Job(id)));
  ASSERT_TRUE(nodes_->Drain("b", false).ok());
  loop_.Run();
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_THAT(Job(id).info().reason(), HasSubstr("set checkpoint.dir"));
}

TEST_F(MorphControllerTest, RelaunchThatNeverStartsIsANewTriggerWithoutThoseNodes) {
  const std::string id = RunningJob();
  ASSERT_TRUE(nodes_->Drain("d", false).ok());
  loop_.Run();
  SaveAndExit(id, {"a", "b", "c", "d"});
  Advance(absl::Seconds(2));
  Tick();
  ASSERT_EQ(Phase(id), v1::MorphState::LAUNCHING);
  agents_.launches.clear();  // rank 0's agent never answers
  Advance(config_.start_timeout + absl::Seconds(1));
  for (const std::string n : {"a", "b", "c"}) Beat(n, {});
  Tick();
  // It joins the morph (the drain's reason stays: same priority) and stops the new
  // generation; the next plan leaves out the nodes that did not answer.
  EXPECT_EQ(State(id), v1::RECONFIGURING);
  EXPECT_EQ(Phase(id), v1::MorphState::SAVING);
  EXPECT_THAT(Job(id).rec.morph().lost_nodes(), ::testing::Contains("a"));
}

TEST_F(MorphControllerTest, WorkersThatNeverReportReadyCloseTheMorphAfterTheStartTimeout) {
  const std::string id = RunningJob();
  Beat("a", RanksOn(id, "a", false, 1));
  SaveAndExit(id, {"b", "c", "d"});
  Advance(absl::Seconds(2));
  Beat("a", {});
  Tick();
  Tick();
  AnswerLaunches();
  ASSERT_EQ(Phase(id), v1::MorphState::RESUMING);
  Advance(config_.start_timeout + absl::Seconds(1));
  for (const std::string n : {"a", "b", "c", "d"}) Beat(n, RanksOn(id, n, true));
  Tick();
  EXPECT_FALSE(Job(id).morphing());
  ASSERT_EQ(Job(id).info().morphs_size(), 1);
  EXPECT_EQ(Job(id).info().morphs(0).steps_lost(), -1);  // never said where it resumed
}

TEST_F(MorphControllerTest, MorphInProgressCarriesOnAfterAManagerRestart) {
  // Note [Morph recovery]
  const std::string id = RunningJob();
  ASSERT_TRUE(nodes_->Drain("d", false).ok());
  loop_.Run();
  ASSERT_EQ(Phase(id), v1::MorphState::SAVING);
  agents_.checkpoints.clear();
  Build();
  ASSERT_TRUE(nodes_->Load().ok());
  ASSERT_TRUE(jobs_->Load(clock_.Now()).ok());
  jobs_ctl_->ResumeRecovered();
  loop_.Run();
  EXPECT_EQ(Phase(id), v1::MorphState::SAVING);
  // The save requests again, to every node but the one leaving (SUSPECT until it heartbeats).
  EXPECT_EQ(agents_.checkpoints.size(), 3u);
}

// Note [Tensor-parallel plans] in common/planner/tp_plan.cc: with tp_size auto every plan picks
// its split, so a morph may change it. A one-slot node holds no group; a joining four-slot
// node does, and the job grows onto it split, though its stages and replicas stay 1 x 1
// (relaunch: a tp job does not morph in place).
TEST_F(MorphControllerTest, TensorParallelAutoChangesItsSizeWhenTheNodesChange) {
  config_.morph_in_place = true;  // on, as by default: the tp job relaunches all the same
  Build();
  AddNode("a", 1);
  const std::string yaml = absl::StrCat(
      "name: t\nmodel: {kind: gpt, layers: 4, d_model: 1024, heads: 4, seq_len: 512, "
      "vocab: 256}\ndata: {kind: text, path: ",
      data_,
      "}\ntrain: {global_batch: 1, steps: 20}\nparallel: {tp_size: auto, micro_batch: 1}\n"
      "checkpoint: {dir: ",
      dir_, "/ckpt}\n");
  ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(yaml));
  ASSERT_OK_AND_ASSIGN(v1::Profile profile, BuiltinProfile(spec));
  bool repeat = false;
  ASSERT_TRUE(profiles_->Store(ProfileToJson(profile), spec, &repeat).ok());
  const std::string id = Submit(yaml);
  AnswerLaunches();
  ASSERT_EQ(State(id), v1::RUNNING) << Job(id).info().reason();
  EXPECT_LE(Job(id).info().tp_size(), 1);
  EXPECT_EQ(Job(id).info().slots(), 1);
  AddNode("e", 4);
  Tick();
  for (int i = 0; i <= absl::ToInt64Seconds(config_.scale_up_delay); ++i) {
    Advance(absl::Seconds(1));
    for (const std::string n : {"a", "e"}) Beat(n, RanksOn(id, n, true));
    Tick();
  }
  ASSERT_EQ(Phase(id), v1::MorphState::SAVING);
  EXPECT_FALSE(Job(id).rec.morph().in_place());
  agents_.AnswerCheckpoints();
  SaveAndExit(id, {"a"});
  Tick();
  Advance(config_.morph_coalesce + absl::Seconds(1));
  for (const std::string n : {"a", "e"}) Beat(n, {});
  Tick();
  ASSERT_EQ(Phase(id), v1::MorphState::LAUNCHING) << Job(id).info().reason();
  const v1::JobInfo& info = Job(id).info();
  ASSERT_GT(info.tp_size(), 1);
  EXPECT_EQ(info.slots(), info.stages() * info.replicas() * info.tp_size());
  // Each group's ranks on one node, consecutive.
  for (const auto& p : info.placement()) {
    EXPECT_EQ(p.node(), info.placement(p.rank() - p.rank() % info.tp_size()).node());
  }
  EXPECT_EQ(Job(id).rec.morph().record().to().tp_size(), info.tp_size());
  EXPECT_THAT(Job(id).rec.morph().record().path(), HasSubstr("tensor-parallel"));
}

}  // namespace
}  // namespace varuna
