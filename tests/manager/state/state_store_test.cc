// The state database on its own: what a restarted manager reads back, and the step
// series' bound (Note [Step series]).

#include "manager/state/state_store.h"

#include <stdlib.h>

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace varuna {
namespace {

class StateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/store_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto s = StateStore::Open(dir_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Reopen() {
    store_.reset();
    auto s = StateStore::Open(dir_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }
  std::string dir_;
  std::unique_ptr<StateStore> store_;
};

TEST_F(StateStoreTest, JobsNodesAndEventsSurviveAReopen) {
  v1::JobRecord job;
  job.set_seq(7);
  job.mutable_info()->set_id("7");
  job.mutable_info()->set_state(v1::RUNNING);
  ASSERT_TRUE(store_->SaveJob(job).ok());
  job.mutable_info()->set_state(v1::SUCCEEDED);
  ASSERT_TRUE(store_->SaveJob(job).ok());  // a save replaces the record
  v1::NodeRecord node;
  node.set_name("a");
  node.set_slots(4);
  ASSERT_TRUE(store_->SaveNode(node).ok());
  v1::Event e;
  e.set_seq(1);
  e.set_kind("job_state");
  ASSERT_TRUE(store_->SaveEvent(e).ok());
  Reopen();
  auto jobs = store_->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].info().state(), v1::SUCCEEDED);
  auto nodes = store_->LoadNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].slots(), 4);
  ASSERT_TRUE(store_->DeleteNode("a").ok());
  EXPECT_TRUE(store_->LoadNodes()->empty());
  auto events = store_->LoadEvents(10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].kind(), "job_state");
}

TEST_F(StateStoreTest, StepSeriesIsThinnedToItsBoundKeepingTheNewestSteps) {
  // As the manager does: each heartbeat's batch saved, then the series thinned.
  for (int batch = 0; batch < 100; ++batch) {
    std::vector<v1::StepRecord> steps;
    for (int s = batch * 10 + 1; s <= batch * 10 + 10; ++s) {
      v1::StepRecord r;
      r.set_step(s);
      r.set_loss(1000 - s);
      r.set_merged(1);
      steps.push_back(r);
    }
    ASSERT_TRUE(store_->SaveSteps("1", steps).ok());
    ASSERT_TRUE(store_->ThinSteps("1", 100).ok());
  }
  auto kept = store_->LoadSteps("1", 0, 100000);
  ASSERT_TRUE(kept.ok());
  EXPECT_LE(kept->size(), 110u);
  EXPECT_GE(kept->size(), 50u);
  EXPECT_EQ(kept->back().step(), 1000);  // the newest step at full resolution
  int64_t merged = 0;
  for (const auto& r : *kept) merged += r.merged();
  EXPECT_EQ(merged, 1000);  // every step is in some record
}

}  // namespace
}  // namespace varuna
