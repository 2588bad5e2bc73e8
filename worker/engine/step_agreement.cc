#include "worker/engine/step_agreement.h"

namespace varuna {

std::vector<double> StepVote::Pack(int world) const {
  std::vector<double> v(StepAgreement::Size(world), 0.0);
  v[0] = overflow ? 1.0 : 0.0;
  v[1] = norm_sq;
  v[2] = loss;
  v[3] = stop ? 1.0 : 0.0;
  v[4] = static_cast<double>(params);
  for (int r = 0; r < world && r < static_cast<int>(busy.size()); ++r) v[5 + r] = busy[r];
  for (int r = 0; r < world && r < static_cast<int>(wait.size()); ++r) v[5 + world + r] = wait[r];
  return v;
}

StepAgreement StepAgreement::Unpack(const double* sum, int world) {
  StepAgreement a;
  a.overflow = sum[0] > 0;
  a.norm_sq = sum[1];
  a.loss = sum[2];
  a.stop = sum[3] > 0;
  a.params = static_cast<int64_t>(sum[4]);
  a.busy.assign(sum + 5, sum + 5 + world);
  a.wait.assign(sum + 5 + world, sum + 5 + 2 * world);
  return a;
}

}  // namespace varuna
