#include "sampler/exchanges.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <utility>

namespace adaptiveload {

namespace {

// The bins as the rounds change them: loads, counts, each bin's items (increasing), and either
// the bins by increasing load, ties by index (`ordered`: the scan and moves walk them), or a
// tree that keeps the heaviest bin at its root (swaps need only that one).
struct Bins {
  const double* costs;
  std::vector<double> load;
  std::vector<int64_t> count;
  std::vector<std::vector<int64_t>> members;
  bool ordered;
  std::vector<int64_t> by_load;
  int64_t leaves = 1;
  std::vector<int64_t> heaviest;  // heaviest[1]: the root; leaf x at leaves + x (-1: none)

  Bins(const double* c, int64_t n_items, int64_t num_bins, const std::vector<int64_t>& bin_of,
       bool keep_order)
      : costs(c), load(num_bins, 0.0), count(num_bins, 0), members(num_bins), ordered(keep_order) {
    for (int64_t i = 0; i < n_items; ++i) load[bin_of[i]] += costs[i], ++count[bin_of[i]];
    for (int64_t x = 0; x < num_bins; ++x) members[x].reserve(count[x]);
    for (int64_t i = 0; i < n_items; ++i) members[bin_of[i]].push_back(i);
    if (!ordered) {
      while (leaves < num_bins) leaves *= 2;
      heaviest.assign(2 * leaves, -1);
      for (int64_t x = 0; x < num_bins; ++x) heaviest[leaves + x] = x;
      for (int64_t k = leaves - 1; k >= 1; --k)
        heaviest[k] = heavier(heaviest[2 * k], heaviest[2 * k + 1]);
      return;
    }
    // Sorted as (load, bin) pairs side by side: the order lighter() defines.
    std::vector<std::pair<double, int64_t>> order(num_bins);
    for (int64_t x = 0; x < num_bins; ++x) order[x] = {load[x], x};
    std::sort(order.begin(), order.end());
    by_load.resize(num_bins);
    for (int64_t x = 0; x < num_bins; ++x) by_load[x] = order[x].second;
  }

  bool lighter(int64_t x, int64_t y) const {
    return load[x] < load[y] || (load[x] == load[y] && x < y);
  }

  // Of two bins (or -1, none), the more loaded, the first of equals.
  int64_t heavier(int64_t x, int64_t y) const {
    if (x < 0 || y < 0) return x < 0 ? y : x;
    return load[y] > load[x] || (load[y] == load[x] && y < x) ? y : x;
  }

  // The most loaded bin, the first of equals (by_load ends with them, in increasing order).
  int64_t top() const {
    if (!ordered) return heaviest[1];
    const int64_t last = static_cast<int64_t>(by_load.size()) - 1;
    int64_t t = last;
    while (t > 0 && load[by_load[t - 1]] == load[by_load[last]]) --t;
    return by_load[t];
  }

  // Bins x and y change load by -d and +d.
  void shift(int64_t x, int64_t y, double d) {
    if (!ordered) {
      load[x] -= d;
      load[y] += d;
      for (int64_t z : {x, y})
        for (int64_t k = (leaves + z) / 2; k >= 1; k /= 2)
          heaviest[k] = heavier(heaviest[2 * k], heaviest[2 * k + 1]);
      return;
    }
    // by_load is in lighter() order of the loads before: each bin found by bisection.
    auto by_lighter = [&](int64_t p, int64_t q) { return lighter(p, q); };
    for (int64_t z : {x, y})
      by_load.erase(std::lower_bound(by_load.begin(), by_load.end(), z, by_lighter));
    load[x] -= d;
    load[y] += d;
    for (int64_t z : {x, y})
      by_load.insert(std::lower_bound(by_load.begin(), by_load.end(), z, by_lighter), z);
  }
};

// The best exchange of a round so far: the larger sum after it and its place in the order
// (item of h, kind: 0 swap / 1 move, other: the item or the bin).
struct Best {
  double after;
  int64_t give = -1, take = -1, to = -1, kind = 0, other = 0;

