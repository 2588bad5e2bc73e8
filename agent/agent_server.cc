#include "agent/agent_server.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>

#include "agent/preemption.h"
#include "agent/probe.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/net/rpc.h"
#include "glog/logging.h"

namespace varuna {
namespace {

// Note [Following the leader]: with several managers (a:7070,b:7070,c:7070), a call goes to
// the one that answered last; a standby answers UNAVAILABLE with the leader's address in the
// trailing metadata `varuna-leader`, and the call is made again there at once; an unreachable
// manager sends the next call to the next address. The agent's workers are untouched by any
// of this: a new leader loads the jobs from etcd and the agent's next heartbeat reaches it.
class GrpcManagerClient final : public ManagerClient {
 public:
  GrpcManagerClient(const std::string& addresses, absl::Duration timeout, const TlsConfig& tls)
      : timeout_(timeout), tls_(tls) {
    for (const std::string& a : SplitAddressList(addresses)) {
      managers_.push_back({a, v1::AgentRegistry::NewStub(MakeChannel(a, tls))});
    }
    if (managers_.empty())
      managers_.push_back({addresses, v1::AgentRegistry::NewStub(MakeChannel(addresses, tls))});
  }

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req) override {
    return Call<v1::RegisterResponse>(
        "Register", [&](v1::AgentRegistry::Stub* stub, grpc::ClientContext* ctx,
                        v1::RegisterResponse* resp) { return stub->Register(ctx, req, resp); });
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) override {
    return Call<v1::HeartbeatResponse>(
        "Heartbeat", [&](v1::AgentRegistry::Stub* stub, grpc::ClientContext* ctx,
                         v1::HeartbeatResponse* resp) { return stub->Heartbeat(ctx, req, resp); });
  }
  std::string current() const override {
    absl::MutexLock lock(&mu_);
    return managers_[current_].address;
  }

 private:
  struct Manager {
    std::string address;
    std::shared_ptr<v1::AgentRegistry::Stub> stub;
  };

  template <typename Resp, typename F>
  absl::StatusOr<Resp> Call(const char* method, F call) {
    grpc::Status s;
    std::string address;
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::shared_ptr<v1::AgentRegistry::Stub> stub;
      {
        absl::MutexLock lock(&mu_);
        address = managers_[current_].address;
        stub = managers_[current_].stub;
      }
      grpc::ClientContext ctx;
      SetDeadline(&ctx, timeout_);
      Resp resp;
      s = call(stub.get(), &ctx, &resp);
      if (s.ok()) return resp;
      const std::string leader = LeaderFromTrailers(ctx);
      absl::MutexLock lock(&mu_);
      if (!leader.empty() && leader != address) {
        Follow(leader);  // a standby named the leader: ask it now
        continue;
      }
      if (managers_.size() > 1 && (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                                   s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)) {
        current_ = (current_ + 1) % managers_.size();  // the next beat tries the next one
      }
      break;
    }
    return FromGrpcStatus(s, absl::StrCat("manager ", address, " ", method));
  }

  void Follow(const std::string& leader) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < managers_.size(); ++i) {
      if (managers_[i].address == leader) {
        current_ = i;
        return;
      }
    }
    managers_.push_back({leader, v1::AgentRegistry::NewStub(MakeChannel(leader, tls_))});
    current_ = managers_.size() - 1;
  }

  const absl::Duration timeout_;
  const TlsConfig tls_;
  mutable absl::Mutex mu_;
  std::vector<Manager> managers_ ABSL_GUARDED_BY(mu_);
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<ManagerClient> MakeGrpcManagerClient(const std::string& address,
                                                     absl::Duration timeout, const TlsConfig& tls) {
  return std::make_unique<GrpcManagerClient>(address, timeout, tls);
}

