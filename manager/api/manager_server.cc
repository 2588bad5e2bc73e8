#include "manager/api/manager_server.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/net/http_request.h"
#include "common/net/rpc.h"
#include "glog/logging.h"
#include "manager/api/access.h"
#include "manager/api/tokens.h"
#include "varuna/v1/control.grpc.pb.h"

namespace varuna {
namespace {

// Runs `fn` (returning absl::Status) on the loop and finishes the RPC from there: no gRPC
// thread ever waits on the manager's state.
template <typename F>
grpc::ServerUnaryReactor* OnLoop(EventLoop* loop, grpc::CallbackServerContext* ctx, F fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  loop->Post([reactor, fn] { reactor->Finish(ToGrpcStatus(fn())); });
  return reactor;
}

// Note [Who may call]: agents prove themselves with a client certificate from the cluster CA
// (gRPC verifies it; kOptional lets varunactl connect without one) whose common name is the
// node name they register and heartbeat as, so one agent cannot speak for another;
// varunactl uses a bearer token from the tokens file. Without TLS / tokens (loopback only)
// everyone may.
absl::Status CheckAgentPeer(const grpc::CallbackServerContext& ctx, bool tls,
                            const std::string& node) {
  if (!tls) return absl::OkStatus();
  const std::string peer = PeerCommonName(ctx);
  if (peer.empty()) {
    return absl::UnauthenticatedError(
        "agent registry: a client certificate from the cluster CA is required");
  }
  if (peer != node) {
    return absl::UnauthenticatedError(absl::StrCat("agent registry: the certificate names '", peer,
                                                   "' but the request is for node '",
                                                   node.substr(0, 64), "'"));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

}  // namespace

class ManagerServer::RegistryService final : public v1::AgentRegistry::CallbackService {
 public:
  RegistryService(EventLoop* loop, Manager* m, bool tls, const ManagerRole* role)
      : loop_(loop), m_(m), tls_(tls), role_(role) {}
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* req,
                                     v1::RegisterResponse* resp) override {
    if (absl::Status s = CheckAgentPeer(*ctx, tls_, req->name()); !s.ok()) return Refuse(ctx, s);
    if (absl::Status s = role_->Gate(ctx); !s.ok()) return Refuse(ctx, s);
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->Register(*req);
      if (r.ok()) *resp = *r;
      if (role_->several()) resp->set_manager_term(role_->term());
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override {
    if (absl::Status s = CheckAgentPeer(*ctx, tls_, req->name()); !s.ok()) return Refuse(ctx, s);
    if (absl::Status s = role_->Gate(ctx); !s.ok()) return Refuse(ctx, s);
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->Heartbeat(*req);
      if (r.ok()) *resp = *std::move(r);
      if (role_->several()) resp->set_manager_term(role_->term());
      return r.status();
    });
  }

 private:
  EventLoop* const loop_;
  Manager* const m_;
  const bool tls_;
  const ManagerRole* const role_;
};

class ManagerServer::JobService final : public v1::JobApi::CallbackService {
 public:
  JobService(EventLoop* loop, EventLoop* files, ManagerApi api, Clock* clock,
             std::optional<TokenTable> tokens, bool check_files, const ManagerRole* role)
      : loop_(loop),
        files_(files),
        api_(std::move(api)),
        clock_(clock),
        tokens_(std::move(tokens)),
        check_files_(check_files),
        role_(role) {}

