#include "manager/nodes/agent_client.h"

#include <atomic>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/net/rpc.h"
#include "varuna/v1/control.grpc.pb.h"

namespace varuna {
namespace {

class GrpcAgentClient final : public AgentClient {
 public:
  GrpcAgentClient(const std::string& node, const std::string& address, absl::Duration timeout,
                  const TlsConfig& tls, std::shared_ptr<const std::atomic<int64_t>> term,
                  std::shared_ptr<const std::function<void()>> fence)
      : address_(address),
        timeout_(timeout),
        term_(std::move(term)),
        fence_(std::move(fence)),
        stub_(v1::AgentApi::NewStub(MakeChannel(address, tls, /*peer_name=*/node))) {}

  void Launch(const v1::LaunchRequest& req, Done<v1::LaunchResponse> done) override {
    Call(req, std::move(done), "Launch", [this](auto* ctx, auto* rq, auto* rs, auto cb) {
      stub_->async()->Launch(ctx, rq, rs, std::move(cb));
    });
  }
  void Stop(const v1::StopRequest& req, Done<v1::StopResponse> done) override {
    Call(req, std::move(done), "Stop", [this](auto* ctx, auto* rq, auto* rs, auto cb) {
      stub_->async()->Stop(ctx, rq, rs, std::move(cb));
    });
  }
  void Checkpoint(const v1::CheckpointRequest& req, Done<v1::CheckpointResponse> done) override {
    Call(req, std::move(done), "Checkpoint", [this](auto* ctx, auto* rq, auto* rs, auto cb) {
      stub_->async()->Checkpoint(ctx, rq, rs, std::move(cb));
    });
  }
  void Probe(const v1::ProbeRequest& req, Done<v1::ProbeResponse> done) override {
    Call(req, std::move(done), "Probe", [this](auto* ctx, auto* rq, auto* rs, auto cb) {
      stub_->async()->Probe(ctx, rq, rs, std::move(cb));
    });
  }
  void FetchLogs(const v1::FetchLogsRequest& req, Done<v1::FetchLogsResponse> done) override {
    Call(req, std::move(done), "FetchLogs", [this](auto* ctx, auto* rq, auto* rs, auto cb) {
      stub_->async()->FetchLogs(ctx, rq, rs, std::move(cb));
    });
  }

 private:
  template <typename Req, typename Resp, typename Start>
  void Call(const Req& req, Done<Resp> done, const char* method, Start start) {
    struct State {
      grpc::ClientContext ctx;
      Req req;
      Resp resp;
    };
    if (*fence_) (*fence_)();
    auto* st = new State;
    st->req = req;
    SetDeadline(&st->ctx, timeout_);
    if (const int64_t term = term_->load(); term > 0) {
      st->ctx.AddMetadata("varuna-term", absl::StrCat(term));
    }
    const std::string what = absl::StrCat("agent ", address_, " ", method);
    start(&st->ctx, &st->req, &st->resp, [st, done = std::move(done), what](grpc::Status s) {
      if (s.ok()) {
        done(std::move(st->resp));
      } else {
        done(FromGrpcStatus(s, what));
      }
      delete st;
    });
  }

  const std::string address_;
  const absl::Duration timeout_;
  std::shared_ptr<const std::atomic<int64_t>> term_;
  std::shared_ptr<const std::function<void()>> fence_;
  std::unique_ptr<v1::AgentApi::Stub> stub_;
};

class GrpcAgentClientPool final : public AgentClientPool {
 public:
  GrpcAgentClientPool(absl::Duration timeout, TlsConfig tls)
      : timeout_(timeout), tls_(std::move(tls)) {}
  // Note [Agent identity]: an agent's address is what it claims at registration, so the
  // manager does not trust it to name the machine: over TLS the channel checks the agent's
  // certificate against the node's name (make_certs.sh puts NAME in every certificate's
  // subjectAltName), not against the address. An agent that registers with another node's
  // address (node_table.cc refuses a live one's) then fails the handshake at the victim
  // instead of running the other node's ranks there.
  std::shared_ptr<AgentClient> For(const std::string& node, const std::string& address) override {
    absl::MutexLock lock(&mu_);
    auto& c = clients_[{node, address}];
    if (c == nullptr)
      c = std::make_shared<GrpcAgentClient>(node, address, timeout_, tls_, term_, fence_);
    return c;
  }
  void set_term(int64_t term) override { term_->store(term); }
  // Set once, before the first call (TakeOver).
  void set_fence(std::function<void()> fence) override { *fence_ = std::move(fence); }

 private:
  const absl::Duration timeout_;
  const TlsConfig tls_;
  const std::shared_ptr<std::atomic<int64_t>> term_ = std::make_shared<std::atomic<int64_t>>(0);
  const std::shared_ptr<std::function<void()>> fence_ = std::make_shared<std::function<void()>>();
  absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<AgentClient>> clients_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<AgentClientPool> MakeGrpcAgentClientPool(absl::Duration timeout,
                                                         const TlsConfig& tls) {
  return std::make_unique<GrpcAgentClientPool>(timeout, tls);
}

}  // namespace varuna
