#include "ctl/varunactl.h"

#include <unistd.h>

#include <cstdlib>
#include <iomanip>
#include <map>
#include <ostream>
#include <random>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/net/proto_json.h"
#include "common/net/rpc.h"
#include "common/pipeline/topology.h"
#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"
#include "common/spec/submission.h"
#include "varuna/v1/control.grpc.pb.h"

namespace varuna {
namespace {

constexpr char kUsage[] =
    R"(usage: varunactl [--manager HOST:PORT] [--tls_ca FILE] [--token T] [-o table|json]
                 COMMAND ...

commands:
  submit FILE [--follow] [--set KEY=VALUE]... [--name N] [--stages P|auto]
              [--replicas D|auto] [--micro_batch M|auto] [--global_batch B] [--steps S]
              [--env KEY=VALUE]... [--env_file FILE] [--configs FILE] [--request_id ID]
              [--raw] [-- ENTRYPOINT ARGS...]
  list                        jobs, oldest first
  status ID                   one job
  logs ID [--rank R] [-f]     a rank's output (rank 0 by default); -f follows it
  cancel ID                   stop a job (CANCELLING -> CANCELLED)
  nodes                       the agents and their state
  drain NODE [--undo]         no new work on NODE; its jobs checkpoint and move off it
                              (--undo: schedulable again)
  preempt NODE [--in DURATION]  a preemption notice by hand (e.g. --in 30s): NODE's jobs
                              checkpoint at the next step and move off it
  events [ID] [-f]            job and node events (morphs, lost and joined nodes), oldest
                              first; -f keeps streaming them
  metrics ID                  every step of the job across morphs: step, loss, generation,
                              samples/s, step time
  plan FILE [--slots N | --nodes N1,N2,...] [--profile FILE] [--memory_gib G] [--all]
              [--set KEY=VALUE]... [--stages P|auto] [--replicas D|auto]
              [--micro_batch M|auto] [--schedule S|auto] [--global_batch B]
                              AutoConfig: every shape ranked by simulated step time (--all:
                              also the rejected ones and those using fewer slots). With
                              --slots/--nodes no manager is needed; without them it plans
                              for the cluster's alive slots (busy or not)
  profile FILE [--follow] [--set KEY=VALUE]...
                              measure the job's model on the cluster (a short job); the
                              manager stores the profile and plans jobs of this model with it

The manager address comes from --manager or $VARUNA_MANAGER; the cluster CA (to talk TLS)
from --tls_ca or $VARUNA_TLS_CA; the token from --token or $VARUNA_TOKEN.
Exit codes: 0 ok, 1 job failed/cancelled or request refused, 2 bad usage or job spec,
3 manager unreachable.
)";

struct UsageError {
  std::string message;
};

class Ctl {
 public:
  Ctl(std::ostream& out, std::ostream& err) : out_(out), err_(err) {}

  int Main(std::vector<std::string> args, const std::string& env_manager);

 private:
  int Submit();
  int List();
  int Status();
  int Logs();
  int Cancel();
  int Nodes();
  int Drain();
  int Preempt();
  int Events();
  int Metrics();
  int Plan();
  int Profile();
  void PrintPlans(const v1::PlanSet& set, bool all);

  // Argument helpers over rest_.
  bool TakeFlag(const std::string& name);
  bool TakeValue(const std::string& name, std::string* value);
  std::vector<std::string> TakeValues(const std::string& name);
  std::string TakePositional(const std::string& what);
  void NoMore();

  int Fail(const absl::Status& s);
  int FailGrpc(const grpc::Status& s, const std::string& call);
  int Follow(const std::vector<std::string>& ids);
  std::string Json(const google::protobuf::Message& m) const;
  void PrintJobsTable(const std::vector<v1::JobInfo>& jobs);
  void PrintJob(const v1::JobInfo& job);
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10)) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    SetDeadline(ctx.get(), timeout);
    if (!token_.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
    return ctx;
  }

  std::ostream& out_;
  std::ostream& err_;
  std::string manager_;
  std::string token_;
  bool tls_ = false;
  bool json_ = false;
  std::vector<std::string> rest_;
  std::unique_ptr<v1::JobApi::Stub> stub_;
};

bool Ctl::TakeFlag(const std::string& name) {
  for (auto it = rest_.begin(); it != rest_.end(); ++it) {
    if (*it == "--") break;
    if (*it == name) {
      rest_.erase(it);
      return true;
    }
  }
  return false;
}

bool Ctl::TakeValue(const std::string& name, std::string* value) {
  for (size_t i = 0; i < rest_.size(); ++i) {
    if (rest_[i] == "--") break;
    if (rest_[i] == name) {
      if (i + 1 >= rest_.size()) throw UsageError{absl::StrCat(name, " needs a value")};
      *value = rest_[i + 1];
      rest_.erase(rest_.begin() + i, rest_.begin() + i + 2);
      return true;
    }
    if (rest_[i].rfind(name + "=", 0) == 0) {
      *value = rest_[i].substr(name.size() + 1);
      rest_.erase(rest_.begin() + i);
      return true;
    }
  }
  return false;
}

std::vector<std::string> Ctl::TakeValues(const std::string& name) {
  std::vector<std::string> values;
  std::string v;
  while (TakeValue(name, &v)) values.push_back(v);
  return values;
}

