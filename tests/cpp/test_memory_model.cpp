#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "sampler/cost_model.h"
#include "sampler/memory_model.h"
#include "sampler/planner.h"

namespace adaptiveload {
namespace {

// Roughly Wan-2.1-1.3B with 30 blocks on one GPU (bytes): 20 GB fixed, 130 kB per token
// per block that keeps its activations, 6 kB per token per checkpointed block.
MemoryModel wan_memory(double margin = 0.05) {
  MemoryModel m;
  m.num_blocks = 30;
  m.m0 = 20e9;
  m.mb = 1e6;
  m.mbk = 2e5;
  m.mt = 1e4;
  m.ma = 1.3e5;
  m.mc = 6e3;
  m.mr = 1.3e5;
  m.margin = margin;
  m.recompute_share = 0.25;
  m.validate();
  return m;
}

std::vector<int64_t> mixed_lengths(int64_t n, uint32_t seed) {
  const int64_t lens[] = {1560, 3600, 14040, 32760, 46800, 75600};
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> pick(0, 5);
  std::vector<int64_t> out(n);
  for (auto& s : out) s = lens[pick(gen)];
  return out;
}

// The fewest n by trying every n.
int64_t brute_force_blocks(const MemoryModel& m, int64_t count, int64_t tokens, double budget,
                           double held = 0.0) {
  for (int64_t n = 0; n <= m.num_blocks; ++n)
    if (m.peak(count, tokens, n, held) * (1.0 + m.margin) <= budget) return n;
  return -1;
}

TEST(MemoryModel, FewestBlocksMatchesTryingEveryCount) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 2000; ++trial) {
    MemoryModel m;
    m.num_blocks = 1 + static_cast<int64_t>(u(gen) * 40);
    m.m0 = u(gen) * 1e10;
    m.mb = u(gen) * 1e6;
    m.mbk = u(gen) * 1e6;
    m.mt = u(gen) * 1e4;
    m.ma = u(gen) * 2e5;
    m.mc = u(gen) * (trial % 5 == 0 ? 4e5 : 1e4);  // sometimes checkpointing does not help
    m.mr = u(gen) * 2e5;
    m.margin = u(gen) * 0.2;
    m.validate();
    const int64_t count = 1 + static_cast<int64_t>(u(gen) * 30);
    const int64_t tokens = count * (1 + static_cast<int64_t>(u(gen) * 80000));
    const double budget = m.m0 + u(gen) * 1e11;
    // Half the trials hold more per kept block (a ring member's keys and values).
    const double held = trial % 2 ? u(gen) * 2e3 * static_cast<double>(tokens) : 0.0;
    EXPECT_EQ(m.checkpointed_blocks(count, tokens, budget, held),
              brute_force_blocks(m, count, tokens, budget, held))
        << m.describe() << " B=" << count << " T=" << tokens << " budget=" << budget
        << " held=" << held;
  }
}

TEST(MemoryModel, HeldBytesCountOncePerKeptBlock) {
  const MemoryModel m = wan_memory();
  for (int64_t n : {0, 1, 15, 29, 30})
    EXPECT_DOUBLE_EQ(m.peak(2, 9000, n, 768.0 * 72000) - m.peak(2, 9000, n),
                     768.0 * 72000 * static_cast<double>(std::max<int64_t>(30 - n, 1)));
  // A member's share of a micro-batch split 8 ways: the policy adds held_per_token at degree 8
  // times the whole micro-batch's tokens, nothing unsplit or at a degree it does not name.
  MemoryPolicy policy{m, 40e9, {0.0, 0.0, 0.0, 768.0}};
  policy.validate();
  BatchStats share;
  share.add(9000, 0.0);
  EXPECT_DOUBLE_EQ(policy.held(8), 768.0);
  EXPECT_DOUBLE_EQ(policy.held(1), 0.0);
  EXPECT_DOUBLE_EQ(policy.held(16), 0.0);
  EXPECT_EQ(policy.share_blocks(share, 72000, 8),
            brute_force_blocks(m, 1, 9000, 40e9, 768.0 * 72000));
  EXPECT_GT(policy.share_blocks(share, 72000, 8), policy.share_blocks(share, 72000, 4));
  EXPECT_EQ(policy.share_blocks(share, 72000, 4), policy.checkpointed_blocks(share));
  for (double bad : {-1.0, std::nan("")}) {
    policy.held_per_token[2] = bad;
    EXPECT_THROW(policy.validate(), std::invalid_argument);
  }
}