// AgentApi glue: each call runs on the agent's loop thread and finishes from there.
// Note [Only the manager]: with TLS the handshake already requires a certificate from the
// cluster CA; every call then also needs its common name to be the manager's, so another
// agent's certificate (same CA) cannot launch anything here.
class AgentServer::Service final : public v1::AgentApi::CallbackService {
 public:
  Service(EventLoop* loop, Agent* agent, bool tls, std::string manager_name,
          std::atomic<int64_t>* term)
      : loop_(loop),
        agent_(agent),
        tls_(tls),
        manager_name_(std::move(manager_name)),
        term_(term) {}

  grpc::ServerUnaryReactor* Launch(grpc::CallbackServerContext* ctx, const v1::LaunchRequest* req,
                                   v1::LaunchResponse* resp) override {
    return OnLoop(ctx, [=] {
      auto r = agent_->Launch(*req);
      if (r.ok()) *resp = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* Stop(grpc::CallbackServerContext* ctx, const v1::StopRequest* req,
                                 v1::StopResponse* resp) override {
    return OnLoop(ctx, [=] {
      *resp = agent_->Stop(*req);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const v1::CheckpointRequest* req,
                                       v1::CheckpointResponse* resp) override {
    return OnLoop(ctx, [=] {
      *resp = agent_->Checkpoint(*req);
      return absl::OkStatus();
    });
  }
  // Off the loop: the probe takes its duration, and the loop must keep serving meanwhile.
  grpc::ServerUnaryReactor* Probe(grpc::CallbackServerContext* ctx, const v1::ProbeRequest* req,
                                  v1::ProbeResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (!Authorized(*ctx, reactor)) return reactor;
    if (req->duration_ms() < 0 || req->duration_ms() > 5000) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "probe duration_ms must be in [0, 5000]"));
      return reactor;
    }
    const absl::Duration d =
        req->duration_ms() > 0 ? absl::Milliseconds(req->duration_ms()) : absl::Milliseconds(500);
    std::thread([reactor, resp, d] {
      const absl::Time t0 = absl::Now();
      resp->set_score(RunSpeedProbe(d));
      resp->set_seconds(absl::ToDoubleSeconds(absl::Now() - t0));
      reactor->Finish(grpc::Status::OK);
    }).detach();
    return reactor;
  }
  grpc::ServerUnaryReactor* FetchLogs(grpc::CallbackServerContext* ctx,
                                      const v1::FetchLogsRequest* req,
                                      v1::FetchLogsResponse* resp) override {
    return OnLoop(ctx, [=] {
      auto r = agent_->FetchLogs(*req);
      if (r.ok()) *resp = *std::move(r);
      return r.status();
    });
  }

 private:
  template <typename F>
  grpc::ServerUnaryReactor* OnLoop(grpc::CallbackServerContext* ctx, F fn) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (!Authorized(*ctx, reactor)) return reactor;
    loop_->Post([reactor, fn] { reactor->Finish(ToGrpcStatus(fn())); });
    return reactor;
  }

  // Over TLS only the manager may call; anyone else's call is finished here, refused.
  bool Authorized(grpc::CallbackServerContext& ctx, grpc::ServerUnaryReactor* reactor) {
    if (tls_) {
      const std::string peer = PeerCommonName(ctx);
      if (peer != manager_name_) {
        LOG(WARNING) << "refused an agent API call from '" << peer << "' at " << ctx.peer();
        reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                     absl::StrCat("only the manager ('", manager_name_,
                                                  "') may call this agent; the "
                                                  "caller's certificate names '",
                                                  peer, "'")));
        return false;
      }
    }
    // Note [Leader lease] (manager/ha/leader_election.h): with several managers each call
    // carries the leader's term; one older than a term this agent has seen is a deposed
    // leader's, refused, and so is a call with no term once the agent has seen one.
    const auto& md = ctx.client_metadata();
    auto it = md.find("varuna-term");
    if (it == md.end() && term_->load() > 0) {
      LOG(WARNING) << "refused a call without a manager term (this agent follows term "
                   << term_->load() << ") from " << ctx.peer();
      reactor->Finish(grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("this agent follows the leader of term ", term_->load(),
                       "; a call without a term is not from that leader (restart the agent "
                       "to move it to a cluster of one manager)")));
      return false;
    }
    if (it != md.end()) {
      int64_t term = 0;
      if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &term)) {
        reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad varuna-term"));
        return false;
      }
      int64_t seen = term_->load();
      while (term > seen && !term_->compare_exchange_weak(seen, term)) {
      }
      if (term < seen) {
        LOG(WARNING) << "refused a call from a deposed manager (term " << term << " < " << seen
                     << ") at " << ctx.peer();
        reactor->Finish(grpc::Status(
            grpc::StatusCode::FAILED_PRECONDITION,
            absl::StrCat("this agent follows the leader of term ", seen, "; the caller's term ",
                         term, " is older (a deposed manager)")));
        return false;
      }
    }
    return true;
  }

  EventLoop* const loop_;
  Agent* const agent_;
  const bool tls_;
  const std::string manager_name_;
  std::atomic<int64_t>* const term_;
};