std::string Ctl::TakePositional(const std::string& what) {
  for (auto it = rest_.begin(); it != rest_.end(); ++it) {
    if (*it == "--") break;
    if (it->rfind("-", 0) != 0) {
      std::string v = *it;
      rest_.erase(it);
      return v;
    }
  }
  throw UsageError{absl::StrCat("missing ", what)};
}

void Ctl::NoMore() {
  if (!rest_.empty()) throw UsageError{absl::StrCat("unexpected argument '", rest_[0], "'")};
}

int Ctl::Fail(const absl::Status& s) {
  err_ << "varunactl: " << s.message() << "\n";
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnreachable;
    case absl::StatusCode::kInvalidArgument:
      return kExitUsage;
    default:
      return kExitFailed;
  }
}

int Ctl::FailGrpc(const grpc::Status& s, const std::string& call) {
  absl::Status st = FromGrpcStatus(s, absl::StrCat("manager ", manager_, " (", call, ")"));
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    st = absl::UnauthenticatedError(
        absl::StrCat("manager ", manager_, " refused ", call, ": ", s.error_message()));
  } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    // A TLS manager and a plaintext client (or the reverse) look like an unreachable peer.
    st = absl::UnavailableError(absl::StrCat(
        st.message(),
        tls_ ? " (TLS handshake: is the manager using TLS with a certificate from this CA?)"
             : " (if the manager uses TLS, pass --tls_ca or set VARUNA_TLS_CA)"));
  }
  return Fail(st);
}

std::string Ctl::Json(const google::protobuf::Message& m) const { return ProtoJson(m); }

std::string Config(const v1::JobInfo& j) {
  if (j.stages() == 0) return "-";
  return absl::StrFormat("%dx%d mb%d", j.stages(), j.replicas(), j.micro_batch());
}

void Ctl::PrintJobsTable(const std::vector<v1::JobInfo>& jobs) {
  out_ << absl::StrFormat("%-5s %-20s %-13s %-11s %-10s %-4s %-20s %s\n", "ID", "NAME", "STATE",
                          "STEP", "CONFIG", "GEN", "SUBMITTED", "REASON");
  for (const auto& j : jobs) {
    out_ << absl::StrFormat("%-5s %-20s %-13s %-11s %-10s %-4d %-20s %s\n", j.id(), j.name(),
                            v1::JobState_Name(j.state()),
                            absl::StrCat(j.step(), "/", j.total_steps()), Config(j), j.generation(),
                            j.submitted_at(), j.reason());
  }
}

void Ctl::PrintJob(const v1::JobInfo& j) {
  auto line = [&](const std::string& k, const std::string& v) {
    if (!v.empty()) out_ << absl::StrFormat("%-18s %s\n", k + ":", v);
  };
  line("id", j.id());
  line("name", j.name());
  line("state", v1::JobState_Name(j.state()));
  line("reason", j.reason());
  line("step", absl::StrCat(j.step(), "/", j.total_steps()));
  if (j.step() > 0) {
    line("loss", absl::StrFormat("%.4f", j.loss()));
    line("samples/s", absl::StrFormat("%.1f", j.samples_per_s()));
  }
  // Predicted (AutoConfig) next to measured (docs/autoconfig.md).
  if (j.step() > 0 || j.predicted_step_s() > 0) {
    std::vector<std::string> parts;
    if (j.step() > 0) parts.push_back(absl::StrFormat("%.4f s measured", j.step_time_s()));
    if (j.predicted_step_s() > 0) {
      parts.push_back(absl::StrFormat("%.4f s predicted", j.predicted_step_s()));
    }
    line("step time", absl::StrJoin(parts, ", "));
  }
  line("generation", absl::StrCat(j.generation()));
  if (j.profile_job()) line("kind", "profile job (varunactl profile)");
  if (j.stages() > 0 && !j.pipelines().empty()) {
    // Heterogeneous pipelines (docs/heterogeneous.md): one line per pipeline.
    line("config", absl::StrFormat("%d pipelines on %d slots, micro-batch %d", j.replicas(),
                                   j.slots(), j.micro_batch()));
    if (auto t = Topology::Parse(j.pipelines()); t.ok()) {
      for (int k = 0; k < t->num_pipelines(); ++k) {
        const PipelineLayout& p = t->pipeline(k);
        line(absl::StrCat("pipeline ", k),
             absl::StrFormat("%d stage%s, %s, segments %s, %d samples/step", p.stages(),
                             p.stages() == 1 ? "" : "s",
                             p.stages() == 1 ? absl::StrCat("rank ", p.first_rank)
                                             : absl::StrCat("ranks ", p.first_rank, "-",
                                                            p.first_rank + p.stages() - 1),
                             absl::StrJoin(p.boundaries, ","), p.samples));
      }
    }
  }
  if (j.stages() > 0) {
    if (j.pipelines().empty()) {
      line("config", absl::StrFormat("%d stages x %d replicas, micro-batch %d", j.stages(),
                                     j.replicas(), j.micro_batch()));
    }
    line("plan",
         absl::StrCat(j.schedule().empty() ? "" : j.schedule(),
                      j.boundaries().empty()
                          ? ""
                          : absl::StrCat(", boundaries ", absl::StrJoin(j.boundaries(), ",")),
                      j.plan_source().empty() ? "" : absl::StrCat(" (", j.plan_source(), ")")));
    if (j.pipelines().empty()) line("stage_to_rank_map", j.stage_to_rank_map());
    if (!j.pipelines().empty()) line("pipelines", j.pipelines());
    line("master", j.master());
    std::map<std::string, std::vector<int>> by_node;
    for (const auto& p : j.placement()) by_node[p.node()].push_back(p.rank());
    std::vector<std::string> parts;
    for (const auto& [n, ranks] : by_node) {
      parts.push_back(absl::StrCat(n, "[", absl::StrJoin(ranks, ","), "]"));
    }
    line("placement", absl::StrJoin(parts, " "));
  }
  line("submitted", j.submitted_by().empty()
                        ? j.submitted_at()
                        : absl::StrCat(j.submitted_at(), " by ", j.submitted_by()));
  if (!j.cancelled_by().empty()) line("cancelled by", j.cancelled_by());
  line("started", j.started_at());
  line("finished", j.finished_at());
  if (j.morphs_size() > 0) {
    out_ << "morphs:\n";
    out_ << absl::StrFormat("  %-20s %-4s %-11s %-11s %-6s %-7s %s\n", "AT", "GEN", "FROM", "TO",
                            "LOST", "TOTAL_S", "REASON");
    auto shape = [](const v1::Shape& s) {
      return absl::StrFormat("%dx%d mb%d", s.stages(), s.replicas(), s.micro_batch());
    };
    for (const auto& m : j.morphs()) {
      auto total = m.phases().find("total");
      out_ << absl::StrFormat(
          "  %-20s %-4d %-11s %-11s %-6d %-7s %s\n", m.at(), m.generation(), shape(m.from()),
          shape(m.to()), m.steps_lost(),
          total == m.phases().end() ? "-" : absl::StrFormat("%.2f", total->second), m.reason());
    }
  }
}

bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

int Ctl::Follow(const std::vector<std::string>& ids) {
  std::map<std::string, v1::JobState> last_state;
  std::map<std::string, int> last_step;
  std::map<std::string, v1::JobInfo> final_info;
  absl::Time last_print = absl::InfinitePast();
  int unreachable_for = 0;
  std::ostream& log = json_ ? err_ : out_;
  while (final_info.size() < ids.size()) {
    for (const std::string& id : ids) {
      if (final_info.count(id)) continue;
      v1::GetJobRequest req;
      req.set_job_id(id);
      v1::GetJobResponse resp;
      grpc::Status s = stub_->GetJob(Context().get(), req, &resp);
      if (!s.ok()) {
        // A manager restart is survivable: keep following for a while.
        if (s.error_code() == grpc::StatusCode::UNAVAILABLE && ++unreachable_for < 120) {
          if (unreachable_for == 1) err_ << "varunactl: manager unreachable; retrying\n";
          continue;
        }
        return FailGrpc(s, "GetJob");
      }
      unreachable_for = 0;
      const v1::JobInfo& j = resp.job();
      const std::string tag = ids.size() > 1 ? absl::StrCat("job ", id, ": ") : "";
      auto print_state = [&] {
        if (last_state.count(id) && last_state[id] == j.state()) return;
        last_state[id] = j.state();
        log << tag << "job " << id << " " << v1::JobState_Name(j.state());
        if (j.state() == v1::RUNNING || j.state() == v1::STARTING) {
          log << " (" << j.stages() << " stages x " << j.replicas() << " replicas, micro-batch "
              << j.micro_batch() << ", generation " << j.generation() << ")";
        }
        if (!j.reason().empty()) log << ": " << j.reason();
        log << "\n";
      };
      // At most one line a second while running; the final step always.
      auto print_progress = [&](bool final) {
        const absl::Time now = absl::Now();
        if (j.step() == last_step[id] || (now - last_print < absl::Seconds(1) && !final)) {
          return;
        }
        last_step[id] = j.step();
        last_print = now;
        log << tag
            << absl::StrFormat("step %d/%d loss %.4f %.1f samples/s\n", j.step(), j.total_steps(),
                               j.loss(), j.samples_per_s());
      };
      if (IsTerminal(j.state())) {
        print_progress(true);  // the last step, then the outcome
        print_state();
      } else {
        print_state();
        print_progress(j.step() == j.total_steps());
      }
      if (IsTerminal(j.state())) final_info[id] = j;
    }
    if (final_info.size() < ids.size()) absl::SleepFor(absl::Milliseconds(500));
  }
  bool all_ok = true;
  if (json_) {
    std::vector<std::string> parts;
    for (const auto& id : ids) parts.push_back(Json(final_info[id]));
    out_ << (ids.size() == 1 ? parts[0] : absl::StrCat("[", absl::StrJoin(parts, ","), "]"))
         << "\n";
  }
  for (const auto& id : ids) all_ok = all_ok && final_info[id].state() == v1::SUCCEEDED;
  return all_ok ? kExitOk : kExitFailed;
}

