#include "manager/manager_server.h"

#include "common/rpc.h"
#include "glog/logging.h"
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

}  // namespace

class ManagerServer::RegistryService final : public v1::AgentRegistry::CallbackService {
 public:
  RegistryService(EventLoop* loop, Manager* m) : loop_(loop), m_(m) {}
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* req,
                                     v1::RegisterResponse* resp) override {
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->Register(*req);
      if (r.ok()) *resp = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override {
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->Heartbeat(*req);
      if (r.ok()) *resp = *std::move(r);
      return r.status();
    });
  }

 private:
  EventLoop* const loop_;
  Manager* const m_;
};

class ManagerServer::JobService final : public v1::JobApi::CallbackService {
 public:
  JobService(EventLoop* loop, Manager* m) : loop_(loop), m_(m) {}

  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx, const v1::SubmitRequest* req,
                                   v1::SubmitResponse* resp) override {
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->Submit(*req);
      if (r.ok()) *resp->mutable_job() = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override {
    return OnLoop(loop_, ctx, [=] {
      for (auto& j : m_->ListJobs()) *resp->add_jobs() = std::move(j);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::GetJobResponse* resp) override {
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->GetJob(req->job_id());
      if (r.ok()) *resp->mutable_job() = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req,
                                      v1::CancelJobResponse* resp) override {
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->Cancel(req->job_id());
      if (r.ok()) *resp->mutable_job() = *r;
      return r.status();
    });
  }
  grpc::ServerUnaryReactor* GetLogs(grpc::CallbackServerContext* ctx, const v1::GetLogsRequest* req,
                                    v1::GetLogsResponse* resp) override {
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
    return OnLoop(loop_, ctx, [=] {
      for (auto& n : m_->ListNodes()) *resp->add_nodes() = std::move(n);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* DrainNode(grpc::CallbackServerContext* ctx,
                                      const v1::DrainNodeRequest* req,
                                      v1::DrainNodeResponse* resp) override {
    return OnLoop(loop_, ctx, [=] {
      auto r = m_->Drain(req->node(), req->undo());
      if (r.ok()) *resp->mutable_node() = *r;
      return r.status();
    });
  }

 private:
  EventLoop* const loop_;
  Manager* const m_;
};

ManagerServer::ManagerServer(ManagerConfig config, Clock* clock,
                             std::unique_ptr<AgentClientPool> agents, Options options)
    : config_(std::move(config)),
      clock_(clock),
      agents_(std::move(agents)),
      loop_("manager", options.tick_period, [this] { manager_->Tick(); }) {}

ManagerServer::~ManagerServer() { Shutdown(); }

absl::Status ManagerServer::Start() {
  auto store = StateStore::Open(config_.state_dir);
  if (!store.ok()) return store.status();
  store_ = *std::move(store);
  manager_ = std::make_unique<Manager>(config_, clock_, store_.get(), agents_.get(),
                                       [this](std::function<void()> fn) { loop_.Post(fn); });
  if (absl::Status s = manager_->Recover(); !s.ok()) return s;
  loop_.Start();
  job_service_ = std::make_unique<JobService>(&loop_, manager_.get());
  registry_service_ = std::make_unique<RegistryService>(&loop_, manager_.get());
  auto started = StartServer(config_.listen, {job_service_.get(), registry_service_.get()});
  if (!started.ok()) return started.status();
  server_ = std::move(started->server);
  address_ = started->address;
  LOG(INFO) << "manager listening on " << address_ << " state_dir=" << config_.state_dir;
  return absl::OkStatus();
}

void ManagerServer::Shutdown() {
  if (stopped_) return;
  stopped_ = true;
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  loop_.Stop();
}

void ManagerServer::Tick() {
  loop_.RunSync([this] { manager_->Tick(); });
}

}  // namespace varuna
