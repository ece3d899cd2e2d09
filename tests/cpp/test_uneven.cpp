// Uneven micro-batch counts per rank (PlanOptions::uneven_counts, assign_uneven).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "sampler/cost_model.h"
#include "sampler/planner.h"
#include "wan_mix.h"

namespace adaptiveload {
namespace {

double largest_load(const std::vector<double>& costs, const std::vector<int64_t>& bin_of,
                    int64_t bins) {
  std::vector<double> load(bins, 0.0);
  for (size_t i = 0; i < costs.size(); ++i) load[bin_of[i]] += costs[i];
  return *std::max_element(load.begin(), load.end());
}

// Largest rank load of step t (sum of its micro-batches' costs).
double step_max(const EpochPlan& p, int64_t t) {
  double mx = 0.0;
  for (int64_t r = 0; r < p.num_replicas; ++r) {
    double load = 0.0;
    for (int64_t k = 0; k < p.micro_batches_in_step(t, r); ++k)
      load += p.costs[p.micro_batch_id(t, r, k)];
    mx = std::max(mx, load);
  }
  return mx;
}

PlanOptions options(int64_t W, int64_t K, int64_t max_batch_size, int64_t lookahead) {
  PlanOptions o;
  o.max_tokens = 2 * 75600;
  o.max_batch_size = max_batch_size;
  o.num_replicas = W;
  o.micro_batches_per_step = K;
  o.lookahead_steps = lookahead;
  o.seed = 7;
  return o;
}

TEST(AssignUneven, EveryBinGetsAtLeastOneAndNeverLosesToEvenCounts) {
  std::mt19937 gen(3);
  std::lognormal_distribution<double> heavy(0.0, 1.5);
  int lower = 0, trials = 0;
  for (int64_t bins : {2, 3, 8}) {
    for (int64_t per_bin : {1, 2, 4, 7}) {
      for (int rep = 0; rep < 20; ++rep, ++trials) {
        std::vector<double> costs(bins * per_bin);
        for (auto& c : costs) c = heavy(gen);
        const auto uneven = assign_uneven(costs.data(), costs.size(), bins);
        std::vector<int64_t> count(bins, 0);
        for (int64_t b : uneven) {
          ASSERT_GE(b, 0);
          ASSERT_LT(b, bins);
          ++count[b];
        }
        for (int64_t c : count) EXPECT_GE(c, 1);
        const auto even = assign_to_ranks(costs.data(), costs.size(), bins, per_bin);
        const double u = largest_load(costs, uneven, bins), e = largest_load(costs, even, bins);
        EXPECT_LE(u, e);
        lower += u < e;
      }
    }
  }
  // Heavy-tailed costs: counts other than per_bin pay off most of the time.
  EXPECT_GT(lower, trials / 2);
}

TEST(AssignUneven, OneExpensiveItemAgainstManyCheapOnes) {
  const std::vector<double> costs = {6.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0};
  const auto bin_of = assign_uneven(costs.data(), costs.size(), 2);
  EXPECT_DOUBLE_EQ(largest_load(costs, bin_of, 2), 7.0);  // {6, 1} and six 1s; even: 9
  EXPECT_EQ(std::count(bin_of.begin(), bin_of.end(), bin_of[0]), 2);
  EXPECT_THROW(assign_uneven(costs.data(), 1, 2), std::invalid_argument);
}

struct Shape {
  int64_t W, K, max_batch_size, lookahead;
};

class UnevenPlan : public ::testing::TestWithParam<Shape> {};

TEST_P(UnevenPlan, CoversEverySampleOnceWithAtLeastOnePerRankAndNoSlowerSteps) {
  const Shape s = GetParam();
  const auto lens = wan_mix(3001, 11);
  const SampleTable table(lens.data(), lens.size(), nullptr,
                          CostModel::polynomial(1.0, 3.1e-3, 1.35e-7));
  PlanOptions o = options(s.W, s.K, s.max_batch_size, s.lookahead);
  o.max_cost = table.default_max_cost(o.max_tokens, o.max_batch_size);
  const EpochPlan even = plan_epoch(table, o);
  o.uneven_counts = true;
  const EpochPlan p = plan_epoch(table, o);

  ASSERT_EQ(p.num_steps, even.num_steps);
  ASSERT_EQ(p.num_micro_batches(), p.num_steps * s.W * s.K);
  ASSERT_EQ(static_cast<int64_t>(p.rank_offsets.size()), p.num_steps * s.W + 1);
  EXPECT_TRUE(even.rank_offsets.empty());
  std::vector<int> seen(lens.size(), 0);
  for (int64_t m = 0; m < p.num_micro_batches(); ++m)
    for (int64_t j = p.offsets[m]; j < p.offsets[m + 1]; ++j)
      if (!p.padding[m]) ++seen[p.samples[j]];
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "sample " << i;

  int64_t faster = 0, uneven_steps = 0;
  double total = 0.0, total_even = 0.0;
  for (int64_t t = 0; t < p.num_steps; ++t) {
    EXPECT_EQ(p.rank_offsets[t * s.W], t * s.W * s.K) << "step " << t;
    bool uneven = false;
    for (int64_t r = 0; r < s.W; ++r) {
      EXPECT_GE(p.micro_batches_in_step(t, r), 1) << "step " << t << " rank " << r;
      uneven |= p.micro_batches_in_step(t, r) != s.K;
    }
    uneven_steps += uneven;
    // Same step, same micro-batches as the even plan (same windows and step order).
    const double mx = step_max(p, t), mx_even = step_max(even, t);
    EXPECT_LE(mx, mx_even * (1 + 1e-12)) << "step " << t;
    faster += mx < mx_even * (1 - 1e-12);
    total += mx;
    total_even += mx_even;
  }
  EXPECT_EQ(p.rank_offsets.back(), p.num_micro_batches());
  // Single samples of very different costs in short windows: counts other than K pay off.
  // (Long windows sort steps into micro-batches of like cost, where K each is as good.)
  if (s.K > 1 && s.max_batch_size == 1 && s.lookahead <= 8) {
    EXPECT_GT(uneven_steps, 0);
    EXPECT_GT(faster, 0);
    EXPECT_LT(total, total_even);
  }
  if (s.K == 1) {
    EXPECT_EQ(uneven_steps, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, UnevenPlan,
                         ::testing::Values(Shape{2, 4, 1, 8}, Shape{8, 4, 1, 1}, Shape{8, 4, 1, 64},
                                           Shape{4, 3, 0, 8}, Shape{8, 1, 1, 8},
                                           Shape{3, 5, 0, 1}));

TEST(UnevenPlanTest, KOneIsTheEvenPlan) {
  const auto lens = wan_mix(500, 5);
  const SampleTable table(lens.data(), lens.size(), nullptr,
                          CostModel::polynomial(1.0, 3.1e-3, 1.35e-7));
  PlanOptions o = options(4, 1, 0, 8);
  o.max_cost = table.default_max_cost(o.max_tokens);
  const EpochPlan even = plan_epoch(table, o);
  o.uneven_counts = true;
  const EpochPlan p = plan_epoch(table, o);
  EXPECT_EQ(p.samples, even.samples);
  EXPECT_EQ(p.offsets, even.offsets);
  EXPECT_EQ(p.costs, even.costs);
}

TEST(UnevenPlanTest, ExcludedSamplesNeverAppearAndBalanceIsRequired) {
  const auto lens = wan_mix(400, 9);
  const SampleTable table(lens.data(), lens.size(), nullptr,
                          CostModel::polynomial(1.0, 3.1e-3, 1.35e-7));
  PlanOptions o = options(2, 3, 1, 4);
  o.max_cost = table.default_max_cost(o.max_tokens, 1);
  o.uneven_counts = true;
  std::vector<uint8_t> exclude(lens.size(), 0);
  for (size_t i = 0; i < exclude.size(); i += 3) exclude[i] = 1;
  const EpochPlan p = plan_epoch(table, o, exclude.data());
  for (int64_t m = 0; m < p.num_micro_batches(); ++m)
    for (int64_t j = p.offsets[m]; j < p.offsets[m + 1]; ++j)
      if (!p.padding[m]) {
        EXPECT_FALSE(exclude[p.samples[j]]);
      }
  o.balance = false;
  EXPECT_THROW(plan_epoch(table, o), std::invalid_argument);
}

TEST(UnevenPlanTest, EmptyDatasetPlansNothing) {
  const SampleTable table(nullptr, 0, nullptr, CostModel::power(2.0));
  PlanOptions o = options(2, 2, 0, 4);
  o.max_cost = 1.0;
  o.uneven_counts = true;
  const EpochPlan p = plan_epoch(table, o);
  EXPECT_EQ(p.num_steps, 0);
  EXPECT_EQ(p.rank_offsets, std::vector<int64_t>{0});
}

}  // namespace
}  // namespace adaptiveload
