// Tokens with roles (Note [Roles] in manager/api/access.cc): the tokens file's four-word lines,
// the decision itself as a table, and every job-API RPC and HTTP path as an admin, a job's
// owner and another user see them.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net/rpc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manager/api/access.h"
#include "manager/api/manager_server.h"
#include "manager/api/tokens.h"
#include "manager/nodes/agent_client.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"
#include "varuna/v1/control.grpc.pb.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;
using Role = TokenTable::Role;
using ::varuna::testing::FakeClock;

constexpr char kRootToken[] = "root-0123456789abcdef";
constexpr char kAliceToken[] = "alice-0123456789abcdef";
constexpr char kBobToken[] = "bob-0123456789abcdef00";

TEST(TokenRolesTest, FourWordLinesGiveRolesAndEveryLineOfANameAgrees) {
  auto t = TokenTable::Parse(absl::StrCat("root ", kRootToken, " - admin\nalice ", kAliceToken,
                                          " alice_ml user\nbob ", kBobToken, "\n"),
                             "f");
  ASSERT_THAT(t.status(), IsOk());
  EXPECT_TRUE(t->roles());
  EXPECT_EQ(t->Find(kRootToken)->role, Role::kAdmin);
  EXPECT_EQ(t->Find(kRootToken)->unix_user, "");  // "-": no Unix user of its own
  EXPECT_EQ(t->Find(kAliceToken)->role, Role::kUser);
  EXPECT_EQ(t->Find(kAliceToken)->unix_user, "alice_ml");
  EXPECT_EQ(t->Find(kBobToken)->role, Role::kUser);  // no role word: a user's line
  EXPECT_EQ(t->ByName("root")->role, Role::kAdmin);
  EXPECT_FALSE(t->ByName("carol").has_value());

  // No line says admin: every token keeps the admin's rights (files from before roles).
  auto old = TokenTable::Parse(absl::StrCat("alice ", kAliceToken, " alice_ml\n"), "f");
  ASSERT_THAT(old.status(), IsOk());
  EXPECT_FALSE(old->roles());
  EXPECT_EQ(old->Find(kAliceToken)->role, Role::kAdmin);

  const std::pair<std::string, std::string> bad[] = {
      {absl::StrCat("a ", kAliceToken, " - boss\n"), "role 'boss' is neither admin nor user"},
      {absl::StrCat("a ", kAliceToken, " - user extra\n"), "NAME TOKEN [USER|-] [admin|user]"},
      {absl::StrCat("a ", kAliceToken, " - admin\na ", kBobToken, " - user\n"),
       "line 2: 'a' is a user here but not on line 1"},
      {absl::StrCat("a ", kAliceToken, " - admin\na ", kBobToken, "\n"), "line 2"},
      {absl::StrCat("a ", kAliceToken, " Root admin\n"), "not a Unix user name"},
  };
  for (const auto& [text, why] : bad) {
    EXPECT_THAT(TokenTable::Parse(text, "f").status(),
                StatusIs(absl::StatusCode::kInvalidArgument, why))
        << text;
  }
}

// Note [Tenant uids] in common/launch/tenant_uid.cc: every name without a Unix user gets its
// own uid; two names that would meet on one stop the manager's start, naming both.
TEST(TokenRolesTest, NamesWithoutAUnixUserGetUidsOfTheirOwn) {
  auto t = TokenTable::Parse(absl::StrCat("root ", kRootToken, " - admin\nalice ", kAliceToken,
                                          " alice_ml user\nbob ", kBobToken, "\n"),
                             "f");
  ASSERT_THAT(t.status(), IsOk());
  const UidRange range = *ParseUidRange(kDefaultTenantUids);
  ASSERT_THAT(t->AssignTenantUids(range), IsOk());
  EXPECT_EQ(t->Find(kRootToken)->uid, TenantUid("root", range));
  EXPECT_EQ(t->Find(kBobToken)->uid, TenantUid("bob", range));
  EXPECT_EQ(t->Find(kAliceToken)->uid, 0u) << "alice_ml is her Unix user";
  ASSERT_THAT(t->AssignTenantUids(UidRange{}), IsOk());
  EXPECT_EQ(t->Find(kBobToken)->uid, 0u) << "tenant_uids: none";
  EXPECT_THAT(t->AssignTenantUids(*ParseUidRange("5000-5000")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "tenants 'bob' and 'root' would share uid 5000"));
}

