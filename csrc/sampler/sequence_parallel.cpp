#include "sampler/sequence_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "sampler/cost_model.h"

namespace adaptiveload {

namespace {

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument(what); }

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Moves and swaps of degree-1 items between the slowest and the fastest rank while that lowers
// the slower of the two; the shared items (run first) stay. Each exchange lowers the sum of
// squared finish times, so the loop ends; the cap only bounds its time.
void improve_own(const std::vector<double>& share, const std::vector<uint8_t>& shares_one,
                 std::vector<double>& finish, std::vector<std::vector<int64_t>>& own) {
  const int64_t rounds_max = 4 * static_cast<int64_t>(share.size());
  for (int64_t rounds = 0; rounds < rounds_max; ++rounds) {
    const int64_t h = std::max_element(finish.begin(), finish.end()) - finish.begin();
    const int64_t l = std::min_element(finish.begin(), finish.end()) - finish.begin();
    if (h == l) return;
    int64_t give = -1, take = -1;
    double best = finish[h];
    for (size_t a = 0; a < own[h].size(); ++a) {
      const double ca = share[own[h][a]];
      // A rank keeps one micro-batch at least: its own, unless it shares one.
      if (own[h].size() >= 2 || shares_one[h]) {
        const double after = std::max(finish[h] - ca, finish[l] + ca);
        if (after < best) best = after, give = static_cast<int64_t>(a), take = -1;
      }
      for (size_t b = 0; b < own[l].size(); ++b) {
        const double d = ca - share[own[l][b]];
        const double after = std::max(finish[h] - d, finish[l] + d);
        if (d > 0 && after < best)
          best = after, give = static_cast<int64_t>(a), take = static_cast<int64_t>(b);
      }
    }
    if (give < 0) return;
    const int64_t a = own[h][give];
    double moved = share[a];
    own[h].erase(own[h].begin() + give);
    if (take >= 0) {
      const int64_t b = own[l][take];
      moved -= share[b];
      own[l].erase(own[l].begin() + take);
      own[h].push_back(b);
    }
    own[l].push_back(a);
    finish[h] -= moved;
    finish[l] += moved;
  }
}

// The step with these degrees: shared items by decreasing degree and share, each on the aligned
// group where it ends soonest (it starts when the group's last member is free), then the
// degree-1 items by LPT onto the rank that is free first, then exchanges. makespan is infinite
// where a rank is left without an item.
SpStep place(const std::vector<SpItem>& items, const std::vector<int64_t>& degree, int64_t W,
             const SequenceParallel& sp, std::vector<double>& finish) {
  const int64_t n = static_cast<int64_t>(items.size());
  std::vector<double> share(n);
  for (int64_t i = 0; i < n; ++i) share[i] = share_cost(items[i], degree[i], sp);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return degree[a] != degree[b] ? degree[a] > degree[b] : share[a] > share[b];
  });
  SpStep s;
  s.degree = degree;
  s.first_rank.assign(n, 0);
  s.rank_items.assign(W, {});
  finish.assign(W, 0.0);
  std::vector<std::vector<int64_t>> own(W);
  std::vector<uint8_t> shares_one(W, 0);
  for (int64_t item : order) {
    const int64_t d = degree[item];
    s.busy += share[item] * static_cast<double>(d);
    if (d == 1) {
      // An idle rank without any item first, then the rank free first (ties: the lower).
      int64_t r = 0;
      for (int64_t q = 1; q < W; ++q) {
        const bool empty_q = own[q].empty() && !shares_one[q];
        const bool empty_r = own[r].empty() && !shares_one[r];
        if ((empty_q && !empty_r) || (empty_q == empty_r && finish[q] < finish[r])) r = q;
      }
      finish[r] += share[item];
      own[r].push_back(item);
      continue;
    }
    int64_t best_g = 0;
    double best_end = kInfinity;
    for (int64_t g = 0; g < W / d; ++g) {
      const double start = *std::max_element(finish.begin() + g * d, finish.begin() + (g + 1) * d);
      if (start + share[item] < best_end) best_end = start + share[item], best_g = g;
    }
    s.first_rank[item] = best_g * d;
    for (int64_t r = best_g * d; r < (best_g + 1) * d; ++r) {
      finish[r] = best_end;
      shares_one[r] = 1;
      s.rank_items[r].push_back(item);
    }
  }
  improve_own(share, shares_one, finish, own);
  for (int64_t r = 0; r < W; ++r) {
    std::stable_sort(own[r].begin(), own[r].end(),
                     [&](int64_t a, int64_t b) { return share[a] > share[b]; });
    for (int64_t item : own[r]) {
      s.first_rank[item] = r;
      s.rank_items[r].push_back(item);
    }
  }
  s.makespan = *std::max_element(finish.begin(), finish.end());
  for (int64_t r = 0; r < W; ++r)
    if (s.rank_items[r].empty()) s.makespan = kInfinity;
  return s;
}

