#pragma once

// varuna-manager's HTTP side (docs/observability.md): GET /metrics (Prometheus), /healthz,
// the dashboard at / (embedded assets), and the JSON API under /api/v1/ that the dashboard
// reads: the same messages varunactl -o json prints. Handlers run on HTTP threads and reach
// the manager's state only through its event loop.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/base/event_loop.h"
#include "common/net/http_server.h"
#include "common/net/metrics.h"
#include "manager/api/manager_api.h"
#include "manager/api/tokens.h"
#include "manager/state/manager_metrics.h"

namespace varuna {

// The manager's HTTP face (--http_listen). Owns the metrics registry that /metrics serves, the
// manager's metric families in it (there from construction, so the manager records into them
// before the server starts), and the HttpServer. Start and Stop from the thread that runs
// ManagerServer's Start and Shutdown.
class ManagerHttp {
 public:
  // The JSON API asks `api` on `loop`, which outlives this.
  ManagerHttp(EventLoop* loop, ManagerApi api);
  ~ManagerHttp();

  ManagerMetrics* metrics() { return &metrics_; }
  // Registers the routes and serves them. Every route but /healthz and the dashboard's static
  // files needs a bearer token when `options` has an authorizer; /metrics too unless
  // `open_metrics`. `gate`: with several managers, OK only on the leader (the API answers 503
  // elsewhere).
  // `caller_of`: who a request's principal (the token's name) is, for the roles (Note [Roles]
  // in access.cc); null: every caller is an admin.
  absl::Status Start(const HttpServer::Options& options, bool open_metrics,
                     std::function<absl::Status()> gate = nullptr,
                     std::function<TokenTable::Caller(const std::string&)> caller_of = nullptr);
  void Stop();
  // HOST:PORT, "" before Start.
  std::string address() const { return http_ ? http_->address() : ""; }
  bool tls() const { return http_ != nullptr && http_->tls(); }

 private:
  EventLoop* const loop_;
  ManagerApi api_;
  MetricsRegistry registry_;
  ManagerMetrics metrics_;
  std::unique_ptr<HttpServer> http_;  // from Start
};

}  // namespace varuna
