// Steps at least as representative as a shuffle (PlanOptions::representative, window_mix.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "sampler/cost_model.h"
#include "sampler/planner.h"
#include "sampler/rng.h"
#include "sampler/window_mix.h"
#include "wan_mix.h"

namespace adaptiveload {
namespace {

CostModel wan14b() { return CostModel::polynomial(1.0, 3.1e-3, 1.35e-7); }

TEST(WindowMix, MeasuresAgainstTheWindowsShares) {
  // Four micro-batches, two groups: group 0 of 10 tokens (1 sample) x 2, group 1 of 30 tokens (3
  // samples) x 2. Window shares: tokens 1/4 and 3/4, samples 1/4 and 3/4.
  const std::vector<int32_t> group = {0, 0, 1, 1};
  const std::vector<int64_t> tokens = {10, 10, 30, 30}, samples = {1, 1, 3, 3};
  WindowMix window(100, group, tokens, samples);
  // Steps of one of each: every step holds the window's mix.
  std::vector<Item> mixed = {{1.0, 100}, {1.0, 102}, {1.0, 101}, {1.0, 103}};
  StepMix m = window.measure(mixed, 2, 2);
  EXPECT_DOUBLE_EQ(m.tokens, 0.0);
  EXPECT_DOUBLE_EQ(m.samples, 0.0);
  EXPECT_DOUBLE_EQ(m.missing, 0.0);
  EXPECT_DOUBLE_EQ(m.lacking_kind, 0.0);
  // Steps of one group each: a step of group 0 is 3/4 away, of group 1 1/4; each lacks one of
  // the two major groups (and one of the two kinds: 10 and 10 tokens per sample are one length,
  // so both groups are of one kind here).
  std::vector<Item> sorted = {{1.0, 100}, {1.0, 101}, {1.0, 102}, {1.0, 103}};
  m = window.measure(sorted, 2, 2);
  EXPECT_DOUBLE_EQ(m.tokens, 0.5);
  EXPECT_DOUBLE_EQ(m.samples, 0.5);
  EXPECT_DOUBLE_EQ(m.missing, 0.5);
  EXPECT_DOUBLE_EQ(m.lacking_kind, 0.0);
}

TEST(WindowMix, KindsPartShortFromLongSamples) {
  // Group 0: images of 1,560 tokens; group 1: clips of 75,600. Steps of one group lack a kind.
  const std::vector<int32_t> group = {0, 0, 1, 1};
  const std::vector<int64_t> tokens = {1560 * 96, 1560 * 96, 75600, 75600};
  const std::vector<int64_t> samples = {96, 96, 1, 1};
  WindowMix window(0, group, tokens, samples);
  std::vector<Item> sorted = {{1.0, 0}, {1.0, 1}, {1.0, 2}, {1.0, 3}};
  EXPECT_DOUBLE_EQ(window.measure(sorted, 2, 2).lacking_kind, 1.0);
  std::vector<Item> mixed = {{1.0, 0}, {1.0, 2}, {1.0, 1}, {1.0, 3}};
  EXPECT_DOUBLE_EQ(window.measure(mixed, 2, 2).lacking_kind, 0.0);
}

// Micro-batches of a plan, each as its sorted sample list, sorted: what packing made.
std::vector<std::vector<int64_t>> micro_batches(const EpochPlan& plan) {
  std::vector<std::vector<int64_t>> mbs;
  for (int64_t m = 0; m < plan.num_micro_batches(); ++m) {
    mbs.emplace_back(plan.samples.begin() + plan.offsets[m],
                     plan.samples.begin() + plan.offsets[m + 1]);
    std::sort(mbs.back().begin(), mbs.back().end());
  }
  std::sort(mbs.begin(), mbs.end());
  return mbs;
}

class Representative : public ::testing::TestWithParam<std::tuple<int, int, bool, int>> {};

TEST_P(Representative, StepsAsCloseToTheMixAsAShuffleWithTheSameMicroBatches) {
  const auto [W, K, uneven, batch] = GetParam();
  const std::vector<int64_t> lens = wan_mix(6001, 11);
  SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr, wan14b());
  PlanOptions o;
  o.max_tokens = 151200;
  o.max_batch_size = batch;
  o.max_cost = table.default_max_cost(o.max_tokens, batch);
  o.num_replicas = W;
  o.micro_batches_per_step = K;
  o.uneven_counts = uneven;
  o.seed = 7;
  o.representative = true;
  const EpochPlan p = plan_epoch(table, o);
  PlanOptions sorted = o;
  sorted.representative = false;
  sorted.mix_tolerance = 0.0;
  const EpochPlan q = plan_epoch(table, sorted);
  // The order changes, not the packing: the same micro-batches, each once.
  ASSERT_EQ(micro_batches(p), micro_batches(q));
  // Whole plan as one window: its steps against uniform shuffles of its micro-batches.
  const int64_t per_step = W * K, n = p.num_steps * per_step;
  std::vector<int32_t> group(n);
  std::vector<int64_t> tokens(n), samples(n);
  std::vector<Item> steps(n);
  for (int64_t m = 0; m < n; ++m) {
    group[m] = table.group(p.samples[p.offsets[m]]);
    tokens[m] = p.tokens[m];
    samples[m] = p.offsets[m + 1] - p.offsets[m];
    steps[m] = {p.costs[m], m};
  }
  WindowMix window(0, group, tokens, samples);
  Rng rng(123, 0);
  StepMix bar;
  for (int d = 0; d < 16; ++d) {
    std::vector<Item> s = steps;
    shuffle_in_place(s, rng);
    bar.add(window.measure(s, p.num_steps, per_step), 1.0 / 16);
  }
  const StepMix got = window.measure(steps, p.num_steps, per_step);
  EXPECT_LE(got.tokens, 1.10 * bar.tokens);
  EXPECT_LE(got.samples, 1.10 * bar.samples);
  EXPECT_LE(got.lacking_kind, bar.lacking_kind + 0.03);
  // The tolerance's rule at 0 (steps of similar cost) is far from the mix.
  std::vector<Item> by_cost(n);
  for (int64_t m = 0; m < n; ++m) by_cost[m] = {q.costs[m], m};
  WindowMix sorted_window(
      0,
      [&] {
        std::vector<int32_t> g(n);
        for (int64_t m = 0; m < n; ++m) g[m] = table.group(q.samples[q.offsets[m]]);
        return g;
      }(),
      std::vector<int64_t>(q.tokens.begin(), q.tokens.begin() + n),
      [&] {
        std::vector<int64_t> c(n);
        for (int64_t m = 0; m < n; ++m) c[m] = q.offsets[m + 1] - q.offsets[m];
        return c;
      }());
  EXPECT_GT(sorted_window.measure(by_cost, q.num_steps, per_step).tokens, 1.3 * bar.tokens);
}

INSTANTIATE_TEST_SUITE_P(
    Setups, Representative,
    ::testing::Values(std::make_tuple(8, 1, false, 0), std::make_tuple(8, 4, false, 0),
                      std::make_tuple(8, 4, true, 0), std::make_tuple(8, 1, false, 1),
                      std::make_tuple(8, 4, false, 1), std::make_tuple(16, 2, true, 1)));

}  // namespace
}  // namespace adaptiveload
