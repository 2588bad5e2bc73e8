// The job controller on its own, synchronously: fake clock, fake agents, no gRPC.

#include "manager/jobs/job_controller.h"

#include <signal.h>
#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "common/launch/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/manager/controller_fixture.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;

class JobControllerTest : public testing::ControllerFixture {};

TEST_F(JobControllerTest, LaunchesRankZerosNodeFirstThenTheRestThenRuns) {
  AddNode("a", 1);
  AddNode("b", 1);
  const std::string id = Submit(Spec());
  EXPECT_EQ(State(id), v1::STARTING);
  EXPECT_EQ(Job(id).info().generation(), 1);
  // Note [Launch order] (job_controller.cc): rank 0's node alone until its agent says which port it
  // picked.
  ASSERT_EQ(agents_.launches.size(), 1u);
  EXPECT_EQ(agents_.launches[0].address, Job(id).info().placement(0).node() + ":7071");
  EXPECT_EQ(agents_.launches[0].req.master_port(), 0);
  agents_.AnswerLaunches(29555);
  loop_.Run();
  ASSERT_EQ(agents_.launches.size(), 2u);  // both nodes now (a repeat is harmless)
  EXPECT_EQ(agents_.launches[0].req.master_port(), 29555);
  EXPECT_EQ(State(id), v1::STARTING);
  AnswerLaunches();
  EXPECT_EQ(State(id), v1::RUNNING);
  EXPECT_THAT(Job(id).info().master(), HasSubstr(":29555"));
}

TEST_F(JobControllerTest, SucceedsWhenEveryRankExitsZero) {
  AddNode("a", 2);
  const std::string id = Submit(Spec());
  AnswerLaunches();
  ASSERT_EQ(State(id), v1::RUNNING);
  v1::WorkerStatus w = Worker(id, 0, true);
  w.mutable_progress()->set_step(20);
  w.mutable_progress()->set_loss(1.5);
  Beat("a", {w, Worker(id, 1, true)});
  EXPECT_EQ(Job(id).info().step(), 20);
  Beat("a", {Worker(id, 0, false), Worker(id, 1, true)});
  EXPECT_EQ(State(id), v1::RUNNING);  // one rank still running
  Beat("a", RanksOn(id, "a", false));
  EXPECT_EQ(State(id), v1::SUCCEEDED);
}

TEST_F(JobControllerTest, StartTimeoutFailsAJobWhoseLaunchIsNeverAnswered) {
  AddNode("a", 2);
  const std::string id = Submit(Spec());
  Advance(config_.start_timeout - absl::Seconds(1));
  Beat("a", {});
  Tick();
  EXPECT_EQ(State(id), v1::STARTING);
  Advance(absl::Seconds(2));
  Beat("a", {});
  Tick();
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_THAT(Job(id).info().reason(), HasSubstr("did not start within"));
}

TEST_F(JobControllerTest, FailureIsHeldSoALostNodeIsNamedAsTheCause) {
  // Note [Failure attribution] (manager/jobs/job.h): without morphing, rank 1's exit waits two
  // heartbeat periods; node a went silent meanwhile, so a is named first.
  AddNode("a", 1);
  AddNode("b", 1);
  const std::string id = Submit(Spec("parallel: {stages: 2}\nmorphing: false"));
  AnswerLaunches();
  ASSERT_EQ(State(id), v1::RUNNING);
  const std::string first = Job(id).info().placement(0).node();
  const std::string second = Job(id).info().placement(1).node();
  Beat(second, {Worker(id, 1, false, 1)});
  EXPECT_EQ(State(id), v1::RUNNING);  // held
  Advance(absl::Seconds(2));
  Beat(second, RanksOn(id, second, false, 1));
  Tick();
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_THAT(Job(id).info().reason(),
              HasSubstr(absl::StrCat("node ", first, " lost (no heartbeat")));
  EXPECT_THAT(Job(id).info().reason(), HasSubstr("then rank 1 on node " + second));
}

