#include "manager/api/manager_http.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net/proto_json.h"
#include "manager/api/access.h"
#include "manager/api/web_assets.h"

namespace varuna {
namespace {

using Response = HttpServer::Response;
using Request = HttpServer::Request;

int HttpStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kFailedPrecondition:
      return 409;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return 503;
    default:
      return 500;
  }
}

template <typename T>
Response Json(const absl::StatusOr<T>& r) {
  if (!r.ok()) return JsonError(HttpStatus(r.status()), std::string(r.status().message()));
  return {200, "application/json", ProtoJson(*r), {}};
}

int64_t ParamInt(const Request& req, const std::string& key, int64_t fallback) {
  auto it = req.params.find(key);
  int64_t v = 0;
  if (it == req.params.end() || !absl::SimpleAtoi(it->second, &v)) return fallback;
  return v;
}

// The last `lines` lines of every rank's log of the job, from its last 16 KiB.
Response Logs(EventLoop& loop, ManagerApi& m, const std::string& id, int lines) {
  auto job = loop.RunSync([&] { return m.GetJob(id); });
  if (!job.ok()) return Json(job);
  struct Shared {
    std::mutex mu;
    std::map<int, std::pair<std::string, absl::StatusOr<v1::GetLogsResponse>>> got;
    int pending = 0;
    std::promise<void> done;
  };
  auto shared = std::make_shared<Shared>();
  const int ranks = std::min(job->placement_size(), 256);
  if (ranks == 0) return {200, "application/json", "{\"ranks\": []}", {}};
  shared->pending = ranks;
  for (int r = 0; r < ranks; ++r) {
    const std::string node = job->placement(r).node();
    const int rank = job->placement(r).rank();
    loop.Post([&m, shared, id, rank, node] {
      v1::GetLogsRequest req;
      req.set_job_id(id);
      req.set_rank(rank);
      req.set_offset(-16384);
      req.set_max_bytes(16384);
      m.GetLogs(req, [shared, rank, node](absl::StatusOr<v1::GetLogsResponse> r) {
        std::lock_guard<std::mutex> l(shared->mu);
        shared->got.emplace(rank, std::make_pair(node, std::move(r)));
        if (--shared->pending == 0) shared->done.set_value();
      });
    });
  }
  if (shared->done.get_future().wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    return JsonError(503, "logs: agents did not answer within 5 s");
  }
  std::string body = "{\"ranks\": [";
  std::lock_guard<std::mutex> l(shared->mu);
  bool first = true;
  for (auto& [rank, entry] : shared->got) {
    auto& [node, r] = entry;
    v1::GetLogsResponse logs;
    std::string error;
    if (r.ok()) {
      logs = *r;
    } else {
      error = std::string(r.status().message());
    }
    std::vector<std::string> all = absl::StrSplit(logs.data(), '\n', absl::SkipEmpty());
    // A tail that starts mid-line: drop the partial first line.
    if (!all.empty() && logs.next_offset() > static_cast<int64_t>(logs.data().size())) {
      all.erase(all.begin());
    }
    if (static_cast<int>(all.size()) > lines) all.erase(all.begin(), all.end() - lines);
    std::string lines_json = "[";
    for (size_t i = 0; i < all.size(); ++i) {
      absl::StrAppend(&lines_json, i ? "," : "", JsonString(all[i]));
    }
    lines_json += "]";
    absl::StrAppend(&body, first ? "" : ",", "{\"rank\": ", rank, ", \"node\": ", JsonString(node),
                    ", \"lines\": ", lines_json, ", \"error\": ", JsonString(error), "}");
    first = false;
  }
  body += "]}";
  return {200, "application/json", body, {}};
}

// The JSON API only where the manager leads (a standby answers 503 naming the leader).
HttpServer::Handler Gated(std::function<absl::Status()> gate, HttpServer::Handler handler) {
  if (!gate) return handler;
  return [gate, handler](const Request& req) -> Response {
    if (absl::Status s = gate(); !s.ok()) return JsonError(503, std::string(s.message()));
    return handler(req);
  };
}

using CallerOf = std::function<TokenTable::Caller(const std::string&)>;

// A job route (Note [Roles] in access.cc): the handler runs only for the job's owner or an admin.
HttpServer::Handler Owned(EventLoop& loop, ManagerApi& m, const CallerOf& caller_of,
                          HttpServer::Handler handler) {
  return [&loop, &m, caller_of, handler](const Request& req) -> Response {
    const TokenTable::Caller caller = caller_of ? caller_of(req.principal) : TokenTable::Caller{};
    if (caller.role != TokenTable::Role::kAdmin) {
      auto job = loop.RunSync([&] { return m.GetJob(req.matches[0]); });
      if (!job.ok()) return Json(job);
      absl::Status may = Authorize(caller, ApiAction::kReadJob, job->id(), job->submitted_by());
      if (!may.ok()) return JsonError(403, std::string(may.message()));
    }
    return handler(req);
  };
}

