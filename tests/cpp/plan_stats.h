// Predicted balance of a plan, for the C++ tests.
#pragma once

#include <algorithm>
#include <cstdint>

#include "sampler/planner.h"

namespace adaptiveload {

// Mean over steps of 1 - mean / max of the ranks' predicted costs (K each, or any count with
// uneven counts).
inline double mean_imbalance(const EpochPlan& p) {
  double total = 0.0;
  for (int64_t t = 0; t < p.num_steps; ++t) {
    double mx = 0.0, sum = 0.0;
    for (int64_t r = 0; r < p.num_replicas; ++r) {
      double load = 0.0;
      for (int64_t k = 0; k < p.micro_batches_in_step(t, r); ++k)
        load += p.costs[p.micro_batch_id(t, r, k)];
      mx = std::max(mx, load);
      sum += load;
    }
    total += 1.0 - sum / p.num_replicas / mx;
  }
  return p.num_steps ? total / p.num_steps : 0.0;
}

}  // namespace adaptiveload
