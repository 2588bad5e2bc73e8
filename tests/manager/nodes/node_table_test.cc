// The node table on its own: liveness by missed heartbeats, draining, peer limits, restarts.

#include "manager/nodes/node_table.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/manager/controller_fixture.h"

namespace varuna {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class NodeTableTest : public testing::ControllerFixture {};

TEST_F(NodeTableTest, AliveThenSuspectThenDeadByMissedHeartbeatsThenBack) {
  AddNode("a", 2);
  const NodeTable::Node* a = nodes_->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(nodes_->Schedulable(*a));
  node_events_.clear();
  Advance(absl::Seconds(3) + absl::Milliseconds(1));  // suspect_after_missed = 3
  nodes_->Tick([](const std::string&) { return 0; });
  EXPECT_TRUE(a->suspect);
  EXPECT_FALSE(a->dead);
  EXPECT_FALSE(nodes_->Schedulable(*a));
  Advance(absl::Seconds(7));  // dead_after_missed = 10
  nodes_->Tick([](const std::string&) { return 0; });
  EXPECT_TRUE(a->dead);
  EXPECT_THAT(node_events_, ::testing::Contains("lost a"));
  Beat("a", {});
  EXPECT_FALSE(a->dead);
  EXPECT_FALSE(a->suspect);
  EXPECT_TRUE(nodes_->Schedulable(*a));
  EXPECT_THAT(node_events_, ::testing::Contains("joined a"));
}

TEST_F(NodeTableTest, AMachineSourceLosesANodeAtOnceAndForgetsOnlyAnIdleOne) {
  AddNode("a", 2);
  AddNode("b", 2);
  node_events_.clear();
  nodes_->Lose("a", "its Slurm job 4 is PREEMPTED");
  EXPECT_TRUE(nodes_->Find("a")->dead);
  EXPECT_THAT(node_events_, ElementsAre("lost a"));
  nodes_->Lose("a", "again");  // already DEAD: nothing more
  nodes_->Lose("ghost", "unknown");
  EXPECT_EQ(node_events_.size(), 1u);
  nodes_->Forget("b", /*used=*/2);  // runs ranks: kept
  EXPECT_NE(nodes_->Find("b"), nullptr);
  nodes_->Forget("b", 0);
  EXPECT_EQ(nodes_->Find("b"), nullptr);
  EXPECT_THAT(node_events_, ::testing::Contains("node_forgotten b"));
}

TEST_F(NodeTableTest, TheHeartbeatPeriodGrowsWithTheClusterAndTheTimeoutsWithIt) {
  config_.max_heartbeats_per_s = 2;  // 1 s period up to 2 nodes
  Build();
  AddNode("a", 1);
  AddNode("b", 1);
  EXPECT_EQ(nodes_->heartbeat_period(), absl::Seconds(1));
  AddNode("c", 1);
  AddNode("d", 1);
  EXPECT_EQ(nodes_->heartbeat_period(), absl::Seconds(2));  // 4 nodes at 2/s
  node_events_.clear();
  Advance(absl::Seconds(11));  // DEAD at 1 s periods, not at 2 s
  nodes_->Tick([](const std::string&) { return 0; });
  EXPECT_FALSE(nodes_->Find("a")->dead);
  EXPECT_TRUE(nodes_->Find("a")->suspect);
  Advance(absl::Seconds(10));  // past dead_after_missed = 10 periods of 2 s
  nodes_->Tick([](const std::string&) { return 0; });
  EXPECT_TRUE(nodes_->Find("a")->dead);
}

TEST_F(NodeTableTest, DrainTellsTheListenerAndUndrainJoinsAgain) {
  AddNode("a", 2);
  node_events_.clear();
  ASSERT_TRUE(nodes_->Drain("a", false).ok());
  EXPECT_FALSE(nodes_->Schedulable(*nodes_->Find("a")));
  EXPECT_THAT(nodes_->DrainReason(*nodes_->Find("a")), HasSubstr("drained"));
  ASSERT_TRUE(nodes_->Drain("a", true).ok());
  EXPECT_TRUE(nodes_->Schedulable(*nodes_->Find("a")));
  EXPECT_THAT(node_events_,
              ElementsAre("node_drained a", "leaving a", "node_undrained a", "joined a"));
  EXPECT_EQ(nodes_->Drain("nope", false).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(NodeTableTest, UnknownNodeHeartbeatIsNotFoundSoTheAgentRegistersAgain) {
  EXPECT_EQ(nodes_->Heartbeat("ghost").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(NodeTableTest, RegistrationIsBoundedByThePeerLimits) {
  config_.max_nodes = 2;
  config_.max_slots_per_node = 8;
  Build();
  AddNode("a", 1);
  AddNode("b", 1);
  v1::RegisterRequest c;
  c.set_name("c");
  c.set_address("c:7071");
  c.set_slots(1);
  EXPECT_FALSE(nodes_->Register(c, [](const std::string&) { return 0; }).ok());
  v1::RegisterRequest big;
  big.set_name("a");
  big.set_address("a:7071");
  big.set_slots(9);
  EXPECT_FALSE(nodes_->Register(big, [](const std::string&) { return 0; }).ok());
}

TEST_F(NodeTableTest, TwoLiveNodesCannotShareAnAddress) {
  AddNode("a", 1);
  const std::string address = nodes_->Find("a")->rec.address();
  v1::RegisterRequest thief;
  thief.set_name("mallory");
  thief.set_address(address);
  thief.set_slots(1);
  auto refused = nodes_->Register(thief, [](const std::string&) { return 0; });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("belongs to live node 'a'"));
  EXPECT_EQ(nodes_->Find("mallory"), nullptr);
  // The same node registering again (an agent restart) is fine; once 'a' is DEAD its address
  // is free for another name.
  v1::RegisterRequest again;
  again.set_name("a");
  again.set_address(address);
  again.set_slots(1);
  EXPECT_TRUE(nodes_->Register(again, [](const std::string&) { return 0; }).ok());
  Advance(absl::Seconds(11));
  nodes_->Tick([](const std::string&) { return 0; });
  ASSERT_TRUE(nodes_->Find("a")->dead);
  EXPECT_TRUE(nodes_->Register(thief, [](const std::string&) { return 0; }).ok());
}

TEST_F(NodeTableTest, NodesSurviveARestartAsSuspectUntilTheyHeartbeat) {
  AddNode("a", 3);
  Build();
  ASSERT_TRUE(nodes_->Load().ok());
  const NodeTable::Node* a = nodes_->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->rec.slots(), 3);
  EXPECT_TRUE(a->suspect);
  Beat("a", {});
  EXPECT_TRUE(nodes_->Schedulable(*nodes_->Find("a")));
}

}  // namespace
}  // namespace varuna
