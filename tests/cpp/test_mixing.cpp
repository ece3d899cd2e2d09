// Steps that mix the window's groups (PlanOptions::mix_tolerance).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "plan_stats.h"
#include "sampler/cost_model.h"
#include "sampler/planner.h"
#include "wan_mix.h"

namespace adaptiveload {
namespace {

CostModel wan14b() { return CostModel::polynomial(1.0, 3.1e-3, 1.35e-7); }

PlanOptions options(int64_t W, int64_t K, double tolerance, const SampleTable& table) {
  PlanOptions o;
  o.max_tokens = 151200;
  o.max_cost = table.default_max_cost(o.max_tokens);
  o.num_replicas = W;
  o.micro_batches_per_step = K;
  o.seed = 5;
  o.mix_tolerance = tolerance;
  return o;
}

// Micro-batches of each group in each step: counts[t][g].
std::vector<std::map<int32_t, int64_t>> step_groups(const SampleTable& table, const EpochPlan& p) {
  const int64_t per_step = p.num_replicas * p.micro_batches_per_step;
  std::vector<std::map<int32_t, int64_t>> counts(p.num_steps);
  for (int64_t m = 0; m < p.num_micro_batches(); ++m)
    ++counts[m / per_step][table.group(p.samples[p.offsets[m]])];
  return counts;
}

class Mixing : public ::testing::TestWithParam<std::tuple<int, int, double, bool>> {};

TEST_P(Mixing, CoversEverySampleOnceWithTheSameMicroBatches) {
  const auto [W, K, tolerance, uneven] = GetParam();
  const std::vector<int64_t> lens = wan_mix(5001, 3);
  SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr, wan14b());
  PlanOptions o = options(W, K, tolerance, table);
  o.uneven_counts = uneven;
  const EpochPlan p = plan_epoch(table, o);
  PlanOptions sorted = o;
  sorted.mix_tolerance = 0.0;
  const EpochPlan q = plan_epoch(table, sorted);
  // The order changes, not the packing: the same micro-batches, each once.
  auto key = [](const EpochPlan& plan) {
    std::vector<std::vector<int64_t>> mbs;
    for (int64_t m = 0; m < plan.num_micro_batches(); ++m)
      mbs.emplace_back(plan.samples.begin() + plan.offsets[m],
                       plan.samples.begin() + plan.offsets[m + 1]);
    std::sort(mbs.begin(), mbs.end());
    return mbs;
  };
  EXPECT_EQ(key(p), key(q));
  EXPECT_EQ(p.num_micro_batches(), p.num_steps * W * K);
  std::vector<int> seen(table.size(), 0);
  for (int64_t m = 0; m < p.num_micro_batches(); ++m)
    if (!p.padding[m])
      for (int64_t j = p.offsets[m]; j < p.offsets[m + 1]; ++j) ++seen[p.samples[j]];
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  if (uneven) {
    for (int64_t t = 0; t < p.num_steps; ++t)
      for (int64_t r = 0; r < W; ++r) EXPECT_GE(p.micro_batches_in_step(t, r), 1);
  }
  // Every window records its strata; a mixed window keeps the tolerance.
  const int64_t windows = (p.num_steps + o.lookahead_steps - 1) / o.lookahead_steps;
  ASSERT_EQ(static_cast<int64_t>(p.window_strata.size()), windows);
  // Deterministic.
  const EpochPlan again = plan_epoch(table, o);
  EXPECT_EQ(again.samples, p.samples);
  EXPECT_EQ(again.offsets, p.offsets);
  EXPECT_EQ(again.rank_offsets, p.rank_offsets);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Mixing,
                         ::testing::Combine(::testing::Values(2, 8), ::testing::Values(1, 4),
                                            ::testing::Values(0.02, 1.0), ::testing::Bool()));

TEST(MixingTest, FullyMixedStepsHoldEveryGroupInProportion) {
  // Tolerance 1: one stratum per window, every group dealt round-robin to its steps, so a
  // step holds floor or ceil of the window's count of each group over its steps.
  const std::vector<int64_t> lens = wan_mix(20000, 4);
  SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr, wan14b());
  const PlanOptions o = options(8, 4, 1.0, table);
  const EpochPlan p = plan_epoch(table, o);
  const auto counts = step_groups(table, p);
  for (int64_t t0 = 0; t0 < p.num_steps; t0 += o.lookahead_steps) {
    const int64_t steps = std::min(o.lookahead_steps, p.num_steps - t0);
    EXPECT_EQ(p.window_strata[t0 / o.lookahead_steps], 1);
    std::map<int32_t, int64_t> total;
    for (int64_t t = t0; t < t0 + steps; ++t)
      for (auto [g, c] : counts[t]) total[g] += c;
    for (int64_t t = t0; t < t0 + steps; ++t)
      for (auto [g, n] : total) {
        const int64_t c = counts[t].count(g) ? counts[t].at(g) : 0;
        EXPECT_GE(c, n / steps) << "step " << t << " group " << g;
        EXPECT_LE(c, (n + steps - 1) / steps) << "step " << t << " group " << g;
      }
  }
}

TEST(MixingTest, TheToleranceBoundsEachMixedWindow) {
  const std::vector<int64_t> lens = wan_mix(20000, 6);
  SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr, wan14b());
  for (double tolerance : {0.005, 0.02, 0.05}) {
    PlanOptions o = options(8, 4, tolerance, table);
    o.lookahead_steps = 1 << 20;  // one window: its mean imbalance is the plan's
    const EpochPlan p = plan_epoch(table, o);
    ASSERT_EQ(p.window_strata.size(), 1u);
    if (p.window_strata[0] < p.num_steps) {
      EXPECT_LE(mean_imbalance(p), tolerance + 1e-12);
    }
  }
}

TEST(MixingTest, ZeroToleranceIsTheSortedPlanAndMixingHasMoreGroupsPerStep) {
  const std::vector<int64_t> lens = wan_mix(20000, 7);
  SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr, wan14b());
  const EpochPlan sorted = plan_epoch(table, options(8, 4, 0.0, table));
  const EpochPlan mixed = plan_epoch(table, options(8, 4, 1.0, table));
  for (size_t w = 0; w < sorted.window_strata.size(); ++w) {
    const int64_t steps = std::min<int64_t>(64, sorted.num_steps - 64 * static_cast<int64_t>(w));
    EXPECT_EQ(sorted.window_strata[w], steps);
  }
  auto mean_groups = [&](const EpochPlan& p) {
    double sum = 0.0;
    for (const auto& c : step_groups(table, p)) sum += static_cast<double>(c.size());
    return sum / static_cast<double>(p.num_steps);
  };
  EXPECT_GT(mean_groups(mixed), mean_groups(sorted) + 2.0);
  EXPECT_LT(mean_imbalance(sorted), mean_imbalance(mixed) + 1e-12);
}

TEST(MixingTest, BadToleranceIsRefused) {
  const std::vector<int64_t> lens = {10, 20, 30};
  SampleTable table(lens.data(), 3, nullptr, wan14b());
  PlanOptions o = options(1, 1, -0.1, table);
  EXPECT_THROW(plan_epoch(table, o), std::invalid_argument);
  o.mix_tolerance = 1.5;
  EXPECT_THROW(plan_epoch(table, o), std::invalid_argument);
}

}  // namespace
}  // namespace adaptiveload