TEST(AuthorizeTest, EveryActionByRoleAndOwner) {
  const TokenTable::Caller admin{"root", "", Role::kAdmin};
  const TokenTable::Caller alice{"alice", "", Role::kUser};
  struct Row {
    ApiAction action;
    bool own_user, other_user;  // allowed for the job's owner / another user
  };
  const Row table[] = {
      {ApiAction::kView, true, true},          {ApiAction::kSubmit, true, true},
      {ApiAction::kReadJob, true, false},      {ApiAction::kCancelJob, true, false},
      {ApiAction::kManageNodes, false, false},
  };
  for (const Row& r : table) {
    SCOPED_TRACE(static_cast<int>(r.action));
    EXPECT_THAT(Authorize(admin, r.action, "7", "alice"), IsOk());
    EXPECT_THAT(Authorize(admin, r.action, "7", "bob"), IsOk());
    EXPECT_EQ(Authorize(alice, r.action, "7", "alice").ok(), r.own_user);
    absl::Status other = Authorize(alice, r.action, "7", "bob");
    EXPECT_EQ(other.ok(), r.other_user);
    if (!other.ok()) EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  }
  EXPECT_THAT(Authorize(alice, ApiAction::kCancelJob, "7", "bob"),
              StatusIs(absl::StatusCode::kPermissionDenied, "submitted by 'bob'"));
  EXPECT_THAT(Authorize(alice, ApiAction::kManageNodes),
              StatusIs(absl::StatusCode::kPermissionDenied, "needs the admin role"));
  // A job with no owner (submitted without tokens) is an admin's only.
  EXPECT_FALSE(Authorize(alice, ApiAction::kReadJob, "7", "").ok());
}

// One HTTP/1.1 GET on loopback; returns the status code and the body.
std::pair<int, std::string> HttpGet(const std::string& address, const std::string& path,
                                    const std::string& token) {
  std::vector<std::string> hp = absl::StrSplit(address, ':');
  int port = 0;
  if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &port)) return {0, "bad address " + address};
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return {0, "connect failed"};
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                                       "Authorization: Bearer ", token, "\r\n\r\n");
  send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, n);
  close(fd);
  const size_t body = out.find("\r\n\r\n");
  return {out.size() > 12 ? std::atoi(out.c_str() + 9) : 0,
          body == std::string::npos ? "" : out.substr(body + 4)};
}

class ApiRolesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/roles_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    data_ = dir_ + "/corpus.txt";
    std::ofstream(data_) << std::string(4096, 'x');
    std::ofstream(dir_ + "/tokens") << "root " << kRootToken << " - admin\nalice " << kAliceToken
                                    << " - user\nbob " << kBobToken << " - user\n";
    ManagerConfig config;
    config.listen = "127.0.0.1:0";
    config.http_listen = "127.0.0.1:0";
    config.state_dir = dir_ + "/state";
    config.tokens_file = dir_ + "/tokens";
    manager_ = std::make_unique<ManagerServer>(
        config, &clock_, MakeGrpcAgentClientPool(absl::Seconds(5), TlsConfig{}),
        ManagerServer::Options{absl::ZeroDuration()});
    ASSERT_THAT(manager_->Start(), IsOk());
    jobs_ = v1::JobApi::NewStub(MakeChannel(manager_->address(), TlsConfig{}));
    // alice's job (PENDING: no agent has registered).
    grpc::ClientContext ctx;
    Auth(&ctx, kAliceToken);
    v1::SubmitRequest req;
    req.set_spec_yaml(absl::StrCat(
        "name: secret-run\nmodel: {kind: gpt, layers: 4, d_model: 32, heads: 2, seq_len: 8}\n",
        "data: {kind: text, path: ", data_, "}\ntrain: {global_batch: 8, steps: 5}\n"));
    v1::SubmitResponse resp;
    ASSERT_TRUE(jobs_->Submit(&ctx, req, &resp).ok());
    job_ = resp.job().id();
  }
  void TearDown() override {
    if (manager_) manager_->Shutdown();
    std::filesystem::remove_all(dir_);
  }
  static void Auth(grpc::ClientContext* ctx, const std::string& token) {
    SetDeadline(ctx, absl::Seconds(5));
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  }

  FakeClock clock_;
  std::string dir_, data_, job_;
  std::unique_ptr<ManagerServer> manager_;
  std::unique_ptr<v1::JobApi::Stub> jobs_;
};

