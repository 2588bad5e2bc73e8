#include "manager/api/manager_server.h"

#include "manager/api/manager_http.h"

#include <atomic>
#include <cstdlib>

#include "manager/ha/etcd_store.h"
#include "manager/ha/leader_election.h"

#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/net/http_request.h"
#include "common/net/rpc.h"
#include "glog/logging.h"
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

// A deposed leader's exit status: its unit restarts it, as a standby.
constexpr int kExitDeposed = 75;

grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

// Nothing more may be done by this process (Note [Leader lease]): its unit starts it again,
// as a standby.
[[noreturn]] void Deposed(const std::string& why) {
  LOG(ERROR) << "manager deposed (" << why << "); exiting with status " << kExitDeposed;
  std::_Exit(kExitDeposed);
}

}  // namespace

struct ManagerServer::Ha {
  std::unique_ptr<EtcdClient> etcd;
  EtcdStateStore* store = nullptr;  // owned by ManagerServer::store_
  std::unique_ptr<LeaderElection> election;
  std::atomic<bool> ready{false};  // elected and recovered: the services act
  std::atomic<int64_t> term{0};

  // A leader past its safe time stops here (Note [Leader lease]); a standby passes.
  void Fence() const {
    if (ready && !election->may_act()) {
      Deposed("it could not renew its lease before the safe time");
    }
  }

  // OK where this manager acts; else UNAVAILABLE naming the leader (also in the trailing
  // metadata `varuna-leader`, which agents and varunactl follow).
  absl::Status Gate(grpc::CallbackServerContext* ctx) const {
    Fence();
    if (ready) return absl::OkStatus();
    const LeaderElection::Leader l = election->leader();
    const std::string me = election->me();
    if (!l.address.empty() && l.address != me) {
      if (ctx != nullptr) ctx->AddTrailingMetadata("varuna-leader", l.address);
      return absl::UnavailableError(absl::StrCat("varuna-manager ", me,
                                                 " is a standby; the leader is ", l.address,
                                                 " (term ", l.term, ")"));
    }
    if (l.address == me) {
      return absl::UnavailableError(absl::StrCat("varuna-manager ", me,
                                                 " was elected leader (term ", l.term,
                                                 ") and is loading the state; try again"));
    }
    const std::string trouble = election->trouble();
    return absl::UnavailableError(absl::StrCat("varuna-manager ", me,
                                               " is a standby and no leader is elected yet",
                                               trouble.empty() ? "" : ": ", trouble));
  }
};

class ManagerServer::RegistryService final : public v1::AgentRegistry::CallbackService {
 public:
  RegistryService(EventLoop* loop, Manager* m, bool tls, const Ha* ha)
      : loop_(loop), m_(m), tls_(tls), ha_(ha) {}
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* req,
                                     v1::RegisterResponse* resp) override {
    if (absl::Status s = CheckAgentPeer(*ctx, tls_, req->name()); !s.ok()) return Refuse(ctx, s);
    if (ha_ != nullptr) {
      if (absl::Status s = ha_->Gate(ctx); !s.ok()) return Refuse(ctx, s);
    }
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->Register(*req);
      if (r.ok()) *resp = *r;
      if (ha_ != nullptr) resp->set_manager_term(ha_->term);
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override {
    if (absl::Status s = CheckAgentPeer(*ctx, tls_, req->name()); !s.ok()) return Refuse(ctx, s);
    if (ha_ != nullptr) {
      if (absl::Status s = ha_->Gate(ctx); !s.ok()) return Refuse(ctx, s);
    }
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->Heartbeat(*req);
      if (r.ok()) *resp = *std::move(r);
      if (ha_ != nullptr) resp->set_manager_term(ha_->term);
      return r.status();
    });
  }

 private:
  EventLoop* const loop_;
  Manager* const m_;
  const bool tls_;
  const Ha* const ha_;
};

class ManagerServer::JobService final : public v1::JobApi::CallbackService {
 public:
  JobService(EventLoop* loop, EventLoop* files, Manager* m, Clock* clock,
             std::optional<TokenTable> tokens, bool check_files, const Ha* ha,
             const ManagerConfig* config)
      : loop_(loop),
        files_(files),
        m_(m),
        clock_(clock),
        tokens_(std::move(tokens)),
        check_files_(check_files),
        ha_(ha),
        config_(config) {}

