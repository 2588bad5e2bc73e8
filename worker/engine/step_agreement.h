#pragma once

// Note [Step agreement]: after its backward every rank contributes one StepVote and the world
// sums them in one all-reduce; every rank then makes the same decision after the same step.
// Pipeline 0 holds every layer once, so its ranks alone contribute the squared gradient norm
// and the parameter count; every last stage adds its pipeline's share of the loss; any rank's
// overflow or stop request counts; each rank fills its own slots of the busy and wait times
// (Note [Step timing]). The wire is a vector of doubles, laid out here and nowhere else:
//   [overflow, norm_sq, loss, stop, params, busy[0..W), wait[0..W)]
// Plain arithmetic: no LibTorch (varuna_optim).

#include <cstdint>
#include <vector>

namespace varuna {

struct StepVote {
  bool overflow = false;           // non-finite gradients on this rank
  double norm_sq = 0;              // squared gradient norm (pipeline 0 only)
  double loss = 0;                 // this pipeline's share of the loss (last stages only)
  bool stop = false;               // this rank asks to stop after the step
  int64_t params = 0;              // parameters (pipeline 0 only)
  std::vector<double> busy, wait;  // per rank, W of each (a rank fills its own slot)

  // The all-reduce's input: this vote laid out for a world of `world` ranks.
  std::vector<double> Pack(int world) const;
};

// What the world agreed: the sum of every rank's Pack, read back.
struct StepAgreement {
  bool overflow = false;  // some rank overflowed: the update is skipped
  double norm_sq = 0;
  double loss = 0;
  bool stop = false;  // some rank asked to stop
  int64_t params = 0;
  std::vector<double> busy, wait;

  static StepAgreement Unpack(const double* sum, int world);
  static int Size(int world) { return 5 + 2 * world; }
};

}  // namespace varuna
