#include "worker/engine/fault.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace varuna {
namespace {

// Note [Faults]: the commit protocol (Note [Committed step] in varuna.cc) is only as good as
// its behaviour at every moment a step can be interrupted, so the worker can interrupt itself
// at each of them, the way etcd's gofail points or FoundationDB's simulator do: a test sets
// VARUNA_FAULT in the job's env (every worker gets it) and the named rank kills itself
// (SIGKILL: a crash), freezes (SIGSTOP: a hung machine, nothing reaches its peers) or, at the
// agreement, splits: the all-reduce completes everywhere, but this rank then behaves as if it
// had timed out in it, so its peers apply the step and it does not, which is what a link cut
// in the collective's last phase does. Link cuts themselves come from the test harness
// (network namespaces), not from here. GEN keeps a fault from firing again after the morph it
// caused.
struct PointName {
  FaultPoint point;
  const char* name;
};
constexpr PointName kPoints[] = {
    {FaultPoint::kForward, "forward"},        {FaultPoint::kPipeline, "pipeline"},
    {FaultPoint::kBackward, "backward"},      {FaultPoint::kDpAllreduce, "dp_allreduce"},
    {FaultPoint::kAgreement, "agreement"},    {FaultPoint::kAfterAgreement, "after_agreement"},
    {FaultPoint::kUpdate, "update"},          {FaultPoint::kCheckpointWrite, "checkpoint_write"},
    {FaultPoint::kRescueSave, "rescue_save"}, {FaultPoint::kFirstStep, "first_step"},
};

std::string PointList() {
  std::string out;
  for (const auto& p : kPoints) absl::StrAppend(&out, out.empty() ? "" : ", ", p.name);
  return out;
}

}  // namespace

const char* FaultPointName(FaultPoint p) {
  for (const auto& n : kPoints) {
    if (n.point == p) return n.name;
  }
  return "?";
}

absl::StatusOr<std::vector<Fault>> ParseFaults(absl::string_view text) {
  std::vector<Fault> out;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("VARUNA_FAULT entry '", entry, "': ", why,
                                                     " (POINT@STEP:RANK:ACTION[:GEN])"));
    };
    const size_t at = entry.find('@');
    if (at == absl::string_view::npos) return bad("no '@'");
    Fault f;
    bool known = false;
    for (const auto& p : kPoints) {
      if (entry.substr(0, at) == p.name) {
        f.point = p.point;
        known = true;
      }
    }
    if (!known) return bad(absl::StrCat("unknown point (known: ", PointList(), ")"));
    std::vector<absl::string_view> parts = absl::StrSplit(entry.substr(at + 1), ':');
    if (parts.size() < 3 || parts.size() > 4) return bad("expected STEP:RANK:ACTION[:GEN]");
    if (!absl::SimpleAtoi(parts[0], &f.step) || f.step < 1) return bad("STEP must be >= 1");
    if (!absl::SimpleAtoi(parts[1], &f.rank) || f.rank < 0) return bad("RANK must be >= 0");
    if (parts[2] == "kill") {
      f.action = FaultAction::kKill;
    } else if (parts[2] == "freeze") {
      f.action = FaultAction::kFreeze;
    } else if (parts[2] == "split") {
      if (f.point != FaultPoint::kAgreement) return bad("split is for the agreement point only");
      f.action = FaultAction::kSplit;
    } else {
      return bad("ACTION must be kill, freeze or split");
    }
    if (parts.size() == 4 && (!absl::SimpleAtoi(parts[3], &f.generation) || f.generation < 1)) {
      return bad("GEN must be >= 1");
    }
    out.push_back(f);
  }
  return out;
}

FaultInjector::FaultInjector(std::vector<Fault> faults, int rank, int generation) {
  for (const Fault& f : faults) {
    if (f.rank == rank && f.generation == generation) faults_.push_back(f);
  }
}

absl::StatusOr<FaultInjector> FaultInjector::FromEnvironment(int rank) {
  const char* text = std::getenv("VARUNA_FAULT");
  if (text == nullptr || *text == '\0') return FaultInjector();
  auto faults = ParseFaults(text);
  if (!faults.ok()) return faults.status();
  int generation = 1;
  if (const char* g = std::getenv("VARUNA_GENERATION"); g != nullptr && *g != '\0') {
    if (!absl::SimpleAtoi(g, &generation)) generation = 1;
  }
  return FaultInjector(*std::move(faults), rank, generation);
}

absl::StatusOr<int64_t> StepMinMsFromEnvironment() {
  const char* text = std::getenv("VARUNA_STEP_MIN_MS");
  if (text == nullptr || *text == '\0') return 0;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(text, &ms) || ms < 0 || ms > 60000) {
    return absl::InvalidArgumentError(
        absl::StrCat("VARUNA_STEP_MIN_MS '", text, "': want whole milliseconds from 0 to 60000"));
  }
  return ms;
}

bool FaultInjector::Hit(FaultPoint point, int64_t step) const {
  for (const Fault& f : faults_) {
    // first_step fires at the first step of its generation when that is at least STEP (a
    // generation's first step depends on where it resumed).
    if (f.point != point || (point == FaultPoint::kFirstStep ? step < f.step : step != f.step)) {
      continue;
    }
    LOG(WARNING) << "VARUNA_FAULT: " << FaultPointName(point) << "@" << step << " rank " << f.rank
                 << (f.action == FaultAction::kKill     ? " kill"
                     : f.action == FaultAction::kFreeze ? " freeze"
                                                        : " split");
    google::FlushLogFiles(google::GLOG_INFO);
    if (f.action != FaultAction::kSplit && actor_) {
      actor_(f);
      continue;
    }
    if (f.action == FaultAction::kKill) {
      kill(getpid(), SIGKILL);
      pause();
    }
    if (f.action == FaultAction::kFreeze) {
      kill(getpid(), SIGSTOP);
      continue;  // a SIGCONT (or the morph's SIGKILL) ends it
    }
    return true;
  }
  return false;
}

}  // namespace varuna
