#include "agent/preemption.h"

#include <gtest/gtest.h>

namespace varuna {
namespace {

TEST(PreemptionReplyTest, UnderstandsTheThreeClouds) {
  // Azure Scheduled Events.
  auto azure = ParsePreemptionReply(
      200, R"({"DocumentIncarnation": 3, "Events": [{"EventId": "E1", "EventType": "Preempt",
           "ResourceType": "VirtualMachine", "Resources": ["vm1"], "EventStatus": "Scheduled",
           "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}]})");
  ASSERT_TRUE(azure.has_value());
  EXPECT_EQ(azure->source(), "azure");
  EXPECT_EQ(azure->deadline_ms(), int64_t{1474309787} * 1000);
  EXPECT_FALSE(ParsePreemptionReply(
                   200, R"({"DocumentIncarnation": 1, "Events": [{"EventType": "Reboot"}]})")
                   .has_value());
  EXPECT_FALSE(
      ParsePreemptionReply(200, R"({"DocumentIncarnation": 0, "Events": []})").has_value());
  // GCE instance/preempted.
  auto gce = ParsePreemptionReply(200, "TRUE");
  ASSERT_TRUE(gce.has_value());
  EXPECT_EQ(gce->source(), "gce");
  EXPECT_FALSE(ParsePreemptionReply(200, "FALSE").has_value());
  // AWS spot/instance-action: 404 until the notice.
  EXPECT_FALSE(ParsePreemptionReply(404, "Not Found").has_value());
  auto aws =
      ParsePreemptionReply(200, R"({"action": "terminate", "time": "2017-09-18T08:22:00Z"})");
  ASSERT_TRUE(aws.has_value());
  EXPECT_EQ(aws->source(), "aws");
  EXPECT_EQ(aws->deadline_ms(), int64_t{1505722920} * 1000);
}

TEST(PreemptionReplyTest, GarbageIsNoNotice) {
  for (const char* body :
       {"", "{", "[1,2", "{\"Events\": 5}", "{\"Events\": [7, \"x\"]}", "{\"action\": [1]}",
        "{\"action\": \"dance\"}", "<html>", "{\"Events\": [{\"EventType\": {\"a\": 1}}]}"}) {
    EXPECT_FALSE(ParsePreemptionReply(200, body).has_value()) << body;
  }
}

TEST(PreemptionReplyTest, BadUrlsAreRefused) {
  EXPECT_FALSE(HttpGet("https://169.254.169.254/x", absl::Seconds(1)).ok());
  EXPECT_FALSE(HttpGet("http://127.0.0.1:1/nothing-listens", absl::Seconds(1)).ok());
}

}  // namespace
}  // namespace varuna