  // Any manager answers, a standby too: who leads, and the managers that are up.
  grpc::ServerUnaryReactor* ListManagers(grpc::CallbackServerContext* ctx,
                                         const v1::ListManagersRequest* req,
                                         v1::ListManagersResponse* resp) override {
    if (auto user = Authenticate(*ctx); !user.ok()) return Refuse(ctx, user.status());
    const std::string me = config_->advertise_address();
    resp->set_answered_by(me);
    if (ha_ == nullptr) {
      auto* m = resp->add_managers();
      m->set_address(me);
      m->set_leader(true);
      resp->set_leader(me);
      resp->set_store("sqlite " + config_->state_dir);
    } else {
      const LeaderElection::Leader l = ha_->election->leader();
      resp->set_leader(l.address);
      resp->set_term(l.term);
      resp->set_note(ha_->election->trouble());
      resp->set_lease_ttl_s(absl::ToDoubleSeconds(config_->lease_ttl));
      resp->set_store("etcd " + ha_->etcd->endpoints());
      std::vector<std::string> all = ha_->election->managers();
      if (std::find(all.begin(), all.end(), me) == all.end()) all.push_back(me);
      std::sort(all.begin(), all.end());
      for (const std::string& a : all) {
        auto* m = resp->add_managers();
        m->set_address(a);
        m->set_leader(a == l.address);
        if (a == l.address) m->set_term(l.term);
      }
    }
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Note [Off the loop]: the spec is parsed and checked (JobController::Admit) and its files
  // (non-blocking opens, regular files only) on the files thread; the loop gets the parsed
  // spec and never parses or touches the filesystem for a request.
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx, const v1::SubmitRequest* req,
                                   v1::SubmitResponse* resp) override {
    auto user = Admit(ctx);
    if (!user.ok()) return Refuse(ctx, user.status());
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    files_->Post([this, reactor, req, resp, user = *user] {
      absl::StatusOr<JobSpec> spec = JobController::Admit(*req);
      if (spec.ok() && check_files_) {
        if (absl::Status s = spec->ValidateFiles(); !s.ok()) spec = s;
      }
      if (!spec.ok()) {
        reactor->Finish(ToGrpcStatus(spec.status()));
        return;
      }
      loop_->Post([this, reactor, req, resp, user, spec = *std::move(spec)]() mutable {
        auto r = m_->Submit(*req, std::move(spec), user.name, user.unix_user);
        if (r.ok()) *resp->mutable_job() = *r;
        reactor->Finish(ToGrpcStatus(r.status()));
      });
    });
    return reactor;
  }
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override {
    if (auto user = Admit(ctx); !user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->ListJobs(*req);
      if (r.ok()) *resp = *std::move(r);
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::GetJobResponse* resp) override {
    if (auto user = Admit(ctx); !user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->GetJob(req->job_id());
      if (r.ok()) *resp->mutable_job() = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req,
                                      v1::CancelJobResponse* resp) override {
    auto user = Admit(ctx);
    if (!user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=, user = *user] {
      auto r = m_->Cancel(req->job_id(), user.name);
      if (r.ok()) *resp->mutable_job() = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* GetLogs(grpc::CallbackServerContext* ctx, const v1::GetLogsRequest* req,
                                    v1::GetLogsResponse* resp) override {
    if (auto user = Admit(ctx); !user.ok()) return Refuse(ctx, user.status());
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    loop_->Post([=] {
      m_->GetLogs(*req, [reactor, resp](absl::StatusOr<v1::GetLogsResponse> r) {
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
      for (auto& n : m_->ListNodes()) *resp->add_nodes() = std::move(n);
      for (auto& s : m_->ListSources()) *resp->add_sources() = std::move(s);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* DrainNode(grpc::CallbackServerContext* ctx,
                                      const v1::DrainNodeRequest* req,
                                      v1::DrainNodeResponse* resp) override {
    if (auto user = Admit(ctx); !user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->Drain(req->node(), req->undo());
      if (r.ok()) *resp->mutable_node() = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* PreemptNode(grpc::CallbackServerContext* ctx,
                                        const v1::PreemptNodeRequest* req,
                                        v1::PreemptNodeResponse* resp) override {
    if (auto user = Admit(ctx); !user.ok()) return Refuse(ctx, user.status());
    const std::string by = Authenticate(*ctx).value_or(TokenTable::Caller{}).name;
    return OnLoop(loop_, ctx, [=] {
      if (req->in_ms() < 0 || req->in_ms() > int64_t{86400} * 1000 * 365) {
        return absl::InvalidArgumentError("preempt: in_ms must be in [0, one year]");
      }
      v1::PreemptionNotice n;
      n.set_source("varunactl");
      n.set_deadline_ms(absl::ToUnixMillis(clock_->Now()) + req->in_ms());
      n.set_detail(by.empty() ? "by hand" : absl::StrCat("by ", by));
      auto r = m_->Preempt(req->node(), n);
      if (r.ok()) *resp->mutable_node() = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* ListEvents(grpc::CallbackServerContext* ctx,
                                       const v1::ListEventsRequest* req,
                                       v1::ListEventsResponse* resp) override {
    if (auto user = Admit(ctx); !user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=] {
      *resp = m_->ListEvents(*req);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* ctx,
                                       const v1::GetMetricsRequest* req,
                                       v1::GetMetricsResponse* resp) override {
    if (auto user = Admit(ctx); !user.ok()) return Refuse(ctx, user.status());
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->GetMetrics(*req);
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
        PlanInputs in = m_->PlanInputsFor(spec);
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
      *resp = m_->GetProfile(*req);
      return absl::OkStatus();
    });
  }

 private:
  // The gate (a standby names the leader), then the token.
  absl::StatusOr<TokenTable::Caller> Admit(grpc::CallbackServerContext* ctx) const {
    if (ha_ != nullptr) RETURN_IF_ERROR(ha_->Gate(ctx));
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
  Manager* const m_;
  Clock* const clock_;
  const std::optional<TokenTable> tokens_;
  const bool check_files_;
  const Ha* const ha_;
  const ManagerConfig* const config_;
};

ManagerServer::ManagerServer(ManagerConfig config, Clock* clock,
                             std::unique_ptr<AgentClientPool> agents, Options options)
    : config_(std::move(config)),
      clock_(clock),
      agents_(std::move(agents)),
      loop_("manager", options.tick_period,
            [this] {
              if (ha_ != nullptr) ha_->Fence();
              if (leading()) manager_->Tick();
            }),
      files_("manager-files", absl::ZeroDuration(), [] {}),
      slurm_loop_("manager-slurm", absl::ZeroDuration(), [] {}) {}

ManagerServer::~ManagerServer() { Shutdown(); }

absl::Status ManagerServer::Start() {
  RETURN_IF_ERROR(config_.Validate());
  ASSIGN_OR_RETURN(TlsConfig tls, LoadTls(config_.tls, /*need_cert=*/true, "varuna-manager"));
  std::optional<TokenTable> tokens;
  if (!config_.tokens_file.empty()) {
    ASSIGN_OR_RETURN(tokens, TokenTable::Load(config_.tokens_file));
    LOG(INFO) << "manager: " << tokens->size() << " tokens from " << config_.tokens_file;
  }
  if (!config_.etcd_endpoints.empty()) {
    // Several managers (Note [Leader lease] in manager/ha/leader_election.h): etcd's ports take
    // the cluster's certificates when the manager has them.
    ha_ = std::make_unique<Ha>();
    ASSIGN_OR_RETURN(ha_->etcd,
                     EtcdClient::Connect(config_.etcd_endpoints, tls,
                                         std::min(absl::Seconds(2), config_.lease_ttl / 2)));
    ASSIGN_OR_RETURN(std::unique_ptr<EtcdStateStore> es,
                     EtcdStateStore::Open(ha_->etcd.get(), config_.etcd_prefix, config_.state_dir,
                                          config_.etcd_flush));
    ha_->store = es.get();
    store_ = std::move(es);
    // Made before the services (their gate asks it who leads), started after them.
    LeaderElection::Callbacks cb;
    cb.on_elected = [this](int64_t term) { loop_.Post([this, term] { TakeOver(term); }); };
    cb.on_deposed = [](const std::string& why) { Deposed(why); };
    ha_->election = std::make_unique<LeaderElection>(ha_->etcd.get(), config_.etcd_prefix,
                                                     config_.advertise_address(), config_.lease_ttl,
                                                     std::move(cb));
    agents_->set_fence([ha = ha_.get()] { ha->Fence(); });

  } else {
    auto store = StateStore::Open(config_.state_dir);
    if (!store.ok()) return store.status();
    store_ = *std::move(store);
  }
  manager_ = std::make_unique<Manager>(config_, clock_, store_.get(), agents_.get(),
                                       [this](std::function<void()> fn) { loop_.Post(fn); });
  if (!config_.http_listen.empty()) {
    metrics_registry_ = std::make_unique<MetricsRegistry>();
    metrics_ = std::make_unique<ManagerMetrics>(*metrics_registry_);
    manager_->set_metrics(metrics_.get());
    metrics_->SetLeader(ha_ == nullptr);
  }
  if (config_.slurm.enabled()) {
    slurm_commands_ = MakeSlurmCommands(config_.slurm);
    manager_->StartSlurm(slurm_commands_.get(),
                         [this](std::function<void()> fn) { slurm_loop_.Post(std::move(fn)); });
    slurm_loop_.Start();
  }
  if (ha_ == nullptr) {
    if (absl::Status s = manager_->Recover(); !s.ok()) return s;
  }
  loop_.Start();
  files_.Start();
  // The HTTP API takes the same tokens (Note [HTTP server] in common/net/http_server.cc).
  std::shared_ptr<const TokenTable> http_tokens;
  if (tokens) http_tokens = std::make_shared<const TokenTable>(*tokens);
  job_service_ =
      std::make_unique<JobService>(&loop_, &files_, manager_.get(), clock_, std::move(tokens),
                                   config_.check_job_files, ha_.get(), &config_);
  registry_service_ =
      std::make_unique<RegistryService>(&loop_, manager_.get(), tls.enabled, ha_.get());
  auto started = StartServer(config_.listen, {job_service_.get(), registry_service_.get()}, "", tls,
                             ClientCerts::kOptional);
  if (!started.ok()) return started.status();
  server_ = std::move(started->server);
  address_ = started->address;
  if (metrics_registry_) {
    http_ = std::make_unique<HttpServer>();
    std::function<absl::Status()> gate;
    if (ha_ != nullptr) gate = [ha = ha_.get()] { return ha->Gate(nullptr); };
    RegisterManagerHttp(*http_, loop_, *manager_, *metrics_registry_, config_.http_open_metrics,
                        gate);
    HttpServer::Options o;
    o.who = "varuna-manager";
    o.listen = config_.http_listen;
    o.allow_remote = config_.http_allow_remote;
    o.tls_cert_file = config_.tls.cert;
    o.tls_key_file = config_.tls.key;
    if (http_tokens) {
      o.authorize = [http_tokens](const std::string& t) {
        return http_tokens->Lookup(t).has_value();
      };
    }
    RETURN_IF_ERROR(http_->Start(o));
    LOG(INFO) << "manager dashboard and /metrics on " << (http_->tls() ? "https" : "http") << "://"
              << http_->address() << "/" << (http_tokens ? " (bearer tokens)" : "");
  }
  if (ha_ != nullptr) {
    ha_->election->Start();
    LOG(INFO) << "manager " << config_.advertise_address() << " campaigning on etcd "
              << config_.etcd_endpoints << " (prefix " << config_.etcd_prefix << ", lease "
              << absl::FormatDuration(config_.lease_ttl) << ")";
  }
  LOG(INFO) << "manager listening on " << address_ << " state_dir=" << config_.state_dir
            << (tls.enabled ? " tls=mutual" : " tls=off")
            << (config_.tokens_file.empty() ? " tokens=off" : " tokens=on");
  return absl::OkStatus();
}

bool ManagerServer::leading() const { return ha_ == nullptr || ha_->ready; }

void ManagerServer::TakeOver(int64_t term) {
  auto fail = [](const absl::Status& s) {
    Deposed(absl::StrCat("it cannot take over: ", s.ToString()));
  };
  const absl::Time t0 = absl::Now();
  ha_->term = term;
  if (absl::Status s = ha_->store->TakeOver(term, [](const std::string& why) { Deposed(why); });
      !s.ok()) {
    fail(s);
  }
  agents_->set_term(term);
  if (absl::Status s = manager_->Recover(); !s.ok()) fail(s);
  ha_->ready = true;
  if (metrics_) {
    metrics_->SetLeader(true);
    metrics_->OnElected();
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
  if (ha_ != nullptr && ha_->election != nullptr) ha_->election->Stop();
}

void ManagerServer::Tick() {
  loop_.RunSync([this] { manager_->Tick(); });
}

}  // namespace varuna
