#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan_stats.h"
#include "sampler/cost_model.h"
#include "sampler/planner.h"
#include "sampler/sequence_parallel.h"
#include "wan_mix.h"

namespace adaptiveload {
namespace {

CostModel wan14b() { return CostModel::polynomial(1.0, 3.1e-3, 1.35e-7); }

// Checks the invariants every plan must hold and returns how often each sample appears
// outside padding micro-batches.
std::vector<int> check_plan(const SampleTable& table, const PlanOptions& o, const EpochPlan& p,
                            const std::vector<int64_t>* keys = nullptr) {
  EXPECT_EQ(p.num_micro_batches(), p.num_steps * o.num_replicas * o.micro_batches_per_step);
  std::vector<int> seen(table.size(), 0);
  for (int64_t m = 0; m < p.num_micro_batches(); ++m) {
    const int64_t b = p.offsets[m], e = p.offsets[m + 1];
    EXPECT_GT(e, b) << "empty micro-batch " << m;
    int64_t tokens = 0;
    for (int64_t j = b; j < e; ++j) {
      const int64_t i = p.samples[j];
      tokens += table.seq_len(i);
      EXPECT_EQ(table.group(i), table.group(p.samples[b]))
          << "micro-batch " << m << " mixes groups";
      if (keys) {
        EXPECT_EQ((*keys)[i], (*keys)[p.samples[b]]);
      }
      if (!p.padding[m]) ++seen[i];
    }
    EXPECT_EQ(tokens, p.tokens[m]);
    EXPECT_LE(tokens, o.max_tokens) << "micro-batch " << m << " over the memory cap";
    const double cost = table.batch_cost(p.samples.data() + b, e - b);
    EXPECT_NEAR(cost, p.costs[m], 1e-9 * std::max(1.0, cost));
    EXPECT_LE(cost, o.max_cost * (1 + 1e-12)) << "micro-batch " << m << " over the compute cap";
  }
  return seen;
}

TEST(CostModel, PowerAndPolynomialValues) {
  const CostModel pw = CostModel::power(1.5, 2.0);
  EXPECT_DOUBLE_EQ(pw.sample_cost(100), 2.0 * 1000.0);
  EXPECT_DOUBLE_EQ(pw.batch_overhead(), 0.0);
  const CostModel poly = CostModel::polynomial(3.0, 0.5, 0.25);
  EXPECT_DOUBLE_EQ(poly.sample_cost(10), 5.0 + 25.0);
  EXPECT_DOUBLE_EQ(poly.batch_overhead(), 3.0);
  const CostModel with_sample = CostModel::polynomial(3.0, 0.5, 0.25, 7.0);
  EXPECT_DOUBLE_EQ(with_sample.sample_cost(10), 7.0 + 5.0 + 25.0);
  EXPECT_THROW(CostModel::polynomial(0, 1, 1, -1), std::invalid_argument);
}

TEST(CostModel, RejectsBadCoefficients) {
  EXPECT_THROW(CostModel::power(0.5), std::invalid_argument);
  EXPECT_THROW(CostModel::power(1.5, 0.0), std::invalid_argument);
  EXPECT_THROW(CostModel::polynomial(-1, 1, 1), std::invalid_argument);
  EXPECT_THROW(CostModel::polynomial(0, 0, 0), std::invalid_argument);
  EXPECT_THROW(CostModel::polynomial(0, NAN, 1), std::invalid_argument);
  try {
    CostModel::polynomial(0, -2, 1);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("c1"), std::string::npos);
  }
}

BatchStats uniform(int64_t seq_len, int64_t count, const CostModel& m) {
  BatchStats b;
  for (int64_t i = 0; i < count; ++i) b.add(seq_len, m.sample_cost(seq_len));
  return b;
}

TEST(CostModel, MeasuredKindsOverrideTheFitOnlyForUniformMicroBatches) {
  const CostModel fit = CostModel::polynomial(1.0, 0.5, 0.0);
  const CostModel m = fit.with_measured({{10, 2, 100.0}, {20, 1, 3.0}});
  EXPECT_DOUBLE_EQ(m.batch_cost(uniform(10, 2, m)), 100.0);
  EXPECT_DOUBLE_EQ(m.batch_cost(uniform(20, 1, m)), 3.0);
  // Unmeasured kinds and mixed lengths use the fitted form.
  EXPECT_DOUBLE_EQ(m.batch_cost(uniform(10, 3, m)), 1.0 + 15.0);
  BatchStats mixed = uniform(10, 1, m);
  mixed.add(20, m.sample_cost(20));
  EXPECT_EQ(mixed.uniform_len, -1);
  EXPECT_DOUBLE_EQ(m.batch_cost(mixed), 1.0 + 15.0);
  EXPECT_DOUBLE_EQ(m.fitted_cost(uniform(10, 2, m)), 11.0);
  ASSERT_EQ(m.measured().size(), 2u);
  EXPECT_EQ(m.measured()[0].seq_len, 10);
  EXPECT_EQ(fit.with_measured({}).num_measured(), 0);
}

TEST(CostModel, FloorBoundsSmallMicroBatchesFromBelow) {
  const CostModel m = CostModel::polynomial(0.0, 1.0, 0.0).with_floor(50.0, 2.0);
  EXPECT_DOUBLE_EQ(m.batch_cost(uniform(10, 1, m)), 52.0);    // floor: 50 + 2 * 1
  EXPECT_DOUBLE_EQ(m.batch_cost(uniform(10, 3, m)), 56.0);    // floor: 50 + 2 * 3 > 30
  EXPECT_DOUBLE_EQ(m.batch_cost(uniform(100, 1, m)), 100.0);  // work above the floor
  EXPECT_THROW(m.with_floor(-1.0, 0.0), std::invalid_argument);
  EXPECT_THROW(m.with_floor(0.0, NAN), std::invalid_argument);
}

TEST(CostModel, SplitKeptIsPerSampleAndLeavesWholeCostsAlone) {
  const CostModel base = CostModel::polynomial(2.0, 0.01, 1e-6);
  const CostModel kept = base.with_split_kept(0.5, 1e-4);
  EXPECT_DOUBLE_EQ(kept.split_kept(1000), 0.6);
  EXPECT_DOUBLE_EQ(base.split_kept(1000), 0.0);
  BatchStats b;
  for (int64_t s : {1000, 3000}) b.add(s, kept.sample_cost(s));
  EXPECT_DOUBLE_EQ(kept.batch_cost(b), base.batch_cost(b));  // whole micro-batches: unchanged
  EXPECT_NE(kept.describe().find("split_kept"), std::string::npos);
  EXPECT_THROW(base.with_split_kept(-0.1, 0.0), std::invalid_argument);
  EXPECT_THROW(base.with_split_kept(0.0, std::nan("")), std::invalid_argument);
}

TEST(CostModel, RejectsBadMeasuredKindsNamingThem) {
  const CostModel m = CostModel::power(1.5);
  auto message = [&](std::vector<MeasuredKind> kinds) {
    try {
      m.with_measured(kinds);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{0, 1, 1.0}}).find("seq_len"), std::string::npos);
  EXPECT_NE(message({{5, 0, 1.0}}).find("batch"), std::string::npos);
  EXPECT_NE(message({{5, 1, -1.0}}).find("cost"), std::string::npos);
  EXPECT_NE(message({{5, 1, NAN}}).find("cost"), std::string::npos);
  EXPECT_NE(message({{5, 2, 1.0}, {5, 2, 3.0}}).find("twice"), std::string::npos);
}

