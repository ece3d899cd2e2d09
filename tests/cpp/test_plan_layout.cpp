// The plan's index arithmetic (plan_layout.h): against each plan's own arrays, for K each and
// uneven counts, and the samples of a set of micro-batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sampler/cost_model.h"
#include "sampler/plan_layout.h"
#include "sampler/planner.h"
#include "wan_mix.h"

namespace adaptiveload {
namespace {

EpochPlan plan_of(bool uneven) {
  const std::vector<int64_t> lens = wan_mix(3000, 7);
  const SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr,
                          CostModel::polynomial(1.0, 3.1e-3, 1.35e-7));
  PlanOptions o;
  o.max_tokens = 2 * 75600;
  o.num_replicas = 4;
  o.micro_batches_per_step = 3;
  o.max_cost = table.default_max_cost(o.max_tokens);
  o.uneven_counts = uneven;
  o.mix_tolerance = 0.02;
  return plan_epoch(table, o);
}

TEST(PlanLayout, EveryStepRankAndMicroBatchHasOneId) {
  for (bool uneven : {false, true}) {
    const EpochPlan p = plan_of(uneven);
    const PlanLayout l = p.layout();
    const int64_t W = p.num_replicas, K = p.micro_batches_per_step;
    std::vector<int> seen(p.num_micro_batches(), 0);
    for (int64_t r = 0; r < W; ++r) {
      const std::vector<int64_t> starts = l.rank_step_starts(r);
      ASSERT_EQ(static_cast<int64_t>(starts.size()), p.num_steps + 1);
      for (int64_t t = 0; t < p.num_steps; ++t) {
        const int64_t n = l.micro_batches_in_step(t, r);
        EXPECT_GE(n, 1);
        if (!uneven) {
          EXPECT_EQ(n, K);
        }
        EXPECT_EQ(starts[t + 1] - starts[t], n);
        for (int64_t k = 0; k < n; ++k) {
          const int64_t m = l.micro_batch_id(t, r, k);
          ASSERT_GE(m, t * W * K);  // step t is ids [t W K, (t + 1) W K)
          ASSERT_LT(m, (t + 1) * W * K);
          ++seen[m];
        }
      }
    }
    for (int c : seen) EXPECT_EQ(c, 1) << (uneven ? "uneven" : "K each");
  }
}

TEST(PlanLayout, RankSumsAddEachRanksMicroBatchesOfTheStep) {
  for (bool uneven : {false, true}) {
    const EpochPlan p = plan_of(uneven);
    const PlanLayout l = p.layout();
    std::vector<double> sums(p.num_steps * p.num_replicas);
    l.rank_sums(p.costs.data(), sums.data());
    std::vector<int64_t> counts(p.num_steps * p.num_replicas);
    const std::vector<int64_t> ones(p.num_micro_batches(), 1);
    l.rank_sums(ones.data(), counts.data());
    for (int64_t t = 0; t < p.num_steps; ++t) {
      for (int64_t r = 0; r < p.num_replicas; ++r) {
        double want = 0.0;
        for (int64_t k = 0; k < p.micro_batches_in_step(t, r); ++k)
          want += p.costs[p.micro_batch_id(t, r, k)];
        EXPECT_DOUBLE_EQ(sums[t * p.num_replicas + r], want);
        EXPECT_EQ(counts[t * p.num_replicas + r], p.micro_batches_in_step(t, r));
      }
    }
  }
}

TEST(PlanLayout, FirstOfEveryRankAndTheirSamples) {
  const EpochPlan p = plan_of(false);
  const PlanLayout l = p.layout();
  const int64_t W = p.num_replicas, K = p.micro_batches_per_step;
  EXPECT_TRUE(l.first_of_every_rank(0).empty());
  const int64_t done = K + 1;  // one whole step, then the first of the next
  const std::vector<int64_t> ids = l.first_of_every_rank(done);
  ASSERT_EQ(static_cast<int64_t>(ids.size()), done * W);
  std::vector<int64_t> want;
  for (int64_t m = 0; m < W * K; ++m) want.push_back(m);
  for (int64_t r = 0; r < W; ++r) want.push_back(l.micro_batch_id(1, r, 0));
  std::vector<int64_t> got = ids;
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);

  const int64_t n = 3000;
  std::vector<uint8_t> flags(n, 0);
  mark_samples(ids.data(), static_cast<int64_t>(ids.size()), p.offsets.data(), p.samples.data(),
               p.padding.data(), flags.data());
  std::vector<uint8_t> expect(n, 0);
  for (int64_t m : ids)
    if (p.padding[m] == 0)
      for (int64_t i = p.offsets[m]; i < p.offsets[m + 1]; ++i) expect[p.samples[i]] = 1;
  EXPECT_EQ(flags, expect);
  int64_t marked = 0;
  for (uint8_t f : flags) marked += f;
  EXPECT_GT(marked, 0);
}

}  // namespace
}  // namespace adaptiveload