TEST_F(JobControllerTest, BadInputExitFailsAtOnceEvenWhenTheJobCouldMorph) {
  AddNode("a", 2);
  const std::string id = Submit(MorphSpec());
  AnswerLaunches();
  v1::WorkerStatus w = Worker(id, 0, false, kExitBadInput);
  w.set_error("data.path: no such file");
  Beat("a", {w, Worker(id, 1, true)});
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_THAT(Job(id).info().reason(), HasSubstr("cannot run the job: data.path: no such file"));
  EXPECT_FALSE(Job(id).morphing());
}

// A worker that never started (Note [Launch failures] in agent/process_launcher.cc): the
// launcher's reason, which the agent sends as the worker's error, is the job's.
TEST_F(JobControllerTest, AFailureCarriesTheWorkersReason) {
  AddNode("a", 1);
  const std::string id = Submit(Spec("parallel: {stages: 1}\nmorphing: false"));
  AnswerLaunches();
  v1::WorkerStatus w = Worker(id, 0, false, 126);
  w.set_error(
      "varuna-agent: the worker user varuna cannot enter the working directory /srv: "
      "Permission denied");
  Beat("a", {w});
  Advance(absl::Seconds(3));
  Beat("a", {w});
  Tick();
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_THAT(Job(id).info().reason(),
              HasSubstr("exited with code 126: varuna-agent: the worker user varuna cannot enter "
                        "the working directory /srv: Permission denied"));
}

// Note [Launch failures that repeat] in manager/jobs/job_controller.cc: when no rank could
// start, a morph would only fail the same way on the same machines: the job fails at once.
TEST_F(JobControllerTest, ALaunchFailureOfEveryRankFailsTheJobWithoutAMorph) {
  AddNode("a", 2);
  const std::string id = Submit(MorphSpec());
  AnswerLaunches();
  const std::string why =
      "varuna-agent: the worker user uid1900000001 cannot enter the working directory /srv: "
      "Permission denied";
  v1::WorkerStatus r0 = Worker(id, 0, false, 126), r1 = Worker(id, 1, false, 126);
  r0.set_error(why);
  r1.set_error(why);
  Beat("a", {r0, Worker(id, 1, true)});
  EXPECT_NE(State(id), v1::FAILED) << "the other rank may still start";
  EXPECT_FALSE(Job(id).morphing());
  Beat("a", {r0, r1});
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_THAT(Job(id).info().reason(),
              HasSubstr("no rank could start (2 of 2), so no morph: rank 0 on node a: " + why));
  EXPECT_EQ(Job(id).info().morphs_size(), 0);
}

// ... but when the other ranks started, it was one node's problem: the held morph starts.
TEST_F(JobControllerTest, ALaunchFailureOfSomeRanksMorphsAfterTheOthersReport) {
  AddNode("a", 2);
  const std::string id = Submit(MorphSpec());
  AnswerLaunches();
  v1::WorkerStatus r0 = Worker(id, 0, false, 127);
  r0.set_error("varuna-agent: the worker user varuna cannot run /opt/w: No such file or directory");
  Beat("a", {r0, Worker(id, 1, true)});
  Tick();
  EXPECT_FALSE(Job(id).morphing());
  Advance(absl::Seconds(4));
  Beat("a", {r0, Worker(id, 1, true)});
  Tick();
  EXPECT_TRUE(Job(id).morphing());
  EXPECT_THAT(Job(id).rec.morph().record().reason(), HasSubstr("cannot run /opt/w"));
}