TEST(CostModel, MeasuredSharesAreKeyedByDegree) {
  // A share of (S, B) split d ways measured at degree d: found only at that degree, listed
  // after the degree-1 kind of the same (S, B), never the cost of a whole micro-batch.
  const CostModel fit = CostModel::polynomial(1.0, 0.5, 0.0);
  const CostModel m = fit.with_measured({{10, 2, 100.0}, {10, 2, 60.0, 2}, {10, 2, 35.0, 4}});
  EXPECT_DOUBLE_EQ(m.batch_cost(uniform(10, 2, m)), 100.0);
  EXPECT_DOUBLE_EQ(m.measured_share(10, 2, 2), 60.0);
  EXPECT_DOUBLE_EQ(m.measured_share(10, 2, 4), 35.0);
  EXPECT_DOUBLE_EQ(m.measured_share(10, 2, 8), 0.0);  // not measured
  EXPECT_DOUBLE_EQ(m.measured_share(10, 1, 2), 0.0);
  EXPECT_DOUBLE_EQ(m.measured_share(10, 2, 1), 100.0);
  ASSERT_EQ(m.num_measured(), 3);
  const std::vector<MeasuredKind> all = m.measured();
  EXPECT_EQ(all[0].degree, 1);
  EXPECT_EQ(all[1].degree, 2);
  EXPECT_EQ(all[2].degree, 4);
  // Only shares, no whole kind: the whole micro-batch still costs the fit.
  const CostModel only = fit.with_measured({{10, 2, 60.0, 2}});
  EXPECT_DOUBLE_EQ(only.batch_cost(uniform(10, 2, only)), 11.0);
}