  void consider(double a_after, int64_t a, int64_t k, int64_t o, int64_t b, int64_t x) {
    const bool earlier =
        give >= 0 && (a < give || (a == give && (k < kind || (k == kind && o < other))));
    if (a_after < after || (a_after == after && earlier)) {
      after = a_after, give = a, take = b, to = x, kind = k, other = o;
    }
  }
};

// Applies the round's exchange to bin_of and the bins.
void apply(Bins& s, int64_t h, const Best& e, std::vector<int64_t>& bin_of) {
  auto drop = [](std::vector<int64_t>& v, int64_t i) { v.erase(std::find(v.begin(), v.end(), i)); };
  auto add = [](std::vector<int64_t>& v, int64_t i) {
    v.insert(std::lower_bound(v.begin(), v.end(), i), i);
  };
  const double d = s.costs[e.give] - (e.take >= 0 ? s.costs[e.take] : 0.0);
  bin_of[e.give] = e.to;
  drop(s.members[h], e.give);
  add(s.members[e.to], e.give);
  if (e.take >= 0) {
    bin_of[e.take] = h;
    drop(s.members[e.to], e.take);
    add(s.members[h], e.take);
  } else {
    --s.count[h];
    ++s.count[e.to];
  }
  s.shift(h, e.to, d);
}

// Moves of an item a of h: the larger sum max(load[h] - c, load[x] + c) does not decrease
// with load[x], so bins are visited by increasing load until it is above the best.
void consider_moves(const Bins& s, int64_t h, int64_t a, Best& best) {
  const double c = s.costs[a];
  for (int64_t x : s.by_load) {
    if (x == h) continue;
    const double after = std::max(s.load[h] - c, s.load[x] + c);
    if (after > best.after) break;
    // A tie wins only over a move of this same a to a later bin.
    if (after == best.after && (best.give != a || best.kind != 1)) break;
    best.consider(after, a, 1, x, -1, x);
  }
}

// The distinct costs, increasing; in one pass where they come in decreasing order (the
// planner's steps do).
std::vector<double> distinct_costs(const double* costs, int64_t n_items) {
  std::vector<double> value;
  if (std::is_sorted(costs, costs + n_items, std::greater<double>())) {
    for (int64_t i = n_items - 1; i >= 0; --i)
      if (value.empty() || value.back() != costs[i]) value.push_back(costs[i]);
    return value;
  }
  value.assign(costs, costs + n_items);
  std::sort(value.begin(), value.end());
  value.erase(std::unique(value.begin(), value.end()), value.end());
  return value;
}

}  // namespace

void improve_by_exchanges_scan(const double* costs, int64_t n_items, int64_t num_bins, bool moves,
                               std::vector<int64_t>& bin_of) {
  Bins s(costs, n_items, num_bins, bin_of, true);
  for (int64_t rounds = 0; rounds < 4 * n_items; ++rounds) {
    const int64_t h = s.top();
    Best best{s.load[h]};
    for (int64_t x : s.by_load) {
      if (x == h) continue;
      // An exchange with x leaves the larger sum at (load[h] + load[x]) / 2 at least; the
      // margin is far above rounding.
      if (0.5 * (s.load[h] + s.load[x]) > best.after + 1e-9 * std::abs(best.after)) break;
      for (int64_t a : s.members[h]) {
        for (int64_t b : s.members[x]) {
          const double d = costs[a] - costs[b];
          if (d > 0) best.consider(std::max(s.load[h] - d, s.load[x] + d), a, 0, b, b, x);
        }
        if (moves && s.count[h] >= 2)
          best.consider(std::max(s.load[h] - costs[a], s.load[x] + costs[a]), a, 1, x, -1, x);
      }
    }
    if (best.give < 0) break;
    apply(s, h, best, bin_of);
  }
}

namespace {

// Per cost v, the least load of the bins holding an item of cost v, kept by item: a tree of
// minima over the items of cost v in increasing order, whose leaf is the load of the item's bin
// where the item is its bin's first of cost v (one leaf per holding bin) and +inf elsewhere.
class MinTree {
 public:
  explicit MinTree(int64_t leaves) {
    while (size_ < leaves) size_ *= 2;
    node_.assign(2 * size_, std::numeric_limits<double>::infinity());
  }
  // Sets leaf k without updating the minima above (build() does them all at once).
  void put(int64_t k, double value) { node_[size_ + k] = value; }
  void build() {
    for (int64_t k = size_ - 1; k >= 1; --k) node_[k] = std::min(node_[2 * k], node_[2 * k + 1]);
  }
  void set(int64_t k, double value) {
    k += size_;
    node_[k] = value;
    for (k /= 2; k >= 1; k /= 2) {
      const double m = std::min(node_[2 * k], node_[2 * k + 1]);
      if (node_[k] == m) break;  // the minima above are unchanged
      node_[k] = m;
    }
  }
  double least() const { return node_[1]; }
  // The first leaf whose value passes `ok`, a test true up to some bound and false above it
  // (so a subtree holds such a leaf where its minimum passes); -1 where none does.
  template <class Ok>
  int64_t first(Ok ok) const {
    if (!ok(node_[1])) return -1;
    int64_t k = 1;
    while (k < size_) k = ok(node_[2 * k]) ? 2 * k : 2 * k + 1;
    return k - size_;
  }