  // Any manager answers, a standby too: who leads, and the managers that are up.
  grpc::ServerUnaryReactor* ListManagers(grpc::CallbackServerContext* ctx,
                                         const v1::ListManagersRequest* req,
                                         v1::ListManagersResponse* resp) override {
    if (auto user = Authenticate(*ctx); !user.ok()) return Refuse(ctx, user.status());
    role_->Describe(resp);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Note [Off the loop]: the spec is parsed and checked (JobAdmission::Admit) and its files
  // (non-blocking opens, regular files only) on the files thread; the loop gets the parsed
  // spec and never parses or touches the filesystem for a request.
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx, const v1::SubmitRequest* req,
                                   v1::SubmitResponse* resp) override {
    auto user = Admit(ctx);
    if (!user.ok()) return Refuse(ctx, user.status());
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    files_->Post([this, reactor, req, resp, user = *user] {
      absl::StatusOr<JobSpec> spec = JobAdmission::Admit(*req);
      if (spec.ok() && check_files_) {
        if (absl::Status s = spec->ValidateFiles(); !s.ok()) spec = s;
      }
      if (!spec.ok()) {
        reactor->Finish(ToGrpcStatus(spec.status()));
        return;
      }
      loop_->Post([this, reactor, req, resp, user, spec = *std::move(spec)]() mutable {
        auto r = api_.Submit(*req, std::move(spec), user.name, user.unix_user, user.uid,
                             user.role == TokenTable::Role::kAdmin);
        if (r.ok()) *resp->mutable_job() = *r;
        reactor->Finish(ToGrpcStatus(r.status()));
      });
    });
    return reactor;
  }
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override {
    auto user = Admit(ctx);
    if (!user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=, user = *user] {
      auto r = api_.ListJobs(*req);
      if (!r.ok()) return r.status();
      *resp = *std::move(r);
      for (v1::JobInfo& j : *resp->mutable_jobs()) {
        if (!MayReadJob(user, j)) RedactForOthers(&j);
      }
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::GetJobResponse* resp) override {
    auto user = Admit(ctx);
    if (!user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=, user = *user] {
      auto r = api_.GetJob(req->job_id());
      if (!r.ok()) return r.status();
      *resp->mutable_job() = *r;
      if (!MayReadJob(user, *r)) RedactForOthers(resp->mutable_job());
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req,
                                      v1::CancelJobResponse* resp) override {
    auto user = Admit(ctx);
    if (!user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=, user = *user] {
      RETURN_IF_ERROR(MayAct(user, ApiAction::kCancelJob, req->job_id()));
      auto r = api_.Cancel(req->job_id(), user.name);
      if (r.ok()) *resp->mutable_job() = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* GetLogs(grpc::CallbackServerContext* ctx, const v1::GetLogsRequest* req,
                                    v1::GetLogsResponse* resp) override {
    auto user = Admit(ctx);
    if (!user.ok()) return Refuse(ctx, user.status());
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    loop_->Post([=, user = *user] {
      if (absl::Status may = MayAct(user, ApiAction::kReadJob, req->job_id()); !may.ok()) {
        reactor->Finish(ToGrpcStatus(may));
        return;
      }
      api_.GetLogs(*req, [reactor, resp](absl::StatusOr<v1::GetLogsResponse> r) {
        if (r.ok()) *resp = *std::move(r);
        reactor->Finish(ToGrpcStatus(r.status()));
      });
    });
    return reactor;
  }
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx,
                                      const v1::ListNodesRequest* req,
                                      v1::ListNodesResponse* resp) override {
    if (auto user = Admit(ctx); !user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=] {
      for (auto& n : api_.ListNodes()) *resp->add_nodes() = std::move(n);
      for (auto& s : api_.ListSources()) *resp->add_sources() = std::move(s);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* DrainNode(grpc::CallbackServerContext* ctx,
                                      const v1::DrainNodeRequest* req,
                                      v1::DrainNodeResponse* resp) override {
    auto user = Admit(ctx);
    if (!user.ok()) return Refuse(ctx, user.status());
    if (auto may = Authorize(*user, ApiAction::kManageNodes); !may.ok()) return Refuse(ctx, may);
    return OnLoop(loop_, ctx, [=] {
      auto r = api_.Drain(req->node(), req->undo());
      if (r.ok()) *resp->mutable_node() = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* PreemptNode(grpc::CallbackServerContext* ctx,
                                        const v1::PreemptNodeRequest* req,
                                        v1::PreemptNodeResponse* resp) override {
    auto user = Admit(ctx);
    if (!user.ok()) return Refuse(ctx, user.status());
    if (auto may = Authorize(*user, ApiAction::kManageNodes); !may.ok()) return Refuse(ctx, may);
    const std::string by = user->name;
    return OnLoop(loop_, ctx, [=] {
      if (req->in_ms() < 0 || req->in_ms() > int64_t{86400} * 1000 * 365) {
        return absl::InvalidArgumentError("preempt: in_ms must be in [0, one year]");
      }
      v1::PreemptionNotice n;
      n.set_source("varunactl");
      n.set_deadline_ms(absl::ToUnixMillis(clock_->Now()) + req->in_ms());
      n.set_detail(by.empty() ? "by hand" : absl::StrCat("by ", by));
      auto r = api_.Preempt(req->node(), n);
      if (r.ok()) *resp->mutable_node() = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* ListEvents(grpc::CallbackServerContext* ctx,
                                       const v1::ListEventsRequest* req,
                                       v1::ListEventsResponse* resp) override {
    auto user = Admit(ctx);
    if (!user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=, user = *user] {
      if (!req->job_id().empty()) RETURN_IF_ERROR(MayAct(user, ApiAction::kReadJob, req->job_id()));
      *resp = api_.ListEvents(*req);
      // A user sees the nodes' events and its own jobs' (each job looked up once).
      std::map<std::string, bool> hidden;
      auto hide = [&](const v1::Event& e) {
        if (e.job_id().empty()) return false;
        auto [it, fresh] = hidden.emplace(e.job_id(), false);
        if (fresh) it->second = !MayAct(user, ApiAction::kReadJob, e.job_id()).ok();
        return it->second;
      };
      auto* events = resp->mutable_events();
      events->erase(std::remove_if(events->begin(), events->end(), hide), events->end());
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* ctx,
                                       const v1::GetMetricsRequest* req,
                                       v1::GetMetricsResponse* resp) override {
    auto user = Admit(ctx);
    if (!user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=, user = *user] {
      RETURN_IF_ERROR(MayAct(user, ApiAction::kReadJob, req->job_id()));
      auto r = api_.GetMetrics(*req);
      if (r.ok()) *resp = *std::move(r);
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* PlanJob(grpc::CallbackServerContext* ctx, const v1::PlanJobRequest* req,
                                    v1::PlanJobResponse* resp) override {
    if (auto user = Admit(ctx); !user.ok()) return Refuse(ctx, user.status());
    // Parsing and planning are the caller's work: off the loop (Note [Off the loop]); the loop
    // only copies the slots and the stored profile.
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    files_->Post([this, reactor, req, resp] {
      absl::StatusOr<JobSpec> spec = ParseJobSpec(req->spec_yaml());
      if (!spec.ok()) {
        reactor->Finish(ToGrpcStatus(spec.status()));
        return;
      }
      loop_->Post([this, reactor, req, resp, spec = *std::move(spec)] {
        PlanInputs in = api_.PlanInputsFor(spec);
        files_->Post([reactor, req, resp, spec, in = std::move(in)] {
          auto r = PlanOnCluster(*req, spec, in);
          if (r.ok()) *resp = *std::move(r);
          reactor->Finish(ToGrpcStatus(r.status()));
        });
      });
    });
    return reactor;
  }
  grpc::ServerUnaryReactor* GetProfile(grpc::CallbackServerContext* ctx,
                                       const v1::GetProfileRequest* req,
                                       v1::GetProfileResponse* resp) override {
    if (auto user = Admit(ctx); !user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=] {
      *resp = api_.GetProfile(*req);
      return absl::OkStatus();
    });
  }

 private:
  // On the loop: whether `user` may act on job `id` (Note [Roles] in access.cc); a job that
  // does not exist is the API's own NOT_FOUND.
  absl::Status MayAct(const TokenTable::Caller& user, ApiAction action,
                      const std::string& id) const {
    if (user.role == TokenTable::Role::kAdmin) return absl::OkStatus();
    absl::StatusOr<v1::JobInfo> job = api_.GetJob(id);
    if (!job.ok()) return job.status();
    return Authorize(user, action, id, job->submitted_by());
  }
  // The gate (a standby names the leader), then the token.
  absl::StatusOr<TokenTable::Caller> Admit(grpc::CallbackServerContext* ctx) const {
    RETURN_IF_ERROR(role_->Gate(ctx));
    return Authenticate(*ctx);
  }
  // The caller's token name ("" without a tokens file), or UNAUTHENTICATED naming why.
  absl::StatusOr<TokenTable::Caller> Authenticate(const grpc::CallbackServerContext& ctx) const {
    if (!tokens_) return TokenTable::Caller{};
    const auto& md = ctx.client_metadata();
    auto it = md.find("authorization");
    if (it == md.end()) {
      return absl::UnauthenticatedError(
          "no token: this manager requires one (varunactl --token or $VARUNA_TOKEN)");
    }
    const std::string token = BearerToken(std::string(it->second.data(), it->second.size()));
    auto caller = tokens_->Find(token);
    if (!caller) return absl::UnauthenticatedError("the token is not in the manager's tokens file");
    return *caller;
  }

  EventLoop* const loop_;
  EventLoop* const files_;
  ManagerApi api_;
  Clock* const clock_;
  const std::optional<TokenTable> tokens_;
  const bool check_files_;
  const ManagerRole* const role_;
};

ManagerServer::ManagerServer(ManagerConfig config, Clock* clock,
                             std::unique_ptr<AgentClientPool> agents, Options options)
    : config_(std::move(config)),
      clock_(clock),
      agents_(std::move(agents)),
      loop_("manager", options.tick_period,
            [this] {
              role_.Fence();
              if (leading()) manager_->Tick();
            }),
      files_("manager-files", absl::ZeroDuration(), [] {}),
      slurm_loop_("manager-slurm", absl::ZeroDuration(), [] {}),
      role_(config_) {}

ManagerServer::~ManagerServer() { Shutdown(); }

absl::Status ManagerServer::Start() {
  RETURN_IF_ERROR(config_.Validate());
  ASSIGN_OR_RETURN(TlsConfig tls, LoadTls(config_.tls, /*need_cert=*/true, "varuna-manager"));
  std::optional<TokenTable> tokens;
  if (!config_.tokens_file.empty()) {
    ASSIGN_OR_RETURN(tokens, TokenTable::Load(config_.tokens_file));
    ASSIGN_OR_RETURN(const UidRange uids, ParseUidRange(config_.tenant_uids));
    RETURN_IF_ERROR(tokens->AssignTenantUids(uids));
    LOG(INFO) << "manager: " << tokens->size() << " tokens from " << config_.tokens_file
              << "; token names without a Unix user run as uids of their own in "
              << uids.ToString();
    if (!tokens->roles()) {
      LOG(WARNING) << "manager: no line of " << config_.tokens_file
                   << " says admin, so every token may do everything (cancel and read any job, "
                      "drain nodes); give lines a role: NAME TOKEN USER|- admin|user";
    }
  }
  // sharing.users and submit_above_normal name token names: a name no token has is a typo
  // that would silently give nobody a quota.
  for (const auto& [name, share] : config_.sharing.users) {
    if (!tokens || !tokens->ByName(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("manager config: sharing.users names '", name, "', but ",
                       tokens ? absl::StrCat("no line of ", config_.tokens_file, " has that name")
                              : std::string("there is no --tokens_file (users are token names)")));
    }
  }
  for (const std::string& name : config_.sharing.submit_above_normal) {
    if (!tokens || !tokens->ByName(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("manager config: sharing.submit_above_normal names '", name, "', but ",
                       tokens ? absl::StrCat("no line of ", config_.tokens_file, " has that name")
                              : std::string("there is no --tokens_file (users are token names)")));
    }
  }
  if (config_.check_job_files) {
    LOG(WARNING) << "manager: check_job_files: true opens every job's files with the manager's "
                    "own rights at submit (docs/operations.md \"Submit\")";
  }
  RETURN_IF_ERROR(
      role_.Open(tls, [this](int64_t term) { loop_.Post([this, term] { TakeOver(term); }); }));
  if (role_.several()) agents_->set_fence([role = &role_] { role->Fence(); });
  manager_ = std::make_unique<Manager>(config_, clock_, role_.store(), agents_.get(),
                                       [this](std::function<void()> fn) { loop_.Post(fn); });
  if (!config_.http_listen.empty()) {
    http_ = std::make_unique<ManagerHttp>(&loop_, api());
    manager_->set_metrics(http_->metrics());
    http_->metrics()->SetLeader(!role_.several());
  }
  if (config_.slurm.enabled()) {
    slurm_commands_ = MakeSlurmCommands(config_.slurm);
    manager_->StartSlurm(slurm_commands_.get(),
                         [this](std::function<void()> fn) { slurm_loop_.Post(std::move(fn)); });
    slurm_loop_.Start();
  }
  if (!role_.several()) {
    if (absl::Status s = manager_->Recover(); !s.ok()) return s;
  }
  loop_.Start();
  files_.Start();
  // The HTTP API takes the same tokens (Note [HTTP server] in common/net/http_server.cc).
  std::shared_ptr<const TokenTable> http_tokens;
  if (tokens) http_tokens = std::make_shared<const TokenTable>(*tokens);
  job_service_ = std::make_unique<JobService>(&loop_, &files_, api(), clock_, std::move(tokens),
                                              config_.check_job_files, &role_);
  registry_service_ =
      std::make_unique<RegistryService>(&loop_, manager_.get(), tls.enabled, &role_);
  auto started = StartServer(config_.listen, {job_service_.get(), registry_service_.get()}, "", tls,
                             ClientCerts::kOptional);
  if (!started.ok()) return started.status();
  server_ = std::move(started->server);
  address_ = started->address;
  if (http_ != nullptr) {
    std::function<absl::Status()> gate;
    if (role_.several()) gate = [role = &role_] { return role->Gate(nullptr); };
    HttpServer::Options o;
    o.who = "varuna-manager";
    o.listen = config_.http_listen;
    o.allow_remote = config_.http_allow_remote;
    o.tls_cert_file = config_.tls.cert;
    o.tls_key_file = config_.tls.key;
    std::function<TokenTable::Caller(const std::string&)> caller_of;
    if (http_tokens) {
      o.authorize = [http_tokens](const std::string& t) { return http_tokens->Lookup(t); };
      caller_of = [http_tokens](const std::string& name) {
        return http_tokens->ByName(name).value_or(
            TokenTable::Caller{name, "", TokenTable::Role::kUser});
      };
    }
    RETURN_IF_ERROR(http_->Start(o, config_.http_open_metrics, gate, std::move(caller_of)));
    LOG(INFO) << "manager dashboard and /metrics on " << (http_->tls() ? "https" : "http") << "://"
              << http_->address() << "/" << (http_tokens ? " (bearer tokens)" : "");
  }
  role_.Campaign();
  LOG(INFO) << "manager listening on " << address_ << " state_dir=" << config_.state_dir
            << (tls.enabled ? " tls=mutual" : " tls=off")
            << (config_.tokens_file.empty() ? " tokens=off" : " tokens=on");
  return absl::OkStatus();
}

void ManagerServer::TakeOver(int64_t term) {
  const absl::Time t0 = absl::Now();
  role_.TakeOver(term, [this, term] {
    agents_->set_term(term);
    return manager_->Recover();
  });
  if (http_ != nullptr) {
    http_->metrics()->SetLeader(true);
    http_->metrics()->OnElected();
  }
  LOG(INFO) << "manager " << config_.advertise_address() << " leads (term " << term
            << "): state loaded from etcd in " << absl::FormatDuration(absl::Now() - t0);
}

void ManagerServer::Shutdown() {
  if (stopped_) return;
  stopped_ = true;

  if (http_ != nullptr) http_->Stop();  // its handlers wait on the loop
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  files_.Stop();       // first: what it still holds posts to the loop, which then answers
  slurm_loop_.Stop();  // likewise (a command in flight finishes or times out)
  loop_.Stop();
  // Last: a leader that stops cleanly hands over at once (its lease revoked).
  role_.Stop();
}

void ManagerServer::Tick() {
  loop_.RunSync([this] { manager_->Tick(); });
}

}  // namespace varuna
