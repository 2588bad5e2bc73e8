#pragma once

// How a worker's exit tells the manager what happened (docs/morphing.md "Exit codes"):
//
//   0                  finished, or stopped on request after saving (progress says which)
//   kExitBadInput      its input is wrong (job spec, data, checkpoint of another model):
//                      the job fails with the worker's error, once; no morph
//   kExitRescued       a peer or the step failed, and this rank saved the state of its last
//                      completed step first: a morph resumes from it
//   anything else      a runtime failure (crash, signal, lost peer without a save)

#include "absl/status/status.h"
#include "absl/strings/cord.h"

namespace varuna {

inline constexpr int kExitBadInput = 3;
inline constexpr int kExitRescued = 75;  // EX_TEMPFAIL: try again elsewhere

inline constexpr char kBadInputPayload[] = "varuna.dev/bad-input";

// Tags `s` as a problem with the job's input (an error a restart cannot fix).
inline absl::Status MarkBadInput(absl::Status s) {
  if (!s.ok()) s.SetPayload(kBadInputPayload, absl::Cord("1"));
  return s;
}
inline bool IsBadInput(const absl::Status& s) {
  return !s.ok() && s.GetPayload(kBadInputPayload).has_value();
}

}  // namespace varuna