TEST_F(ApiRolesTest, EveryRpcByRoleAndOwner) {
  using Call = std::function<grpc::Status(grpc::ClientContext*)>;
  struct Row {
    std::string rpc;
    Call call;
    bool other_user, admin_only;  // another user may call it / only an admin may
  };
  const std::string id = job_;
  const std::string spec =
      absl::StrCat("name: r\nmodel: {kind: gpt, layers: 4, d_model: 32, heads: 2, seq_len: 8}\n",
                   "data: {kind: text, path: ", data_, "}\ntrain: {global_batch: 8, steps: 5}\n");
  const std::vector<Row> table = {
      {"Submit",
       [&](grpc::ClientContext* c) {
         v1::SubmitRequest q;
         q.set_spec_yaml(spec);
         v1::SubmitResponse r;
         return jobs_->Submit(c, q, &r);
       },
       true, false},
      {"PlanJob",
       [&](grpc::ClientContext* c) {
         v1::PlanJobRequest q;
         q.set_spec_yaml(spec);
         v1::PlanJobResponse r;
         return jobs_->PlanJob(c, q, &r);
       },
       true, false},
      {"ListManagers",
       [&](grpc::ClientContext* c) {
         v1::ListManagersResponse r;
         return jobs_->ListManagers(c, v1::ListManagersRequest(), &r);
       },
       true, false},
      {"ListJobs",
       [&](grpc::ClientContext* c) {
         v1::ListJobsResponse r;
         return jobs_->ListJobs(c, v1::ListJobsRequest(), &r);
       },
       true, false},
      {"GetJob",
       [&](grpc::ClientContext* c) {
         v1::GetJobRequest q;
         q.set_job_id(id);
         v1::GetJobResponse r;
         return jobs_->GetJob(c, q, &r);
       },
       true, false},
      {"ListNodes",
       [&](grpc::ClientContext* c) {
         v1::ListNodesResponse r;
         return jobs_->ListNodes(c, v1::ListNodesRequest(), &r);
       },
       true, false},
      {"ListEvents (all)",
       [&](grpc::ClientContext* c) {
         v1::ListEventsResponse r;
         return jobs_->ListEvents(c, v1::ListEventsRequest(), &r);
       },
       true, false},
      {"GetProfile",
       [&](grpc::ClientContext* c) {
         v1::GetProfileResponse r;
         return jobs_->GetProfile(c, v1::GetProfileRequest(), &r);
       },
       true, false},
      {"ListEvents (job)",
       [&](grpc::ClientContext* c) {
         v1::ListEventsRequest q;
         q.set_job_id(id);
         v1::ListEventsResponse r;
         return jobs_->ListEvents(c, q, &r);
       },
       false, false},
      {"GetMetrics",
       [&](grpc::ClientContext* c) {
         v1::GetMetricsRequest q;
         q.set_job_id(id);
         v1::GetMetricsResponse r;
         return jobs_->GetMetrics(c, q, &r);
       },
       false, false},
      {"GetLogs",
       [&](grpc::ClientContext* c) {
         v1::GetLogsRequest q;
         q.set_job_id(id);
         v1::GetLogsResponse r;
         return jobs_->GetLogs(c, q, &r);
       },
       false, false},
      {"DrainNode",
       [&](grpc::ClientContext* c) {
         v1::DrainNodeRequest q;
         q.set_node("node9");
         v1::DrainNodeResponse r;
         return jobs_->DrainNode(c, q, &r);
       },
       false, true},
      {"PreemptNode",
       [&](grpc::ClientContext* c) {
         v1::PreemptNodeRequest q;
         q.set_node("node9");
         v1::PreemptNodeResponse r;
         return jobs_->PreemptNode(c, q, &r);
       },
       false, true},
      // Last: it changes the job.
      {"CancelJob",
       [&](grpc::ClientContext* c) {
         v1::CancelJobRequest q;
         q.set_job_id(id);
         v1::CancelJobResponse r;
         return jobs_->CancelJob(c, q, &r);
       },
       false, false},
  };
  for (const Row& row : table) {
    SCOPED_TRACE(row.rpc);
    const std::pair<const char*, bool> callers[] = {
        {kBobToken, row.other_user}, {kAliceToken, !row.admin_only}, {kRootToken, true}};
    for (const auto& [token, allowed] : callers) {
      grpc::ClientContext ctx;
      Auth(&ctx, token);
      const grpc::Status s = row.call(&ctx);
      // Allowed calls may still fail for their own reasons (no such node, no logs yet), never
      // for the role.
      EXPECT_EQ(s.error_code() == grpc::StatusCode::PERMISSION_DENIED, !allowed)
          << token << ": " << s.error_message();
      if (!allowed) {
        EXPECT_THAT(s.error_message(),
                    ::testing::AnyOf(HasSubstr("admin role"), HasSubstr("submitted by 'alice'")));
      }
    }
  }
}

