// control_plane_load: simulated agents against a real varuna-manager.
//
// Registers --agents nodes one after another, and has each send a heartbeat every --period_s
// from its registration on, evenly spread over the period (as independent agents would be),
// each over its own connection unless --connections says fewer. Heartbeats count from
// --warmup_s after the last registration, for --duration_s - --warmup_s.
// Prints one JSON line: heartbeats sent, errors, latency percentiles in ms, and how late the
// load generator itself ran (so a saturated client is not mistaken for a slow manager).
//
//   control_plane_load --manager 127.0.0.1:7070 --agents 1000 --period_s 1 --duration_s 30

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "varuna/v1/control.grpc.pb.h"

ABSL_FLAG(std::string, manager, "127.0.0.1:7070", "manager host:port");
ABSL_FLAG(int, agents, 1000, "simulated agents");
ABSL_FLAG(int, connections, 0, "gRPC connections to share among them (0 = one per agent)");
ABSL_FLAG(double, period_s, 1.0, "heartbeat period per agent");
ABSL_FLAG(double, duration_s, 30.0, "how long to heartbeat, warm-up included");
ABSL_FLAG(double, warmup_s, 5.0, "heartbeats sent in the first seconds are not counted");
ABSL_FLAG(int, workers, 0,
          "running workers each agent reports (of a job the manager does not know, so each "
          "heartbeat also gets a stop order back)");
ABSL_FLAG(double, timeout_s, 5.0, "deadline of each RPC");

namespace v1 = varuna::v1;

namespace {

struct Stats {
  std::mutex mu;
  std::vector<double> latency_ms;
  int64_t errors = 0;
  std::string first_error;
};

struct Call {
  grpc::ClientContext ctx;
  v1::HeartbeatRequest req;
  v1::HeartbeatResponse resp;
  absl::Time start;
  bool counted = false;
};

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string manager = absl::GetFlag(FLAGS_manager);
  const int agents = absl::GetFlag(FLAGS_agents);
  const int conns = absl::GetFlag(FLAGS_connections) > 0
                        ? std::min(absl::GetFlag(FLAGS_connections), agents)
                        : agents;
  const absl::Duration period = absl::Seconds(absl::GetFlag(FLAGS_period_s));
  const absl::Duration duration = absl::Seconds(absl::GetFlag(FLAGS_duration_s));
  const absl::Duration warmup = absl::Seconds(absl::GetFlag(FLAGS_warmup_s));
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  if (agents < 1 || period <= absl::ZeroDuration() || duration <= warmup) {
    std::fprintf(stderr,
                 "control_plane_load: need --agents >= 1, --period_s > 0 and "
                 "--duration_s > --warmup_s\n");
    return 2;
  }

  // Distinct channel arguments keep gRPC from sharing one TCP connection among channels.
  std::vector<std::unique_ptr<v1::AgentRegistry::Stub>> stubs;
  for (int c = 0; c < conns; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("varuna.bench_connection", c);
    stubs.push_back(v1::AgentRegistry::NewStub(
        grpc::CreateCustomChannel(manager, grpc::InsecureChannelCredentials(), args)));
  }
  auto name_of = [](int i) { return absl::StrCat("sim-", i); };

  // Agents register one after another on a thread of their own, and each heartbeats from
  // its registration on, as a real agent does (one that waited for 10,000 others to
  // register first would be SUSPECT before its first beat). The counted window starts
  // --warmup_s after the last registration.
  std::atomic<int> registered{0};
  std::atomic<bool> register_failed{false};
  std::atomic<int64_t> registered_at_ns{0};  // when the last one registered; 0 until then
  std::thread registrar([&] {
    for (int i = 0; i < agents; ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::RegisterRequest req;
      req.set_name(name_of(i));
      req.set_address(absl::StrCat("127.0.0.1:", 20000 + i % 40000));
      req.set_slots(8);
      (*req.mutable_labels())["sim"] = "1";
      v1::RegisterResponse resp;
      grpc::Status s = stubs[i % conns]->Register(&ctx, req, &resp);
      if (!s.ok()) {
        std::fprintf(stderr, "control_plane_load: register %s: %s\n", name_of(i).c_str(),
                     s.error_message().c_str());
        register_failed = true;
        return;
      }
      registered.store(i + 1);
    }
    registered_at_ns.store(absl::ToUnixNanos(absl::Now()));
  });