// How good a step is, lexicographically: its makespan, then how many ranks finish at it (so that
// of two long micro-batches that tie the makespan, splitting one is a step towards splitting
// both), then the rank time it takes in all.
struct Score {
  double makespan;
  int64_t at_makespan;
  double busy;
  bool operator<(const Score& o) const {
    const double tol = 1e-12 * std::max(makespan, o.makespan);
    if (std::abs(makespan - o.makespan) > tol) return makespan < o.makespan;
    if (at_makespan != o.at_makespan) return at_makespan < o.at_makespan;
    return busy < o.busy - 1e-12 * std::max(busy, o.busy);
  }
};

Score score(const SpStep& s, const std::vector<double>& finish) {
  int64_t at = 0;
  for (double f : finish) at += f >= s.makespan * (1.0 - 1e-12) ? 1 : 0;
  return {s.makespan, at, s.busy};
}

}  // namespace

double share_cost(const SpItem& item, int64_t d, const SequenceParallel& sp) {
  if (d <= 1) return item.cost;
  const double whole = item.compute < 0.0 ? item.cost : item.compute;
  const double split = (whole - item.fixed) / static_cast<double>(d);
  const double dd = static_cast<double>(d);
  const size_t level = degree_level(d);
  const double g = level < sp.comm_scale.size() ? sp.comm_scale[level] : 1.0;
  const double sent = static_cast<double>(item.tokens) * (dd - 1.0) / (dd * dd);
  const double comm = sp.comm_fraction * split + sp.comm_per_token * g * sent;
  const double measured = level < item.measured.size() ? item.measured[level] : 0.0;
  const double f = level < item.factor.size() ? item.factor[level] : 1.0;
  // The host floor is paid in full, whatever the factor: it is launch time, not compute.
  return (measured > 0.0 ? measured * f : std::max(item.floor, (item.fixed + split) * f)) + comm;
}

void validate_sequence_parallel(const SequenceParallel& sp, int64_t W) {
  const int64_t d = sp.max_degree;
  if (d < 1 || (d & (d - 1)) != 0 || W % d != 0)
    invalid("sequence_parallel must be a power of two that divides num_replicas = " +
            std::to_string(W) + ", got " + std::to_string(d));
  if (!(sp.comm_per_token >= 0.0) || !(sp.comm_fraction >= 0.0))
    invalid("sequence-parallel communication costs must be >= 0, got comm_per_token " +
            std::to_string(sp.comm_per_token) + ", comm_fraction " +
            std::to_string(sp.comm_fraction));
  for (size_t k = 0; k < sp.comm_scale.size(); ++k)
    if (!(sp.comm_scale[k] > 0.0) || !std::isfinite(sp.comm_scale[k]))
      invalid("sequence-parallel comm_scale must be finite and > 0, got " +
              std::to_string(sp.comm_scale[k]) + " at degree " + std::to_string(int64_t{1} << k));
}