int Ctl::Submit() {
  SubmitOptions opts;
  const bool follow = TakeFlag("--follow");
  opts.sets = TakeValues("--set");
  opts.env = TakeValues("--env");
  TakeValue("--env_file", &opts.env_file);
  std::string v;
  for (const char* key : {"name"}) {
    if (TakeValue(absl::StrCat("--", key), &v)) opts.sets.push_back(absl::StrCat(key, "=", v));
  }
  for (const char* key : {"stages", "replicas", "micro_batch"}) {
    if (TakeValue(absl::StrCat("--", key), &v)) {
      opts.sets.push_back(absl::StrCat("parallel.", key, "=", v));
    }
  }
  for (const char* key : {"global_batch", "steps"}) {
    if (TakeValue(absl::StrCat("--", key), &v))
      opts.sets.push_back(absl::StrCat("train.", key, "=", v));
  }
  std::string configs, request_id;
  // --raw sends the file's bytes as they are: no overrides, no local checks (the manager's
  // own validation is then the only one; for testing it and for generated specs).
  const bool raw = TakeFlag("--raw");
  TakeValue("--configs", &configs);
  TakeValue("--request_id", &request_id);
  const std::string file = TakePositional("job FILE");
  std::vector<std::string> entrypoint;
  for (auto it = rest_.begin(); it != rest_.end(); ++it) {
    if (*it == "--") {
      entrypoint.assign(it + 1, rest_.end());
      rest_.erase(it, rest_.end());
      break;
    }
  }
  NoMore();
  std::vector<std::vector<std::string>> commands;
  if (!configs.empty()) {
    if (!entrypoint.empty()) throw UsageError{"--configs and '-- ENTRYPOINT' exclude each other"};
    auto text = ReadTextFile(configs, "configs file");
    if (!text.ok()) return Fail(absl::InvalidArgumentError(text.status().message()));
    auto parsed = ParseExperimentFile(*text, configs);
    if (!parsed.ok()) return Fail(parsed.status());
    commands = *std::move(parsed);
  } else {
    commands.push_back(entrypoint);
  }
  // Validate everything before queueing anything.
  std::vector<std::string> specs;
  if (raw) {
    if (!opts.sets.empty() || !opts.env.empty() || !opts.env_file.empty() || commands.size() > 1 ||
        !entrypoint.empty()) {
      throw UsageError{"--raw takes the file as it is: no overrides, --configs or entrypoint"};
    }
    auto text = ReadTextFile(file, "job file");
    if (!text.ok()) return Fail(absl::InvalidArgumentError(text.status().message()));
    specs.push_back(*text);
    commands.clear();
  }
  for (const auto& cmd : commands) {
    SubmitOptions o = opts;
    o.entrypoint = cmd;
    auto yaml = PrepareSubmission(file, o);
    if (!yaml.ok()) {
      err_ << "varunactl: job refused, nothing queued: " << yaml.status().message() << "\n";
      return kExitUsage;
    }
    specs.push_back(*yaml);
  }
  if (request_id.empty()) {
    std::random_device rd;
    request_id = absl::StrFormat("%08x%08x", rd(), rd());
  }
  std::vector<std::string> ids;
  std::vector<std::string> json_parts;
  for (size_t i = 0; i < specs.size(); ++i) {
    v1::SubmitRequest req;
    req.set_spec_yaml(specs[i]);
    req.set_request_id(specs.size() > 1 ? absl::StrCat(request_id, "-", i) : request_id);
    v1::SubmitResponse resp;
    // Safe to retry: the request id makes a repeat return the first job.
    grpc::Status s;
    for (int attempt = 0; attempt < 3; ++attempt) {
      s = stub_->Submit(Context().get(), req, &resp);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
      absl::SleepFor(absl::Seconds(1));
    }
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
          s.error_code() == grpc::StatusCode::NOT_FOUND) {
        err_ << "varunactl: job refused, nothing queued: " << s.error_message() << "\n";
        return kExitUsage;
      }
      return FailGrpc(s, "Submit");
    }
    ids.push_back(resp.job().id());
    if (json_) {
      json_parts.push_back(Json(resp.job()));
    } else {
      out_ << "submitted job " << resp.job().id() << " (" << resp.job().name() << ")";
      if (commands.size() > 1) out_ << ": " << absl::StrJoin(commands[i], " ");
      out_ << "\n";
    }
  }
  if (follow) return Follow(ids);
  if (json_) {
    out_ << (ids.size() == 1 ? json_parts[0]
                             : absl::StrCat("[", absl::StrJoin(json_parts, ","), "]"))
         << "\n";
  } else if (ids.size() == 1) {
    out_ << "  status:  varunactl status " << ids[0] << "\n"
         << "  logs:    varunactl logs " << ids[0] << " -f\n"
         << "  cancel:  varunactl cancel " << ids[0] << "\n";
  }
  return kExitOk;
}

int Ctl::List() {
  NoMore();
  v1::ListJobsResponse resp;
  grpc::Status s = stub_->ListJobs(Context().get(), v1::ListJobsRequest(), &resp);
  if (!s.ok()) return FailGrpc(s, "ListJobs");
  std::vector<v1::JobInfo> jobs(resp.jobs().begin(), resp.jobs().end());
  if (json_) {
    std::vector<std::string> parts;
    for (const auto& j : jobs) parts.push_back(Json(j));
    out_ << "[" << absl::StrJoin(parts, ",") << "]\n";
  } else {
    PrintJobsTable(jobs);
  }
  return kExitOk;
}