TEST(CostModel, RejectsBadDegreeNamingIt) {
  const CostModel m = CostModel::power(1.5);
  for (int64_t d : {int64_t{0}, int64_t{3}, int64_t{-2}, int64_t{1} << 20}) {
    try {
      m.with_measured({{5, 1, 1.0, d}});
      ADD_FAILURE() << "degree " << d << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("degree"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(m.with_measured({{5, 1, 1.0, 2}, {5, 1, 2.0, 2}}), std::invalid_argument);
}

// A micro-batch of cost 100 (10 of it not split) and 1,000 tokens; sequence parallelism up to
// `max_degree` at 0.01 per token sent.
SpItem hundred_cost_item() {
  SpItem it;
  it.cost = 100.0;
  it.fixed = 10.0;
  it.tokens = 1000;
  return it;
}

SequenceParallel per_token_comm(int64_t max_degree) {
  SequenceParallel sp;
  sp.max_degree = max_degree;
  sp.comm_per_token = 0.01;
  return sp;
}

TEST(SequenceParallel, MeasuredShareReplacesTheSplitFormula) {
  SpItem it = hundred_cost_item();
  const SequenceParallel sp = per_token_comm(4);
  const double comm2 = 0.01 * 1000 * 1.0 / 4.0;
  EXPECT_DOUBLE_EQ(share_cost(it, 2, sp), 10.0 + 45.0 + comm2);
  it.measured = {0.0, 80.0};  // degree 2 measured, 4 not
  EXPECT_DOUBLE_EQ(share_cost(it, 2, sp), 80.0 + comm2);
  EXPECT_DOUBLE_EQ(share_cost(it, 4, sp), 10.0 + 22.5 + 0.01 * 1000 * 3.0 / 16.0);
  EXPECT_DOUBLE_EQ(share_cost(it, 1, sp), 100.0);
}

TEST(SequenceParallel, RingFactorScalesTheCommunicationOfItsDegreeOnly) {
  // comm_scale[k] multiplies the per-token communication at degree 2^k (a ring beyond the
  // heads sends more keys and values); compute, the flat fraction and other degrees keep theirs.
  const SpItem it = hundred_cost_item();
  SequenceParallel sp = per_token_comm(8);
  sp.comm_fraction = 0.1;
  sp.comm_scale = {1.0, 1.0, 1.0, 1.43};
  EXPECT_DOUBLE_EQ(share_cost(it, 4, sp), 10.0 + 22.5 + 0.1 * 22.5 + 0.01 * 1000 * 3.0 / 16.0);
  EXPECT_DOUBLE_EQ(share_cost(it, 8, sp),
                   10.0 + 11.25 + 0.1 * 11.25 + 0.01 * 1.43 * 1000 * 7.0 / 64.0);
  sp.comm_scale = {1.0, 2.0};  // short: degrees past its end take 1
  EXPECT_DOUBLE_EQ(share_cost(it, 2, sp), 10.0 + 45.0 + 0.1 * 45.0 + 0.01 * 2.0 * 1000 / 4.0);
  EXPECT_DOUBLE_EQ(share_cost(it, 8, sp), 10.0 + 11.25 + 0.1 * 11.25 + 0.01 * 1000 * 7.0 / 64.0);
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    sp.comm_scale = {1.0, bad};
    EXPECT_THROW(validate_sequence_parallel(sp, 8), std::invalid_argument) << bad;
  }
}

TEST(SequenceParallel, MemoryPolicyScalesEachSharesComputeNotItsCommunication) {
  // With a memory policy the shares split the fully checkpointed cost (compute) and each runs
  // slower by the time factor of the blocks its member checkpoints; communication is not
  // scaled, and degree 1 keeps the whole's own (already scaled) cost.
  SpItem it;
  it.cost = 90.0;  // the whole, with its own factor 0.9
  it.compute = 100.0;
  it.fixed = 10.0;
  it.tokens = 1000;
  it.factor = {0.9, 0.8, 0.5};
  SequenceParallel sp;
  sp.max_degree = 4;
  sp.comm_per_token = 0.01;
  EXPECT_DOUBLE_EQ(share_cost(it, 1, sp), 90.0);
  EXPECT_DOUBLE_EQ(share_cost(it, 2, sp), (10.0 + 45.0) * 0.8 + 0.01 * 1000 * 1.0 / 4.0);
  it.measured = {0.0, 0.0, 30.0};
  EXPECT_DOUBLE_EQ(share_cost(it, 4, sp), 30.0 * 0.5 + 0.01 * 1000 * 3.0 / 16.0);
  // The host floor is launch time: paid in full whatever the factor.
  it.measured.clear();
  it.floor = 20.0;
  EXPECT_DOUBLE_EQ(share_cost(it, 4, sp), 20.0 + 0.01 * 1000 * 3.0 / 16.0);  // 32.5 * 0.5 < 20
}

TEST(SequenceParallel, SplitsTwoClipsTogetherWhereOneAloneDoesNotPay) {
  // One step of 32 micro-batches (batch size 1) over 8 ranks, D = 8: two long clips (559) and
  // many short ones, images at the launch floor (9). Balance needs both long clips at 4 ranks
  // and the two 164s split as well: no single change of one degree improves on the first
  // placements, so the search must try moves together (it left about 3% before it did).
  std::vector<double> costs(19, 9.0);
  for (double c :
       {12.6, 12.6, 12.6, 36.2, 36.2, 108.4, 108.4, 116.1, 116.1, 164.2, 164.2, 558.6, 558.6})
    costs.push_back(c);
  std::vector<SpItem> items;
  for (double c : costs) {
    SpItem it;
    it.cost = c;
    it.fixed = 1.5;
    it.floor = 9.0;
    it.tokens = 1000;
    items.push_back(it);
  }
  SequenceParallel sp;
  sp.max_degree = 8;
  const SpStep s = assign_with_degrees(items, 8, sp);
  EXPECT_LE(s.imbalance(8), 0.02) << "makespan " << s.makespan;
}

TEST(SequenceParallel, LostCountsWaitingAndWhatSplittingAdds) {
  // Two ranks: a clip of 100 and an image of 10, each share of the clip paying a fixed 10. Kept
  // whole, the step waits 45% of its rank time and splitting adds nothing (lost == imbalance).
  // Split over both, each share costs 10 + 45 = 55: the ranks finish together at 65 and 55 with
  // the image, waiting little, yet 10 of the 130 rank-ms are the split's: lost counts them, as
  // 1 - (100 + 10) / (2 x makespan).
  std::vector<SpItem> items(2);
  items[0].cost = 100.0;
  items[0].fixed = 10.0;
  items[0].tokens = 1000;
  items[1].cost = 10.0;
  items[1].fixed = 10.0;
  items[1].tokens = 100;
  SequenceParallel sp;
  sp.comm_per_token = 0.0;
  sp.comm_fraction = 0.0;
  sp.max_degree = 1;
  const SpStep whole = assign_with_degrees(items, 2, sp);
  EXPECT_DOUBLE_EQ(whole.makespan, 100.0);
  EXPECT_DOUBLE_EQ(whole.reference, 110.0);
  EXPECT_DOUBLE_EQ(whole.lost(2), whole.imbalance(2));
  EXPECT_DOUBLE_EQ(whole.lost(2), 1.0 - 110.0 / 200.0);
  sp.max_degree = 2;
  const SpStep split = assign_with_degrees(items, 2, sp);
  ASSERT_DOUBLE_EQ(split.makespan, 65.0);
  EXPECT_DOUBLE_EQ(split.busy, 120.0);
  EXPECT_DOUBLE_EQ(split.reference, 110.0);
  EXPECT_DOUBLE_EQ(split.imbalance(2), 1.0 - 120.0 / 130.0);
  EXPECT_DOUBLE_EQ(split.lost(2), 1.0 - 110.0 / 130.0);
  EXPECT_GT(split.lost(2), split.imbalance(2));
  // A micro-batch that must be split (min_degree 2) is priced at its shares over 2 ranks.
  items[0].min_degree = 2;
  const SpStep must = assign_with_degrees(items, 2, sp);
  EXPECT_DOUBLE_EQ(must.reference, 2 * 55.0 + 10.0);
  EXPECT_DOUBLE_EQ(must.lost(2), must.imbalance(2));
}

TEST(PlanEpochTest, PackingUsesMeasuredCosts) {
  // 12 samples of 10 tokens; the fit says 4 of them cost 4, but 4 were measured at 100 and
  // 3 at 3: under a cap of 50, micro-batches hold 3 samples, not 4 (as the fit would allow).
  const std::vector<int64_t> lens(12, 10);
  const CostModel fit = CostModel::polynomial(0.0, 0.1, 0.0);
  PlanOptions o;
  o.max_tokens = 1000;
  o.max_cost = 50.0;
  o.shuffle = false;
  SampleTable plain(lens.data(), 12, nullptr, fit);
  EXPECT_EQ(plan_epoch(plain, o).num_micro_batches(), 1);
  SampleTable measured(lens.data(), 12, nullptr, fit.with_measured({{10, 4, 100.0}, {10, 3, 3.0}}));
  const EpochPlan p = plan_epoch(measured, o);
  ASSERT_EQ(p.num_micro_batches(), 4);
  for (int64_t m = 0; m < 4; ++m) {
    EXPECT_EQ(p.offsets[m + 1] - p.offsets[m], 3);
    EXPECT_DOUBLE_EQ(p.costs[m], 3.0);
  }
  check_plan(measured, o, p);
  // The default cap sees the measured cost of a full micro-batch.
  SampleTable full(lens.data(), 12, nullptr, fit.with_measured({{10, 100, 7.0}}));
  EXPECT_DOUBLE_EQ(full.default_max_cost(1000), 7.0);
}

TEST(PlanEpochTest, MaxBatchSizeCapsSamplesPerMicroBatch) {
  const std::vector<int64_t> lens = wan_mix(3000, 11);
  SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr, wan14b());
  for (int64_t cap : {1, 2, 5}) {
    PlanOptions o;
    o.max_tokens = 151200;
    o.max_batch_size = cap;
    o.max_cost = table.default_max_cost(o.max_tokens, cap);
    o.num_replicas = 8;
    o.micro_batches_per_step = 4;
    const EpochPlan p = plan_epoch(table, o);
    for (int64_t m = 0; m < p.num_micro_batches(); ++m)
      EXPECT_LE(p.offsets[m + 1] - p.offsets[m], cap) << "micro-batch " << m;
    const std::vector<int> seen = check_plan(table, o, p);
    for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "sample " << i;
    EXPECT_LT(mean_imbalance(p), 0.05) << "cap " << cap;
  }
  // The default compute cap sees the capped full micro-batch of the cheapest group.
  const std::vector<int64_t> images(10, 1560);
  SampleTable image_table(images.data(), 10, nullptr, wan14b());
  BatchStats one, three;
  one.add(1560, wan14b().sample_cost(1560));
  for (int i = 0; i < 3; ++i) three.add(1560, wan14b().sample_cost(1560));
  EXPECT_DOUBLE_EQ(image_table.default_max_cost(151200, 1), wan14b().batch_cost(one));
  EXPECT_DOUBLE_EQ(image_table.default_max_cost(151200, 3), wan14b().batch_cost(three));
  PlanOptions bad;
  bad.max_tokens = 10;
  bad.max_cost = 1.0;
  bad.max_batch_size = -1;
  EXPECT_THROW(plan_epoch(table, bad), std::invalid_argument);
  EXPECT_THROW(table.default_max_cost(10, -1), std::invalid_argument);
}

TEST(SampleTable, RejectsNonPositiveLengthNamingTheIndex) {
  const std::vector<int64_t> lens = {10, 20, 0, 5};
  try {
    SampleTable t(lens.data(), 4, nullptr, CostModel::power(1.5));
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("seq_lens[2]"), std::string::npos) << e.what();
  }
}

