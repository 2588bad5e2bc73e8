// varunactl in process: help generated from the command table (and never contacting the
// manager), usage errors and their exit codes, and a few commands against a fake manager.

#include "ctl/varunactl.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/net/rpc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "varuna/v1/control.grpc.pb.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

// Every command, by group, as `varunactl help` lists them.
const std::vector<std::pair<std::string, std::vector<std::string>>> kGroups = {
    {"Jobs", {"submit", "list", "status", "cancel"}},
    {"Monitoring", {"logs", "events", "metrics"}},
    {"Cluster", {"nodes", "drain", "preempt", "managers"}},
    {"Planning", {"plan", "profile", "data"}},
    {"Other", {"help"}},
};

struct Result {
  int code;
  std::string out;
  std::string err;
};

Result Ctl(const std::vector<std::string>& args, const CtlEnvironment& env = {}) {
  std::ostringstream out, err;
  const int code = RunVarunactl(args, env, out, err);
  return {code, out.str(), err.str()};
}

// A port nothing listens on.
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(HelpTest, ListsEveryCommandUnderItsGroup) {
  const Result r = Ctl({"help"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  size_t last = 0;
  for (const auto& [group, commands] : kGroups) {
    const size_t heading = r.out.find(absl::StrCat("\n", group, ":\n"));
    ASSERT_NE(heading, std::string::npos) << group << "\n" << r.out;
    EXPECT_GT(heading, last) << group;
    last = heading;
    for (const std::string& name : commands) {
      const size_t at = r.out.find(absl::StrCat("\n  ", name, " "), heading);
      ASSERT_NE(at, std::string::npos) << name;
      // Listed before the next group's heading.
      EXPECT_EQ(r.out.find(":\n", heading + group.size() + 2) > at, true) << name;
    }
  }
  EXPECT_THAT(r.out, HasSubstr("status    one job"));
  EXPECT_THAT(r.out, HasSubstr("(alias: describe)"));
  EXPECT_THAT(r.out, HasSubstr("Global flags (every command):\n"));
  EXPECT_THAT(r.out, HasSubstr("-o, --output FORMAT"));
  EXPECT_THAT(r.out, HasSubstr("Exit codes:"));
  // The same list for --help and -h; on stderr with exit 2 when no command is given.
  EXPECT_EQ(Ctl({"--help"}).out, r.out);
  EXPECT_EQ(Ctl({"-h"}).out, r.out);
  const Result none = Ctl({});
  EXPECT_EQ(none.code, kExitUsage);
  EXPECT_EQ(none.err, r.out);
  EXPECT_THAT(none.out, IsEmpty());
}

TEST(HelpTest, CommandHelpIsThatCommandsOnly) {
  const Result help = Ctl({"help", "submit"});
  ASSERT_EQ(help.code, kExitOk) << help.err;
  EXPECT_THAT(help.out, StartsWith("varunactl submit: queue a job"));
  EXPECT_THAT(help.out, HasSubstr("usage: varunactl submit FILE [flags] [-- ENTRYPOINT ARGS...]"));
  for (const char* flag :
       {"--follow", "--set KEY=VALUE", "--name N", "--stages P|auto", "--replicas D|auto",
        "--micro_batch M|auto", "--global_batch B", "--steps S", "--env KEY=VALUE",
        "--env_file FILE", "--configs FILE", "--request_id ID", "--raw", "--manager HOST:PORT",
        "--tls_ca FILE", "--token T"}) {
    EXPECT_THAT(help.out, HasSubstr(flag));
  }
  EXPECT_THAT(help.out, Not(HasSubstr("the agents and their state")));  // nodes' synopsis
  EXPECT_THAT(help.out, Not(HasSubstr("usage: varunactl logs")));
  EXPECT_THAT(help.out, Not(HasSubstr("--rank")));
  // The global flags once.
  const size_t global = help.out.find("Global flags");
  ASSERT_NE(global, std::string::npos);
  EXPECT_EQ(help.out.find("Global flags", global + 1), std::string::npos);
  EXPECT_EQ(help.out.find("--manager"), help.out.rfind("--manager"));
  // `CMD --help`, `CMD -h`, by an alias, and with the rest of a command line: the same text.
  EXPECT_EQ(Ctl({"submit", "--help"}).out, help.out);
  EXPECT_EQ(Ctl({"submit", "job.yaml", "--bogus", "-h"}).out, help.out);
  EXPECT_EQ(Ctl({"--help", "submit"}).out, help.out);
  EXPECT_EQ(Ctl({"describe", "--help"}).out, Ctl({"help", "status"}).out);
  const Result logs = Ctl({"help", "logs"});
  EXPECT_THAT(logs.out, HasSubstr("--rank R"));
  EXPECT_THAT(logs.out, HasSubstr("(default: 0)"));
  EXPECT_THAT(logs.out, HasSubstr("-f, --follow"));
}

TEST(HelpTest, NeedsNoManager) {
  const std::string dead = absl::StrCat("127.0.0.1:", ClosedPort());
  const absl::Time start = absl::Now();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--manager", dead, "help"},
           {"--manager", dead, "submit", "--help"},
           {"--manager", dead, "help", "plan"},
           {"logs", "3", "-h", "--manager", dead},
           {"--manager", "not an address", "--tls_ca", "/nonexistent/ca.pem", "list", "-h"}}) {
    const Result r = Ctl(args, CtlEnvironment{dead, "", ""});
    EXPECT_EQ(r.code, kExitOk) << args.back() << r.err;
    EXPECT_THAT(r.out, HasSubstr("usage: varunactl"));
    EXPECT_THAT(r.err, IsEmpty());
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(UsageTest, ErrorsNameTheProblemAndPointToHelp) {
  const CtlEnvironment env{"127.0.0.1:1", "", ""};
  struct Case {
    std::vector<std::string> args;
    std::string message;
    std::string hint;
  };
  const std::vector<Case> cases = {
      {{"frobnicate"}, "varunactl: unknown command 'frobnicate'\n", "(varunactl help for usage)"},
      {{"help", "frobnicate"}, "unknown command 'frobnicate'", "(varunactl help help for usage)"},
      {{"list", "--bogus"}, "unknown flag '--bogus' for 'list'", "(varunactl help list for usage)"},
      {{"logs", "3", "--rank"}, "--rank needs a value", "(varunactl help logs for usage)"},
      {{"logs", "3", "--rank", "x"}, "--rank needs a rank number", "(varunactl help logs"},
      {{"status"}, "missing job ID", "(varunactl help status for usage)"},
      {{"cancel", "1", "2"}, "unexpected argument '2'", "(varunactl help cancel"},
      {{"preempt", "n1", "--in", "soon"}, "--in needs a duration like 30s or 2m, not 'soon'", ""},
      {{"plan", "job.yaml", "--slots", "2", "--nodes", "2,2"}, "--slots and --nodes exclude", ""},
      {{"plan", "job.yaml", "--nodes", "2,2", "--speeds", "1"},
       "--speeds gives 1 speeds for 2",
       ""},
      {{"plan", "job.yaml", "--nodes", "2,2", "--speeds", "1,0"}, "--speeds needs a speed in", ""},
      {{"plan", "job.yaml", "--speeds", "1"}, "--speeds needs --slots or --nodes", ""},
      {{"-o", "yaml", "list"}, "-o must be table or json, not 'yaml'", "(varunactl help list"},
      {{"--manager", "nocolon", "list"}, "nocolon", "(varunactl help list for usage)"},
      {{"--manager"}, "missing COMMAND", "(varunactl help for usage)"},
  };
  for (const Case& c : cases) {
    const Result r = Ctl(c.args, env);
    EXPECT_EQ(r.code, kExitUsage) << c.message;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_THAT(r.err, HasSubstr(c.hint));
    EXPECT_THAT(r.out, IsEmpty()) << c.message;
  }
  // No manager for a command that needs one; plan with --slots needs none (next test).
  const Result r = Ctl({"list"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("no manager: pass --manager HOST:PORT or set VARUNA_MANAGER"));
}

TEST(UsageTest, UnreachableManagerIsExitThree) {
  const Result r = Ctl({"--manager", absl::StrCat("127.0.0.1:", ClosedPort()), "list"});
  EXPECT_EQ(r.code, kExitUnreachable);
  EXPECT_THAT(r.err, HasSubstr("cannot reach manager"));
  EXPECT_THAT(r.err, HasSubstr("--tls_ca"));
}

// A job file and its data, in a fresh directory.
class JobFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/ctl_XXXXXX";
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
    std::ofstream(dir_ + "/corpus.txt") << std::string(4096, 'x');
    job_ = dir_ + "/job.yaml";
    std::ofstream(job_) << "name: t\nmodel: {kind: gpt, layers: 4, d_model: 32, heads: 2, "
                           "seq_len: 8, vocab: 256}\ndata: {kind: text, path: corpus.txt}\n"
                           "train: {global_batch: 8, steps: 20}\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::string job_;
};

TEST_F(JobFileTest, PlanWithSlotsNeedsNoManager) {
  const Result r = Ctl({"plan", job_, "--slots", "2", "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"plans\""));
  const Result table = Ctl({"plan", job_, "--nodes", "2,1", "--stages", "1"});
  ASSERT_EQ(table.code, kExitOk) << table.err;
  EXPECT_THAT(table.out, HasSubstr("costs: "));
  EXPECT_THAT(table.out, HasSubstr("planned in"));
  // What-if with a straggler: the best plan works around it (Note [Speed-aware plans]).
  const Result slow = Ctl(
      {"plan", job_, "--nodes", "1,1,1", "--speeds", "1,1,0.25", "--stages", "1", "-o", "json"});
  ASSERT_EQ(slow.code, kExitOk) << slow.err;
  EXPECT_THAT(slow.out, HasSubstr("\"topology\""));
  // Without slots it asks the manager, and there is none.
  const Result none = Ctl({"plan", job_});
  EXPECT_EQ(none.code, kExitUsage);
  EXPECT_THAT(none.err, HasSubstr("no manager: pass --slots/--nodes, or --manager HOST:PORT"));
}

// A manager that answers from memory and records what it was sent.
class FakeJobApi final : public v1::JobApi::Service {
 public:
  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req,
                      v1::SubmitResponse* resp) override {
    absl::MutexLock lock(&mu_);
    submitted_.push_back(*req);
    token_ = Token(*ctx);
    resp->mutable_job()->set_id(absl::StrCat(submitted_.size()));
    resp->mutable_job()->set_name("t");
    resp->mutable_job()->set_state(v1::PENDING);
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse* resp) override {
    v1::JobInfo* j = resp->add_jobs();
    j->set_id("1");
    j->set_name("first");
    j->set_state(v1::RUNNING);
    j->set_reason("a peer wrote \x1b]0;owned\x07 here");
    j->set_step(5);
    j->set_total_steps(20);
    // Sharing: a running job the allocator is shrinking, and two pending jobs out of order.
    v1::JobInfo* shrinking = resp->add_jobs();
    shrinking->set_id("2");
    shrinking->set_name("elastic");
    shrinking->set_state(v1::RECONFIGURING);
    shrinking->set_submitted_by("alice");
    shrinking->set_priority("low");
    shrinking->set_slots(6);
    shrinking->set_allocated_slots(2);
    for (const auto& [id, pos] : {std::pair<const char*, int>{"3", 2}, {"4", 1}}) {
      v1::JobInfo* p = resp->add_jobs();
      p->set_id(id);
      p->set_name(absl::StrCat("waits-", id));
      p->set_state(v1::PENDING);
      p->set_submitted_by("bob");
      p->set_priority("high");
      p->set_queue_position(pos);
      p->set_allocated_slots(pos == 1 ? 4 : 0);
      p->set_reason(pos == 1 ? "starting: waiting for 4 of its 4 slots to be freed"
                             : "waiting: user 'bob' is at its quota (4 of 4 slots)");
    }
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                      v1::GetJobResponse* resp) override {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no job with id '", req->job_id(), "'"));
  }

  std::vector<v1::SubmitRequest> submitted() {
    absl::MutexLock lock(&mu_);
    return submitted_;
  }
  std::string token() {
    absl::MutexLock lock(&mu_);
    return token_;
  }

 private:
  static std::string Token(const grpc::ServerContext& ctx) {
    auto it = ctx.client_metadata().find("authorization");
    return it == ctx.client_metadata().end() ? ""
                                             : std::string(it->second.data(), it->second.size());
  }
  absl::Mutex mu_;
  std::vector<v1::SubmitRequest> submitted_ ABSL_GUARDED_BY(mu_);
  std::string token_ ABSL_GUARDED_BY(mu_);
};

class FakeManagerTest : public JobFileTest {
 protected:
  void SetUp() override {
    JobFileTest::SetUp();
    ASSERT_OK_AND_ASSIGN(server_, StartServer("127.0.0.1:0", {&api_}));
    env_.manager = server_.address;
  }
  void TearDown() override {
    server_.server->Shutdown();
    JobFileTest::TearDown();
  }

  FakeJobApi api_;
  StartedServer server_;
  CtlEnvironment env_;
};

TEST_F(FakeManagerTest, ListAsTableAndJson) {
  const Result table = Ctl({"list"}, env_);
  ASSERT_EQ(table.code, kExitOk) << table.err;
  EXPECT_THAT(table.out, StartsWith("ID       NAME"));
  EXPECT_THAT(table.out, HasSubstr("first"));
  EXPECT_THAT(table.out, HasSubstr("5/20"));
  EXPECT_THAT(table.out, HasSubstr("alice      low     RECONFIGURING"));
  EXPECT_THAT(table.out, HasSubstr("6->2"));
  EXPECT_THAT(table.out, HasSubstr("->4"));
  // The queue: pending jobs only, in their positions' order, each with why it waits.
  const Result queue = Ctl({"queue"}, env_);
  ASSERT_EQ(queue.code, kExitOk) << queue.err;
  EXPECT_THAT(queue.out, StartsWith("POS"));
  EXPECT_LT(queue.out.find("waits-4"), queue.out.find("waits-3")) << queue.out;
  EXPECT_THAT(queue.out, HasSubstr("at its quota"));
  EXPECT_THAT(queue.out, Not(HasSubstr("elastic")));
  const Result queue_json = Ctl({"queue", "-o", "json"}, env_);
  ASSERT_EQ(queue_json.code, kExitOk) << queue_json.err;
  EXPECT_LT(queue_json.out.find("\"id\":\"4\""), queue_json.out.find("\"id\":\"3\""));
  // Global flags after the command, as bench/control_plane.sh passes them.
  const Result json = Ctl({"list", "-o", "json"}, env_);
  ASSERT_EQ(json.code, kExitOk) << json.err;
  EXPECT_THAT(json.out, StartsWith("[{"));
  EXPECT_THAT(json.out, HasSubstr("\"name\":\"first\""));
}

TEST_F(FakeManagerTest, WhatOthersWroteCannotDriveTheTerminal) {
  const Result table = Ctl({"list"}, env_);
  ASSERT_EQ(table.code, kExitOk) << table.err;
  EXPECT_EQ(table.out.find('\x1b'), std::string::npos);
  EXPECT_THAT(table.out, HasSubstr("a peer wrote ?]0;owned? here"));
}

TEST_F(FakeManagerTest, ATokenAHeaderCannotCarryIsAnErrorNotACrash) {
  for (const std::string& token :
       std::vector<std::string>{"abc\n", "a b", std::string("a\0b", 3), "t\x7f"}) {
    CtlEnvironment env = env_;
    env.token = token;
    const Result r = Ctl({"list"}, env);
    EXPECT_NE(r.code, kExitOk);
    EXPECT_THAT(r.err, HasSubstr("token")) << r.err;
  }
}

TEST_F(FakeManagerTest, RefusedRequestIsExitOne) {
  const Result r = Ctl({"status", "999"}, env_);
  EXPECT_EQ(r.code, kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("no job with id '999'"));
  EXPECT_THAT(r.err, Not(HasSubstr("for usage")));
}

TEST_F(FakeManagerTest, SubmitSendsTheOverriddenSpec) {
  const Result r = Ctl({"--token", "secret-token", "submit", "--name", "renamed", job_, "--set",
                        "train.steps=7", "--request_id", "req-1", "--", "python3", "-u", "x.py"},
                       env_);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("submitted job 1 (t)\n  status:  varunactl status 1\n"));
  const auto sent = api_.submitted();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].request_id(), "req-1");
  EXPECT_THAT(sent[0].spec_yaml(), HasSubstr("renamed"));
  EXPECT_THAT(sent[0].spec_yaml(), HasSubstr("steps: 7"));
  EXPECT_THAT(sent[0].spec_yaml(), HasSubstr("x.py"));
  EXPECT_EQ(api_.token(), "Bearer secret-token");
  // A bad spec is refused before anything is sent.
  const Result bad = Ctl({"submit", job_, "--set", "train.lrr=1"}, env_);
  EXPECT_EQ(bad.code, kExitUsage);
  EXPECT_THAT(bad.err, HasSubstr("job refused, nothing queued"));
  EXPECT_THAT(bad.err, HasSubstr("unknown key 'train.lrr'"));
  EXPECT_EQ(api_.submitted().size(), 1u);
}

}  // namespace
}  // namespace varuna
