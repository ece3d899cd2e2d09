// Index arithmetic of an epoch's plan: which micro-batches rank r takes in step t, where each
// step starts in a rank's stream, sums per (step, rank), and the samples of a set of
// micro-batches. The one place it lives: EpochPlan (planner.h) answers through it, and Python's
// Plan (adaptiveload/sampler/plan.py) through its binding (_sampler.PlanLayout).
//
// Layout: micro-batch m = (t * W + r) * K + k holds rank r's k-th micro-batch of step t; with
// uneven counts rank r takes ids [rank_offsets[t * W + r], rank_offsets[t * W + r + 1]) of step
// t. Either way step t is ids [step_begin(t), step_begin(t + 1)): [t * W * K, (t + 1) * W * K),
// except with sequence parallelism, which lists a shared micro-batch once per member rank.
#pragma once

#include <cstdint>
#include <vector>

namespace adaptiveload {

struct PlanLayout {
  int64_t num_replicas = 1;            ///< W
  int64_t micro_batches_per_step = 1;  ///< K (the average per rank with uneven counts)
  int64_t num_steps = 0;
  const int64_t* rank_offsets = nullptr;  ///< uneven counts: num_steps * W + 1 ids; else null

  /// Micro-batches of `rank` in `step`: K, or any count >= 1 with uneven counts.
  int64_t micro_batches_in_step(int64_t step, int64_t rank) const {
    if (rank_offsets == nullptr) return micro_batches_per_step;
    const int64_t t = step * num_replicas + rank;
    return rank_offsets[t + 1] - rank_offsets[t];
  }

  /// Id of `rank`'s k-th micro-batch of `step`.
  int64_t micro_batch_id(int64_t step, int64_t rank, int64_t k) const {
    const int64_t t = step * num_replicas + rank;
    if (rank_offsets == nullptr) return t * micro_batches_per_step + k;
    return rank_offsets[t] + k;
  }

  /// First id of `step` (step = num_steps: the number of ids).
  int64_t step_begin(int64_t step) const {
    if (rank_offsets == nullptr) return step * num_replicas * micro_batches_per_step;
    return rank_offsets[step * num_replicas];
  }

  /// num_steps + 1 positions in `rank`'s stream: its micro-batches before each step, and in all.
  std::vector<int64_t> rank_step_starts(int64_t rank) const {
    std::vector<int64_t> starts(static_cast<size_t>(num_steps) + 1, 0);
    for (int64_t t = 0; t < num_steps; ++t)
      starts[t + 1] = starts[t] + micro_batches_in_step(t, rank);
    return starts;
  }

  /// out[t * W + r] = the sum of `values` (one per micro-batch) over rank r's micro-batches of
  /// step t, added in id order.
  template <typename T>
  void rank_sums(const T* values, T* out) const {
    for (int64_t t = 0; t < num_steps; ++t) {
      for (int64_t r = 0; r < num_replicas; ++r) {
        const int64_t first = micro_batch_id(t, r, 0), n = micro_batches_in_step(t, r);
        T sum = 0;
        for (int64_t k = 0; k < n; ++k) sum += values[first + k];
        out[t * num_replicas + r] = sum;
      }
    }
  }

  /// Ids of the first `done` micro-batches of every rank, in the K-each layout (the i-th of
  /// rank r is its micro-batch i % K of step i / K).
  std::vector<int64_t> first_of_every_rank(int64_t done) const {
    std::vector<int64_t> ids;
    if (done <= 0) return ids;
    ids.reserve(static_cast<size_t>(done * num_replicas));
    for (int64_t i = 0; i < done; ++i)
      for (int64_t r = 0; r < num_replicas; ++r)
        ids.push_back(micro_batch_id(i / micro_batches_per_step, r, i % micro_batches_per_step));
    return ids;
  }
};

/// Sets out[s] = 1 for every sample s of the micro-batches `ids` that are not padding (padding
/// micro-batches repeat samples to fill the last step). offsets: num_micro_batches + 1 offsets
/// into samples.
inline void mark_samples(const int64_t* ids, int64_t num_ids, const int64_t* offsets,
                         const int64_t* samples, const uint8_t* padding, uint8_t* out) {
  for (int64_t j = 0; j < num_ids; ++j) {
    const int64_t m = ids[j];
    if (padding[m] != 0) continue;
    for (int64_t i = offsets[m]; i < offsets[m + 1]; ++i) out[samples[i]] = 1;
  }
}

}  // namespace adaptiveload