TEST(SampleTable, DefaultMaxCostAdmitsHeaviestAndFullLightGroup) {
  const std::vector<int64_t> lens = {100, 100, 1000};
  SampleTable t(lens.data(), 3, nullptr, CostModel::power(2.0));
  // heaviest alone: 1e6; full micro-batch of the 100-token group at 2000 tokens: 20 * 1e4.
  EXPECT_DOUBLE_EQ(t.default_max_cost(2000), 1e6);
  // Only short samples: the cap is a full micro-batch of them.
  SampleTable short_only(lens.data(), 2, nullptr, CostModel::power(2.0));
  EXPECT_DOUBLE_EQ(short_only.default_max_cost(2000), 20 * 1e4);
}

TEST(SampleTable, KnowsWhichGroupsHoldOneLength) {
  const std::vector<int64_t> lens = {10, 10, 20, 30};
  const std::vector<int64_t> ids = {0, 1, 0, 1};
  const std::vector<int64_t> same = {0, 0, 1, 1};
  SampleTable mixed(lens.data(), 4, ids.data(), CostModel::power(1.0));
  EXPECT_EQ(mixed.group_uniform_len(0), 0);
  EXPECT_EQ(mixed.group_uniform_len(1), 0);
  SampleTable uniform(lens.data(), 2, same.data(), CostModel::power(1.0));
  EXPECT_EQ(uniform.group_uniform_len(0), 10);
  SampleTable by_length(lens.data(), 4, nullptr, CostModel::power(1.0));
  EXPECT_EQ(by_length.group_uniform_len(0), 10);
  EXPECT_EQ(by_length.group_uniform_len(2), 30);
}