TEST_F(ApiRolesTest, OthersSeeASummaryOfAJobAndNoneOfItsEvents) {
  auto get = [&](const std::string& token) {
    grpc::ClientContext ctx;
    Auth(&ctx, token);
    v1::GetJobRequest q;
    q.set_job_id(job_);
    v1::GetJobResponse r;
    EXPECT_TRUE(jobs_->GetJob(&ctx, q, &r).ok());
    return r.job();
  };
  // Cancelled by its owner: a reason and a canceller to hide from others.
  {
    grpc::ClientContext ctx;
    Auth(&ctx, kAliceToken);
    v1::CancelJobRequest q;
    q.set_job_id(job_);
    v1::CancelJobResponse r;
    ASSERT_TRUE(jobs_->CancelJob(&ctx, q, &r).ok());
  }
  const v1::JobInfo own = get(kAliceToken), other = get(kBobToken), admin = get(kRootToken);
  EXPECT_EQ(other.id(), job_);
  EXPECT_EQ(other.name(), "secret-run");
  EXPECT_EQ(other.submitted_by(), "alice");
  EXPECT_EQ(other.state(), own.state());
  EXPECT_FALSE(own.cancelled_by().empty());
  EXPECT_TRUE(other.cancelled_by().empty());
  EXPECT_EQ(admin.cancelled_by(), own.cancelled_by());
  // Her tokens name no Unix user: the job carries her tenant uid (Note [Tenant uids]).
  EXPECT_EQ(own.run_as_uid(), TenantUid("alice", *ParseUidRange(kDefaultTenantUids)));
  EXPECT_EQ(other.run_as_uid(), 0u);
  // Events of alice's job reach alice and the admin only.
  auto events = [&](const std::string& token) {
    grpc::ClientContext ctx;
    Auth(&ctx, token);
    v1::ListEventsResponse r;
    EXPECT_TRUE(jobs_->ListEvents(&ctx, v1::ListEventsRequest(), &r).ok());
    int of_job = 0;
    for (const auto& e : r.events()) of_job += e.job_id() == job_;
    return of_job;
  };
  EXPECT_GT(events(kAliceToken), 0);
  EXPECT_EQ(events(kRootToken), events(kAliceToken));
  EXPECT_EQ(events(kBobToken), 0);
}

