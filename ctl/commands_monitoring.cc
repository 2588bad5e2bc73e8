// The Monitoring group: logs, events, metrics.

#include <ostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ctl/commands.h"
#include "ctl/session.h"
#include "ctl/varunactl.h"

namespace varuna::ctl {
namespace {

absl::StatusOr<int> RunLogs(Session& s, const ParsedArgs& a) {
  const bool follow = a.Has("--follow");
  int rank = 0;
  if (!absl::SimpleAtoi(a.Value("--rank"), &rank) || rank < 0) {
    return UsageError("--rank needs a rank number");
  }
  v1::GetLogsRequest req;
  req.set_job_id(a.Get("ID"));
  req.set_rank(rank);
  int waits = 0;
  for (;;) {
    v1::GetLogsResponse resp;
    grpc::Status st = s.stub()->GetLogs(s.Context().get(), req, &resp);
    if (!st.ok()) {
      // While following, a log that does not exist yet (job still starting) is worth a wait.
      const bool transient = st.error_code() == grpc::StatusCode::NOT_FOUND ||
                             st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                             st.error_code() == grpc::StatusCode::UNAVAILABLE;
      if (follow && transient && ++waits < 600) {
        v1::GetJobRequest jr;
        jr.set_job_id(req.job_id());
        v1::GetJobResponse jresp;
        grpc::Status js = s.stub()->GetJob(s.Context().get(), jr, &jresp);
        if (js.ok() && !IsTerminal(jresp.job().state())) {
          absl::SleepFor(absl::Milliseconds(500));
          continue;
        }
      }
      return s.CallError(st, "GetLogs");
    }
    s.out() << resp.data();
    s.out().flush();
    req.set_offset(resp.next_offset());
    if (!resp.data().empty()) continue;
    if (!follow || resp.job_finished()) return kExitOk;
    absl::SleepFor(absl::Milliseconds(500));
  }
}

absl::StatusOr<int> RunEvents(Session& s, const ParsedArgs& a) {
  const bool follow = a.Has("--follow");
  v1::ListEventsRequest req;
  req.set_job_id(a.Get("ID"));
  int unreachable_for = 0;
  for (;;) {
    v1::ListEventsResponse resp;
    grpc::Status st = s.stub()->ListEvents(s.Context().get(), req, &resp);
    if (!st.ok()) {
      if (follow && st.error_code() == grpc::StatusCode::UNAVAILABLE && ++unreachable_for < 120) {
        if (unreachable_for == 1) s.err() << "varunactl: manager unreachable; retrying\n";
        absl::SleepFor(absl::Milliseconds(500));
        continue;
      }
      return s.CallError(st, "ListEvents");
    }
    unreachable_for = 0;
    for (const auto& e : resp.events()) {
      if (s.json()) {
        s.out() << s.Json(e) << "\n";
      } else {
        const std::string subject = !e.job_id().empty() ? absl::StrCat("job ", e.job_id())
                                    : !e.node().empty() ? absl::StrCat("node ", e.node())
                                                        : "manager";
        s.out() << absl::StrFormat("%s %-12s %-18s %s\n", e.at(), Printable(subject), e.kind(),
                                   Printable(e.message()));
      }
      req.set_after_seq(e.seq());
    }
    s.out().flush();
    if (!follow) return kExitOk;
    if (resp.events().empty()) absl::SleepFor(absl::Milliseconds(500));
  }
}

absl::StatusOr<int> RunMetrics(Session& s, const ParsedArgs& a) {
  v1::GetMetricsRequest req;
  req.set_job_id(a.Get("ID"));
  std::vector<v1::StepRecord> steps;
  for (;;) {
    v1::GetMetricsResponse resp;
    grpc::Status st = s.stub()->GetMetrics(s.Context(absl::Seconds(60)).get(), req, &resp);
    if (!st.ok()) return s.CallError(st, "GetMetrics");
    if (resp.steps().empty()) break;
    for (const auto& r : resp.steps()) steps.push_back(r);
    req.set_after_step(steps.back().step());
  }
  if (s.json()) {
    std::vector<std::string> parts;
    for (const auto& r : steps) parts.push_back(s.Json(r));
    s.out() << "[" << absl::StrJoin(parts, ",\n") << "]\n";
  } else {
    s.out() << absl::StrFormat("%-8s %-12s %-12s %-4s %-10s %s\n", "STEP", "LOSS", "EVAL_LOSS",
                               "GEN", "SAMPLES/S", "STEP_S");
    for (const auto& r : steps) {
      const std::string eval =
          r.has_eval_loss() ? absl::StrFormat("%.6f", r.eval_loss()) : std::string("-");
      s.out() << absl::StrFormat("%-8d %-12.6f %-12s %-4d %-10.1f %.3f\n", r.step(), r.loss(), eval,
                                 r.generation(), r.samples_per_s(), r.step_time_s());
    }
  }
  return kExitOk;
}

}  // namespace

Command NewCmdLogs() {
  Command c;
  c.name = "logs";
  c.group = kGroupMonitoring;
  c.synopsis = "a rank's output (rank 0 by default); -f follows it";
  c.help =
      "Prints what one rank of the job wrote (stdout and stderr), from its agent. With -f,\n"
      "keeps printing as the rank writes until the job ends, waiting for a job that is\n"
      "still starting.\n";
  c.args = {Arg("ID", "job ID")};
  c.flags = {
      Option("--rank", "R", "the rank whose output to print", "0"),
      Switch("--follow", "keep printing until the job ends", "-f"),
  };
  c.run = RunLogs;
  return c;
}

Command NewCmdEvents() {
  Command c;
  c.name = "events";
  c.group = kGroupMonitoring;
  c.synopsis = "job and node events (morphs, lost and joined nodes), oldest first";
  c.help =
      "Prints node and job events, oldest first (node_lost, node_joined, preemption_notice,\n"
      "morph_begin, morph_regroup or morph_relaunch, morph_done, job_state, ...). With ID, only\n"
      "that job's.\n"
      "With -f, keeps streaming them (and waits out a manager restart).\n";
  c.args = {Arg("ID", "job ID", /*optional=*/true)};
  c.flags = {
      Switch("--follow", "keep streaming new events", "-f"),
  };
  c.run = RunEvents;
  return c;
}

Command NewCmdMetrics() {
  Command c;
  c.name = "metrics";
  c.group = kGroupMonitoring;
  c.synopsis = "every step of a job across morphs: loss, generation, samples/s, step time";
  c.help =
      "Prints every step of the job across generations (step, loss, generation, samples/s,\n"
      "step time), each step once: a step re-run after a rollback is the newer generation's\n"
      "record. -o json prints an array of step records.\n";
  c.args = {Arg("ID", "job ID")};
  c.run = RunMetrics;
  return c;
}

}  // namespace varuna::ctl
