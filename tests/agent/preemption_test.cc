#include "agent/preemption.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace varuna {
namespace {

const std::vector<std::string> kMe = {"", "node1", "vm1"};

TEST(PreemptionReplyTest, UnderstandsTheThreeClouds) {
  // Azure Scheduled Events.
  auto azure = ParsePreemptionReply(
      200, R"({"DocumentIncarnation": 3, "Events": [{"EventId": "E1", "EventType": "Preempt",
           "ResourceType": "VirtualMachine", "Resources": ["vm1"], "EventStatus": "Scheduled",
           "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}]})",
      kMe);
  ASSERT_TRUE(azure.has_value());
  EXPECT_EQ(azure->source(), "azure");
  EXPECT_EQ(azure->deadline_ms(), int64_t{1474309787} * 1000);
  EXPECT_FALSE(ParsePreemptionReply(
                   200, R"({"DocumentIncarnation": 1, "Events": [{"EventType": "Reboot"}]})", kMe)
                   .has_value());
  EXPECT_FALSE(
      ParsePreemptionReply(200, R"({"DocumentIncarnation": 0, "Events": []})", kMe).has_value());
  // GCE instance/preempted.
  auto gce = ParsePreemptionReply(200, "TRUE", kMe);
  ASSERT_TRUE(gce.has_value());
  EXPECT_EQ(gce->source(), "gce");
  EXPECT_FALSE(ParsePreemptionReply(200, "FALSE", kMe).has_value());
  // AWS spot/instance-action: 404 until the notice.
  EXPECT_FALSE(ParsePreemptionReply(404, "Not Found", kMe).has_value());
  auto aws =
      ParsePreemptionReply(200, R"({"action": "terminate", "time": "2017-09-18T08:22:00Z"})", kMe);
  ASSERT_TRUE(aws.has_value());
  EXPECT_EQ(aws->source(), "aws");
  EXPECT_EQ(aws->deadline_ms(), int64_t{1505722920} * 1000);
}

// Note [Whose notice] (agent/preemption.cc): an event for another VM of the scale set, or one
// that already ended, is no notice for this machine.
TEST(PreemptionReplyTest, AzureEventsOfOtherVmsOrThatEndedAreNotOurs) {
  auto event = [](const std::string& resources, const std::string& status) {
    return ParsePreemptionReply(
        200,
        R"({"DocumentIncarnation": 5, "Events": [{"EventId": "E9", "EventType": "Preempt",
             "ResourceType": "VirtualMachine", "Resources": )" +
            resources + R"(, "EventStatus": ")" + status + R"("}]})",
        kMe);
  };
  EXPECT_TRUE(event(R"(["vm7", "VM1"])", "Scheduled").has_value());
  EXPECT_TRUE(event(R"(["node1"])", "Started").has_value());
  EXPECT_FALSE(event(R"(["vm7"])", "Scheduled").has_value());
  EXPECT_FALSE(event(R"([])", "Scheduled").has_value());
  EXPECT_FALSE(event(R"(["vm1"])", "Completed").has_value());
  EXPECT_FALSE(event(R"(["vm1"])", "Canceled").has_value());
  EXPECT_FALSE(event(R"("vm1")", "Scheduled").has_value());  // not a list
}

TEST(PreemptionReplyTest, GarbageIsNoNotice) {
  for (const char* body :
       {"", "{", "[1,2", "{\"Events\": 5}", "{\"Events\": [7, \"x\"]}", "{\"action\": [1]}",
        "{\"action\": \"dance\"}", "<html>", "{\"Events\": [{\"EventType\": {\"a\": 1}}]}"}) {
    EXPECT_FALSE(ParsePreemptionReply(200, body, kMe).has_value()) << body;
  }
}

TEST(PreemptionReplyTest, BadUrlsAreRefused) {
  EXPECT_FALSE(HttpGet("https://169.254.169.254/x", absl::Seconds(1)).ok());
  EXPECT_FALSE(HttpGet("http://127.0.0.1:1/nothing-listens", absl::Seconds(1)).ok());
}

// A metadata endpoint that trickles its reply a byte at a time cannot hold the poll past its
// deadline (and with it the agent's shutdown).
TEST(HttpGetTest, ATricklingEndpointIsCutOffAtTheDeadline) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  std::atomic<bool> done{false};
  std::thread server([&] {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    const std::string head = "HTTP/1.0 200 OK\r\n";
    send(fd, head.data(), head.size(), MSG_NOSIGNAL);
    for (int i = 0; i < 100 && !done; ++i) {  // up to 10 s, one byte per 100 ms
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      send(fd, "x", 1, MSG_NOSIGNAL);
    }
    close(fd);
  });
  const auto start = std::chrono::steady_clock::now();
  auto reply =
      HttpGet(absl::StrCat("http://127.0.0.1:", ntohs(addr.sin_port), "/x"), absl::Seconds(1));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  done = true;
  server.join();
  close(listener);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_LT(took, 5.0);  // the trickle alone would take 10 s
}

// Shutdown never waits on a poll: the cancel fd ends one in flight at once, however long its
// deadline.
TEST(HttpGetTest, TheCancelFdEndsAPollInFlight) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(listen(listener, 1), 0);  // accepts (the kernel does), never answers
  const int cancel = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const uint64_t one = 1;
    (void)!write(cancel, &one, sizeof one);
  });
  const auto start = std::chrono::steady_clock::now();
  auto reply = HttpGet(absl::StrCat("http://127.0.0.1:", ntohs(addr.sin_port), "/x"),
                       absl::Seconds(30), cancel);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  canceller.join();
  close(cancel);
  close(listener);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kCancelled) << reply.status();
  EXPECT_LT(took, 2.0);
}

}  // namespace
}  // namespace varuna