int Ctl::Status() {
  v1::GetJobRequest req;
  req.set_job_id(TakePositional("job ID"));
  NoMore();
  v1::GetJobResponse resp;
  grpc::Status s = stub_->GetJob(Context().get(), req, &resp);
  if (!s.ok()) return FailGrpc(s, "GetJob");
  if (json_) {
    out_ << Json(resp.job()) << "\n";
  } else {
    PrintJob(resp.job());
  }
  return kExitOk;
}

int Ctl::Logs() {
  v1::GetLogsRequest req;
  const bool follow = TakeFlag("-f") || TakeFlag("--follow");
  std::string rank = "0";
  TakeValue("--rank", &rank);
  int r = 0;
  if (!absl::SimpleAtoi(rank, &r) || r < 0) throw UsageError{"--rank needs a rank number"};
  req.set_job_id(TakePositional("job ID"));
  req.set_rank(r);
  NoMore();
  int waits = 0;
  for (;;) {
    v1::GetLogsResponse resp;
    grpc::Status s = stub_->GetLogs(Context().get(), req, &resp);
    if (!s.ok()) {
      // While following, a log that does not exist yet (job still starting) is worth a wait.
      const bool transient = s.error_code() == grpc::StatusCode::NOT_FOUND ||
                             s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                             s.error_code() == grpc::StatusCode::UNAVAILABLE;
      if (follow && transient && ++waits < 600) {
        v1::GetJobRequest jr;
        jr.set_job_id(req.job_id());
        v1::GetJobResponse jresp;
        grpc::Status js = stub_->GetJob(Context().get(), jr, &jresp);
        if (js.ok() && !IsTerminal(jresp.job().state())) {
          absl::SleepFor(absl::Milliseconds(500));
          continue;
        }
      }
      return FailGrpc(s, "GetLogs");
    }
    out_ << resp.data();
    out_.flush();
    req.set_offset(resp.next_offset());
    if (!resp.data().empty()) continue;
    if (!follow || resp.job_finished()) return kExitOk;
    absl::SleepFor(absl::Milliseconds(500));
  }
}

int Ctl::Cancel() {
  v1::CancelJobRequest req;
  req.set_job_id(TakePositional("job ID"));
  NoMore();
  v1::CancelJobResponse resp;
  grpc::Status s = stub_->CancelJob(Context().get(), req, &resp);
  if (!s.ok()) return FailGrpc(s, "CancelJob");
  if (json_) {
    out_ << Json(resp.job()) << "\n";
  } else {
    out_ << "job " << resp.job().id() << " " << v1::JobState_Name(resp.job().state()) << "\n";
  }
  return kExitOk;
}

int Ctl::Nodes() {
  NoMore();
  v1::ListNodesResponse resp;
  grpc::Status s = stub_->ListNodes(Context().get(), v1::ListNodesRequest(), &resp);
  if (!s.ok()) return FailGrpc(s, "ListNodes");
  if (json_) {
    std::vector<std::string> parts;
    for (const auto& n : resp.nodes()) parts.push_back(Json(n));
    out_ << "[" << absl::StrJoin(parts, ",") << "]\n";
    return kExitOk;
  }
  out_ << absl::StrFormat("%-16s %-22s %-5s %-4s %-9s %-9s %s\n", "NAME", "ADDRESS", "SLOTS",
                          "USED", "STATE", "HEARTBEAT", "REASON");
  for (const auto& n : resp.nodes()) {
    out_ << absl::StrFormat("%-16s %-22s %-5d %-4d %-9s %-9s %s\n", n.name(), n.address(),
                            n.slots(), n.used_slots(), v1::NodeState_Name(n.state()),
                            absl::StrFormat("%.1fs", n.last_heartbeat_age_s()), n.reason());
  }
  return kExitOk;
}

int Ctl::Drain() {
  v1::DrainNodeRequest req;
  req.set_undo(TakeFlag("--undo"));
  req.set_node(TakePositional("NODE"));
  NoMore();
  v1::DrainNodeResponse resp;
  grpc::Status s = stub_->DrainNode(Context().get(), req, &resp);
  if (!s.ok()) return FailGrpc(s, "DrainNode");
  if (json_) {
    out_ << Json(resp.node()) << "\n";
  } else {
    out_ << "node " << resp.node().name() << " " << v1::NodeState_Name(resp.node().state()) << "\n";
  }
  return kExitOk;
}

int Ctl::Preempt() {
  v1::PreemptNodeRequest req;
  std::string in = "0s";
  TakeValue("--in", &in);
  req.set_node(TakePositional("NODE"));
  NoMore();
  absl::Duration d;
  if (!absl::ParseDuration(in, &d) || d < absl::ZeroDuration() || d > absl::Hours(24 * 365)) {
    throw UsageError{absl::StrCat("--in needs a duration like 30s or 2m, not '", in, "'")};
  }
  req.set_in_ms(absl::ToInt64Milliseconds(d));
  v1::PreemptNodeResponse resp;
  grpc::Status s = stub_->PreemptNode(Context().get(), req, &resp);
  if (!s.ok()) return FailGrpc(s, "PreemptNode");
  if (json_) {
    out_ << Json(resp.node()) << "\n";
  } else {
    out_ << "node " << resp.node().name() << " " << v1::NodeState_Name(resp.node().state()) << ": "
         << resp.node().reason() << "\n";
  }
  return kExitOk;
}