void Register(HttpServer& http, EventLoop& loop, ManagerApi& m, const MetricsRegistry& metrics,
              bool open_metrics, std::function<absl::Status()> gate, CallerOf caller_of) {
  using Access = HttpServer::Access;
  auto caller = [caller_of](const Request& req) {
    return caller_of ? caller_of(req.principal) : TokenTable::Caller{};
  };
  auto owned = [&](HttpServer::Handler h) { return Owned(loop, m, caller_of, std::move(h)); };
  // The cluster's /metrics names every job (its loss, step, slots): once roles are on it is an
  // admin's, as node management is (a Prometheus scraper gets an admin token, or the operator
  // opens it with --http_open_metrics); a user reads its own job's at /api/v1/jobs/ID/metrics.
  http.Get(
      "/metrics",
      [&metrics, caller, open_metrics](const Request& req) -> Response {
        if (!open_metrics) {
          const TokenTable::Caller who = caller(req);
          if (who.role != TokenTable::Role::kAdmin) {
            return JsonError(403,
                             absl::StrCat("/metrics names every tenant's jobs: token '", who.name,
                                          "' has the user role; it needs an admin's"));
          }
        }
        return {200, "text/plain; version=0.0.4; charset=utf-8", metrics.Text(), {}};
      },
      open_metrics ? Access::kPublic : Access::kToken);
  // Healthy = the manager's loop answers (not just the HTTP thread).
  http.Get(
      "/healthz",
      [&loop](const Request&) -> Response {
        auto answered = std::make_shared<std::promise<void>>();
        auto f = answered->get_future();
        loop.Post([answered] { answered->set_value(); });
        if (f.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
          return {503, "text/plain", "manager loop not answering\n", {}};
        }
        return {200, "text/plain", "ok\n", {}};
      },
      Access::kPublic, /*priority=*/true);
  http.Get("/api/v1/nodes", Gated(gate, [&](const Request&) {
             v1::ListNodesResponse r;
             loop.RunSync([&] {
               for (auto& n : m.ListNodes()) *r.add_nodes() = std::move(n);
               for (auto& s : m.ListSources()) *r.add_sources() = std::move(s);
             });
             return Response{200, "application/json", ProtoJson(r), {}};
           }));
  // Paged like ListJobs (Note [Pages] in manager_api.cc): ?page_size=N&page_token=T.
  http.Get("/api/v1/jobs", Gated(gate, [&, caller](const Request& req) {
             v1::ListJobsRequest q;
             q.set_page_size(
                 static_cast<int32_t>(std::clamp<int64_t>(ParamInt(req, "page_size", 0), 0, 1000)));
             if (auto it = req.params.find("page_token"); it != req.params.end())
               q.set_page_token(it->second);
             auto r = loop.RunSync([&] { return m.ListJobs(q); });
             if (r.ok()) {
               const TokenTable::Caller who = caller(req);
               for (v1::JobInfo& j : *r->mutable_jobs()) {
                 if (!MayReadJob(who, j)) RedactForOthers(&j);
               }
             }
             return Json(r);
           }));
  http.Get(R"(/api/v1/jobs/([A-Za-z0-9._-]{1,64}))", Gated(gate, [&, caller](const Request& req) {
             auto r = loop.RunSync([&] { return m.GetJob(req.matches[0]); });
             if (r.ok() && !MayReadJob(caller(req), *r)) RedactForOthers(&*r);
             return Json(r);
           }));
  http.Get(R"(/api/v1/jobs/([A-Za-z0-9._-]{1,64})/metrics)",
           Gated(gate, owned([&](const Request& req) {
                   v1::GetMetricsRequest q;
                   q.set_job_id(req.matches[0]);
                   q.set_after_step(ParamInt(req, "after_step", 0));
                   return Json(loop.RunSync([&] { return m.GetMetrics(q); }));
                 })));
  http.Get(R"(/api/v1/jobs/([A-Za-z0-9._-]{1,64})/stages)",
           Gated(gate, owned([&](const Request& req) {
                   return Json(loop.RunSync([&] { return m.GetStages(req.matches[0]); }));
                 })));
  http.Get(R"(/api/v1/jobs/([A-Za-z0-9._-]{1,64})/events)",
           Gated(gate, owned([&](const Request& req) {
                   if (auto job = loop.RunSync([&] { return m.GetJob(req.matches[0]); });
                       !job.ok()) {
                     return Json(job);
                   }
                   v1::ListEventsRequest q;
                   q.set_job_id(req.matches[0]);
                   q.set_after_seq(ParamInt(req, "after_seq", 0));
                   return Response{200,
                                   "application/json",
                                   ProtoJson(loop.RunSync([&] { return m.ListEvents(q); })),
                                   {}};
                 })));
  http.Get(R"(/api/v1/jobs/([A-Za-z0-9._-]{1,64})/logs)",
           Gated(gate, owned([&](const Request& req) {
                   const int tail =
                       static_cast<int>(std::clamp<int64_t>(ParamInt(req, "tail", 20), 1, 200));
                   return Logs(loop, m, req.matches[0], tail);
                 })));
  http.Get(R"(/api/v1/.*)", [](const Request& req) {
    return JsonError(404, absl::StrCat("no API endpoint ", req.path));
  });
  // The dashboard itself is static and public: it asks for the token (web/src/app.js).
  http.Get(R"(/(|index\.html|app\.js|app\.css))",
           [](const Request& req) -> Response {
             const WebAsset* a = FindWebAsset(req.path);
             if (a == nullptr) return {404, "text/plain", "not found\n", {}};
             return {200, std::string(a->content_type), std::string(a->body), {}};
           },
           Access::kPublic);
}

}  // namespace

ManagerHttp::ManagerHttp(EventLoop* loop, ManagerApi api)
    : loop_(loop), api_(std::move(api)), metrics_(registry_) {}

ManagerHttp::~ManagerHttp() = default;

absl::Status ManagerHttp::Start(const HttpServer::Options& options, bool open_metrics,
                                std::function<absl::Status()> gate, CallerOf caller_of) {
  http_ = std::make_unique<HttpServer>();
  Register(*http_, *loop_, api_, registry_, open_metrics, std::move(gate), std::move(caller_of));
  return http_->Start(options);
}

void ManagerHttp::Stop() {
  if (http_ != nullptr) http_->Stop();
}

}  // namespace varuna