TEST_F(ApiRolesTest, EveryHttpPathByRoleAndOwner) {
  const std::string http = manager_->http_address();
  ASSERT_FALSE(http.empty());
  const std::string base = "/api/v1/jobs/" + job_;
  struct Row {
    std::string path;
    bool other_user;
  };
  const Row table[] = {
      {"/api/v1/jobs", true},    {base, true},
      {"/api/v1/nodes", true},   {base + "/metrics", false},
      {base + "/stages", false}, {base + "/events", false},
      {base + "/logs", false},
  };
  for (const Row& row : table) {
    for (const auto& [token, allowed] : {std::pair<const char*, bool>{kBobToken, row.other_user},
                                         {kAliceToken, true},
                                         {kRootToken, true}}) {
      const auto [status, body] = HttpGet(http, row.path, token);
      EXPECT_EQ(status == 403, !allowed) << row.path << " " << token << ": " << status << body;
      if (!allowed) EXPECT_THAT(body, HasSubstr("submitted by 'alice'")) << row.path;
    }
  }
  EXPECT_EQ(HttpGet(http, base, "not-a-token-0123456789").first, 401);
  // The cluster's /metrics names every tenant's jobs (their loss and step): an admin's only,
  // own job or not (a user reads its job's at .../metrics above).
  for (const auto& [token, allowed] :
       {std::pair<const char*, bool>{kBobToken, false}, {kAliceToken, false}, {kRootToken, true}}) {
    const auto [status, body] = HttpGet(http, "/metrics", token);
    EXPECT_EQ(status, allowed ? 200 : 403) << token << ": " << body;
    if (allowed) EXPECT_THAT(body, HasSubstr("job=\"" + job_ + "\""));
    if (!allowed) EXPECT_THAT(body, HasSubstr("needs an admin's"));
  }
}

// Sharing (docs/operations.md "Sharing a cluster"): a class above normal needs the admin role
// (or sharing.submit_above_normal); a class the cluster lacks is refused by name.
TEST_F(ApiRolesTest, ClassesAboveNormalNeedTheAdminRole) {
  auto submit = [&](const std::string& token, const std::string& priority) {
    grpc::ClientContext ctx;
    Auth(&ctx, token);
    v1::SubmitRequest req;
    req.set_spec_yaml(
        absl::StrCat("name: p\nmodel: {kind: gpt, layers: 4, d_model: 32, heads: 2, seq_len: 8}\n",
                     "data: {kind: text, path: ", data_, "}\ntrain: {global_batch: 8, steps: 5}\n",
                     "priority: ", priority, "\n"));
    v1::SubmitResponse resp;
    return jobs_->Submit(&ctx, req, &resp);
  };
  grpc::Status st = submit(kAliceToken, "high");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(st.error_message(), HasSubstr("user 'alice' may not submit priority 'high'"));
  EXPECT_TRUE(submit(kAliceToken, "low").ok());
  EXPECT_TRUE(submit(kRootToken, "high").ok());
  st = submit(kRootToken, "urgent");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("priority 'urgent' is not a class of this cluster"));
  st = submit(kRootToken, "Urgent!");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("priority"));
}

// A quota or a right for a name no token has is a typo that would give nobody anything.
TEST_F(ApiRolesTest, SharingNamesMustBeTokenNames) {
  for (const bool quota : {true, false}) {
    ManagerConfig config;
    config.listen = "127.0.0.1:0";
    config.state_dir = dir_ + (quota ? "/state-quota" : "/state-above");
    config.tokens_file = dir_ + "/tokens";
    config.sharing.enabled = true;
    if (quota) {
      config.sharing.users["carol"].quota_slots = 4;
    } else {
      config.sharing.submit_above_normal = {"carol"};
    }
    ManagerServer other(config, &clock_, MakeGrpcAgentClientPool(absl::Seconds(5), TlsConfig{}),
                        ManagerServer::Options{absl::ZeroDuration()});
    EXPECT_THAT(other.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                        quota ? "sharing.users names 'carol', but no line of"
                                              : "sharing.submit_above_normal names 'carol'"));
    other.Shutdown();
  }
}

}  // namespace
}  // namespace varuna