// A group of one length is packed by counting (pack_uniform): every micro-batch holds the
// count the first binding cap allows, the last what is left; as a group of mixed lengths
// holding the same samples would be packed one sample at a time.
TEST(PlanEpochTest, GroupOfOneLengthPacksLikeSampleBySample) {
  for (int64_t n : {1, 7, 25, 40}) {
    for (int64_t max_batch_size : {0, 3}) {
      for (double max_cost : {1e9, 450.0}) {  // 450: four samples of cost 100 fit, five do not
        const std::vector<int64_t> lens(n, 100);
        SampleTable table(lens.data(), n, nullptr, CostModel::power(1.0));
        PlanOptions o;
        o.max_tokens = 1000;  // ten samples
        o.max_batch_size = max_batch_size;
        o.max_cost = max_cost;
        o.balance = false;
        o.shuffle = false;
        const EpochPlan plan = plan_epoch(table, o);
        int64_t run = 10;
        if (max_batch_size > 0) run = std::min(run, max_batch_size);
        if (max_cost < 1e9) run = std::min<int64_t>(run, 4);
        std::vector<int64_t> sizes;
        for (size_t m = 0; m + 1 < plan.offsets.size(); ++m)
          if (!plan.padding[m]) sizes.push_back(plan.offsets[m + 1] - plan.offsets[m]);
        std::vector<int64_t> expected;
        for (int64_t left = n; left > 0; left -= run) expected.push_back(std::min(run, left));
        std::sort(sizes.begin(), sizes.end());
        std::sort(expected.begin(), expected.end());
        EXPECT_EQ(sizes, expected)
            << "n " << n << " max_batch_size " << max_batch_size << " max_cost " << max_cost;
      }
    }
  }
}

TEST(AssignToRanks, EachBinGetsExactlyPerBinItems) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> u(0.1, 10.0);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t bins = 1 + trial % 7, per = 1 + trial % 4;
    std::vector<double> c(bins * per);
    for (auto& x : c) x = u(gen);
    const auto bin_of = assign_to_ranks(c.data(), bins * per, bins, per);
    std::vector<int64_t> count(bins, 0);
    for (auto b : bin_of) ++count[b];
    for (auto k : count) EXPECT_EQ(k, per);
  }
  std::vector<double> c = {1, 2};
  EXPECT_THROW(assign_to_ranks(c.data(), 2, 3, 1), std::invalid_argument);
}

// Costs in few runs take the two sorted queues; each assignment must be the heap's, item for
// item, ties and rounding included (1e16 + 1 rounds to 1e16: two loads that add a cost to one
// sum, where the queues give way to the heap).
TEST(AssignToRanks, QueuesOfRunsAssignAsTheHeapDoes) {
  std::mt19937_64 rng(std::random_device{}());
  const std::vector<double> values = {1.0, 1.0 + 0x1p-52, 3.0, 7.5, 1e16, 1e16 + 2.0, 0.1, 0.2};
  int64_t checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t bins = 1 + static_cast<int64_t>(rng() % 40);
    const int64_t per_bin = 1 + static_cast<int64_t>(rng() % 6);
    const int64_t distinct = 1 + static_cast<int64_t>(rng() % values.size());
    std::vector<double> costs(bins * per_bin);
    for (double& c : costs) c = values[rng() % distinct];
    if (trial % 2) std::sort(costs.begin(), costs.end(), std::greater<double>());
    const auto heap = assign_to_ranks_heap(costs.data(), bins * per_bin, bins, per_bin);
    const auto queues = assign_to_ranks(costs.data(), bins * per_bin, bins, per_bin);
    ASSERT_EQ(queues, heap) << "trial " << trial << " bins " << bins << " per_bin " << per_bin;
    ++checked;
  }
  EXPECT_EQ(checked, 400);
}

TEST(AssignToRanks, MatchesBruteForceOptimumClosely) {
  // 3 bins x 2 items: LPT with cardinality is within 4/3 of optimal; on these small
  // random cases check against exhaustive search.
  std::mt19937 gen(11);
  std::uniform_real_distribution<double> u(1.0, 10.0);
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<double> c(6);
    for (auto& x : c) x = u(gen);
    const auto bin_of = assign_to_ranks(c.data(), 6, 3, 2);
    std::vector<double> load(3, 0.0);
    for (int i = 0; i < 6; ++i) load[bin_of[i]] += c[i];
    const double got = *std::max_element(load.begin(), load.end());
    std::vector<int> perm = {0, 1, 2, 3, 4, 5};
    double best = 1e300;
    do {
      double mx = 0;
      for (int b = 0; b < 3; ++b) mx = std::max(mx, c[perm[2 * b]] + c[perm[2 * b + 1]]);
      best = std::min(best, mx);
    } while (std::next_permutation(perm.begin(), perm.end()));
    EXPECT_LE(got, best * 4.0 / 3.0 + 1e-9);
  }
}

class PlanEpoch : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(PlanEpoch, CoversEverySampleOnceUnderBothCaps) {
  const auto [W, K, drop_last] = GetParam();
  const std::vector<int64_t> lens = wan_mix(3001, 1);
  SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr, wan14b());
  PlanOptions o;
  o.max_tokens = 151200;
  o.max_cost = table.default_max_cost(o.max_tokens);
  o.num_replicas = W;
  o.micro_batches_per_step = K;
  o.drop_last = drop_last;
  o.seed = 3;
  const EpochPlan p = plan_epoch(table, o);
  const auto seen = check_plan(table, o, p);
  int64_t covered = 0;
  for (int s : seen) {
    EXPECT_LE(s, 1);
    covered += s;
  }
  EXPECT_EQ(covered + p.num_dropped_samples, table.size());
  if (!drop_last) {
    EXPECT_EQ(p.num_dropped_samples, 0);
    EXPECT_EQ(p.num_padded_samples, 0) << "halving micro-batches should have filled the last step";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PlanEpoch,
                         ::testing::Combine(::testing::Values(1, 2, 8, 64), ::testing::Values(1, 4),
                                            ::testing::Bool()));

