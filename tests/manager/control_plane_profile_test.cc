// The control plane over loopback gRPC: profile jobs and the plans they feed (fixture:
// control_plane_fixture.h).

#include "tests/manager/control_plane_fixture.h"

namespace varuna {
namespace {

// docs/autoconfig.md: a profile job stores the profile its rank 0 measured; later jobs of the
// same model are planned by AutoConfig with it (schedule and stage boundaries in the launch,
// the predicted step time in status). Before that, the placement rule, said in status.
TEST_F(ControlPlaneTest, AProfileJobStoresAProfileThatPlansLaterJobs) {
  AddAgent("a1", 2);
  AddAgent("a2", 2);
  const std::string auto_spec =
      Spec("parallel: {stages: auto, replicas: auto, micro_batch: auto, schedule: auto}");
  auto plain = Submit(auto_spec);
  ASSERT_THAT(plain.status(), IsOk());
  ASSERT_TRUE(WaitState(plain->id(), v1::RUNNING));
  EXPECT_THAT(Get(plain->id()).plan_source(), HasSubstr("placement rule (no profile of 'gpt"));
  EXPECT_EQ(Get(plain->id()).predicted_step_s(), 0);
  Cancel(plain->id());
  // The stops reach the agents asynchronously: beat once every worker is gone, not before (a
  // beat that ran ahead of an agent's stop left its exits unreported, and the wait timed out).
  ASSERT_TRUE(Eventually([&] { return TotalAlive() == 0; }));
  BeatAll();
  ASSERT_TRUE(WaitState(plain->id(), v1::CANCELLED));

  grpc::ClientContext ctx;
  v1::SubmitRequest req;
  req.set_spec_yaml(auto_spec);
  req.set_profile(true);
  v1::SubmitResponse resp;
  ASSERT_TRUE(jobs_->Submit(&ctx, req, &resp).ok());
  const std::string pid = resp.job().id();
  ASSERT_TRUE(WaitState(pid, v1::RUNNING)) << Get(pid).DebugString();
  EXPECT_TRUE(Get(pid).profile_job());
  EXPECT_EQ(Get(pid).slots(), 4);  // one replica per slot: links between all of them

  // Rank 0 writes the profile where the agent told it to and says so in its progress file.
  auto spec = ParseJobSpec(auto_spec);
  ASSERT_THAT(spec.status(), IsOk());
  auto profile = BuiltinProfile(*spec);
  ASSERT_THAT(profile.status(), IsOk());
  profile->set_device("cpu");
  profile->set_host("test");
  bool wrote = false;
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) {
      if (p.spec.env.at("VARUNA_JOB_ID") != pid) continue;
      std::string out;
      for (const auto& arg : p.spec.argv) {
        if (absl::StartsWith(arg, "--profile_out=")) out = arg.substr(strlen("--profile_out="));
      }
      ASSERT_FALSE(out.empty()) << absl::StrJoin(p.spec.argv, " ");
      if (p.spec.env.at("RANK") != "0") continue;
      ASSERT_THAT(WriteProfileFile(out, *profile), IsOk());
      std::ofstream(p.spec.env.at("VARUNA_PROGRESS_FILE"))
          << "{\"profile\": \"" << out << "\"}\n{\"stopped\": true}\n";
      wrote = true;
    }
  }
  ASSERT_TRUE(wrote);
  BeatAll();
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) {
      if (p.spec.env.at("VARUNA_JOB_ID") == pid) a->launcher.Exit(p.pid, 0);
    }
  }
  BeatAll();
  ASSERT_TRUE(WaitState(pid, v1::SUCCEEDED)) << Get(pid).DebugString();

  auto job = Submit(auto_spec);
  ASSERT_THAT(job.status(), IsOk());
  ASSERT_TRUE(WaitState(job->id(), v1::RUNNING));
  const v1::JobInfo info = Get(job->id());
  EXPECT_THAT(info.plan_source(), HasSubstr("profile of gpt layers=4"));
  EXPECT_GT(info.predicted_step_s(), 0);
  ASSERT_EQ(info.boundaries_size(), info.stages() + 1);
  const std::string bounds = absl::StrJoin(info.boundaries(), ",");
  int launched = 0;
  for (auto& a : agents_) {
    for (const auto& p : a->launcher.procs()) {
      if (p.spec.env.at("VARUNA_JOB_ID") != job->id()) continue;
      ++launched;
      EXPECT_THAT(p.spec.argv, ::testing::Contains(absl::StrCat("--schedule=", info.schedule())));
      EXPECT_THAT(p.spec.argv, ::testing::Contains(absl::StrCat("--stage_boundaries=", bounds)));
    }
  }
  EXPECT_EQ(launched, info.slots());

  // varunactl plan's RPCs: the stored profile, and a plan for the slots now.
  grpc::ClientContext c2;
  v1::GetProfileRequest gr;
  gr.set_model_key(ModelKey(spec->model));
  gr.set_precision("fp32");
  v1::GetProfileResponse got;
  ASSERT_TRUE(jobs_->GetProfile(&c2, gr, &got).ok());
  EXPECT_TRUE(got.found());
  EXPECT_EQ(got.profile().host(), "test");
  grpc::ClientContext c3;
  v1::PlanJobRequest pr;
  pr.set_spec_yaml(auto_spec);
  v1::PlanJobResponse planned;
  ASSERT_TRUE(jobs_->PlanJob(&c3, pr, &planned).ok());
  EXPECT_THAT(planned.plans().cost_source(), HasSubstr("profile of"));
}

