#pragma once

// varuna-manager's HTTP side (docs/observability.md): GET /metrics (Prometheus), /healthz,
// the dashboard at / (embedded assets), and the JSON API under /api/v1/ that the dashboard
// reads: the same messages varunactl -o json prints. Handlers run on HTTP threads and reach
// the manager's state only through its event loop.

#include "common/base/event_loop.h"
#include "common/net/http_server.h"
#include "common/net/metrics.h"
#include "manager/manager.h"

namespace varuna {

// Every route but /healthz and the dashboard's static files needs a bearer token when the
// server has an authorizer; /metrics too unless `open_metrics`.
// `gate`: with several managers, OK only on the leader (the API answers 503 elsewhere).
void RegisterManagerHttp(HttpServer& http, EventLoop& loop, Manager& manager,
                         const MetricsRegistry& metrics, bool open_metrics,
                         std::function<absl::Status()> gate = nullptr);

}  // namespace varuna