TEST(PlanEpochTest, DeterministicAndEpochDependent) {
  const std::vector<int64_t> lens = wan_mix(2000, 2);
  SampleTable table(lens.data(), 2000, nullptr, wan14b());
  PlanOptions o;
  o.max_tokens = 151200;
  o.max_cost = table.default_max_cost(o.max_tokens);
  o.num_replicas = 8;
  const EpochPlan a = plan_epoch(table, o), b = plan_epoch(table, o);
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.offsets, b.offsets);
  o.epoch = 1;
  EXPECT_NE(plan_epoch(table, o).samples, a.samples);
  o.epoch = 0;
  o.seed = 99;
  EXPECT_NE(plan_epoch(table, o).samples, a.samples);
}

TEST(PlanEpochTest, BalancingBeatsRoundRobin) {
  const std::vector<int64_t> lens = wan_mix(20000, 3);
  SampleTable table(lens.data(), 20000, nullptr, wan14b());
  PlanOptions o;
  o.max_tokens = 151200;
  o.max_cost = table.default_max_cost(o.max_tokens);
  o.num_replicas = 8;
  o.micro_batches_per_step = 4;
  const double balanced = mean_imbalance(plan_epoch(table, o));
  o.balance = false;
  const double round_robin = mean_imbalance(plan_epoch(table, o));
  EXPECT_LT(balanced, 0.03);
  EXPECT_GT(round_robin, 2 * balanced);
}

TEST(PlanEpochTest, PadsWithRepeatsOnlyWhenNothingCanBeHalved) {
  // Every sample fills the memory cap alone: no micro-batch can be split.
  const std::vector<int64_t> lens(10, 1000);
  SampleTable table(lens.data(), 10, nullptr, CostModel::power(1.0));
  PlanOptions o;
  o.max_tokens = 1000;
  o.max_cost = 1e9;
  o.num_replicas = 4;
  const EpochPlan p = plan_epoch(table, o);
  EXPECT_EQ(p.num_steps, 3);
  EXPECT_EQ(p.num_padded_samples, 2);
  const auto seen = check_plan(table, o, p);
  for (int s : seen) EXPECT_EQ(s, 1);
  o.drop_last = true;
  const EpochPlan d = plan_epoch(table, o);
  EXPECT_EQ(d.num_steps, 2);
  EXPECT_EQ(d.num_dropped_samples, 2);
}

// The first prefix of one wan_mix draw, from n samples on, whose micro-batch count falls short
// of a multiple of W * K by at least half a step: at least that many micro-batches are halved.
std::vector<int64_t> mix_that_halves(const PlanOptions& o, int64_t n, double max_cost) {
  const std::vector<int64_t> draw = wan_mix(n + 4000, 5);
  for (int64_t size = n; size < static_cast<int64_t>(draw.size()); ++size) {
    SampleTable table(draw.data(), size, nullptr, wan14b());
    PlanOptions probe = o;
    probe.max_cost = max_cost > 0 ? max_cost : table.default_max_cost(o.max_tokens);
    const int64_t per_step = o.num_replicas * o.micro_batches_per_step;
    if (plan_epoch(table, probe).num_split_micro_batches >= per_step / 2)
      return {draw.begin(), draw.begin() + size};
  }
  ADD_FAILURE() << "no mix size halves half a step's micro-batches";
  return {};
}

// The halves of a micro-batch split to fill the last step stay where it was in a plan that does
// not balance (equal-token buckets, or balance = false): the last step is a step like the others
// (its samples and its share of images within the other steps' range), not W * K - 1 halves of
// the largest micro-batches, and without shuffling the plan reads every group in order.
class UnbalancedLastStep : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(UnbalancedLastStep, HalvesStayWhereTheirMicroBatchWas) {
  const auto [K, cost_cap] = GetParam();
  PlanOptions o;
  o.max_tokens = 151200;
  o.num_replicas = 8;
  o.micro_batches_per_step = K;
  o.balance = false;
  o.seed = 5;
  const double no_cap = 1e300;  // EqualTokenBatchSampler's: memory is the only cap
  const std::vector<int64_t> lens = mix_that_halves(o, 4000 * K, cost_cap ? 0.0 : no_cap);
  SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr, wan14b());
  o.max_cost = cost_cap ? table.default_max_cost(o.max_tokens) : no_cap;
  const EpochPlan p = plan_epoch(table, o);
  const auto seen = check_plan(table, o, p);
  for (int s : seen) EXPECT_EQ(s, 1);
  ASSERT_GE(p.num_split_micro_batches, 4 * K);
  ASSERT_EQ(p.num_padded_samples, 0);

  const int64_t per_step = o.num_replicas * K;
  std::vector<int64_t> samples(p.num_steps, 0);
  std::vector<double> share(p.num_steps, 0.0);
  for (int64_t t = 0; t < p.num_steps; ++t) {
    const int64_t b = p.offsets[t * per_step], e = p.offsets[(t + 1) * per_step];
    samples[t] = e - b;
    for (int64_t j = b; j < e; ++j) share[t] += lens[p.samples[j]] == 1560;
    share[t] /= static_cast<double>(samples[t]);
  }
  const int64_t last = p.num_steps - 1;
  const auto [few, many] = std::minmax_element(samples.begin(), samples.begin() + last);
  EXPECT_GE(samples[last], *few);
  EXPECT_LE(samples[last], *many) << "last step of " << samples[last] << " samples";
  const auto [low, high] = std::minmax_element(share.begin(), share.begin() + last);
  EXPECT_GE(share[last], *low);
  EXPECT_LE(share[last], *high) << "last step " << share[last] << " images";

  o.shuffle = false;
  const EpochPlan in_order = plan_epoch(table, o);
  ASSERT_EQ(in_order.num_split_micro_batches, p.num_split_micro_batches);
  std::vector<int64_t> bucketed(lens.size()), dealt;
  std::iota(bucketed.begin(), bucketed.end(), 0);
  std::stable_sort(bucketed.begin(), bucketed.end(),
                   [&](int64_t a, int64_t b) { return table.group(a) < table.group(b); });
  // Micro-batches in the order they were dealt: step by step, k by k, rank by rank.
  for (int64_t t = 0; t < in_order.num_steps; ++t)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t r = 0; r < o.num_replicas; ++r) {
        const int64_t m = in_order.micro_batch_id(t, r, k);
        dealt.insert(dealt.end(), in_order.samples.begin() + in_order.offsets[m],
                     in_order.samples.begin() + in_order.offsets[m + 1]);
      }
  EXPECT_EQ(dealt, bucketed);
}