AgentServer::AgentServer(AgentConfig config, Clock* clock, ProcessLauncher* launcher,
                         std::unique_ptr<ManagerClient> manager, Options options)
    : clock_(clock),
      agent_(std::move(config), clock, launcher),
      options_(options),
      heartbeat_(std::move(manager), &agent_, &loop_),
      loop_("agent", options.background_heartbeats ? options.tick_period : absl::ZeroDuration(),
            [this] {
              agent_.Tick();
              // An exit (or a notice) goes to the manager now, not at the next period: a
              // morph waits for it (docs/morphing.md).
              if (agent_.report().TakeUrgent()) heartbeat_.Wake();
            }) {}

AgentServer::~AgentServer() { Shutdown(); }

absl::Status AgentServer::Start() {
  const AgentConfig& c = agent_.config();
  RETURN_IF_ERROR(CheckListenSecurity("varuna-agent", c.listen, c.tls.enabled(), c.allow_insecure));
  ASSIGN_OR_RETURN(TlsConfig tls, LoadTls(c.tls, /*need_cert=*/true, "varuna-agent"));
  loop_.Start();
  service_ = std::make_unique<Service>(&loop_, &agent_, tls.enabled, c.tls_manager_name,
                                       heartbeat_.manager_term());
  auto started =
      StartServer(c.listen, {service_.get()}, c.advertise_host, tls, ClientCerts::kRequired);
  if (!started.ok()) return started.status();
  server_ = std::move(started->server);
  address_ = started->address;
  heartbeat_.set_address(address_);
  loop_.RunSync([this] { agent_.set_address(address_); });
  if (!c.http_listen.empty()) {
    metrics_registry_ = std::make_unique<MetricsRegistry>();
    metrics_ = std::make_unique<AgentMetrics>(*metrics_registry_, c.slots);
    loop_.RunSync([this] { agent_.set_metrics(metrics_.get()); });
    http_ = std::make_unique<HttpServer>();
    const MetricsRegistry* reg = metrics_registry_.get();
    // The agent's HTTP holds no job data beyond metrics: both routes are public (it has no
    // tokens); HTTPS with the agent's certificate when it has one.
    using Access = HttpServer::Access;
    http_->Get(
        "/metrics",
        [reg](const HttpServer::Request&) -> HttpServer::Response {
          return {200, "text/plain; version=0.0.4; charset=utf-8", reg->Text(), {}};
        },
        Access::kPublic);
    http_->Get(
        "/healthz",
        [this](const HttpServer::Request&) -> HttpServer::Response {
          const bool ok = heartbeat_.registered();
          return {
              ok ? 200 : 503, "text/plain", ok ? "ok\n" : "not registered with the manager\n", {}};
        },
        Access::kPublic, /*priority=*/true);
    HttpServer::Options o;
    o.who = "varuna-agent";
    o.listen = c.http_listen;
    o.allow_remote = c.http_allow_remote;
    o.tls_cert_file = c.tls.cert;
    o.tls_key_file = c.tls.key;
    RETURN_IF_ERROR(http_->Start(o));
    LOG(INFO) << "node=" << c.name << " /metrics on " << (http_->tls() ? "https" : "http") << "://"
              << http_->address() << "/metrics";
  }
  LOG(INFO) << "node=" << agent_.config().name << " agent listening on " << address_
            << " slots=" << agent_.config().slots << " manager=" << agent_.config().manager;
  if (c.startup_probe > absl::ZeroDuration()) {
    // Note [Speed probe] in probe.cc: the baseline, measured once, off the loop.
    probe_thread_ = std::thread([this, d = c.startup_probe] {
      const double score = RunSpeedProbe(d);
      loop_.Post([this, score] { agent_.report().set_probe_score(score); });
    });
  }
  if (options_.background_heartbeats) heartbeat_.Start();
  if (!agent_.config().preemption_notice_url.empty()) {
    notice_cancel_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    notice_thread_ = std::thread([this] { NoticeLoop(); });
  }
  return absl::OkStatus();
}