int Ctl::Events() {
  const bool follow = TakeFlag("-f") || TakeFlag("--follow");
  v1::ListEventsRequest req;
  if (!rest_.empty() && rest_[0] != "--") req.set_job_id(TakePositional("job ID"));
  NoMore();
  int unreachable_for = 0;
  for (;;) {
    v1::ListEventsResponse resp;
    grpc::Status s = stub_->ListEvents(Context().get(), req, &resp);
    if (!s.ok()) {
      if (follow && s.error_code() == grpc::StatusCode::UNAVAILABLE && ++unreachable_for < 120) {
        if (unreachable_for == 1) err_ << "varunactl: manager unreachable; retrying\n";
        absl::SleepFor(absl::Milliseconds(500));
        continue;
      }
      return FailGrpc(s, "ListEvents");
    }
    unreachable_for = 0;
    for (const auto& e : resp.events()) {
      if (json_) {
        out_ << Json(e) << "\n";
      } else {
        const std::string subject = !e.job_id().empty() ? absl::StrCat("job ", e.job_id())
                                    : !e.node().empty() ? absl::StrCat("node ", e.node())
                                                        : "manager";
        out_ << absl::StrFormat("%s %-12s %-18s %s\n", e.at(), subject, e.kind(), e.message());
      }
      req.set_after_seq(e.seq());
    }
    out_.flush();
    if (!follow) return kExitOk;
    if (resp.events().empty()) absl::SleepFor(absl::Milliseconds(500));
  }
}

int Ctl::Metrics() {
  v1::GetMetricsRequest req;
  req.set_job_id(TakePositional("job ID"));
  NoMore();
  std::vector<v1::StepRecord> steps;
  for (;;) {
    v1::GetMetricsResponse resp;
    grpc::Status s = stub_->GetMetrics(Context(absl::Seconds(60)).get(), req, &resp);
    if (!s.ok()) return FailGrpc(s, "GetMetrics");
    if (resp.steps().empty()) break;
    for (const auto& r : resp.steps()) steps.push_back(r);
    req.set_after_step(steps.back().step());
  }
  if (json_) {
    std::vector<std::string> parts;
    for (const auto& r : steps) parts.push_back(Json(r));
    out_ << "[" << absl::StrJoin(parts, ",\n") << "]\n";
  } else {
    out_ << absl::StrFormat("%-8s %-12s %-4s %-10s %s\n", "STEP", "LOSS", "GEN", "SAMPLES/S",
                            "STEP_S");
    for (const auto& r : steps) {
      out_ << absl::StrFormat("%-8d %-12.6f %-4d %-10.1f %.3f\n", r.step(), r.loss(),
                              r.generation(), r.samples_per_s(), r.step_time_s());
    }
  }
  return kExitOk;
}

// The job file with the plan's overrides, validated (files are not checked: the data may
// live on the cluster only).
absl::StatusOr<std::string> PlanSpec(const std::string& file, SubmitOptions opts) {
  opts.check_files = false;
  return PrepareSubmission(file, opts);
}

std::string Mib(double bytes) { return absl::StrFormat("%.1f", bytes / (1 << 20)); }

// A heterogeneous plan's shape: its pipeline depths, "4+3 (het)", "3*2+1 (het)" for two
// pipelines of 3 stages and one of 1.
std::string HetShape(const v1::Plan& p) {
  std::vector<std::string> parts;
  for (const auto& pp : p.pipelines()) {
    parts.push_back(pp.count() > 1 ? absl::StrCat(pp.stages(), "*", pp.count())
                                   : absl::StrCat(pp.stages()));
  }
  if (parts.empty()) parts.push_back(absl::StrCat(p.replicas(), " pipelines"));
  return absl::StrCat(absl::StrJoin(parts, "+"), " (het)");
}