namespace {

// The degrees an item may move to from its own: double or half, within [min_degree, D].
std::vector<int64_t> moves_of(const std::vector<SpItem>& items, const SequenceParallel& sp,
                              const std::vector<int64_t>& degree, int64_t item) {
  std::vector<int64_t> to;
  const int64_t d = degree[item];
  for (const int64_t t : {d * 2, d / 2})
    if (t <= sp.max_degree && t >= std::max<int64_t>(items[item].min_degree, 1) && t != d)
      to.push_back(t);
  return to;
}

// The best placement found by a search, and the score it must beat.
struct Pick {
  Score bar;
  SpStep step;
  std::vector<double> finish;
  bool found = false;
};

// Places the items at `degree`; where that beats `pick.bar`, it becomes the pick (true).
bool try_degrees(const std::vector<SpItem>& items, const std::vector<int64_t>& degree, int64_t W,
                 const SequenceParallel& sp, std::vector<double>& trial_finish, Pick& pick) {
  SpStep t = place(items, degree, W, sp, trial_finish);
  if (!(t.makespan < kInfinity)) return false;
  const Score st = score(t, trial_finish);
  if (!(st < pick.bar)) return false;
  pick.bar = st;
  pick.step = std::move(t);
  pick.finish = trial_finish;
  pick.found = true;
  return true;
}

// Where no single move improves: the best pair of moves on two of the kPairCandidates
// costliest items (a clip that must split further only pays once a second one splits to fill
// the ranks it frees). Applies it and returns true where it improves the score.
constexpr int64_t kPairCandidates = 8;

bool pair_move(const std::vector<SpItem>& items, int64_t W, const SequenceParallel& sp,
               const std::vector<int64_t>& costliest, std::vector<int64_t>& degree, SpStep& best,
               std::vector<double>& finish) {
  const int64_t m = std::min<int64_t>(static_cast<int64_t>(costliest.size()), kPairCandidates);
  Pick pick{score(best, finish), {}, {}};
  std::vector<double> trial_finish;
  int64_t pa = -1, pb = -1, da = 0, db = 0;
  for (int64_t x = 0; x < m; ++x) {
    const int64_t a = costliest[x];
    const int64_t a0 = degree[a];
    for (const int64_t ta : moves_of(items, sp, degree, a)) {
      degree[a] = ta;
      for (int64_t y = x + 1; y < m; ++y) {
        const int64_t b = costliest[y];
        const int64_t b0 = degree[b];
        for (const int64_t tb : moves_of(items, sp, degree, b)) {
          degree[b] = tb;
          if (try_degrees(items, degree, W, sp, trial_finish, pick))
            pa = a, pb = b, da = ta, db = tb;
          degree[b] = b0;
        }
      }
      degree[a] = a0;
    }
  }
  if (!pick.found) return false;
  degree[pa] = da;
  degree[pb] = db;
  best = std::move(pick.step);
  finish = std::move(pick.finish);
  return true;
}

// Local search over the degrees: moves that double or halve one item's degree (within
// [min_degree, D]), among the items of the slowest rank and the kCandidates costliest items,
// taking the move that improves the step's score most, while one does (a pair of moves where
// no single one does). `best`, `finish` and `degree` describe the start and are updated in
// place.
constexpr int64_t kCandidates = 16;

void refine(const std::vector<SpItem>& items, int64_t W, const SequenceParallel& sp,
            std::vector<int64_t>& degree, SpStep& best, std::vector<double>& finish) {
  const int64_t n = static_cast<int64_t>(items.size());
  std::vector<int64_t> costliest(n);
  std::iota(costliest.begin(), costliest.end(), 0);
  std::stable_sort(costliest.begin(), costliest.end(),
                   [&](int64_t a, int64_t b) { return items[a].cost > items[b].cost; });
  costliest.resize(std::min(n, kCandidates));
  std::vector<double> trial_finish;
  std::vector<int64_t> candidates;
  std::vector<uint8_t> seen(n);
  // Each accepted move improves the score; the cap only bounds the time.
  for (int64_t round = 0; round < 8 * n + 64; ++round) {
    const int64_t h = std::max_element(finish.begin(), finish.end()) - finish.begin();
    candidates = best.rank_items[h];
    candidates.insert(candidates.end(), costliest.begin(), costliest.end());
    std::fill(seen.begin(), seen.end(), 0);
    int64_t item_moved = -1, moved_to = 0;
    Pick pick{score(best, finish), {}, {}};
    for (int64_t item : candidates) {
      if (seen[item]) continue;
      seen[item] = 1;
      const int64_t d = degree[item];
      for (const int64_t to : moves_of(items, sp, degree, item)) {
        degree[item] = to;
        if (try_degrees(items, degree, W, sp, trial_finish, pick)) item_moved = item, moved_to = to;
        degree[item] = d;
      }
    }
    if (!pick.found) {
      if (!pair_move(items, W, sp, costliest, degree, best, finish)) return;
      continue;
    }
    degree[item_moved] = moved_to;
    best = std::move(pick.step);
    finish = std::move(pick.finish);
  }
}

}  // namespace