TEST(MemoryModel, FewestBlocksMatchesTryingEveryCountForDeepModels) {
  // The closed form on [1, L - 1] against the loop, up to the largest L accepted.
  std::mt19937 gen(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 400; ++trial) {
    MemoryModel m;
    m.num_blocks = trial == 0 ? MemoryModel::kMaxBlocks
                              : 2 + static_cast<int64_t>(u(gen) * (MemoryModel::kMaxBlocks - 2));
    m.m0 = u(gen) * 1e10;
    m.mb = u(gen) * 1e5;
    m.mbk = u(gen) * 1e4;
    m.mt = u(gen) * 1e4;
    m.ma = u(gen) * 2e3;
    m.mc = u(gen) * (trial % 5 == 0 ? 4e3 : 1e2);
    m.mr = u(gen) * 2e5;
    m.margin = u(gen) * 0.2;
    m.validate();
    const int64_t count = 1 + static_cast<int64_t>(u(gen) * 30);
    const int64_t tokens = count * (1 + static_cast<int64_t>(u(gen) * 80000));
    const double budget = m.m0 + u(gen) * m.peak(count, tokens, 0) * 1.2;
    EXPECT_EQ(m.checkpointed_blocks(count, tokens, budget),
              brute_force_blocks(m, count, tokens, budget))
        << m.describe() << " B=" << count << " T=" << tokens << " budget=" << budget;
  }
}

TEST(MemoryModel, TimeFactorAndValidation) {
  const MemoryModel m = wan_memory();
  EXPECT_DOUBLE_EQ(m.time_factor(30), 1.0);
  EXPECT_DOUBLE_EQ(m.time_factor(0), 0.75);
  EXPECT_DOUBLE_EQ(m.time_factor(15), 0.875);
  MemoryModel bad = m;
  bad.ma = -1.0;
  EXPECT_THROW(bad.validate(), std::invalid_argument);
  bad = m;
  bad.recompute_share = 1.0;
  EXPECT_THROW(bad.validate(), std::invalid_argument);
  bad = m;
  bad.num_blocks = 0;
  EXPECT_THROW(bad.validate(), std::invalid_argument);
  bad = m;
  bad.num_blocks = MemoryModel::kMaxBlocks + 1;
  EXPECT_THROW(bad.validate(), std::invalid_argument);
  bad = m;
  bad.ma = bad.mt = 0.0;
  EXPECT_THROW(bad.validate(), std::invalid_argument);
}

TEST(MemoryPolicyPlan, EveryMicroBatchFitsWithTheFewestBlocks) {
  const std::vector<int64_t> lens = mixed_lengths(3000, 11);
  const CostModel cost = CostModel::polynomial(0.5, 1e-3, 2e-8);
  const MemoryPolicy policy{wan_memory(), 60e9, {}};
  const SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr, cost, &policy);
  PlanOptions o;
  o.max_tokens = 1 << 30;  // memory is the budget's business here
  o.num_replicas = 8;
  o.micro_batches_per_step = 2;
  o.max_cost = table.default_max_cost(o.max_tokens);
  const EpochPlan p = plan_epoch(table, o);
  ASSERT_EQ(static_cast<int64_t>(p.checkpointed.size()), p.num_micro_batches());
  std::vector<int> seen(lens.size(), 0);
  int64_t partly = 0, several = 0;
  for (int64_t mb = 0; mb < p.num_micro_batches(); ++mb) {
    const int64_t b = p.offsets[mb], e = p.offsets[mb + 1];
    BatchStats stats;
    for (int64_t j = b; j < e; ++j) {
      stats.add(lens[p.samples[j]], cost.sample_cost(lens[p.samples[j]]));
      if (!p.padding[mb]) ++seen[p.samples[j]];
    }
    const int64_t n = p.checkpointed[mb];
    ASSERT_GE(n, 0);
    EXPECT_EQ(n, brute_force_blocks(policy.model, stats.count, stats.tokens, policy.budget));
    EXPECT_LE(policy.model.peak(stats.count, stats.tokens, n) * 1.05, policy.budget);
    EXPECT_NEAR(p.costs[mb], cost.batch_cost(stats) * policy.model.time_factor(n),
                1e-9 * p.costs[mb]);
    // The compute cap binds micro-batches of two or more samples, and they need no
    // recomputation; only a sample alone may checkpoint.
    if (e - b > 1) {
      EXPECT_LE(p.costs[mb], o.max_cost * (1 + 1e-12));
      EXPECT_EQ(n, 0) << "micro-batch " << mb << " of " << (e - b) << " samples";
      ++several;
    }
    if (n > 0 && n < 30) ++partly;
  }
  for (size_t i = 0; i < lens.size(); ++i) EXPECT_EQ(seen[i], 1) << "sample " << i;
  EXPECT_GT(partly, 0) << "the budget should leave some long samples partly checkpointed";
  EXPECT_GT(several, 0);
}