TEST_F(JobControllerTest, CancelStopsTheWorkersAndEndsWhenTheyAreGone) {
  AddNode("a", 2);
  const std::string id = Submit(Spec());
  AnswerLaunches();
  ASSERT_TRUE(jobs_ctl_->Cancel(id, "alice").ok());
  EXPECT_EQ(State(id), v1::CANCELLING);
  EXPECT_EQ(Job(id).info().cancelled_by(), "alice");
  ASSERT_EQ(agents_.stops.size(), 1u);
  EXPECT_EQ(agents_.stops[0].req.grace_ms(), 5000);
  // A lost Stop is sent again after 5 s.
  Advance(absl::Seconds(6));
  Beat("a", RanksOn(id, "a", true));
  Tick();
  EXPECT_EQ(agents_.stops.size(), 2u);
  Beat("a", RanksOn(id, "a", false, 0));
  EXPECT_EQ(State(id), v1::CANCELLED);
  // Cancelling again changes nothing.
  EXPECT_EQ(jobs_ctl_->Cancel(id, "bob")->state(), v1::CANCELLED);
}

TEST_F(JobControllerTest, SubmitIsIdempotentByRequestId) {
  AddNode("a", 4);
  const std::string a = Submit(Spec(), "req-1");
  const std::string b = Submit(Spec(), "req-1");
  EXPECT_EQ(a, b);
  EXPECT_EQ(jobs_->order().size(), 1u);
  v1::SubmitRequest long_id;
  long_id.set_spec_yaml(Spec());
  long_id.set_request_id(std::string(129, 'x'));
  EXPECT_THAT(JobAdmission::Admit(long_id).status().message(), HasSubstr("request_id"));
}

// Issue 47: request ids were one namespace for every tenant, so bob repeating alice's id got
// her job's whole record back (and taking an id first blocked her submits). Now an id is the
// submitter's own.
TEST_F(JobControllerTest, ARequestIdIsTheSubmittersOwn) {
  AddNode("a", 4);
  const std::string alices = Submit(Spec(), "req-1", "alice");
  const std::string bobs = Submit(Spec(), "req-1", "bob");
  EXPECT_NE(alices, bobs);
  EXPECT_EQ(Job(bobs).info().submitted_by(), "bob");
  EXPECT_EQ(Submit(Spec(), "req-1", "alice"), alices);
  EXPECT_EQ(Submit(Spec(), "req-1", "bob"), bobs);
  EXPECT_EQ(jobs_->order().size(), 2u);
  // After a restart (a requeued Slurm allocation submits again with its request id) the ids
  // are still each submitter's own.
  Build();
  ASSERT_TRUE(nodes_->Load().ok());
  ASSERT_TRUE(jobs_->Load(clock_.Now()).ok());
  EXPECT_EQ(Submit(Spec(), "req-1", "bob"), bobs);
  EXPECT_EQ(Submit(Spec(), "req-1", "alice"), alices);
  EXPECT_NE(Submit(Spec(), "req-1", "carol"), alices);
  EXPECT_EQ(jobs_->order().size(), 3u);
}

// Note [Tensor-parallel placement] in manager/nodes/placement.cc: a tp job is planned in groups of
// tp_size slots on one node, each group's processes get consecutive ranks there, and every
// A tensor-parallel group larger than every node waits, saying so (not "waiting for slots").
TEST_F(JobControllerTest, ATensorParallelGroupLargerThanEveryNodeSaysSo) {
  AddNode("a", 1);
  AddNode("b", 1);
  const std::string id = Submit(Spec("parallel: {stages: 1, tp_size: 2}"));
  EXPECT_EQ(State(id), v1::PENDING);
  EXPECT_THAT(Job(id).info().reason(),
              HasSubstr("waiting for a node of at least 2 slots (parallel.tp_size"));
  EXPECT_THAT(Job(id).info().reason(), HasSubstr("the largest schedulable node has 1"));
}

