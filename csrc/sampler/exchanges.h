// Exchanges that lower a step's most loaded rank after LPT (the planner's balancing, planner.h).
// Plain C++17 on plain arrays; no torch, no Python.
//
// A step's micro-batches (items, with costs) are in bins (ranks). Each round takes the most
// loaded bin h (the first of equals) and the exchange between h and another bin that lowers the
// larger of their two sums most: a swap of an item of h with a cheaper item of the other bin,
// or, with `moves` (any count >= 1 per bin), a move of an item of h to it. Of the exchanges
// that lower it equally, the first in the order (item of h, swaps before moves, the other
// item or bin) is taken. Rounds go on while one lowers it. Each exchange lowers the sum of
// squared loads, so the loop ends; a cap of 4 rounds per item only bounds its time.
//
// The exchange taken is defined by that order alone, so any search that finds the least
// (larger sum, item of h, kind, other) finds the same plan. Two searches are kept:
//
//   - the scan visits bins by increasing load and stops at the first whose half sum with h is
//     above the best found so far (no exchange with it or a heavier bin can do better);
//   - the index, where the items have few distinct costs (micro-batches of one group and one
//     count cost exactly the same, so a step of 4,096 typically has a dozen): for each item a
//     of h and each cost v below a's, the larger sum after swapping a with an item of cost v in
//     bin x, max(load[h] - d, load[x] + d), does not decrease with load[x] (rounded addition is
//     monotone). So the lightest bin holding cost v gives the best sum, and the bins that tie
//     with it are those up to some load. Per cost, a tree of minima over its items (leaf: the
//     load of the item's bin where the item is the bin's first of that cost) gives both: the
//     least load at its root, and the least tied item as its first leaf whose load ties, in
//     a descent instead of a walk through the tied bins (hundreds at 1,024 ranks).
//
// improve_by_exchanges picks the index where the distinct costs are few (kIndexedMaxCosts) and
// the scan elsewhere; the tests check that both give the same bins.
#pragma once

#include <cstdint>
#include <vector>

namespace adaptiveload {

/// The index serves steps whose items have at most this many distinct costs; a step of more
/// is scanned (the index then visits about as many bins per round as the scan, at more cost).
inline constexpr int64_t kIndexedMaxCosts = 64;

/// \brief The exchanges described above, applied to `bin_of` (each item's bin; every bin
/// non-empty where `moves`). The index or the scan, per kIndexedMaxCosts.
void improve_by_exchanges(const double* costs, int64_t n_items, int64_t num_bins, bool moves,
                          std::vector<int64_t>& bin_of);

/// The same exchanges, found by the scan.
void improve_by_exchanges_scan(const double* costs, int64_t n_items, int64_t num_bins, bool moves,
                               std::vector<int64_t>& bin_of);

/// The same exchanges, found by the index (any count of distinct costs).
void improve_by_exchanges_indexed(const double* costs, int64_t n_items, int64_t num_bins,
                                  bool moves, std::vector<int64_t>& bin_of);

}  // namespace adaptiveload
