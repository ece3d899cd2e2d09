// Plans that stream (stream.h): the permutation, the table over borrowed arrays, and segments
// that cover the epoch once, obey the caps and fill whole windows.
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <vector>

#include "sampler/cost_model.h"
#include "sampler/planner.h"
#include "sampler/stream.h"
#include "wan_mix.h"

namespace adaptiveload {
namespace {

CostModel wan14b() { return CostModel::polynomial(1.0, 3.1e-3, 1.35e-7); }

TEST(Permutation, IsABijectionKeyedBySeedAndEpoch) {
  for (int64_t n : {0, 1, 2, 3, 5, 17, 64, 1000, 4097, 100003}) {
    const Permutation p(n, 7, 0, true);
    std::vector<int> seen(n, 0);
    for (int64_t x = 0; x < n; ++x) {
      const int64_t y = p(x);
      ASSERT_GE(y, 0);
      ASSERT_LT(y, n);
      ++seen[y];
    }
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "n = " << n << ", sample " << i;
  }
  const int64_t n = 10007;
  const Permutation a(n, 7, 0, true), b(n, 7, 1, true), c(n, 8, 0, true), same(n, 7, 0, true);
  int64_t differ_epoch = 0, differ_seed = 0, fixed = 0;
  for (int64_t x = 0; x < n; ++x) {
    differ_epoch += a(x) != b(x);
    differ_seed += a(x) != c(x);
    fixed += a(x) == x;
    ASSERT_EQ(a(x), same(x));
  }
  EXPECT_GT(differ_epoch, n * 9 / 10);
  EXPECT_GT(differ_seed, n * 9 / 10);
  EXPECT_LT(fixed, 20);  // about 1 expected
  const Permutation off(n, 7, 0, false);
  for (int64_t x = 0; x < n; ++x) ASSERT_EQ(off(x), x);
}

// The permutation's values are pinned: a streamed epoch's order, and so every resumed state,
// depends on them. These are the values of the first implementation.
TEST(Permutation, ValuesArePinned) {
  const std::vector<int64_t> small = {984, 619, 829, 824, 152, 871, 658, 790};
  const std::vector<int64_t> large = {1883578, 9326572, 8050061, 6498186,
                                      87534,   6955670, 8766952, 7861695};
  const Permutation a(1000, 7, 3, true), b(10000000, 7, 3, true);
  std::vector<int64_t> got(8);
  for (int64_t x = 0; x < 8; ++x) {
    EXPECT_EQ(a(x), small[x]);
    EXPECT_EQ(b(x), large[x]);
  }
  b.fill(0, 8, got.data());
  EXPECT_EQ(got, large);
}

// fill (blocks of positions, the rounds in vector registers, cycle walking gathered) gives
// what operator() gives position by position, for every build this processor runs, at block
// edges and with the walk's second and third rounds.
TEST(Permutation, FillGivesWhatEachPositionGives) {
  std::mt19937_64 gen(11);
  for (int64_t n :
       {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{17}, int64_t{255}, int64_t{256},
        int64_t{257}, int64_t{4097}, int64_t{100003}, (int64_t{1} << 20) + 3}) {
    for (bool shuffle : {true, false}) {
      const Permutation p(n, gen(), static_cast<int64_t>(gen() % 5), shuffle);
      std::vector<int64_t> want(n);
      for (int64_t x = 0; x < n; ++x) want[x] = p(x);
      for (VectorIsa isa : {VectorIsa::kBaseline, VectorIsa::kAvx2, VectorIsa::kAvx512}) {
        if (!Permutation::supports(isa)) continue;
        std::vector<int64_t> got(n, -1);
        p.fill_with(isa, 0, n, got.data());
        ASSERT_EQ(got, want) << "n = " << n << ", build " << static_cast<int>(isa);
        for (int trial = 0; trial < 20 && n > 0; ++trial) {
          const int64_t begin = static_cast<int64_t>(gen() % n);
          const int64_t count = static_cast<int64_t>(gen() % (n - begin + 1));
          std::vector<int64_t> part(count + 1, -7);
          p.fill_with(isa, begin, count, part.data());
          for (int64_t j = 0; j < count; ++j)
            ASSERT_EQ(part[j], want[begin + j]) << "n = " << n << ", position " << begin + j;
          ASSERT_EQ(part[count], -7) << "fill wrote past its count";
        }
      }
      std::vector<int64_t> got(n, -1);
      p.fill(0, n, got.data());
      ASSERT_EQ(got, want);
      int64_t out[2];
      EXPECT_THROW(p.fill(n, 1, out), std::invalid_argument);
      EXPECT_THROW(p.fill(-1, 1, out), std::invalid_argument);
    }
  }
  EXPECT_TRUE(Permutation::supports(VectorIsa::kBaseline));
}

TEST(StreamTable, AgreesWithSampleTable) {
  std::vector<int64_t> lens = wan_mix(5000, 3);
  lens[17] = 200000;  // one over the cap
  std::vector<int32_t> lens32(lens.begin(), lens.end());
  std::vector<int64_t> groups(lens.size());
  std::mt19937 gen(5);
  for (auto& g : groups) g = static_cast<int64_t>(gen() % 7);
  const SampleTable by_len(lens.data(), lens.size(), nullptr, wan14b());
  const SampleTable by_group(lens.data(), lens.size(), groups.data(), wan14b());
  const StreamTable s64(lens.data(), 8, lens.size(), nullptr, 0, wan14b());
  const StreamTable s32(lens32.data(), 4, lens.size(), nullptr, 0, wan14b());
  const StreamTable sg(lens32.data(), 4, lens.size(), groups.data(), 8, wan14b());
  for (int64_t cap : {75600, 151200, 400000}) {
    for (int64_t bs : {0, 4}) {
      EXPECT_DOUBLE_EQ(s64.default_max_cost(cap, bs), by_len.default_max_cost(cap, bs));
      EXPECT_DOUBLE_EQ(s32.default_max_cost(cap, bs), by_len.default_max_cost(cap, bs));
      EXPECT_DOUBLE_EQ(sg.default_max_cost(cap, bs), by_group.default_max_cost(cap, bs));
    }
  }
  EXPECT_EQ(s64.num_groups(), by_len.num_groups());
  EXPECT_EQ(sg.num_groups(), by_group.num_groups());
  for (int64_t i = 0; i < static_cast<int64_t>(lens.size()); ++i) {
    ASSERT_EQ(s32.group(i), by_len.group(i));
    ASSERT_EQ(sg.group(i), by_group.group(i));
  }
  const double cap_cost = by_len.default_max_cost(151200);
  const auto over = s32.oversize(151200, cap_cost, 1);
  const auto expected = by_len.oversize_samples(151200, cap_cost);
  EXPECT_EQ(over.first, static_cast<int64_t>(expected.size()));
  EXPECT_EQ(over.second, expected.at(0));
  EXPECT_EQ(s32.digest(), s64.digest());
  lens32[4000] += 1;
  const StreamTable changed(lens32.data(), 4, lens.size(), nullptr, 0, wan14b());
  EXPECT_NE(changed.digest(), s32.digest());
}

TEST(StreamTable, RefusesBadArrays) {
  std::vector<int32_t> lens = {5, 0, 7};
  EXPECT_THROW(StreamTable(lens.data(), 4, 3, nullptr, 0, wan14b()), std::invalid_argument);
  lens[1] = 6;
  std::vector<int32_t> groups = {0, 2, 2};  // id 1 unused
  EXPECT_THROW(StreamTable(lens.data(), 4, 3, groups.data(), 4, wan14b()), std::invalid_argument);
  EXPECT_THROW(StreamTable(lens.data(), 2, 3, nullptr, 0, wan14b()), std::invalid_argument);
}

// The whole epoch, segment after segment: each sample once, every cap obeyed, every segment but
// the last filling whole windows without halving or padding.
struct Streamed {
  std::vector<EpochPlan> plans;
  std::vector<int64_t> begins;
};

Streamed stream_epoch(const StreamTable& t, const PlanOptions& o, int64_t min_samples) {
  const Permutation perm(t.size(), o.seed, o.epoch, o.shuffle);
  Streamed out;
  for (int64_t b = 0, j = 0; b < t.size(); ++j) {
    const Segment seg = next_segment(t, o, perm, b, min_samples);
    EXPECT_EQ(seg.begin, b);
    EXPECT_GT(seg.end, b);
    out.begins.push_back(b);
    out.plans.push_back(plan_samples(t, o, seg.samples.data(), seg.samples.size(), j));
    b = seg.end;
  }
  return out;
}

TEST(Stream, SegmentsCoverTheEpochOnceWithinTheCaps) {
  const std::vector<int64_t> lens = wan_mix(20000, 11);
  const StreamTable t(lens.data(), 8, lens.size(), nullptr, 0, wan14b());
  for (bool uneven : {false, true}) {
    for (int64_t K : {1, 4}) {
      PlanOptions o;
      o.max_tokens = 151200;
      o.max_cost = t.default_max_cost(o.max_tokens);
      o.num_replicas = 8;
      o.micro_batches_per_step = K;
      o.uneven_counts = uneven;
      o.mix_tolerance = 0.05;
      o.seed = 3;
      o.epoch = 2;
      o.lookahead_steps = 16;
      const Streamed s = stream_epoch(t, o, 3000);
      ASSERT_GE(s.plans.size(), 4u);
      std::vector<int> seen(lens.size(), 0);
      for (size_t j = 0; j < s.plans.size(); ++j) {
        const EpochPlan& p = s.plans[j];
        const bool last = j + 1 == s.plans.size();
        if (!last) {
          EXPECT_EQ(p.num_padded_samples, 0);
          EXPECT_EQ(p.num_split_micro_batches, 0);
        }
        EXPECT_EQ(p.num_micro_batches(), p.num_steps * 8 * K);
        if (!last) {
          EXPECT_EQ(p.num_steps % o.lookahead_steps, 0) << "a window cut short";
        }
        for (int64_t m = 0; m < p.num_micro_batches(); ++m) {
          int64_t tokens = 0;
          for (int64_t q = p.offsets[m]; q < p.offsets[m + 1]; ++q) {
            tokens += lens[p.samples[q]];
            EXPECT_EQ(lens[p.samples[q]], lens[p.samples[p.offsets[m]]]) << "groups mixed";
            if (!p.padding[m]) ++seen[p.samples[q]];
          }
          EXPECT_LE(tokens, o.max_tokens);
          EXPECT_LE(p.costs[m], o.max_cost * (1 + 1e-12));
        }
      }
      for (size_t i = 0; i < lens.size(); ++i) ASSERT_EQ(seen[i], 1) << "sample " << i;
      // Deterministic: the same options stream the same plans.
      const Streamed again = stream_epoch(t, o, 3000);
      ASSERT_EQ(again.begins, s.begins);
      for (size_t j = 0; j < s.plans.size(); ++j) {
        EXPECT_EQ(again.plans[j].samples, s.plans[j].samples);
        EXPECT_EQ(again.plans[j].rank_offsets, s.plans[j].rank_offsets);
      }
    }
  }
}

TEST(Stream, SegmentsShorterThanTheReadAheadCoverOnce) {
  const std::vector<int64_t> lens = wan_mix(300, 6);
  const StreamTable t(lens.data(), 8, lens.size(), nullptr, 0, wan14b());
  PlanOptions o;
  o.max_tokens = 151200;
  o.max_cost = t.default_max_cost(o.max_tokens);
  o.lookahead_steps = 1;
  for (int64_t least : {1, 3, 15, 16, 17}) {
    const Streamed s = stream_epoch(t, o, least);
    std::vector<int> seen(lens.size(), 0);
    for (const EpochPlan& p : s.plans)
      for (int64_t m = 0; m < p.num_micro_batches(); ++m)
        for (int64_t q = p.offsets[m]; q < p.offsets[m + 1]; ++q)
          if (!p.padding[m]) ++seen[p.samples[q]];
    for (size_t i = 0; i < lens.size(); ++i) ASSERT_EQ(seen[i], 1) << "least " << least;
  }
}

TEST(StreamTable, GroupIdsOfZerosAreNotNoGroupIds) {
  const std::vector<int64_t> lens = wan_mix(100, 1);
  const std::vector<int32_t> zeros(lens.size(), 0);
  const StreamTable none(lens.data(), 8, lens.size(), nullptr, 0, wan14b());
  const StreamTable zero(lens.data(), 8, lens.size(), zeros.data(), 4, wan14b());
  EXPECT_NE(none.digest(), zero.digest());
}

TEST(Stream, PlanSegmentEqualsPlanSamples) {
  std::vector<int64_t> lens = wan_mix(6000, 4);
  std::vector<int32_t> groups(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) groups[i] = static_cast<int32_t>((i * 7) % 5);
  const StreamTable t(lens.data(), 8, lens.size(), groups.data(), 4, wan14b());
  PlanOptions o;
  o.max_tokens = 151200;
  o.max_cost = t.default_max_cost(o.max_tokens);
  o.num_replicas = 4;
  o.micro_batches_per_step = 2;
  o.uneven_counts = true;
  const Permutation perm(t.size(), o.seed, o.epoch, o.shuffle);
  Segment seg = next_segment(t, o, perm, 1000, 2000);
  const EpochPlan a = plan_samples(t, o, seg.samples.data(), seg.samples.size(), 3);
  const EpochPlan b = plan_segment(t, o, std::move(seg), 3);
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_EQ(a.rank_offsets, b.rank_offsets);
  EXPECT_EQ(a.costs, b.costs);
  for (int64_t m = 0; m < a.num_micro_batches(); ++m)
    for (int64_t q = a.offsets[m] + 1; q < a.offsets[m + 1]; ++q)
      ASSERT_EQ(groups[a.samples[q]], groups[a.samples[a.offsets[m]]]) << "groups mixed";
}

TEST(Stream, SkipsOrRefusesSamplesOverACap) {
  std::vector<int64_t> lens = wan_mix(3000, 2);
  lens[5] = lens[900] = 400000;
  const StreamTable t(lens.data(), 8, lens.size(), nullptr, 0, wan14b());
  PlanOptions o;
  o.max_tokens = 151200;
  o.max_cost = t.default_max_cost(o.max_tokens);
  o.num_replicas = 4;
  const Permutation perm(t.size(), 0, 0, true);
  EXPECT_THROW(next_segment(t, o, perm, 0, 100000), std::invalid_argument);
  o.oversize = OversizePolicy::kSkip;
  const Segment seg = next_segment(t, o, perm, 0, 100000);
  EXPECT_EQ(seg.end, 3000);
  EXPECT_EQ(seg.samples.size(), 2998u);
  EXPECT_EQ(seg.skipped.size(), 2u);
  const EpochPlan p = plan_samples(t, o, seg.samples.data(), seg.samples.size(), 0);
  EXPECT_TRUE(p.skipped.empty());
  const int64_t all[] = {5, 6, 900};
  const EpochPlan q = plan_samples(t, o, all, 3, 0);
  EXPECT_EQ(q.skipped, (std::vector<int64_t>{5, 900}));
}

}  // namespace
}  // namespace adaptiveload