// launch says tp_size (no in-place morphs for tp jobs).
TEST_F(JobControllerTest, TensorParallelJobsArePlacedInGroupsOnOneNode) {
  AddNode("a", 3);  // one group of two (and a slot no group can use)
  AddNode("b", 1);  // none
  AddNode("c", 2);  // one
  const std::string id = Submit(Spec("parallel: {stages: 1, tp_size: 2}"));
  ASSERT_EQ(State(id), v1::STARTING) << Job(id).info().reason();
  const v1::JobInfo& info = Job(id).info();
  EXPECT_EQ(info.tp_size(), 2);
  EXPECT_EQ(info.stages(), 1);
  EXPECT_EQ(info.replicas(), 2);
  EXPECT_EQ(info.slots(), 4);
  ASSERT_EQ(info.placement_size(), 4);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(info.placement(r).rank(), r);
    EXPECT_EQ(info.placement(r).node(), r < 2 ? "a" : "c");
    EXPECT_EQ(info.placement(r).local_rank(), r % 2);
  }
  agents_.AnswerLaunches(29555);  // rank 0's node first (Note [Launch order]), then the rest
  loop_.Run();
  ASSERT_EQ(agents_.launches.size(), 2u);
  for (const auto& l : agents_.launches) {
    EXPECT_EQ(l.req.tp_size(), 2);
    EXPECT_EQ(l.req.world_size(), 4);
    EXPECT_EQ(l.req.stage_to_rank_map(), "0,1;");  // positions
    EXPECT_FALSE(l.req.in_place());
    EXPECT_EQ(l.req.ranks_size(), 2);
  }
  AnswerLaunches();
  EXPECT_EQ(State(id), v1::RUNNING);
  // Two single free slots (a's and b's) hold no group: the next job waits and says why.
  const std::string more = Submit(Spec("parallel: {stages: 1, tp_size: 2}"));
  EXPECT_EQ(State(more), v1::PENDING);
  EXPECT_THAT(Job(more).info().reason(), HasSubstr("parallel.tp_size = 2"));
}

TEST_F(JobControllerTest, PendingJobWaitsForSlotsThenStarts) {
  AddNode("a", 1);
  const std::string id = Submit(Spec());
  EXPECT_EQ(State(id), v1::PENDING);
  EXPECT_THAT(Job(id).info().reason(), HasSubstr("waiting for slots"));
  AddNode("b", 1);
  Tick();
  EXPECT_EQ(State(id), v1::STARTING);
}

TEST_F(JobControllerTest, RanksTheAgentNoLongerReportsAreChargedToTheJob) {
  AddNode("a", 1);
  AddNode("b", 1);
  const std::string id = Submit(Spec("parallel: {stages: 2}\nmorphing: false"));
  AnswerLaunches();
  const std::string second = Job(id).info().placement(1).node();
  const std::string first = Job(id).info().placement(0).node();
  Advance(absl::Seconds(3));
  Beat(first, RanksOn(id, first, true));
  Beat(second, {});  // its agent restarted: rank 1 is gone without an exit
  Advance(absl::Seconds(3));
  Beat(first, RanksOn(id, first, true));
  Beat(second, {});
  Tick();
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_THAT(Job(id).info().reason(), HasSubstr("no longer known to its agent"));
}

TEST_F(JobControllerTest, RecoveredJobResendsItsLaunches) {
  AddNode("a", 2);
  const std::string id = Submit(Spec());
  ASSERT_EQ(State(id), v1::STARTING);
  agents_.launches.clear();
  Build();  // a manager restart on the same state directory
  ASSERT_TRUE(nodes_->Load().ok());
  ASSERT_TRUE(jobs_->Load(clock_.Now()).ok());
  jobs_ctl_->ResumeRecovered();
  loop_.Run();
  EXPECT_EQ(State(id), v1::STARTING);
  EXPECT_EQ(agents_.launches.size(), 1u);
  Beat("a", {});
  AnswerLaunches();
  EXPECT_EQ(State(id), v1::RUNNING);
}