TEST(MemoryPolicyPlan, WithoutPolicyNothingChanges) {
  const std::vector<int64_t> lens = mixed_lengths(2000, 3);
  const CostModel cost = CostModel::polynomial(0.5, 1e-3, 2e-8);
  const SampleTable plain(lens.data(), static_cast<int64_t>(lens.size()), nullptr, cost);
  // A budget so large that every micro-batch fits with n = 0 and recompute_share = 0:
  // the same plan as without a policy, all n = 0.
  MemoryModel free_model = wan_memory(0.0);
  free_model.recompute_share = 0.0;
  const MemoryPolicy huge{free_model, 1e18, {}};
  const SampleTable roomy(lens.data(), static_cast<int64_t>(lens.size()), nullptr, cost, &huge);
  PlanOptions o;
  o.max_tokens = 160000;
  o.num_replicas = 4;
  o.max_cost = plain.default_max_cost(o.max_tokens);
  // Under a policy the default cap is the heaviest group's full micro-batch, not the lightest
  // one's, so it is at least as high; with the same explicit cap the plans are the same.
  EXPECT_GE(roomy.default_max_cost(o.max_tokens), o.max_cost);
  const EpochPlan a = plan_epoch(plain, o), b = plan_epoch(roomy, o);
  EXPECT_TRUE(a.checkpointed.empty());
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_EQ(b.checkpointed, std::vector<int32_t>(b.num_micro_batches(), 0));
}

TEST(MemoryPolicyPlan, SampleOverBudgetIsRefusedOrSkipped) {
  std::vector<int64_t> lens = mixed_lengths(500, 5);
  lens[17] = 400000;  // needs more than the budget even with every block checkpointed
  const CostModel cost = CostModel::polynomial(0.5, 1e-3, 2e-8);
  const MemoryPolicy policy{wan_memory(), 60e9, {}};
  const SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr, cost, &policy);
  PlanOptions o;
  o.max_tokens = 1 << 30;
  o.max_cost = 1e9;
  try {
    plan_epoch(table, o);
    FAIL() << "expected the over-budget sample to be refused";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("sample 17"), std::string::npos) << what;
    EXPECT_NE(what.find("budget"), std::string::npos) << what;
  }
  o.oversize = OversizePolicy::kSkip;
  const EpochPlan p = plan_epoch(table, o);
  EXPECT_EQ(p.skipped, std::vector<int64_t>{17});
  EXPECT_EQ(table.oversize_samples(o.max_tokens, o.max_cost), std::vector<int64_t>{17});
}

TEST(MemoryPolicyPlan, BadBudgetIsRefused) {
  const std::vector<int64_t> lens = {100, 200};
  const MemoryPolicy zero{wan_memory(), 0.0, {}};
  EXPECT_THROW(SampleTable(lens.data(), 2, nullptr, CostModel::power(1.5), &zero),
               std::invalid_argument);
}

}  // namespace
}  // namespace adaptiveload