INSTANTIATE_TEST_SUITE_P(EqualTokenAndUnbalanced, UnbalancedLastStep,
                         ::testing::Combine(::testing::Values(1, 4), ::testing::Bool()));

// With balancing the micro-batches halved to fill whole steps are spread over the epoch and
// their halves stay in its order, so each window of lookahead steps holds about its share of
// them: the last window no longer gathers every half (W * K - 1 at most) of the largest
// micro-batches, the images.
TEST(PlanEpochTest, BalancedHalvesAreSpreadOverTheWindows) {
  PlanOptions o;
  o.max_tokens = 151200;
  o.num_replicas = 8;
  o.micro_batches_per_step = 4;
  o.lookahead_steps = 4;
  o.seed = 5;
  const std::vector<int64_t> lens = mix_that_halves(o, 16000, 0.0);
  SampleTable table(lens.data(), static_cast<int64_t>(lens.size()), nullptr, wan14b());
  o.max_cost = table.default_max_cost(o.max_tokens);
  const EpochPlan p = plan_epoch(table, o);
  for (int s : check_plan(table, o, p)) EXPECT_EQ(s, 1);
  const int64_t halved = p.num_split_micro_batches, per_step = 8 * 4;
  ASSERT_GE(halved, per_step / 2);
  int64_t full = 0;  // the most images a micro-batch holds
  for (int64_t m = 0; m + 1 < static_cast<int64_t>(p.offsets.size()); ++m)
    if (lens[p.samples[p.offsets[m]]] == 1560)
      full = std::max(full, p.offsets[m + 1] - p.offsets[m]);
  // Per window: its image micro-batches short of full (halves, and the group's one remainder).
  for (int64_t t0 = 0; t0 < p.num_steps; t0 += o.lookahead_steps) {
    const int64_t t1 = std::min(t0 + o.lookahead_steps, p.num_steps);
    int64_t short_of_full = 0;
    for (int64_t m = t0 * per_step; m < t1 * per_step; ++m)
      short_of_full +=
          lens[p.samples[p.offsets[m]]] == 1560 && p.offsets[m + 1] - p.offsets[m] < full;
    const int64_t share = (halved * (t1 - t0) + p.num_steps - 1) / p.num_steps;
    EXPECT_LE(short_of_full, 2 * (share + 2) + 1)
        << "window at step " << t0 << " of " << p.num_steps;
  }
}

TEST(PlanEpochTest, ExcludedSamplesNeverAppear) {
  const std::vector<int64_t> lens = wan_mix(500, 4);
  SampleTable table(lens.data(), 500, nullptr, wan14b());
  std::vector<uint8_t> exclude(500, 0);
  for (int i = 0; i < 500; i += 3) exclude[i] = 1;
  PlanOptions o;
  o.max_tokens = 151200;
  o.max_cost = table.default_max_cost(o.max_tokens);
  o.num_replicas = 2;
  const EpochPlan p = plan_epoch(table, o, exclude.data());
  const auto seen = check_plan(table, o, p);
  for (int i = 0; i < 500; ++i) EXPECT_EQ(seen[i], exclude[i] ? 0 : 1) << "sample " << i;
}

TEST(PlanEpochTest, OversizeSampleErrorsOrIsSkipped) {
  const std::vector<int64_t> lens = {100, 5000, 100, 100};
  SampleTable table(lens.data(), 4, nullptr, CostModel::power(1.0));
  PlanOptions o;
  o.max_tokens = 1000;
  o.max_cost = 1e9;
  try {
    plan_epoch(table, o);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("sample 1 has 5000 tokens"), std::string::npos)
        << e.what();
  }
  o.oversize = OversizePolicy::kSkip;
  const EpochPlan p = plan_epoch(table, o);
  ASSERT_EQ(p.skipped.size(), 1u);
  EXPECT_EQ(p.skipped[0], 1);
  EXPECT_EQ(p.samples.size(), 3u);
}

