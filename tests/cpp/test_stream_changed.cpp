// A StreamTable borrows its arrays, which may change under it (a memory-mapped file rewritten in
// place): every read of planning checks the value against what the table was built from, and a
// length or group id it was not built from throws DataChanged, never indexes anything. Also the
// cap rules (caps.h) both tables consult.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "sampler/caps.h"
#include "sampler/planner.h"
#include "sampler/stream.h"

namespace adaptiveload {
namespace {

constexpr int64_t kCap = 8192;      // max_tokens
constexpr int64_t kLong = 3000000;  // a length past the dense lookup, over the cap

CostModel model() { return CostModel::polynomial(1.0, 3.1e-3, 1.35e-7); }

// n lengths of {256, 512, 1024, 2048}, and kLong last (so that the oversize pass reads all).
template <class T>
std::vector<T> lengths(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<T> lens(n);
  for (T& len : lens) len = static_cast<T>(256 << (gen() % 4));
  lens[n - 1] = static_cast<T>(kLong);
  return lens;
}

PlanOptions options(const StreamTable& t) {
  PlanOptions o;
  o.max_tokens = kCap;
  o.max_cost = t.default_max_cost(kCap);
  o.num_replicas = 2;
  o.lookahead_steps = 2;
  o.seed = 4;
  o.oversize = OversizePolicy::kSkip;  // kLong is over the cap
  return o;
}

// Every path of planning that reads the arrays, with sample i < n - 1 holding what the table was
// not built from: each throws DataChanged whose message has `what`.
void expect_refused(const StreamTable& t, const PlanOptions& o, int64_t i,
                    const std::string& what) {
  auto check = [&](const char* path, auto&& read) {
    try {
      read();
      ADD_FAILURE() << path << ": nothing thrown";
    } catch (const DataChanged& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << path << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("rename it over the old one"), std::string::npos);
    } catch (const std::exception& e) {
      ADD_FAILURE() << path << ": not DataChanged: " << e.what();
    }
  };
  const Permutation perm(t.size(), o.seed, o.epoch, o.shuffle);
  check("next_segment", [&] { next_segment(t, o, perm, 0, t.size()); });
  const int64_t prefix[] = {i};
  check("next_segment's prefix", [&] { next_segment(t, o, perm, t.size(), 1, prefix, 1); });
  check("plan_samples", [&] { plan_samples(t, o, &i, 1, 0); });
  PlanOptions refusing = o;
  refusing.oversize = OversizePolicy::kError;
  check("plan_samples, refusing", [&] { plan_samples(t, refusing, &i, 1, 0); });
  if (!t.has_group_ids()) check("oversize", [&] { t.oversize(kCap, o.max_cost, 1); });
  check("default_max_cost", [&] { t.default_max_cost(kCap); });
  if (!t.has_group_ids()) check("group", [&] { t.group(i); });
}

template <class T>
void changed_lengths(int width) {
  const int64_t n = 3000;
  std::vector<T> lens = lengths<T>(n, 11);
  const StreamTable t(lens.data(), width, n, nullptr, 0, model());
  const PlanOptions o = options(t);
  const Permutation perm(t.size(), o.seed, o.epoch, o.shuffle);
  const EpochPlan before = plan_segment(t, o, next_segment(t, o, perm, 0, n), 0);
  std::vector<int64_t> values = {0,    -1,      300,  5000, 2500000, std::numeric_limits<T>::min(),
                                 4096, 2097152, 2049, 257,  kCap,    std::numeric_limits<T>::max()};
  if (width == 8) values.push_back(kMaxSeqLen + 1);
  std::mt19937_64 gen(3);
  for (int64_t v : values) {
    const int64_t i = static_cast<int64_t>(gen() % (n - 1));
    const T was = lens[i];
    lens[i] = static_cast<T>(v);
    expect_refused(t, o, i, "index " + std::to_string(i) + " holds " + std::to_string(v));
    lens[i] = was;
  }
  // Restored, the table plans as before: nothing was written where it should not have been.
  const EpochPlan after = plan_segment(t, o, next_segment(t, o, perm, 0, n), 0);
  EXPECT_EQ(after.samples, before.samples);
  EXPECT_EQ(after.offsets, before.offsets);
  EXPECT_EQ(after.skipped, before.skipped);
}

TEST(StreamChanged, LengthsNotBuiltFromAreRefused) {
  changed_lengths<int32_t>(4);
  changed_lengths<int64_t>(8);
}

template <class G>
void changed_groups(int width) {
  const int64_t n = 2000;
  const std::vector<int32_t> lens = lengths<int32_t>(n, 5);
  std::vector<G> groups(n);
  for (int64_t i = 0; i < n; ++i) groups[i] = static_cast<G>(i % 3);
  const StreamTable t(lens.data(), 4, n, groups.data(), width, model());
  const PlanOptions o = options(t);
  std::vector<int64_t> values = {-1, 3, 4, std::numeric_limits<G>::min(),
                                 std::numeric_limits<G>::max()};
  if (width == 8) values.push_back(int64_t{1} << 40);
  std::mt19937_64 gen(8);
  for (int64_t v : values) {
    const int64_t i = static_cast<int64_t>(gen() % (n - 1));
    const G was = groups[i];
    groups[i] = static_cast<G>(v);
    expect_refused(t, o, i, "index " + std::to_string(i) + " holds group " + std::to_string(v));
    EXPECT_THROW(t.group(i), DataChanged);
    groups[i] = was;
  }
}

TEST(StreamChanged, GroupIdsOutOfRangeAreRefused) {
  changed_groups<int32_t>(4);
  changed_groups<int64_t>(8);
}

TEST(StreamChanged, KnownLengthsStillPlan) {
  // One known length for another is no read out of bounds: planned (the digest tells the change).
  const int64_t n = 2000;
  std::vector<int64_t> lens = lengths<int64_t>(n, 2);
  const StreamTable t(lens.data(), 8, n, nullptr, 0, model());
  const PlanOptions o = options(t);
  const Permutation perm(t.size(), o.seed, o.epoch, o.shuffle);
  for (int64_t i = 0; i < n; i += 3) lens[i] = 2048;
  const EpochPlan p = plan_segment(t, o, next_segment(t, o, perm, 0, n), 0);
  EXPECT_GT(p.num_micro_batches(), 0);
}

TEST(StreamChanged, PlanSegmentRefusesASegmentItDidNotCut) {
  const int64_t n = 1000;
  const std::vector<int64_t> lens = lengths<int64_t>(n, 9);
  const StreamTable t(lens.data(), 8, n, nullptr, 0, model());
  const PlanOptions o = options(t);
  const Permutation perm(t.size(), o.seed, o.epoch, o.shuffle);
  const Segment cut = next_segment(t, o, perm, 0, n);
  for (int field = 0; field < 3; ++field) {
    Segment seg = cut;
    if (field == 0) seg.length_of[5] = static_cast<int32_t>(t.num_lengths());
    if (field == 1) seg.groups[5] = -1;
    if (field == 2) seg.samples[5] = n;
    EXPECT_THROW(plan_segment(t, o, std::move(seg), 0), std::invalid_argument) << field;
  }
}

// Caps::breaks with n and the cost computed by the caller (whole-epoch packing) and computed
// itself (streamed cutting) agree, with and without a memory policy.
TEST(Caps, BreaksTheSameWhoeverComputesTheCost) {
  MemoryPolicy policy;
  policy.model.num_blocks = 40;
  policy.model.m0 = 20e9;
  policy.model.mt = 1e5;
  policy.model.ma = 2e4;
  policy.model.mc = 1e3;
  policy.model.recompute_share = 0.3;
  policy.budget = 60e9;
  const CostModel cost = model();
  std::mt19937_64 gen(1);
  const MemoryPolicy* policies[] = {nullptr, &policy};
  for (const MemoryPolicy* memory : policies) {
    const Caps caps(cost, memory, 60000, 6, 4000.0);
    for (int trial = 0; trial < 2000; ++trial) {
      BatchStats b;
      const int64_t count = 2 + static_cast<int64_t>(gen() % 8);
      for (int64_t j = 0; j < count; ++j) {
        const int64_t len = 1000 + static_cast<int64_t>(gen() % 20000);
        b.add(len, cost.sample_cost(len));
      }
      const int64_t n = caps.checkpointed_blocks(b);
      ASSERT_EQ(caps.breaks(b), caps.breaks(b, n, caps.cost(b, n))) << trial;
    }
  }
}

}  // namespace
}  // namespace adaptiveload