void Ctl::PrintPlans(const v1::PlanSet& set, bool all) {
  if (json_) {
    v1::PlanSet shown = set;
    if (!all) shown.clear_rejected();
    out_ << Json(shown) << "\n";
    return;
  }
  out_ << "costs: " << set.cost_source() << "\n";
  for (const auto& n : set.notes()) out_ << "note: " << n << "\n";
  out_ << absl::StrFormat("%-4s %-3s %-4s %-4s %-8s %-10s %-10s %-7s %s\n", "#", "P", "D", "MB",
                          "SCHEDULE", "STEP_S", "SAMPLES/S", "BUBBLE", "PEAK_MIB/STAGE");
  int shown = 0, bounded = 0;
  for (int i = 0; i < set.plans_size(); ++i) {
    const v1::Plan& p = set.plans(i);
    if (p.lower_bound()) {
      ++bounded;
      if (!all) continue;
    } else if (!all && shown >= 25) {
      continue;
    }
    ++shown;
    std::vector<std::string> peaks;
    for (double b : p.peak_bytes()) peaks.push_back(Mib(b));
    const std::string shape = p.heterogeneous()
                                  ? absl::StrFormat("%-8s", HetShape(p))
                                  : absl::StrFormat("%-3d %-4d", p.stages(), p.replicas());
    out_ << absl::StrFormat(
        "%-4d %s %-4d %-8s %-10s %-10.2f %-7s %s\n", i + 1, shape, p.micro_batch(), p.schedule(),
        absl::StrFormat(p.lower_bound() ? ">=%.4f" : "%.4f", p.step_s()), p.samples_per_s(),
        p.lower_bound() ? "-" : absl::StrFormat("%.1f%%", 100 * p.bubble()),
        p.lower_bound() ? "-" : absl::StrJoin(peaks, ","));
    // Each kind of pipeline of a heterogeneous plan, then what the engine runs.
    for (const auto& pp : p.pipelines()) {
      std::vector<std::string> pipe_peaks;
      for (double b : pp.peak_bytes()) pipe_peaks.push_back(Mib(b));
      out_ << absl::StrFormat(
          "     %d x %d stages: %d micro-batches (%d samples), %.4f s, boundaries %s, peak MiB "
          "%s\n",
          pp.count(), pp.stages(), pp.microbatches(), pp.samples(), pp.step_s(),
          absl::StrJoin(pp.boundaries(), ","), absl::StrJoin(pipe_peaks, ","));
    }
    if (!p.topology().empty()) out_ << "     topology " << p.topology() << "\n";
  }
  const int hidden = set.plans_size() - shown;
  if (hidden > 0) {
    out_ << hidden << " more shapes (" << bounded
         << " not simulated: their lower bound is over 1.5x the best); --all lists them\n";
  }
  if (all) {
    for (const auto& r : set.rejected()) {
      const std::string shape =
          r.heterogeneous() ? HetShape(r) : absl::StrFormat("P=%d D=%d", r.stages(), r.replicas());
      out_ << absl::StrFormat("rejected %s MB=%d %s: %s\n", shape, r.micro_batch(), r.schedule(),
                              r.rejected());
    }
  }
  out_ << absl::StrFormat("planned in %.3f s\n", set.planner_s());
}

int Ctl::Plan() {
  std::string slots_s, nodes_s, profile_path, mem_s, v;
  TakeValue("--slots", &slots_s);
  TakeValue("--nodes", &nodes_s);
  TakeValue("--profile", &profile_path);
  TakeValue("--memory_gib", &mem_s);
  const bool all = TakeFlag("--all");
  SubmitOptions opts;
  opts.sets = TakeValues("--set");
  for (const char* key : {"stages", "replicas", "micro_batch", "schedule"}) {
    if (TakeValue(absl::StrCat("--", key), &v)) {
      opts.sets.push_back(absl::StrCat("parallel.", key, "=", v));
    }
  }
  if (TakeValue("--global_batch", &v)) opts.sets.push_back(absl::StrCat("train.global_batch=", v));
  const std::string file = TakePositional("job FILE");
  NoMore();
  if (!slots_s.empty() && !nodes_s.empty())
    throw UsageError{"--slots and --nodes exclude each other"};
  PlanRequest req;
  req.all = all;
  req.heterogeneous = true;  // mixes of depths too (docs/autoconfig.md "Heterogeneous plans")
  if (!mem_s.empty()) {
    double gib = 0;
    if (!absl::SimpleAtod(mem_s, &gib) || gib <= 0) {
      throw UsageError{absl::StrCat("--memory_gib needs a positive number, got '", mem_s, "'")};
    }
    req.memory_per_slot = gib * (1 << 30);
  }
  if (!slots_s.empty()) {
    int n = 0;
    if (!absl::SimpleAtoi(slots_s, &n) || n < 1 || n > kMaxSlots) {
      throw UsageError{absl::StrCat("--slots needs a number of slots >= 1, got '", slots_s, "'")};
    }
    req.slots_per_node.push_back(n);
  }
  if (!nodes_s.empty()) {
    for (absl::string_view part : absl::StrSplit(nodes_s, ',')) {
      int n = 0;
      if (!absl::SimpleAtoi(part, &n) || n < 1 || n > kMaxSlots) {
        throw UsageError{
            absl::StrCat("--nodes needs slots per node like 8,8,4, got '", nodes_s, "'")};
      }
      req.slots_per_node.push_back(n);
    }
  }
  auto yaml = PlanSpec(file, opts);
  if (!yaml.ok()) return Fail(absl::InvalidArgumentError(yaml.status().message()));
  auto spec = ParseJobSpec(*yaml);
  if (!spec.ok()) return Fail(absl::InvalidArgumentError(spec.status().message()));
  if (req.slots_per_node.empty()) {
    // The cluster's slots now: the manager plans (with its stored profile).
    if (!profile_path.empty()) throw UsageError{"--profile needs --slots or --nodes"};
    if (!stub_) throw UsageError{"no manager: pass --slots/--nodes, or --manager HOST:PORT"};
    v1::PlanJobRequest pr;
    pr.set_spec_yaml(*yaml);
    pr.set_all(all);
    v1::PlanJobResponse resp;
    grpc::Status s = stub_->PlanJob(Context(absl::Seconds(30)).get(), pr, &resp);
    if (!s.ok()) return FailGrpc(s, "PlanJob");
    if (!json_)
      out_ << "slots: " << absl::StrJoin(resp.slots_per_node(), ",")
           << " (alive and schedulable, busy or not)\n";
    PrintPlans(resp.plans(), all);
    return kExitOk;
  }
  v1::Profile profile;
  std::vector<std::string> notes;
  if (!profile_path.empty()) {
    auto p = LoadProfile(profile_path);
    if (!p.ok()) return Fail(absl::InvalidArgumentError(p.status().message()));
    profile = *std::move(p);
  } else {
    bool found = false;
    if (stub_) {
      v1::GetProfileRequest gr;
      gr.set_model_key(ModelKey(spec->model));
      gr.set_precision(spec->train.precision);
      v1::GetProfileResponse resp;
      grpc::Status s = stub_->GetProfile(Context(absl::Seconds(5)).get(), gr, &resp);
      if (s.ok() && resp.found()) {
        profile = resp.profile();
        found = true;
        notes.push_back(absl::StrCat("profile from the manager ", manager_));
      } else if (!s.ok()) {
        notes.push_back(absl::StrCat("manager ", manager_, " not reachable (", s.error_message(),
                                     "): built-in cost model"));
      } else {
        notes.push_back("the manager has no profile of this model: built-in cost model");
      }
    }
    if (!found) {
      auto b = BuiltinProfile(*spec);
      if (!b.ok()) return Fail(b.status());
      profile = *std::move(b);
    }
  }
  auto set = PlanShapes(*spec, profile, req);
  if (!set.ok()) return Fail(set.status());
  for (const auto& n : notes) set->add_notes(n);
  PrintPlans(*set, all);
  return kExitOk;
}