SpStep assign_with_degrees(const std::vector<SpItem>& items, int64_t W,
                           const SequenceParallel& sp) {
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t top = sp.max_degree;
  std::vector<int64_t> degree(n);
  double lo = 0.0;  // no step finishes sooner than its longest share at D, or its mean load
  double total = 0.0, reference = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (items[i].min_degree > top)
      invalid("a micro-batch needs " + std::to_string(items[i].min_degree) +
              " ranks to fit max_tokens (and the memory budget), more than sequence_parallel = " +
              std::to_string(top));
    degree[i] = std::max<int64_t>(items[i].min_degree, 1);
    lo = std::max(lo, share_cost(items[i], top, sp));
    const double share = share_cost(items[i], degree[i], sp);
    total += share;
    reference += static_cast<double>(degree[i]) * share;
  }
  lo = std::max(lo, total / static_cast<double>(W));
  std::vector<double> finish, trial_finish;
  SpStep best = place(items, degree, W, sp, finish);
  if (!(best.makespan < kInfinity))
    invalid("a step's " + std::to_string(n) + " micro-batches cannot give each of " +
            std::to_string(W) +
            " ranks one at the degrees max_tokens (and the memory budget) need (raise "
            "micro_batches_per_step or max_tokens)");
  std::vector<int64_t> best_degree = degree;
  // Places the items at `degree`; keeps the placement where it beats the best. Its makespan.
  auto consider = [&]() {
    SpStep t = place(items, degree, W, sp, trial_finish);
    const double makespan = t.makespan;
    if (makespan < kInfinity && score(t, trial_finish) < score(best, finish)) {
      best = std::move(t);
      finish = trial_finish;
      best_degree = degree;
    }
    return makespan;
  };
  // Degrees for a target finish T: each item the fewest ranks whose share is within f * T.
  // The smallest T whose placement finishes by T is bisected (geometrically) between the bound
  // `lo` and the finish at the fewest ranks; every placement tried competes for the best.
  // f = 1 splits only what exceeds T; f = 1/2 also what would leave a rank a gap no smaller
  // item fills.
  const double start_hi = best.makespan;
  for (const double f : {1.0, 0.5}) {
    double low = lo, hi = start_hi;
    for (int64_t it = 0; it < 24 && hi > low * (1.0 + 1e-3); ++it) {
      const double target = std::sqrt(low * hi);
      for (int64_t i = 0; i < n; ++i) {
        int64_t d = std::max<int64_t>(items[i].min_degree, 1);
        while (d < top && share_cost(items[i], d, sp) > f * target) d *= 2;
        degree[i] = d;
      }
      (consider() <= target ? hi : low) = target;
    }
  }
  // Every item at one degree d (its min_degree where higher): where one micro-batch dominates
  // a step, splitting all of them alike keeps the groups in step.
  for (int64_t d = 2; d <= top; d *= 2) {
    for (int64_t i = 0; i < n; ++i) degree[i] = std::max<int64_t>(items[i].min_degree, d);
    consider();
  }
  refine(items, W, sp, best_degree, best, finish);
  best.reference = reference;
  return best;
}

}  // namespace adaptiveload
