// The Planning group: plan (AutoConfig's ranked shapes) and profile (measure a model).

#include <ostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/pipeline/limits.h"
#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"
#include "common/spec/job_spec.h"
#include "common/spec/submission.h"
#include "ctl/commands.h"
#include "ctl/session.h"
#include "ctl/varunactl.h"

namespace varuna::ctl {
namespace {

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

// One ranked plan's line, then a line per kind of pipeline of a heterogeneous plan, then
// the topology the engine runs.
void PrintPlan(std::ostream& out, int rank, const v1::Plan& p) {
  std::vector<std::string> peaks;
  for (double b : p.peak_bytes()) peaks.push_back(Mib(b));
  const std::string shape = p.heterogeneous()
                                ? absl::StrFormat("%-8s", HetShape(p))
                                : absl::StrFormat("%-3d %-4d", p.stages(), p.replicas());
  out << absl::StrFormat(
      "%-4d %s %-4d %-8s %-10s %-10.2f %-7s %s\n", rank, shape, p.micro_batch(), p.schedule(),
      absl::StrFormat(p.lower_bound() ? ">=%.4f" : "%.4f", p.step_s()), p.samples_per_s(),
      p.lower_bound() ? "-" : absl::StrFormat("%.1f%%", 100 * p.bubble()),
      p.lower_bound() ? "-" : absl::StrJoin(peaks, ","));
  for (const auto& pp : p.pipelines()) {
    std::vector<std::string> pipe_peaks;
    for (double b : pp.peak_bytes()) pipe_peaks.push_back(Mib(b));
    out << absl::StrFormat(
        "     %d x %d stages: %d micro-batches (%d samples), %.4f s, boundaries %s, peak MiB "
        "%s\n",
        pp.count(), pp.stages(), pp.microbatches(), pp.samples(), pp.step_s(),
        absl::StrJoin(pp.boundaries(), ","), absl::StrJoin(pipe_peaks, ","));
  }
  if (!p.topology().empty()) out << "     topology " << p.topology() << "\n";
}

void PrintPlans(Session& s, const v1::PlanSet& set, bool all) {
  std::ostream& out = s.out();
  if (s.json()) {
    v1::PlanSet shown = set;
    if (!all) shown.clear_rejected();
    out << s.Json(shown) << "\n";
    return;
  }
  out << "costs: " << set.cost_source() << "\n";
  for (const auto& n : set.notes()) out << "note: " << n << "\n";
  out << absl::StrFormat("%-4s %-3s %-4s %-4s %-8s %-10s %-10s %-7s %s\n", "#", "P", "D", "MB",
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
    PrintPlan(out, i + 1, p);
  }
  const int hidden = set.plans_size() - shown;
  if (hidden > 0) {
    out << hidden << " more shapes (" << bounded
        << " not simulated: their lower bound is over 1.5x the best); --all lists them\n";
  }
  if (all) {
    for (const auto& r : set.rejected()) {
      const std::string shape =
          r.heterogeneous() ? HetShape(r) : absl::StrFormat("P=%d D=%d", r.stages(), r.replicas());
      out << absl::StrFormat("rejected %s MB=%d %s: %s\n", shape, r.micro_batch(), r.schedule(),
                             r.rejected());
    }
  }
  out << absl::StrFormat("planned in %.3f s\n", set.planner_s());
}

// The slots to plan for from --slots / --nodes / --memory_gib; no slots = the cluster's.
absl::StatusOr<PlanRequest> ParsePlanRequest(const ParsedArgs& a) {
  const std::string slots = a.Value("--slots"), nodes = a.Value("--nodes");
  const std::string memory = a.Value("--memory_gib");
  if (!slots.empty() && !nodes.empty()) return UsageError("--slots and --nodes exclude each other");
  PlanRequest req;
  req.all = a.Has("--all");
  req.heterogeneous = true;  // mixes of depths too (docs/autoconfig.md "Heterogeneous plans")
  if (!memory.empty()) {
    double gib = 0;
    if (!absl::SimpleAtod(memory, &gib) || gib <= 0) {
      return UsageError(absl::StrCat("--memory_gib needs a positive number, got '", memory, "'"));
    }
    req.memory_per_slot = gib * (1 << 30);
  }
  if (!slots.empty()) {
    int n = 0;
    if (!absl::SimpleAtoi(slots, &n) || n < 1 || n > kMaxSlots) {
      return UsageError(absl::StrCat("--slots needs a number of slots >= 1, got '", slots, "'"));
    }
    req.slots_per_node.push_back(n);
  }
  if (!nodes.empty()) {
    for (absl::string_view part : absl::StrSplit(nodes, ',')) {
      int n = 0;
      if (!absl::SimpleAtoi(part, &n) || n < 1 || n > kMaxSlots) {
        return UsageError(
            absl::StrCat("--nodes needs slots per node like 8,8,4, got '", nodes, "'"));
      }
      req.slots_per_node.push_back(n);
    }
  }
  // What-if for stragglers (Note [Speed-aware plans]): each node's speed, 1 = normal.
  if (const std::string speeds = a.Value("--speeds"); !speeds.empty()) {
    if (req.slots_per_node.empty()) return UsageError("--speeds needs --slots or --nodes");
    for (absl::string_view part : absl::StrSplit(speeds, ',')) {
      double v = 0;
      if (!absl::SimpleAtod(part, &v) || !(v > 0) || v > 100) {
        return UsageError(
            absl::StrCat("--speeds needs a speed in (0, 100] per node like "
                         "1,1,0.25, got '",
                         speeds, "'"));
      }
      req.node_speed.push_back(v);
    }
    if (req.node_speed.size() != req.slots_per_node.size()) {
      return UsageError(absl::StrCat("--speeds gives ", req.node_speed.size(), " speeds for ",
                                     req.slots_per_node.size(), " nodes"));
    }
  }
  return req;
}

// The cluster's slots now: the manager plans (with its stored profile).
absl::StatusOr<int> PlanOnManager(Session& s, const std::string& yaml, bool all) {
  v1::PlanJobRequest pr;
  pr.set_spec_yaml(yaml);
  pr.set_all(all);
  v1::PlanJobResponse resp;
  grpc::Status st = s.stub()->PlanJob(s.Context(absl::Seconds(30)).get(), pr, &resp);
  if (!st.ok()) return s.CallError(st, "PlanJob");
  if (!s.json()) {
    s.out() << "slots: " << absl::StrJoin(resp.slots_per_node(), ",")
            << " (alive and schedulable, busy or not)\n";
  }
  PrintPlans(s, resp.plans(), all);
  return kExitOk;
}

// The costs to plan with: --profile, else the manager's stored profile of the model (if
// there is a manager and it has one), else the built-in cost model. Says which in `notes`.
absl::StatusOr<v1::Profile> PlanProfile(Session& s, const JobSpec& spec, const std::string& path,
                                        std::vector<std::string>* notes) {
  if (!path.empty()) {
    auto p = LoadProfile(path);
    if (!p.ok()) return absl::InvalidArgumentError(p.status().message());
    return p;
  }
  if (s.stub() != nullptr) {
    v1::GetProfileRequest gr;
    gr.set_model_key(ModelKey(spec.model));
    gr.set_precision(spec.train.precision);
    v1::GetProfileResponse resp;
    grpc::Status st = s.stub()->GetProfile(s.Context(absl::Seconds(5)).get(), gr, &resp);
    if (st.ok() && resp.found()) {
      notes->push_back(absl::StrCat("profile from the manager ", s.manager()));
      return resp.profile();
    }
    if (!st.ok()) {
      notes->push_back(absl::StrCat("manager ", s.manager(), " not reachable (", st.error_message(),
                                    "): built-in cost model"));
    } else {
      notes->push_back("the manager has no profile of this model: built-in cost model");
    }
  }
  return BuiltinProfile(spec);
}

absl::StatusOr<int> RunPlan(Session& s, const ParsedArgs& a) {
  SubmitOptions opts;
  opts.sets = a.Values("--set");
  for (const char* key : {"stages", "replicas", "micro_batch", "schedule"}) {
    const std::string flag = absl::StrCat("--", key);
    if (a.Has(flag)) opts.sets.push_back(absl::StrCat("parallel.", key, "=", a.Value(flag)));
  }
  if (a.Has("--global_batch")) {
    opts.sets.push_back(absl::StrCat("train.global_batch=", a.Value("--global_batch")));
  }
  auto req = ParsePlanRequest(a);
  if (!req.ok()) return req.status();
  // Files are not checked: the data may live on the cluster only.
  opts.check_files = false;
  auto yaml = PrepareSubmission(a.Get("FILE"), opts);
  if (!yaml.ok()) return absl::InvalidArgumentError(yaml.status().message());
  auto spec = ParseJobSpec(*yaml);
  if (!spec.ok()) return absl::InvalidArgumentError(spec.status().message());
  const std::string profile_path = a.Value("--profile");
  if (req->slots_per_node.empty()) {
    if (!profile_path.empty()) return UsageError("--profile needs --slots or --nodes");
    if (s.stub() == nullptr) {
      return UsageError("no manager: pass --slots/--nodes, or --manager HOST:PORT");
    }
    return PlanOnManager(s, *yaml, req->all);
  }
  std::vector<std::string> notes;
  auto profile = PlanProfile(s, *spec, profile_path, &notes);
  if (!profile.ok()) return profile.status();
  auto set = PlanShapes(*spec, *profile, *req);
  if (!set.ok()) return set.status();
  for (const auto& n : notes) set->add_notes(n);
  PrintPlans(s, *set, req->all);
  return kExitOk;
}

absl::StatusOr<int> RunProfile(Session& s, const ParsedArgs& a) {
  SubmitOptions opts;
  opts.sets = a.Values("--set");
  const std::string file = a.Get("FILE");
  auto yaml = PrepareSubmission(file, opts);
  if (!yaml.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile job refused: ", yaml.status().message()));
  }
  v1::SubmitRequest req;
  req.set_spec_yaml(*yaml);
  req.set_profile(true);
  v1::SubmitResponse resp;
  grpc::Status st = s.stub()->Submit(s.Context().get(), req, &resp);
  if (!st.ok()) return s.CallError(st, "Submit");
  if (s.json()) {
    s.out() << s.Json(resp.job()) << "\n";
  } else {
    s.out() << "profile job " << resp.job().id() << " submitted: it measures the model on the "
            << "slots it gets, and the manager stores the profile when it succeeds\n"
            << "  status: varunactl status " << resp.job().id() << "\n"
            << "  then:   varunactl plan " << file << "\n";
  }
  if (a.Has("--follow")) return FollowJobs(s, {resp.job().id()});
  return kExitOk;
}

}  // namespace

Command NewCmdPlan() {
  Command c;
  c.name = "plan";
  c.group = kGroupPlanning;
  c.synopsis = "AutoConfig: every shape ranked by simulated step time";
  c.help =
      "Ranks every shape (stages x replicas, micro-batch, schedule) the job file allows by\n"
      "simulated step time; `auto` fields are searched, fixed ones kept. Without --slots or\n"
      "--nodes the manager plans for the cluster's alive slots (busy or not) with its stored\n"
      "profile. With them no manager is needed: the costs come from --profile, else the\n"
      "manager's profile of the model if a manager is given, else the built-in cost model.\n"
      "The job's files are not checked (the data may live on the cluster only).\n"
      "See docs/autoconfig.md.\n"
      "\n"
      "Examples:\n"
      "  varunactl plan job.yaml\n"
      "  varunactl plan job.yaml --nodes 8,8,4 --all -o json\n";
  c.args = {Arg("FILE", "job FILE")};
  c.flags = {
      Option("--slots", "N", "plan for one node of N slots (no manager needed)"),
      Option("--nodes", "N1,N2,...", "plan for nodes of these slots (no manager needed)"),
      Option("--profile", "FILE", "the profile JSON to plan with (needs --slots or --nodes)"),
      Option("--speeds", "S1,S2,...",
             "each node's speed relative to a normal one (1 = normal, 0.25 = a straggler at a "
             "quarter), one per --nodes entry"),
      Option("--memory_gib", "G", "memory per slot, GiB (default: no limit)"),
      Switch("--all",
             "also list the rejected shapes, those not simulated and those using fewer "
             "slots"),
      Repeated("--set", "KEY=VALUE", "set a spec field by its dotted name (the value is YAML)"),
      Option("--stages", "P|auto", "pipeline stages (parallel.stages)"),
      Option("--replicas", "D|auto", "data-parallel replicas (parallel.replicas)"),
      Option("--micro_batch", "M|auto", "micro-batch size (parallel.micro_batch)"),
      Option("--schedule", "S|auto", "pipeline schedule (parallel.schedule)"),
      Option("--global_batch", "B", "samples per step (train.global_batch)"),
  };
  c.manager = ManagerUse::kOptional;
  c.run = RunPlan;
  return c;
}

Command NewCmdProfile() {
  Command c;
  c.name = "profile";
  c.group = kGroupPlanning;
  c.synopsis = "measure the job's model on the cluster; the manager stores the profile";
  c.help =
      "Submits a short profile job that measures the job's model on the slots it gets. When\n"
      "it succeeds the manager stores the profile and plans jobs of this model (and\n"
      "precision) with it: `auto` shapes, `varunactl plan`. See docs/autoconfig.md.\n";
  c.args = {Arg("FILE", "job FILE")};
  c.flags = {
      Switch("--follow", "print the profile job's progress; exit with its outcome"),
      Repeated("--set", "KEY=VALUE", "set a spec field by its dotted name (the value is YAML)"),
  };
  c.run = RunProfile;
  return c;
}

}  // namespace varuna::ctl