void AgentServer::Shutdown() {
  if (!heartbeat_.Stop()) return;
  if (notice_cancel_fd_ >= 0) {  // a poll in flight ends now, not at its deadline
    const uint64_t one = 1;
    (void)!write(notice_cancel_fd_, &one, sizeof one);
  }
  if (http_ != nullptr) http_->Stop();
  heartbeat_.Join();
  if (probe_thread_.joinable()) probe_thread_.join();
  if (notice_thread_.joinable()) notice_thread_.join();
  if (notice_cancel_fd_ >= 0) close(notice_cancel_fd_);
  notice_cancel_fd_ = -1;
  if (server_ != nullptr) {
    const int n = loop_.RunSync([this] { return agent_.StopAll(); });
    if (n > 0) LOG(INFO) << "node=" << agent_.config().name << " stopping " << n << " workers";
    const absl::Time deadline = absl::Now() + agent_.config().stop_grace + absl::Seconds(2);
    while (loop_.RunSync([this] {
      agent_.Tick();
      return agent_.running_workers();
    }) > 0 &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    loop_.RunSync([this] { agent_.KillAll(); });
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  loop_.Stop();
}

absl::Status AgentServer::HeartbeatOnce() { return heartbeat_.Once(); }

// Polls the cloud's metadata endpoint off the event loop (a slow endpoint must not delay
// heartbeats); a notice is handed to the agent, whose heartbeats then carry it.
void AgentServer::NoticeLoop() {
  const AgentConfig& c = agent_.config();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::vector<std::string> vm_names = {c.cloud_vm_name, c.name, host};
  bool warned = false;
  for (;;) {
    auto reply = HttpGet(c.preemption_notice_url, absl::Seconds(2), notice_cancel_fd_);
    if (absl::IsCancelled(reply.status())) return;
    if (!reply.ok()) {
      if (!warned)
        LOG(WARNING) << "node=" << c.name << " preemption notice poll: " << reply.status();
      warned = true;
    } else if (auto notice = ParsePreemptionReply(reply->status, reply->body, vm_names)) {
      loop_.Post([this, n = *notice] { agent_.report().SetNotice(n); });
      return;  // one notice per machine lifetime
    }
    if (heartbeat_.WaitStopped(c.notice_poll_period)) return;  // the agent is shutting down
  }
}

void AgentServer::PostNotice(v1::PreemptionNotice notice) {
  loop_.Post([this, n = std::move(notice)] { agent_.report().SetNotice(n); });
  heartbeat_.Wake();
}

int AgentServer::RunningWorkers() {
  return loop_.RunSync([this] { return agent_.running_workers(); });
}

void AgentServer::Tick() {
  loop_.RunSync([this] { agent_.Tick(); });
}

}  // namespace varuna