int Ctl::Profile() {
  SubmitOptions opts;
  const bool follow = TakeFlag("--follow");
  opts.sets = TakeValues("--set");
  const std::string file = TakePositional("job FILE");
  NoMore();
  auto yaml = PrepareSubmission(file, opts);
  if (!yaml.ok()) {
    err_ << "varunactl: profile job refused: " << yaml.status().message() << "\n";
    return kExitUsage;
  }
  v1::SubmitRequest req;
  req.set_spec_yaml(*yaml);
  req.set_profile(true);
  v1::SubmitResponse resp;
  grpc::Status s = stub_->Submit(Context().get(), req, &resp);
  if (!s.ok()) return FailGrpc(s, "Submit");
  if (json_) {
    out_ << Json(resp.job()) << "\n";
  } else {
    out_ << "profile job " << resp.job().id() << " submitted: it measures the model on the "
         << "slots it gets, and the manager stores the profile when it succeeds\n"
         << "  status: varunactl status " << resp.job().id() << "\n"
         << "  then:   varunactl plan " << file << "\n";
  }
  if (follow) return Follow({resp.job().id()});
  return kExitOk;
}

int Ctl::Main(std::vector<std::string> args, const std::string& env_manager) {
  rest_ = std::move(args);
  try {
    if (rest_.empty() || TakeFlag("-h") || TakeFlag("--help")) {
      (rest_.empty() ? err_ : out_) << kUsage;
      return rest_.empty() ? kExitUsage : kExitOk;
    }
    manager_ = env_manager;
    TakeValue("--manager", &manager_);
    const char* env_token = std::getenv("VARUNA_TOKEN");
    const char* env_ca = std::getenv("VARUNA_TLS_CA");
    token_ = env_token != nullptr ? env_token : "";
    TakeValue("--token", &token_);
    TlsFiles tls_files;
    tls_files.ca = env_ca != nullptr ? env_ca : "";
    TakeValue("--tls_ca", &tls_files.ca);
    std::string output = "table";
    if (!TakeValue("-o", &output)) TakeValue("--output", &output);
    if (output != "table" && output != "json") {
      throw UsageError{absl::StrCat("-o must be table or json, not '", output, "'")};
    }
    json_ = output == "json";
    const std::string verb = TakePositional("COMMAND");
    // `plan --slots/--nodes` works without a manager (and asks one for a profile if given).
    if (manager_.empty() && verb != "plan")
      throw UsageError{"no manager: pass --manager HOST:PORT or set VARUNA_MANAGER"};
    if (!manager_.empty()) {
      if (auto hp = SplitHostPort(manager_); !hp.ok())
        throw UsageError{std::string(hp.status().message())};
      auto tls = LoadTls(tls_files, /*need_cert=*/false, "varunactl");
      if (!tls.ok()) throw UsageError{std::string(tls.status().message())};
      tls_ = tls->enabled;
      stub_ = v1::JobApi::NewStub(MakeChannel(manager_, *tls));
    }
    if (verb == "plan") return Plan();
    if (verb == "profile") return Profile();
    if (verb == "submit") return Submit();
    if (verb == "list") return List();
    if (verb == "status" || verb == "describe") return Status();
    if (verb == "logs") return Logs();
    if (verb == "cancel") return Cancel();
    if (verb == "nodes") return Nodes();
    if (verb == "drain") return Drain();
    if (verb == "preempt") return Preempt();
    if (verb == "events") return Events();
    if (verb == "metrics") return Metrics();
    throw UsageError{absl::StrCat("unknown command '", verb, "'")};
  } catch (const UsageError& e) {
    err_ << "varunactl: " << e.message << "\n(varunactl --help for usage)\n";
    return kExitUsage;
  }
}

}  // namespace

int RunVarunactl(const std::vector<std::string>& args, const std::string& env_manager,
                 std::ostream& out, std::ostream& err) {
  Ctl ctl(out, err);
  return ctl.Main(args, env_manager);
}

}  // namespace varuna