TEST_F(JobControllerTest, StepSeriesIsReadInPagesWhateverTheRecordsWeigh) {
  // A program that reports thousands of per-stage values every step: the series is still
  // readable, one bounded page at a time (varunactl metrics follows the pages).
  AddNode("a", 2);
  const std::string id = Submit(Spec());
  AnswerLaunches();
  v1::WorkerStatus w = Worker(id, 0, true);
  for (int s = 1; s <= 20; ++s) {
    v1::StepMetrics* m = w.add_steps();
    m->set_step(s);
    for (int k = 0; k < 4000; ++k) {
      m->add_stage_busy_s(k);
      m->add_stage_wait_s(k);
    }
  }
  Beat("a", {w, Worker(id, 1, true)});
  v1::GetMetricsRequest req;
  req.set_job_id(id);
  std::vector<int64_t> seen;
  int pages = 0;
  for (;; ++pages) {
    auto page = steps_->Get(req);
    ASSERT_TRUE(page.ok());
    if (page->steps().empty()) break;
    EXPECT_LE(page->ByteSizeLong(), StepSeries::kMaxReplyBytes + 100000);
    for (const auto& r : page->steps()) seen.push_back(r.step());
    req.set_after_step(seen.back());
  }
  EXPECT_GT(pages, 1);
  ASSERT_EQ(seen.size(), 20u);
  for (int s = 1; s <= 20; ++s) EXPECT_EQ(seen[s - 1], s);
}

// Note [Retention] (job_table.cc): specs live in the store, not in memory; a submitter's
// pending jobs are capped; finished jobs are pruned beyond the count and the age.
TEST_F(JobControllerTest, SpecsAreStoredNotHeldAndLaunchesReadThemBack) {
  AddNode("a", 2);
  const std::string id = Submit(Spec());
  EXPECT_TRUE(Job(id).rec.spec_yaml().empty());
  ASSERT_FALSE(agents_.launches.empty());
  EXPECT_EQ(agents_.launches[0].req.spec_yaml(), Spec());
  auto stored = store_->LoadSpec(id);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(*stored, Spec());
  Build();  // a restart reads the spec back from the store
  ASSERT_TRUE(jobs_->Load(clock_.Now()).ok());
  EXPECT_EQ(Job(id).spec.train.steps, 20);
}

// Note [Records on load] (job_table.cc): a record that does not parse, one that parses into
// nonsense, a spec that no longer parses: each job loads FAILED naming its record, the rest of
// the cluster loads, and a bad node record is dropped (its agent registers again).
TEST_F(JobControllerTest, BadRecordsAreQuarantinedAndTheRestLoads) {
  AddNode("a", 2);
  const std::string good = Submit(Spec()), torn = Submit(Spec()), odd = Submit(Spec()),
                    badspec = Submit(Spec());
  v1::JobRecord nonsense = Job(odd).rec;
  nonsense.mutable_info()->set_id("not-a-number");
  ASSERT_TRUE(store_->SaveJob(nonsense).ok());  // saved under its new id...
  ASSERT_TRUE(store_->DeleteJob(odd).ok());     // ...and no longer under the old one
  ASSERT_TRUE(store_->SaveSpec(badspec, "model: [unclosed").ok());
  v1::NodeRecord huge;
  huge.set_name("");
  huge.set_slots(2147483647);
  ASSERT_TRUE(store_->SaveNode(huge).ok());
  Build();
  {  // bytes that are no JobRecord, as a torn or hostile write would leave
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((config_.state_dir + "/manager.db").c_str(), &db), SQLITE_OK);
    const std::string sql =
        absl::StrCat("UPDATE jobs SET record = x'ffffffff0a' WHERE id = '", torn, "'");
    ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  ASSERT_TRUE(nodes_->Load().ok());
  ASSERT_TRUE(jobs_->Load(clock_.Now()).ok()) << "one bad record does not stop the manager";
  EXPECT_EQ(nodes_->Find(""), nullptr);
  EXPECT_NE(nodes_->Find("a"), nullptr);
  EXPECT_NE(State(good), v1::FAILED);
  EXPECT_EQ(State(torn), v1::FAILED);
  EXPECT_THAT(Job(torn).info().reason(),
              HasSubstr(absl::StrCat("table jobs row ", torn, " (5 bytes) does not parse")));
  EXPECT_EQ(State(badspec), v1::FAILED);
  EXPECT_THAT(Job(badspec).info().reason(), HasSubstr("its spec does not parse"));
  const std::string renamed = absl::StrCat(Job(good).rec.seq() + 2);  // odd's seq, not its name
  EXPECT_EQ(State(renamed), v1::FAILED);
  EXPECT_THAT(Job(renamed).info().reason(), HasSubstr("is not its sequence number"));
  // Quarantined records are saved as what they now are: the next load is clean.
  Build();
  ASSERT_TRUE(nodes_->Load().ok());
  ASSERT_TRUE(jobs_->Load(clock_.Now()).ok());
  EXPECT_EQ(State(torn), v1::FAILED);
}