  Stats stats;
  std::atomic<int64_t> in_flight{0};
  std::vector<double> lag_ms;  // how late each send left, generator thread only
  int64_t sent = 0;
  const absl::Time t0 = absl::Now();
  absl::Time counting_from = absl::InfiniteFuture(), end = absl::InfiniteFuture();
  const absl::Duration spacing = period / agents;
  for (int64_t k = 0;; ++k) {
    if (register_failed) break;
    if (end == absl::InfiniteFuture() && registered_at_ns.load() != 0) {
      counting_from = absl::FromUnixNanos(registered_at_ns.load()) + warmup;
      end = counting_from + (duration - warmup);
    }
    const absl::Time due = t0 + spacing * k;
    if (due >= end) break;
    const absl::Time now = absl::Now();
    if (due > now) absl::SleepFor(due - now);
    const int i = static_cast<int>(k % agents);
    if (i >= registered.load()) continue;  // not registered yet: no heartbeat
    auto* call = new Call;
    call->req.set_name(name_of(i));
    // As a real agent does: the previous heartbeat's round trip (the manager's histogram).
    call->req.set_last_rtt_s(0.001 + 0.0001 * static_cast<double>(k % 7));
    for (int w = 0; w < absl::GetFlag(FLAGS_workers); ++w) {
      v1::WorkerStatus* ws = call->req.add_workers();
      ws->set_job_id("bench-unknown");
      ws->set_generation(1);
      ws->set_rank(i * absl::GetFlag(FLAGS_workers) + w);
      ws->set_state(v1::WORKER_RUNNING);
      ws->set_pid(100000 + w);
      ws->mutable_progress()->set_step(k / agents);
      ws->mutable_progress()->set_loss(3.0);
    }
    call->ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
    call->start = absl::Now();
    call->counted = call->start >= counting_from;
    if (call->counted) {
      lag_ms.push_back(absl::ToDoubleMilliseconds(call->start - due));
      ++sent;
    }
    in_flight.fetch_add(1);
    stubs[i % conns]->async()->Heartbeat(
        &call->ctx, &call->req, &call->resp, [call, &stats, &in_flight](grpc::Status s) {
          const double ms = absl::ToDoubleMilliseconds(absl::Now() - call->start);
          if (call->counted) {
            std::lock_guard<std::mutex> lock(stats.mu);
            if (s.ok()) {
              stats.latency_ms.push_back(ms);
            } else {
              if (stats.errors++ == 0) {
                stats.first_error = s.error_message();
              }
            }
          }
          delete call;
          in_flight.fetch_sub(1);
        });
  }
  // Every call has a deadline, so each callback runs soon; they use `stats` and `in_flight`,
  // which must outlive them.
  while (in_flight.load() > 0) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  registrar.join();
  if (register_failed) return 1;
  const double window_s = absl::ToDoubleSeconds(end - counting_from);

  std::lock_guard<std::mutex> lock(stats.mu);
  std::vector<double>& lat = stats.latency_ms;
  const double p50 = Percentile(lat, 0.50), p90 = Percentile(lat, 0.90),
               p99 = Percentile(lat, 0.99), p999 = Percentile(lat, 0.999);
  const double max = lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end());
  const double lag_p99 = Percentile(lag_ms, 0.99);
  std::printf(
      "{\"agents\": %d, \"connections\": %d, \"workers_per_agent\": %d, \"period_s\": %.3f, "
      "\"window_s\": %.1f, \"sent\": %lld, \"ok\": %zu, \"errors\": %lld, "
      "\"heartbeats_per_s\": %.1f, \"p50_ms\": %.3f, \"p90_ms\": %.3f, \"p99_ms\": %.3f, "
      "\"p999_ms\": %.3f, \"max_ms\": %.3f, \"send_lag_p99_ms\": %.3f, \"first_error\": \"%s\"}\n",
      agents, conns, absl::GetFlag(FLAGS_workers), absl::ToDoubleSeconds(period), window_s,
      static_cast<long long>(sent), lat.size(), static_cast<long long>(stats.errors),
      lat.size() / window_s, p50, p90, p99, p999, max, lag_p99,
      absl::StrReplaceAll(stats.first_error, {{"\"", "'"}}).c_str());
  return stats.errors == 0 ? 0 : 1;
}
