// The exchanges after LPT (exchanges.h): the index finds the exchanges the scan finds.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "sampler/exchanges.h"
#include "sampler/planner.h"

namespace adaptiveload {
namespace {

// Items of `distinct` costs (drawn from a few magnitudes, so that sums tie and round alike):
// in decreasing order as the planner gives them, assigned by LPT (even counts) or uneven LPT,
// or in any order and any bins.
struct Case {
  std::vector<double> costs;
  std::vector<int64_t> bins;
  int64_t num_bins;
  bool moves;
};

Case draw(std::mt19937_64& rng, int64_t num_bins, int64_t per_bin, int64_t distinct, bool moves,
          bool start_lpt) {
  std::vector<double> value(distinct);
  std::uniform_real_distribution<double> u(0.5, 40.0);
  for (double& v : value) v = std::round(u(rng) * 8.0) / 8.0 + (u(rng) < 10.0 ? 1e-7 : 0.0);
  const int64_t n = num_bins * per_bin;
  std::vector<double> costs(n);
  std::uniform_int_distribution<int64_t> pick(0, distinct - 1);
  for (double& c : costs) c = value[pick(rng)];
  std::sort(costs.begin(), costs.end(), std::greater<double>());
  std::vector<int64_t> bins;
  if (!start_lpt) {
    // Any start, every bin non-empty, the costs in any order.
    std::shuffle(costs.begin(), costs.end(), rng);
    bins.resize(n);
    std::uniform_int_distribution<int64_t> any(0, num_bins - 1);
    for (int64_t i = 0; i < n; ++i) bins[i] = i < num_bins ? i : any(rng);
  } else if (moves) {
    bins = assign_uneven(costs.data(), n, num_bins);
  } else {
    bins = assign_to_ranks(costs.data(), n, num_bins, per_bin);
  }
  return {costs, bins, num_bins, moves};
}

TEST(Exchanges, IndexFindsTheScansExchanges) {
  std::mt19937_64 rng(20261204);
  int64_t changed = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int64_t num_bins = std::vector<int64_t>{2, 3, 8, 64, 256}[trial % 5];
    const int64_t per_bin = 1 + trial % 5;
    const int64_t distinct = 1 + (trial * 7) % 12;
    const bool moves = (trial / 5) % 2 == 1;
    const bool start_lpt = (trial / 10) % 2 == 0;
    Case c = draw(rng, num_bins, per_bin, distinct, moves, start_lpt);
    const int64_t n = static_cast<int64_t>(c.costs.size());
    std::vector<int64_t> scan = c.bins, indexed = c.bins, picked = c.bins;
    improve_by_exchanges_scan(c.costs.data(), n, num_bins, moves, scan);
    improve_by_exchanges_indexed(c.costs.data(), n, num_bins, moves, indexed);
    improve_by_exchanges(c.costs.data(), n, num_bins, moves, picked);
    ASSERT_EQ(scan, indexed) << "trial " << trial << ": " << num_bins << " bins, " << per_bin
                             << " per bin, " << distinct << " costs, moves " << moves;
    ASSERT_EQ(scan, picked) << "trial " << trial;
    changed += scan != c.bins;
  }
  EXPECT_GT(changed, 100);  // the cases exercise exchanges, not only starts already balanced
}

// The planner's regime: a step of 1,024 ranks, 4 micro-batches each, a handful of costs, so
// that the bins tied for the best swap run to hundreds and the least item among them decides.
TEST(Exchanges, IndexFindsTheScansExchangesAtAThousandRanks) {
  std::mt19937_64 rng(20261205);
  int64_t changed = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const bool moves = trial % 2 == 1;
    Case c = draw(rng, 1024, 4, 3 + trial % 5, moves, true);
    const int64_t n = static_cast<int64_t>(c.costs.size());
    std::vector<int64_t> scan = c.bins, indexed = c.bins;
    improve_by_exchanges_scan(c.costs.data(), n, c.num_bins, moves, scan);
    improve_by_exchanges_indexed(c.costs.data(), n, c.num_bins, moves, indexed);
    ASSERT_EQ(scan, indexed) << "trial " << trial;
    changed += scan != c.bins;
  }
  EXPECT_GE(changed, 6);  // most steps exchange
}

TEST(Exchanges, ManyDistinctCostsAreScannedAndAgree) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(1.0, 100.0);
  const int64_t num_bins = 32, n = 32 * 4;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> costs(n);
    for (double& c : costs) c = u(rng);  // more distinct costs than kIndexedMaxCosts
    std::sort(costs.begin(), costs.end(), std::greater<double>());
    std::vector<int64_t> bins = assign_to_ranks(costs.data(), n, num_bins, 4);
    std::vector<int64_t> scan = bins, indexed = bins, picked = bins;
    improve_by_exchanges_scan(costs.data(), n, num_bins, false, scan);
    improve_by_exchanges_indexed(costs.data(), n, num_bins, false, indexed);
    improve_by_exchanges(costs.data(), n, num_bins, false, picked);
    ASSERT_EQ(scan, indexed);
    ASSERT_EQ(scan, picked);
  }
}

TEST(Exchanges, EachExchangeLowersTheLargestBinOrStops) {
  // Bins {9, 9} and {1, 1}: swapping the first 9 with the first 1 lowers the top from 18 to
  // 10, and then no exchange lowers it.
  std::vector<double> costs = {9, 9, 1, 1};
  std::vector<int64_t> bins = {0, 0, 1, 1};
  improve_by_exchanges(costs.data(), 4, 2, false, bins);
  EXPECT_EQ(bins, (std::vector<int64_t>{1, 0, 0, 1}));  // the first 9 and the first 1 swap
}

}  // namespace
}  // namespace adaptiveload