// A damaged profile from a worker is refused with the reason and stored nowhere.
TEST_F(ControlPlaneTest, ADamagedProfileIsNotStored) {
  AddAgent("a1", 2);
  grpc::ClientContext ctx;
  v1::SubmitRequest req;
  req.set_spec_yaml(Spec("parallel: {stages: auto}"));
  req.set_profile(true);
  v1::SubmitResponse resp;
  ASSERT_TRUE(jobs_->Submit(&ctx, req, &resp).ok());
  const std::string pid = resp.job().id();
  ASSERT_TRUE(WaitState(pid, v1::RUNNING));
  for (const auto& p : agents_[0]->launcher.procs()) {
    if (p.spec.env.at("RANK") != "0") continue;
    std::string out;
    for (const auto& arg : p.spec.argv) {
      if (absl::StartsWith(arg, "--profile_out=")) out = arg.substr(strlen("--profile_out="));
    }
    std::ofstream(out) << "{\"version\": 1, \"segments\": [";
    std::ofstream(p.spec.env.at("VARUNA_PROGRESS_FILE")) << "{\"profile\": \"" << out << "\"}\n";
    // A path other than the one the agent chose is never read.
    std::ofstream(p.spec.env.at("VARUNA_PROGRESS_FILE"), std::ios::app)
        << "{\"profile\": \"/etc/passwd\"}\n";
  }
  BeatAll();
  grpc::ClientContext c2;
  v1::GetProfileRequest gr;
  gr.set_model_key("gpt layers=4 d_model=32 heads=2 seq_len=8 vocab=256");
  gr.set_precision("fp32");
  v1::GetProfileResponse got;
  ASSERT_TRUE(jobs_->GetProfile(&c2, gr, &got).ok());
  EXPECT_FALSE(got.found());
  // The job fails with the reason even though its workers exit 0.
  for (const auto& p : agents_[0]->launcher.procs()) agents_[0]->launcher.Exit(p.pid, 0);
  BeatAll();
  ASSERT_TRUE(WaitState(pid, v1::FAILED));
  EXPECT_THAT(Get(pid).reason(), HasSubstr("no profile stored: unusable profile"));

  // A profile job runs varuna-worker's profiler: an entrypoint is refused at submit.
  grpc::ClientContext c3;
  v1::SubmitRequest bad;
  bad.set_spec_yaml(Spec("parallel: {stages: auto}\nentrypoint: [/bin/true]"));
  bad.set_profile(true);
  v1::SubmitResponse r3;
  const grpc::Status st = jobs_->Submit(&c3, bad, &r3);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("remove the job's entrypoint"));
}

}  // namespace
}  // namespace varuna
