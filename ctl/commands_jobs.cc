// The Jobs group: submit, list, status, cancel; and following jobs to their end.

#include <algorithm>
#include <functional>
#include <map>
#include <ostream>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/pipeline/topology.h"
#include "common/spec/submission.h"
#include "ctl/commands.h"
#include "ctl/session.h"
#include "ctl/varunactl.h"

namespace varuna::ctl {
namespace {

// " tp2" for a tensor-parallel job, else "".
std::string Tp(int tp_size) { return tp_size > 1 ? absl::StrCat(" tp", tp_size) : ""; }

std::string Config(const v1::JobInfo& j) {
  if (j.stages() == 0) return "-";
  return absl::StrFormat("%dx%d%s mb%d", j.stages(), j.replicas(), Tp(j.tp_size()),
                         j.micro_batch());
}

bool Finished(const v1::JobInfo& j) {
  return j.state() == v1::SUCCEEDED || j.state() == v1::FAILED || j.state() == v1::CANCELLED;
}

// The slots a job holds now (0 pending or finished).
int Held(const v1::JobInfo& j) { return j.state() == v1::PENDING || Finished(j) ? 0 : j.slots(); }

// The slots a job holds, and where the allocator (sharing) is taking it: "6", "6->2", "->4".
std::string Slots(const v1::JobInfo& j) {
  const int now = Held(j);
  const int to = Finished(j) ? 0 : j.allocated_slots();
  if (to > 0 && to != now) return now > 0 ? absl::StrCat(now, "->", to) : absl::StrCat("->", to);
  return now > 0 ? absl::StrCat(now) : "-";
}

std::string UserOf(const v1::JobInfo& j) {
  return j.submitted_by().empty() ? "-" : Printable(j.submitted_by());
}

void PrintJobsTable(std::ostream& out, const std::vector<v1::JobInfo>& jobs) {
  out << absl::StrFormat("%-8s %-16s %-10s %-7s %-13s %-11s %-10s %-6s %-4s %-20s %s\n", "ID",
                         "NAME", "USER", "CLASS", "STATE", "STEP", "CONFIG", "SLOTS", "GEN",
                         "SUBMITTED", "REASON");
  for (const auto& j : jobs) {
    out << absl::StrFormat(
        "%-8s %-16s %-10s %-7s %-13s %-11s %-10s %-6s %-4d %-20s %s\n", j.id(), Printable(j.name()),
        UserOf(j), j.priority().empty() ? "normal" : Printable(j.priority()),
        v1::JobState_Name(j.state()), absl::StrCat(j.step(), "/", j.total_steps()), Config(j),
        Slots(j), j.generation(), j.submitted_at(), Printable(j.reason()));
  }
}

// Every job, every page (Note [Pages] in manager/api/manager_api.cc); a manager keeps a bounded
// number of jobs (retention), and a token that does not advance ends the loop.
absl::StatusOr<std::vector<v1::JobInfo>> AllJobs(Session& s) {
  std::vector<v1::JobInfo> jobs;
  v1::ListJobsRequest req;
  for (int page = 0; page < 10000; ++page) {
    v1::ListJobsResponse resp;
    grpc::Status st = s.stub()->ListJobs(s.Context().get(), req, &resp);
    if (!st.ok()) return s.CallError(st, "ListJobs");
    jobs.insert(jobs.end(), resp.jobs().begin(), resp.jobs().end());
    if (resp.next_page_token().empty() || resp.next_page_token() == req.page_token()) break;
    req.set_page_token(resp.next_page_token());
  }
  return jobs;
}

// Heterogeneous pipelines (docs/heterogeneous.md): one line per pipeline.
void PrintPipelines(const v1::JobInfo& j,
                    const std::function<void(const std::string&, const std::string&)>& line) {
  line("config", absl::StrFormat("%d pipelines on %d slots, micro-batch %d", j.replicas(),
                                 j.slots(), j.micro_batch()));
  auto t = Topology::Parse(j.pipelines());
  if (!t.ok()) return;
  for (int k = 0; k < t->num_pipelines(); ++k) {
    const PipelineLayout& p = t->pipeline(k);
    line(absl::StrCat("pipeline ", k),
         absl::StrFormat(
             "%d stage%s, %s, segments %s, %d samples/step", p.stages(), p.stages() == 1 ? "" : "s",
             p.stages() == 1
                 ? absl::StrCat("rank ", p.first_rank)
                 : absl::StrCat("ranks ", p.first_rank, "-", p.first_rank + p.stages() - 1),
             absl::StrJoin(p.boundaries, ","), p.samples));
  }
}

void PrintMorphs(std::ostream& out, const v1::JobInfo& j) {
  out << "morphs:\n";
  out << absl::StrFormat("  %-20s %-4s %-11s %-11s %-6s %-7s %-8s %s\n", "AT", "GEN", "FROM", "TO",
                         "LOST", "TOTAL_S", "PATH", "REASON");
  auto shape = [](const v1::Shape& s) {
    return absl::StrFormat("%dx%d%s mb%d", s.stages(), s.replicas(), Tp(s.tp_size()),
                           s.micro_batch());
  };
  for (const auto& m : j.morphs()) {
    auto total = m.phases().find("total");
    out << absl::StrFormat(
        "  %-20s %-4d %-11s %-11s %-6d %-7s %-8s %s\n", m.at(), m.generation(), shape(m.from()),
        shape(m.to()), m.steps_lost(),
        total == m.phases().end() ? "-" : absl::StrFormat("%.2f", total->second),
        m.in_place() ? "in-place" : "relaunch",
        m.kind().empty() ? m.reason() : absl::StrCat(m.kind(), ": ", m.reason()));
  }
}

// `varunactl status`: one "key: value" line per known field, then the morphs.
void PrintJob(std::ostream& out, const v1::JobInfo& j) {
  auto line = [&](const std::string& k, const std::string& v) {
    if (!v.empty()) out << absl::StrFormat("%-18s %s\n", k + ":", v);
  };
  line("id", j.id());
  line("name", Printable(j.name()));
  line("state", v1::JobState_Name(j.state()));
  line("reason", Printable(j.reason()));
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
  if (j.stages() > 0 && !j.pipelines().empty()) PrintPipelines(j, line);
  if (j.stages() > 0) {
    if (j.pipelines().empty()) {
      line("config", absl::StrFormat("%d stages x %d replicas, micro-batch %d", j.stages(),
                                     j.replicas(), j.micro_batch()));
    }
    if (j.tp_size() > 1) {
      line("tensor parallel", absl::StrFormat("%d ranks of one node per stage (%d processes)",
                                              j.tp_size(), j.slots()));
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
  if (j.morphs_size() > 0) PrintMorphs(out, j);
}

// The validated spec(s) a submit sends, and the entrypoint of each (for --configs output).
struct Submission {
  std::vector<std::string> specs;
  std::vector<std::vector<std::string>> commands;
};

// Everything is validated before anything is queued.
absl::StatusOr<Submission> PrepareSpecs(const ParsedArgs& a) {
  SubmitOptions opts;
  opts.sets = a.Values("--set");
  opts.env = a.Values("--env");
  opts.env_file = a.Value("--env_file");
  if (a.Has("--name")) opts.sets.push_back(absl::StrCat("name=", a.Value("--name")));
  for (const char* key : {"stages", "replicas", "micro_batch"}) {
    const std::string flag = absl::StrCat("--", key);
    if (a.Has(flag)) opts.sets.push_back(absl::StrCat("parallel.", key, "=", a.Value(flag)));
  }
  for (const char* key : {"global_batch", "steps"}) {
    const std::string flag = absl::StrCat("--", key);
    if (a.Has(flag)) opts.sets.push_back(absl::StrCat("train.", key, "=", a.Value(flag)));
  }
  const std::string file = a.Get("FILE");
  const std::string configs = a.Value("--configs");
  const std::vector<std::string>& entrypoint = a.passthrough();
  Submission sub;
  if (!configs.empty()) {
    if (!entrypoint.empty()) return UsageError("--configs and '-- ENTRYPOINT' exclude each other");
    auto text = ReadTextFile(configs, "configs file");
    if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
    ASSIGN_OR_RETURN(sub.commands, ParseExperimentFile(*text, configs));
  } else {
    sub.commands.push_back(entrypoint);
  }
  if (a.Has("--raw")) {
    if (!opts.sets.empty() || !opts.env.empty() || !opts.env_file.empty() ||
        sub.commands.size() > 1 || !entrypoint.empty()) {
      return UsageError("--raw takes the file as it is: no overrides, --configs or entrypoint");
    }
    auto text = ReadTextFile(file, "job file");
    if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
    sub.specs.push_back(*text);
    sub.commands.clear();
    return sub;
  }
  for (const auto& cmd : sub.commands) {
    SubmitOptions o = opts;
    o.entrypoint = cmd;
    auto yaml = PrepareSubmission(file, o);
    if (!yaml.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("job refused, nothing queued: ", yaml.status().message()));
    }
    sub.specs.push_back(*yaml);
  }
  return sub;
}

absl::StatusOr<int> RunSubmit(Session& s, const ParsedArgs& a) {
  ASSIGN_OR_RETURN(Submission sub, PrepareSpecs(a));
  std::string request_id = a.Value("--request_id");
  if (request_id.empty()) {
    std::random_device rd;
    request_id = absl::StrFormat("%08x%08x", rd(), rd());
  }
  std::vector<std::string> ids;
  std::vector<std::string> json_parts;
  for (size_t i = 0; i < sub.specs.size(); ++i) {
    v1::SubmitRequest req;
    req.set_spec_yaml(sub.specs[i]);
    req.set_request_id(sub.specs.size() > 1 ? absl::StrCat(request_id, "-", i) : request_id);
    v1::SubmitResponse resp;
    // Safe to retry: the request id makes a repeat return the first job, on whichever
    // manager leads by then (a leader that died with the submit in flight: its successor
    // has the job if the first one stored it, and makes it once if not).
    grpc::Status st;
    const int tries = s.several_managers() ? 15 : 3;  // a takeover takes seconds
    for (int attempt = 0; attempt < tries; ++attempt) {
      st = s.stub()->Submit(s.Context().get(), req, &resp);
      if (st.error_code() != grpc::StatusCode::UNAVAILABLE) break;
      absl::SleepFor(absl::Seconds(1));
      s.FindLeader();
    }
    if (!st.ok()) {
      if (st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
          st.error_code() == grpc::StatusCode::NOT_FOUND) {
        return absl::InvalidArgumentError(
            absl::StrCat("job refused, nothing queued: ", st.error_message()));
      }
      return s.CallError(st, "Submit");
    }
    ids.push_back(resp.job().id());
    if (s.json()) {
      json_parts.push_back(s.Json(resp.job()));
    } else {
      s.out() << "submitted job " << resp.job().id() << " (" << Printable(resp.job().name()) << ")";
      if (sub.commands.size() > 1) s.out() << ": " << absl::StrJoin(sub.commands[i], " ");
      s.out() << "\n";
    }
  }
  if (a.Has("--follow")) return FollowJobs(s, ids);
  if (s.json()) {
    s.out() << (ids.size() == 1 ? json_parts[0]
                                : absl::StrCat("[", absl::StrJoin(json_parts, ","), "]"))
            << "\n";
  } else if (ids.size() == 1) {
    s.out() << "  status:  varunactl status " << ids[0] << "\n"
            << "  logs:    varunactl logs " << ids[0] << " -f\n"
            << "  cancel:  varunactl cancel " << ids[0] << "\n";
  }
  return kExitOk;
}

absl::StatusOr<int> RunList(Session& s, const ParsedArgs&) {
  ASSIGN_OR_RETURN(std::vector<v1::JobInfo> jobs, AllJobs(s));
  if (s.json()) {
    std::vector<std::string> parts;
    for (const auto& j : jobs) parts.push_back(s.Json(j));
    s.out() << "[" << absl::StrJoin(parts, ",") << "]\n";
    return kExitOk;
  }
  PrintJobsTable(s.out(), jobs);
  // Each user's share of the schedulable slots (what the allocator balances with sharing).
  // What each job holds, or is being resized to.
  std::map<std::string, int> by_user;
  for (const auto& j : jobs) {
    const int n = !Finished(j) && j.allocated_slots() > 0 ? j.allocated_slots() : Held(j);
    if (n > 0) by_user[UserOf(j)] += n;
  }
  v1::ListNodesResponse nodes;
  if (by_user.empty() ||
      !s.stub()->ListNodes(s.Context().get(), v1::ListNodesRequest(), &nodes).ok()) {
    return kExitOk;
  }
  int total = 0;
  for (const auto& n : nodes.nodes()) total += n.state() == v1::ALIVE ? n.slots() : 0;
  std::vector<std::string> shares;
  for (const auto& [user, n] : by_user) {
    shares.push_back(total > 0 ? absl::StrFormat("%s %d (%.0f%%)", user, n, 100.0 * n / total)
                               : absl::StrFormat("%s %d", user, n));
  }
  s.out() << "\nslots by user (of " << total << " alive): " << absl::StrJoin(shares, ", ") << "\n";
  return kExitOk;
}

absl::StatusOr<int> RunQueue(Session& s, const ParsedArgs&) {
  ASSIGN_OR_RETURN(std::vector<v1::JobInfo> all, AllJobs(s));
  std::vector<v1::JobInfo> pending;
  for (auto& j : all) {
    if (j.state() == v1::PENDING) pending.push_back(std::move(j));
  }
  std::stable_sort(pending.begin(), pending.end(), [](const v1::JobInfo& a, const v1::JobInfo& b) {
    const int pa = a.queue_position() > 0 ? a.queue_position() : 1 << 30;
    const int pb = b.queue_position() > 0 ? b.queue_position() : 1 << 30;
    return pa < pb;
  });
  if (s.json()) {
    std::vector<std::string> parts;
    for (const auto& j : pending) parts.push_back(s.Json(j));
    s.out() << "[" << absl::StrJoin(parts, ",") << "]\n";
    return kExitOk;
  }
  s.out() << absl::StrFormat("%-4s %-8s %-16s %-10s %-7s %-6s %-20s %s\n", "POS", "ID", "NAME",
                             "USER", "CLASS", "SLOTS", "SUBMITTED", "WHY IT WAITS");
  for (const auto& j : pending) {
    s.out() << absl::StrFormat("%-4s %-8s %-16s %-10s %-7s %-6s %-20s %s\n",
                               j.queue_position() > 0 ? absl::StrCat(j.queue_position()) : "-",
                               j.id(), Printable(j.name()), UserOf(j),
                               j.priority().empty() ? "normal" : Printable(j.priority()), Slots(j),
                               j.submitted_at(), Printable(j.reason()));
  }
  if (pending.empty()) s.out() << "no job is waiting\n";
  return kExitOk;
}

absl::StatusOr<int> RunStatus(Session& s, const ParsedArgs& a) {
  v1::GetJobRequest req;
  req.set_job_id(a.Get("ID"));
  v1::GetJobResponse resp;
  grpc::Status st = s.stub()->GetJob(s.Context().get(), req, &resp);
  if (!st.ok()) return s.CallError(st, "GetJob");
  if (s.json()) {
    s.out() << s.Json(resp.job()) << "\n";
  } else {
    PrintJob(s.out(), resp.job());
  }
  return kExitOk;
}

absl::StatusOr<int> RunCancel(Session& s, const ParsedArgs& a) {
  v1::CancelJobRequest req;
  req.set_job_id(a.Get("ID"));
  v1::CancelJobResponse resp;
  grpc::Status st = s.stub()->CancelJob(s.Context().get(), req, &resp);
  if (!st.ok()) return s.CallError(st, "CancelJob");
  if (s.json()) {
    s.out() << s.Json(resp.job()) << "\n";
  } else {
    s.out() << "job " << resp.job().id() << " " << v1::JobState_Name(resp.job().state()) << "\n";
  }
  return kExitOk;
}

}  // namespace

absl::StatusOr<int> FollowJobs(Session& s, const std::vector<std::string>& ids) {
  std::map<std::string, v1::JobState> last_state;
  std::map<std::string, int> last_step;
  std::map<std::string, v1::JobInfo> final_info;
  absl::Time last_print = absl::InfinitePast();
  int unreachable_for = 0;
  std::ostream& log = s.json() ? s.err() : s.out();
  while (final_info.size() < ids.size()) {
    for (const std::string& id : ids) {
      if (final_info.count(id)) continue;
      v1::GetJobRequest req;
      req.set_job_id(id);
      v1::GetJobResponse resp;
      grpc::Status st = s.stub()->GetJob(s.Context().get(), req, &resp);
      if (!st.ok()) {
        // A manager restart is survivable: keep following for a while.
        if (st.error_code() == grpc::StatusCode::UNAVAILABLE && ++unreachable_for < 120) {
          if (unreachable_for == 1) s.err() << "varunactl: manager unreachable; retrying\n";
          continue;
        }
        return s.CallError(st, "GetJob");
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
        if (!j.reason().empty()) log << ": " << Printable(j.reason());
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
  if (s.json()) {
    std::vector<std::string> parts;
    for (const auto& id : ids) parts.push_back(s.Json(final_info[id]));
    s.out() << (ids.size() == 1 ? parts[0] : absl::StrCat("[", absl::StrJoin(parts, ","), "]"))
            << "\n";
  }
  for (const auto& id : ids) all_ok = all_ok && final_info[id].state() == v1::SUCCEEDED;
  return all_ok ? kExitOk : kExitFailed;
}

Command NewCmdSubmit() {
  Command c;
  c.name = "submit";
  c.group = kGroupJobs;
  c.synopsis = "queue a job from a job file (one job per command with --configs)";
  c.help =
      "Checks the job file (with the overrides applied, and that its files are readable\n"
      "here), then queues it. A bad spec is refused with the problem named and nothing is\n"
      "queued (exit 2). With --configs, every command is checked before any job is queued.\n"
      "Job file keys: docs/job_spec.md; the options: docs/operations.md \"Submit\".\n"
      "\n"
      "By default each rank runs varuna-worker; `-- PROGRAM ARGS...` (or the spec's\n"
      "entrypoint) runs PROGRAM instead, with Varuna's launcher arguments appended.\n"
      "\n"
      "Examples:\n"
      "  varunactl submit job.yaml --follow --set train.lr=3e-4\n"
      "  varunactl submit job.yaml --configs experiments.txt\n"
      "  varunactl submit job.yaml --stages auto -- python3 train.py --lr 1e-3\n";
  c.args = {Arg("FILE", "job FILE")};
  c.passthrough_name = "ENTRYPOINT ARGS...";
  c.flags = {
      Switch("--follow", "print state changes and progress; exit with the job's outcome"),
      Repeated("--set", "KEY=VALUE", "set a spec field by its dotted name (the value is YAML)"),
      Option("--name", "N", "the job's name (name=N)"),
      Option("--stages", "P|auto", "pipeline stages (parallel.stages)"),
      Option("--replicas", "D|auto", "data-parallel replicas (parallel.replicas)"),
      Option("--micro_batch", "M|auto", "micro-batch size (parallel.micro_batch)"),
      Option("--global_batch", "B", "samples per step (train.global_batch)"),
      Option("--steps", "S", "steps to train (train.steps)"),
      Repeated("--env", "KEY=VALUE", "an environment variable for every worker"),
      Option("--env_file", "FILE", "KEY=VALUE lines; replaces the spec's env_file"),
      Option("--configs", "FILE", "an experiment file: one job per command in it"),
      Option("--request_id", "ID",
             "a retried submit with this ID returns the first job (default: a random ID)"),
      Switch("--raw", "send the file's bytes as they are: no overrides, no local checks"),
  };
  c.run = RunSubmit;
  return c;
}

Command NewCmdList() {
  Command c;
  c.name = "list";
  c.group = kGroupJobs;
  c.synopsis = "jobs, oldest first";
  c.help =
      "Lists every job, oldest first: id, name, user, priority class, state, step, shape,\n"
      "slots (6->2: the allocator is resizing it), generation, submission time and the reason\n"
      "for its state; then each user's slots and share of the alive ones. -o json prints an\n"
      "array of `status` objects.\n";
  c.run = RunList;
  return c;
}

Command NewCmdQueue() {
  Command c;
  c.name = "queue";
  c.group = kGroupJobs;
  c.synopsis = "pending jobs, in the order they will start";
  c.help =
      "Lists the pending jobs in the order they will start (POS 1 is next), each with its\n"
      "user, priority class, the slots it will start with and why it waits: its quota, its\n"
      "minimum, a job ahead of it (docs/operations.md \"Sharing a cluster\"). -o json prints\n"
      "an array of `status` objects in that order.\n";
  c.run = RunQueue;
  return c;
}

Command NewCmdStatus() {
  Command c;
  c.name = "status";
  c.aliases = {"describe"};
  c.group = kGroupJobs;
  c.synopsis = "one job: state, progress, plan, placement and morphs";
  c.help =
      "Shows one job: its state and reason, step, loss and throughput, measured and\n"
      "predicted step time, its shape and plan, where each rank runs, and every morph.\n"
      "The -o json fields are listed in docs/operations.md \"Inspect\".\n";
  c.args = {Arg("ID", "job ID")};
  c.run = RunStatus;
  return c;
}

Command NewCmdCancel() {
  Command c;
  c.name = "cancel";
  c.group = kGroupJobs;
  c.synopsis = "stop a job (CANCELLING -> CANCELLED)";
  c.help =
      "Moves a running job to CANCELLING: its workers get SIGTERM, then SIGKILL after the\n"
      "manager's stop_grace_s, and the job is CANCELLED once every worker has exited. A\n"
      "PENDING job is CANCELLED at once. Cancelling a CANCELLING or finished job changes\n"
      "nothing.\n";
  c.args = {Arg("ID", "job ID")};
  c.run = RunCancel;
  return c;
}

}  // namespace varuna::ctl