TEST(SampleTable, OversizeSamplesAreThosePlanningSkips) {
  // One token cap breach, one cost cap breach (power 1: cost = S), two that fit.
  const std::vector<int64_t> lens = {100, 5000, 700, 100};
  SampleTable table(lens.data(), 4, nullptr, CostModel::power(1.0));
  EXPECT_EQ(table.oversize_samples(1000, 500.0), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(table.oversize_samples(10000, 1e9).empty());
  PlanOptions o;
  o.max_tokens = 1000;
  o.max_cost = 500.0;
  o.oversize = OversizePolicy::kSkip;
  EXPECT_EQ(plan_epoch(table, o).skipped, table.oversize_samples(1000, 500.0));
}

TEST(PlanEpochTest, GroupKeysAreNeverMixed) {
  const std::vector<int64_t> lens(400, 100);
  std::vector<int64_t> keys(400);
  for (int i = 0; i < 400; ++i) keys[i] = (i * 7919) % 5;
  SampleTable table(lens.data(), 400, keys.data(), CostModel::power(1.0));
  PlanOptions o;
  o.max_tokens = 1000;
  o.max_cost = 1e9;
  o.num_replicas = 3;
  const EpochPlan p = plan_epoch(table, o);
  check_plan(table, o, p, &keys);
}

TEST(SampleTable, TakesDenseGroupIdsAndNumbersLengthsInOrder) {
  const std::vector<int64_t> lens = {300, 100, 200, 100, 300};
  const SampleTable by_length(lens.data(), 5, nullptr, CostModel::power(1.0));
  EXPECT_EQ(by_length.num_groups(), 3);
  const std::vector<int32_t> expected = {2, 0, 1, 0, 2};
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(by_length.group(i), expected[i]) << i;
  const std::vector<int64_t> ids = {1, 0, 1, 0, 2};
  const SampleTable grouped(lens.data(), 5, ids.data(), CostModel::power(1.0));
  EXPECT_EQ(grouped.num_groups(), 3);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(grouped.group(i), ids[i]) << i;
  // Ids that skip one, or fall outside [0, n), are refused naming the problem.
  for (const std::vector<int64_t>& bad :
       {std::vector<int64_t>{0, 2, 2, 0, 0}, std::vector<int64_t>{0, -1, 0, 0, 0},
        std::vector<int64_t>{0, 5, 0, 0, 0}}) {
    try {
      SampleTable t(lens.data(), 5, bad.data(), CostModel::power(1.0));
      ADD_FAILURE() << "accepted non-dense group ids";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("group ids must be dense"), std::string::npos);
    }
  }
}

TEST(SampleTable, RefusesLengthsPastWhatPlanSumsHold) {
  const std::vector<int64_t> one = {10, kMaxSeqLen + 1};
  EXPECT_THROW(SampleTable(one.data(), 2, nullptr, CostModel::power(1.5)), std::invalid_argument);
  // Each length in range, their sum past 2^62.
  const int64_t fit = int64_t{1} << 22;  // 2^22 samples of 2^40 - 1 tokens stay under 2^62
  const std::vector<int64_t> many(fit + 1, kMaxSeqLen);
  EXPECT_THROW(SampleTable(many.data(), fit + 1, nullptr, CostModel::power(1.5)),
               std::invalid_argument);
  EXPECT_NO_THROW(SampleTable(many.data(), fit, nullptr, CostModel::power(1.5)));
}

TEST(SampleTable, DefaultMaxCostAtTheLargestCapsIsImmediate) {
  // The cap's full micro-batch of 2^62 / 1560 samples is costed in closed form (the group has
  // 3), and the memory policy's largest fill without recomputation is bisected.
  const std::vector<int64_t> lens = {1560, 75600, 3600, 1560};
  SampleTable t(lens.data(), 4, nullptr, CostModel::power(1.5));
  const double cap = t.default_max_cost(kMaxTokens);
  EXPECT_TRUE(std::isfinite(cap));
  EXPECT_GE(cap, t.single_cost(1));
  PlanOptions o;
  o.max_tokens = kMaxTokens;
  o.max_cost = cap;
  o.num_replicas = 2;
  const EpochPlan p = plan_epoch(t, o);
  EXPECT_EQ(p.samples.size(), 4u + static_cast<size_t>(p.num_padded_samples));

  MemoryModel m;
  m.num_blocks = MemoryModel::kMaxBlocks;
  m.m0 = 1e9;
  m.ma = 1.0;
  m.mc = 0.01;
  m.validate();
  MemoryPolicy policy{m, 1e30, {}};
  SampleTable mt(lens.data(), 4, nullptr, CostModel::power(1.5), &policy);
  EXPECT_TRUE(std::isfinite(mt.default_max_cost(kMaxTokens)));
}

TEST(PlanEpochTest, RejectsBadOptions) {
  const std::vector<int64_t> lens = {1, 2, 3};
  SampleTable table(lens.data(), 3, nullptr, CostModel::power(1.0));
  PlanOptions o;
  o.max_tokens = 0;
  o.max_cost = 1;
  EXPECT_THROW(plan_epoch(table, o), std::invalid_argument);
  o.max_tokens = 10;
  o.max_cost = -1;
  EXPECT_THROW(plan_epoch(table, o), std::invalid_argument);
  o.max_cost = 100;
  o.num_replicas = 0;
  EXPECT_THROW(plan_epoch(table, o), std::invalid_argument);
  o.num_replicas = 1 << 10;
  o.micro_batches_per_step = (1 << 10) + 1;  // W * K past 2^20
  EXPECT_THROW(plan_epoch(table, o), std::invalid_argument);
  o.micro_batches_per_step = 1;
  o.max_tokens = kMaxTokens + 1;
  EXPECT_THROW(plan_epoch(table, o), std::invalid_argument);
}

TEST(PlanEpochTest, EmptyDatasetPlansNothing) {
  SampleTable table(nullptr, 0, nullptr, CostModel::power(1.5));
  PlanOptions o;
  o.max_tokens = 10;
  o.max_cost = 10;
  const EpochPlan p = plan_epoch(table, o);
  EXPECT_EQ(p.num_steps, 0);
  EXPECT_EQ(p.num_micro_batches(), 0);
}

}  // namespace
}  // namespace adaptiveload