TEST_F(JobControllerTest, PendingJobsAreCappedPerSubmitter) {
  config_.max_pending_jobs_per_user = 2;
  Build();  // no nodes: everything stays pending
  v1::SubmitRequest req;
  req.set_spec_yaml(Spec());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(jobs_ctl_->Submit(req, *JobAdmission::Admit(req), "alice").ok());
  }
  auto refused = jobs_ctl_->Submit(req, *JobAdmission::Admit(req), "alice");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("user 'alice'"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("max_pending_jobs_per_user"));
  EXPECT_TRUE(jobs_ctl_->Submit(req, *JobAdmission::Admit(req), "bob").ok());  // others may
}

TEST_F(JobControllerTest, FinishedJobsArePrunedByCountAndAge) {
  config_.max_pending_jobs_per_user = 1000;
  Build();
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(Submit(Spec()));
    ASSERT_TRUE(jobs_ctl_->Cancel(ids.back(), "").ok());
    Advance(absl::Hours(1));
  }
  const std::string pending = Submit(Spec());
  // Keep 3 finished: the two oldest go, with their records and specs.
  auto pruned = jobs_->Prune(clock_.Now(), 3, absl::ZeroDuration());
  EXPECT_EQ(pruned, (std::vector<std::string>{ids[0], ids[1]}));
  EXPECT_EQ(jobs_->Find(ids[0]), nullptr);
  EXPECT_FALSE(store_->LoadSpec(ids[0]).ok());
  EXPECT_NE(jobs_->Find(ids[2]), nullptr);
  // By age: finished more than 90 minutes ago (ids[2] 3 h, ids[3] 2 h; ids[4] 1 h).
  pruned = jobs_->Prune(clock_.Now(), 1000, absl::Minutes(90));
  EXPECT_EQ(pruned, (std::vector<std::string>{ids[2], ids[3]}));
  EXPECT_NE(jobs_->Find(ids[4]), nullptr);
  EXPECT_NE(jobs_->Find(pending), nullptr);  // never a job that has not finished
  Build();                                   // and they stay gone after a restart
  ASSERT_TRUE(jobs_->Load(clock_.Now()).ok());
  EXPECT_EQ(jobs_->Find(ids[0]), nullptr);
  EXPECT_NE(jobs_->Find(ids[4]), nullptr);
}

// A job's stragglers: settings valid alone can disagree with the manager's defaults once
// merged (slow_below 0.95 above the default recovered_above 0.9): refused at submit, named.
TEST_F(JobControllerTest, StragglerSettingsMergedWithTheDefaultsAreChecked) {
  v1::SubmitRequest req;
  req.set_spec_yaml(Spec("parallel: {stages: 2}\nstragglers: {slow_below: 0.95}"));
  auto spec = JobAdmission::Admit(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto info = jobs_ctl_->Submit(req, *std::move(spec), "");
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("recovered_above"));
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("manager's defaults"));
  req.set_spec_yaml(
      Spec("parallel: {stages: 2}\nstragglers: {slow_below: 0.95, recovered_above: 0.97}"));
  auto ok = JobAdmission::Admit(req);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(jobs_ctl_->Submit(req, *std::move(ok), "").ok());
}

}  // namespace
}  // namespace varuna