 private:
  int64_t size_ = 1;
  std::vector<double> node_;  // node_[1] the root, leaves from size_
};

// improve_by_exchanges_indexed, given the distinct costs, increasing.
void improve_indexed(const double* costs, int64_t n_items, int64_t num_bins, bool moves,
                     std::vector<int64_t>& bin_of, const std::vector<double>& value) {
  const int64_t V = static_cast<int64_t>(value.size());
  std::vector<int64_t> value_of(n_items), leaf(n_items);
  std::vector<std::vector<int64_t>> items_of(V);  // per cost, its items increasing
  for (int64_t i = 0; i < n_items; ++i) {
    const int64_t v = std::lower_bound(value.begin(), value.end(), costs[i]) - value.begin();
    value_of[i] = v;
    leaf[i] = static_cast<int64_t>(items_of[v].size());
    items_of[v].push_back(i);
  }

  Bins s(costs, n_items, num_bins, bin_of, moves);
  std::vector<MinTree> tree;
  tree.reserve(V);
  for (int64_t v = 0; v < V; ++v) tree.emplace_back(static_cast<int64_t>(items_of[v].size()));
  std::vector<int64_t> seen(V, -1);
  int64_t visit = 0;
  // f(v, i) for each cost v that bin x holds, i its first item of that cost (members come
  // increasing: the first of each cost is its least item).
  auto each_cost = [&](int64_t x, auto&& f) {
    ++visit;
    for (int64_t i : s.members[x]) {
      const int64_t v = value_of[i];
      if (seen[v] == visit) continue;
      seen[v] = visit;
      f(v, i);
    }
  };
  for (int64_t x = 0; x < num_bins; ++x)
    each_cost(x, [&](int64_t v, int64_t i) { tree[v].put(leaf[i], s.load[x]); });
  for (MinTree& t : tree) t.build();
  auto index = [&](int64_t x, bool enter) {
    const double load = enter ? s.load[x] : std::numeric_limits<double>::infinity();
    each_cost(x, [&](int64_t v, int64_t i) { tree[v].set(leaf[i], load); });
  };

  for (int64_t rounds = 0; rounds < 4 * n_items; ++rounds) {
    const int64_t h = s.top();
    Best best{s.load[h]};
    for (int64_t a : s.members[h]) {
      for (int64_t v = 0; v < value_of[a]; ++v) {
        const double d = costs[a] - value[v];  // the same double as costs[a] - costs[b]
        auto after_with = [&](double load) { return std::max(s.load[h] - d, load + d); };
        // The lightest bin holding cost v gives the least larger sum. Where that is h itself
        // (or a bin as loaded), the sum is above load[h] and nothing is taken: bins other than
        // h need no test.
        const double after = after_with(tree[v].least());
        if (after > best.after) continue;
        // A tie wins only over a swap of this same a with a later item (items of h come in
        // increasing order, and a's swaps before its moves).
        if (after == best.after && (best.give != a || best.kind != 0)) continue;
        // The bins whose sum ties with it are those of load up to some bound (the larger sum
        // does not decrease with the load: rounded addition is monotone); the swap takes the
        // least item among them, the first leaf that ties.
        const int64_t b =
            items_of[v][tree[v].first([&](double load) { return after_with(load) <= after; })];
        best.consider(after, a, 0, b, b, bin_of[b]);
      }
      if (moves && s.count[h] >= 2) consider_moves(s, h, a, best);
    }
    if (best.give < 0) break;
    const int64_t to = best.to;
    index(h, false);
    index(to, false);
    apply(s, h, best, bin_of);
    index(h, true);
    index(to, true);
  }
}

}  // namespace

void improve_by_exchanges_indexed(const double* costs, int64_t n_items, int64_t num_bins,
                                  bool moves, std::vector<int64_t>& bin_of) {
  improve_indexed(costs, n_items, num_bins, moves, bin_of, distinct_costs(costs, n_items));
}

void improve_by_exchanges(const double* costs, int64_t n_items, int64_t num_bins, bool moves,
                          std::vector<int64_t>& bin_of) {
  // The index where the step's costs are few distinct values; the scan elsewhere.
  std::vector<double> value = distinct_costs(costs, n_items);
  if (static_cast<int64_t>(value.size()) <= kIndexedMaxCosts) {
    improve_indexed(costs, n_items, num_bins, moves, bin_of, value);
  } else {
    improve_by_exchanges_scan(costs, n_items, num_bins, moves, bin_of);
  }
}

}  // namespace adaptiveload
