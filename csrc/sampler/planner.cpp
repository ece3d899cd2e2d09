#include "sampler/planner.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "sampler/exchanges.h"
#include "sampler/rng.h"
#include "sampler/window_mix.h"

namespace adaptiveload {

namespace {

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument(what); }

// A micro-batch under construction: a range of the bucketed sample array.
struct MicroBatch {
  int64_t begin;
  int64_t end;
  double cost;
  int64_t tokens;
  bool padding;
  int32_t checkpointed;
  int64_t count() const { return end - begin; }
};

void validate_options(const PlanOptions& o) {
  if (o.max_tokens <= 0 || o.max_tokens > kMaxTokens)
    invalid("max_tokens must be in [1, 2^62], got " + std::to_string(o.max_tokens));
  if (o.max_batch_size < 0)
    invalid("max_batch_size must be >= 0 (0: no limit), got " + std::to_string(o.max_batch_size));
  if (!(o.max_cost > 0.0) || !std::isfinite(o.max_cost))
    invalid("max_cost must be finite and > 0, got " + std::to_string(o.max_cost));
  if (o.num_replicas < 1)
    invalid("num_replicas must be >= 1, got " + std::to_string(o.num_replicas));
  if (o.micro_batches_per_step < 1)
    invalid("micro_batches_per_step must be >= 1, got " + std::to_string(o.micro_batches_per_step));
  if (o.num_replicas > kMaxStepMicroBatches ||
      o.micro_batches_per_step > kMaxStepMicroBatches / o.num_replicas)
    invalid("num_replicas * micro_batches_per_step must be <= 2^20 (micro-batches per step), got " +
            std::to_string(o.num_replicas) + " * " + std::to_string(o.micro_batches_per_step));
  if (o.lookahead_steps < 1)
    invalid("lookahead_steps must be >= 1, got " + std::to_string(o.lookahead_steps));
  if (o.uneven_counts && !o.balance)
    invalid("uneven_counts needs balance: without balancing every rank takes K per step");
  if (!(o.mix_tolerance >= 0.0 && o.mix_tolerance <= 1.0))
    invalid("mix_tolerance must be in [0, 1], got " + std::to_string(o.mix_tolerance));
  validate_sequence_parallel(o.sequence_parallel, o.num_replicas);
  if (o.sequence_parallel.enabled() && !o.uneven_counts)
    invalid(
        "sequence_parallel > 1 needs uneven_counts: a rank's count of micro-batches in a "
        "step depends on the groups it joins");
}

double largest_bin(const double* costs, int64_t n_items, int64_t num_bins,
                   const std::vector<int64_t>& bin_of) {
  std::vector<double> load(num_bins, 0.0);
  for (int64_t i = 0; i < n_items; ++i) load[bin_of[i]] += costs[i];
  return *std::max_element(load.begin(), load.end());
}

MicroBatch make_micro_batch(const SampleTable& table, const std::vector<int64_t>& samples,
                            int64_t begin, int64_t end, bool padding) {
  BatchStats stats;
  for (int64_t j = begin; j < end; ++j)
    stats.add(table.seq_len(samples[j]), table.sample_cost(samples[j]));
  return {begin,        end,     table.stats_cost(stats),
          stats.tokens, padding, static_cast<int32_t>(table.checkpointed_blocks(stats))};
}

// pack_groups for a group whose samples all have `len` tokens: whether a sample joins the open
// micro-batch depends only on how many it holds, so the group is cut every `run` samples, run
// being the first count at which one more breaks a cap, and no sample is read.
void pack_uniform(const SampleTable& table, const Caps& caps, int64_t len, double f, int64_t begin,
                  int64_t end, std::vector<MicroBatch>& mbs) {
  auto micro_batch = [&](int64_t first, int64_t count) {
    BatchStats stats;
    for (int64_t j = 0; j < count; ++j) stats.add(len, f);
    return MicroBatch{
        first,        first + count, table.stats_cost(stats),
        stats.tokens, false,         static_cast<int32_t>(table.checkpointed_blocks(stats))};
  };
  BatchStats stats;
  stats.add(len, f);
  int64_t run = 1;
  while (begin + run < end) {
    BatchStats grown = stats;
    grown.add(len, f);
    if (caps.breaks(grown, table.checkpointed_blocks(grown), table.stats_cost(grown))) break;
    stats = grown;
    ++run;
  }
  const MicroBatch full = micro_batch(begin, run);
  for (; begin + run <= end; begin += run)
    mbs.push_back({begin, begin + run, full.cost, full.tokens, false, full.checkpointed});
  if (begin < end) mbs.push_back(micro_batch(begin, end - begin));
}

// Greedy packing of each group's samples, in their (shuffled) order, under the caps.
std::vector<MicroBatch> pack_groups(const SampleTable& table, const Caps& caps,
                                    const std::vector<int64_t>& bucketed,
                                    const std::vector<int64_t>& group_begin) {
  std::vector<MicroBatch> mbs;
  for (size_t g = 0; g + 1 < group_begin.size(); ++g) {
    const int64_t end = group_begin[g + 1];
    int64_t begin = group_begin[g];
    if (begin == end) continue;
    if (const int64_t len = table.group_uniform_len(static_cast<int64_t>(g)); len > 0) {
      pack_uniform(table, caps, len, table.sample_cost(bucketed[begin]), begin, end, mbs);
      continue;
    }
    BatchStats stats;
    double cost = 0.0;
    int64_t ckpt = 0;
    for (int64_t j = begin; j < end; ++j) {
      BatchStats grown = stats;
      grown.add(table.seq_len(bucketed[j]), table.sample_cost(bucketed[j]));
      const int64_t grown_ckpt = table.checkpointed_blocks(grown);
      const double grown_cost = table.stats_cost(grown);
      if (j > begin && caps.breaks(grown, grown_ckpt, grown_cost)) {
        mbs.push_back({begin, j, cost, stats.tokens, false, static_cast<int32_t>(ckpt)});
        begin = j;
        grown = BatchStats{};
        grown.add(table.seq_len(bucketed[j]), table.sample_cost(bucketed[j]));
        stats = grown;
        cost = table.stats_cost(stats);
        ckpt = table.checkpointed_blocks(stats);
        continue;
      }
      stats = grown;
      cost = grown_cost;
      ckpt = grown_ckpt;
    }
    if (end > begin)
      mbs.push_back({begin, end, cost, stats.tokens, false, static_cast<int32_t>(ckpt)});
  }
  return mbs;
}

// Halves micro-batches, the largest first, until `deficit` more are made or none is left to halve
// (returns what is left of it); see fit_to_steps for which ones and where their halves go.
int64_t halve_largest(const SampleTable& table, const std::vector<int64_t>& bucketed,
                      std::vector<MicroBatch>& mbs, int64_t deficit, EpochPlan& plan) {
  const int64_t m = static_cast<int64_t>(mbs.size());
  std::vector<int64_t> place(m);  // per micro-batch: the position of the one it was cut from
  std::iota(place.begin(), place.end(), 0);
  // In the epoch's order: by the place of the micro-batch cut from, then by first sample.
  auto before = [&](int64_t a, int64_t b) {
    return place[a] != place[b] ? place[a] < place[b] : mbs[a].begin < mbs[b].begin;
  };
  std::vector<int64_t> largest;
  int64_t halved = 0;
  while (deficit > 0) {
    // The micro-batches of the most samples, in order; q of them, evenly spaced, are halved.
    int64_t top = 2;
    for (const MicroBatch& mb : mbs) top = std::max(top, mb.count());
    largest.clear();
    for (int64_t i = 0; i < static_cast<int64_t>(mbs.size()); ++i)
      if (mbs[i].count() == top) largest.push_back(i);
    if (largest.empty()) break;
    std::sort(largest.begin(), largest.end(), before);
    const int64_t c = static_cast<int64_t>(largest.size()), q = std::min(deficit, c);
    for (int64_t j = 0; j < q; ++j) {
      const int64_t i = largest[(2 * j + 1) * c / (2 * q)];
      const MicroBatch whole = mbs[i];
      const int64_t mid = whole.begin + whole.count() / 2;
      mbs[i] = make_micro_batch(table, bucketed, whole.begin, mid, false);
      mbs.push_back(make_micro_batch(table, bucketed, mid, whole.end, false));
      place.push_back(place[i]);
    }
    halved += q;
    deficit -= q;
  }
  plan.num_split_micro_batches += halved;
  if (halved > 0) {
    // The pieces of one micro-batch in its place, in their samples' order.
    std::vector<int64_t> order(mbs.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), before);
    std::vector<MicroBatch> placed(mbs.size());
    for (size_t j = 0; j < order.size(); ++j) placed[j] = mbs[order[j]];
    mbs.swap(placed);
  }
  return deficit;
}

// Makes the micro-batch count a multiple of W*K. drop_last drops the smallest
// micro-batches; otherwise the largest ones are halved (no sample repeated), and only
// when nothing is left to halve are single-sample micro-batches of the cheapest
// samples repeated (at the end).
//
// The halves are what makes an epoch's steps unlike one another: the largest micro-batches are
// all of one kind (images, in a video mix), and a step or a window that receives many of their
// halves holds several times the samples of the others. So among micro-batches of equal size the
// ones halved are spread evenly over the epoch's order, and each micro-batch's halves take its
// place in it, balanced or not: every window of lookahead steps (every step, without balancing)
// receives about its share of halves, and the last one no more than the others.
void fit_to_steps(const SampleTable& table, const PlanOptions& o, std::vector<int64_t>& bucketed,
                  std::vector<MicroBatch>& mbs, EpochPlan& plan) {
  const int64_t per_step = o.num_replicas * o.micro_batches_per_step;
  const int64_t m = static_cast<int64_t>(mbs.size());
  const int64_t rem = m % per_step;
  if (rem == 0 || m == 0) return;

  if (o.drop_last) {
    std::vector<int64_t> idx(m);
    std::iota(idx.begin(), idx.end(), 0);
    // Fewest samples first; among equals the latest in order.
    std::nth_element(idx.begin(), idx.begin() + (rem - 1), idx.end(), [&](int64_t a, int64_t b) {
      if (mbs[a].count() != mbs[b].count()) return mbs[a].count() < mbs[b].count();
      return a > b;
    });
    std::vector<uint8_t> drop(m, 0);
    for (int64_t i = 0; i < rem; ++i) {
      drop[idx[i]] = 1;
      plan.num_dropped_samples += mbs[idx[i]].count();
    }
    int64_t w = 0;
    for (int64_t i = 0; i < m; ++i)
      if (!drop[i]) mbs[w++] = mbs[i];
    mbs.resize(w);
    return;
  }

  const int64_t deficit = halve_largest(table, bucketed, mbs, per_step - rem, plan);
  if (deficit == 0) return;

  // Every micro-batch holds one sample: repeat the cheapest samples.
  std::vector<int64_t> active(bucketed.begin(), bucketed.end());
  std::stable_sort(active.begin(), active.end(), [&](int64_t a, int64_t b) {
    return table.single_cost(a) < table.single_cost(b);
  });
  for (int64_t p = 0; p < deficit; ++p) {
    const int64_t pos = static_cast<int64_t>(bucketed.size());
    bucketed.push_back(active[p % static_cast<int64_t>(active.size())]);
    mbs.push_back(make_micro_batch(table, bucketed, pos, pos + 1, true));
    ++plan.num_padded_samples;
  }
}

// A micro-batch of a window, Item (window_mix.h): (predicted cost, index into the epoch's
// micro-batches).

bool by_decreasing_cost(const Item& a, const Item& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Each micro-batch's place among the distinct costs of `mbs`, decreasing, where they are at most
// 64 (micro-batches of one group and one count cost exactly the same, so a segment or an epoch
// often holds a dozen); empty where they are more.
std::vector<uint8_t> cost_ranks(const std::vector<MicroBatch>& mbs) {
  constexpr size_t kMaxDistinct = 64;
  std::vector<double> value;  // the distinct costs, decreasing
  std::vector<uint8_t> rank(mbs.size());
  auto place = [&](double c) {
    return std::lower_bound(value.begin(), value.end(), c, std::greater<double>());
  };
  for (const MicroBatch& mb : mbs) {
    auto it = place(mb.cost);
    if (it != value.end() && *it == mb.cost) continue;
    if (value.size() == kMaxDistinct) return {};
    value.insert(it, mb.cost);
  }
  for (size_t i = 0; i < mbs.size(); ++i)
    rank[i] = static_cast<uint8_t>(place(mbs[i].cost) - value.begin());
  return rank;
}

// Sorts a window's items (given in increasing micro-batch) by decreasing cost, equal costs
// in increasing micro-batch: by_decreasing_cost's order. With each micro-batch's cost rank
// (cost_ranks), a stable counting sort in two passes; otherwise std::sort.
void sort_by_decreasing_cost(std::vector<Item>& items, const std::vector<uint8_t>& rank,
                             std::vector<Item>& scratch) {
  if (rank.empty()) {
    std::sort(items.begin(), items.end(), by_decreasing_cost);
    return;
  }
  int64_t next[257] = {0};
  for (const Item& item : items) ++next[rank[item.second] + 1];
  for (int v = 0; v < 256; ++v) next[v + 1] += next[v];
  scratch.resize(items.size());
  for (const Item& item : items) scratch[next[rank[item.second]]++] = item;
  items.swap(scratch);
}

// Steps of a window mixed from `strata` cost strata: the cost-sorted items are cut into that
// many contiguous strata of whole steps, and each stratum's items, ordered by group and then by
// decreasing cost, are dealt round-robin to its steps, so each step holds every group of its
// stratum in proportion and a spread of its costs. One stratum mixes the whole window; as many
// strata as steps leave the sorted order (steps of similar cost). Each step's items are then in
// decreasing cost (by_decreasing_cost): appended in the sorted order, which needs no sort.
void mix_window(const std::vector<Item>& sorted, const std::vector<int32_t>& item_group,
                int64_t steps, int64_t strata, int64_t per_step, std::vector<Item>& out) {
  out.resize(sorted.size());
  std::vector<int32_t> groups;   // the stratum's groups, as met
  std::vector<int64_t> start;    // per group of the stratum: where its run starts in the deal
  std::vector<int32_t> kind_of;  // per item of the stratum: its group's place in `groups`
  std::vector<int64_t> fill(steps);
  std::unordered_map<int32_t, int32_t> place;  // group -> its place in `groups`
  for (int64_t i = 0; i < strata; ++i) {
    const int64_t s0 = i * steps / strata, s1 = (i + 1) * steps / strata, n = s1 - s0;
    const int64_t p0 = s0 * per_step, p1 = s1 * per_step;
    // The deal takes the stratum stable-sorted by group: group g's j-th item (in sorted order)
    // is dealt at start[g] + j, to step s0 + (start[g] + j) % n.
    groups.clear();
    start.clear();
    place.clear();
    kind_of.resize(p1 - p0);
    int32_t last_group = -1, last_place = -1;
    for (int64_t p = p0; p < p1; ++p) {
      const int32_t g = item_group[sorted[p].second];
      if (g != last_group) {
        auto [it, added] = place.try_emplace(g, static_cast<int32_t>(groups.size()));
        if (added) {
          groups.push_back(g);
          start.push_back(0);
        }
        last_group = g, last_place = it->second;
      }
      kind_of[p - p0] = last_place;
      ++start[last_place];
    }
    std::vector<int32_t> by_group(groups.size());
    std::iota(by_group.begin(), by_group.end(), 0);
    std::sort(by_group.begin(), by_group.end(),
              [&](int32_t a, int32_t b) { return groups[a] < groups[b]; });
    int64_t at = 0;
    for (int32_t k : by_group) {
      const int64_t count = start[k];
      start[k] = at;
      at += count;
    }
    std::fill(fill.begin() + s0, fill.begin() + s1, 0);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t j = start[kind_of[p - p0]]++;
      const int64_t c = s0 + j % n;
      out[c * per_step + fill[c]++] = sorted[p];
    }
  }
}

// Ranks of every item of a window's steps (`ranks`, by position), and the steps' mean
// predicted imbalance 1 - mean / max of the ranks' sums. `improve`: exchanges after LPT.
//
// `limit` > 0 (a trial of a mix): once the steps so far put the mean above `limit`, whatever the
// rest add, the rest are skipped and a mean above `limit` returned (with `ranks` incomplete). A
// step adds 1 - mean / max >= 0 but for rounding, at most (W + 2) * 2^-53 below 0: with the
// margin, a trial given up is one that all its steps fail too.
double assign_window(const std::vector<Item>& arranged, int64_t steps, int64_t W, int64_t K,
                     bool uneven, bool improve, std::vector<int64_t>& ranks, double limit = 0.0) {
  const int64_t per_step = W * K;
  const double rounding = static_cast<double>(W + 2) * 1e-15;  // per step, far above rounding
  ranks.resize(steps * per_step);
  std::vector<double> costs(per_step), load(W);
  std::vector<int64_t> rank_of(per_step);
  double imbalance = 0.0;
  for (int64_t c = 0; c < steps; ++c) {
    for (int64_t j = 0; j < per_step; ++j) costs[j] = arranged[c * per_step + j].first;
    if (uneven) {
      rank_of = assign_uneven(costs.data(), per_step, W);
      if (improve) improve_by_exchanges(costs.data(), per_step, W, true, rank_of);
    } else if (K == 1) {
      // One micro-batch per rank: any assignment is as good as another.
      std::iota(rank_of.begin(), rank_of.end(), 0);
    } else {
      rank_of = assign_to_ranks(costs.data(), per_step, W, K);
      if (improve) improve_by_exchanges(costs.data(), per_step, W, false, rank_of);
    }
    std::fill(load.begin(), load.end(), 0.0);
    for (int64_t j = 0; j < per_step; ++j) load[rank_of[j]] += costs[j];
    const double top = *std::max_element(load.begin(), load.end());
    if (top > 0.0) imbalance += 1.0 - std::accumulate(load.begin(), load.end(), 0.0) / (W * top);
    std::copy(rank_of.begin(), rank_of.end(), ranks.begin() + c * per_step);
    if (limit > 0.0 && imbalance - rounding * static_cast<double>(steps - 1 - c) >
                           limit * static_cast<double>(steps) + 1e-9)
      return limit + 1.0;
  }
  return steps > 0 ? imbalance / static_cast<double>(steps) : 0.0;
}

// Sequence parallelism: one listing of a micro-batch in a rank's list of a step.
struct Listing {
  int64_t mb;
  int32_t degree;
  int32_t member;
};

// A micro-batch as degrees see it: its cost, the parts splitting leaves (the cost model's fixed
// term and its samples' split_kept, and the host floor), its tokens, the shares the cost model
// measured for its kind (where all its samples have one length), and the fewest ranks whose
// shares fit max_tokens (twice the largest degree where none does).
SpItem sp_item(const SampleTable& table, const PlanOptions& o, const std::vector<int64_t>& bucketed,
               const MicroBatch& mb) {
  const CostModel& cm = table.cost_model();
  SpItem it;
  it.cost = mb.cost;
  double kept = cm.batch_overhead();  // what shares pay in full: c0, and per sample split_kept
  for (int64_t j = mb.begin; j < mb.end; ++j) kept += cm.split_kept(table.seq_len(bucketed[j]));
  it.fixed = std::min(kept, mb.cost);
  it.floor = cm.h0 + cm.hs * static_cast<double>(mb.count());
  it.tokens = mb.tokens;
  const int64_t top = o.sequence_parallel.max_degree;
  const int64_t first = table.seq_len(bucketed[mb.begin]);
  bool uniform = cm.num_measured() > 0;
  for (int64_t j = mb.begin; uniform && j < mb.end; ++j)
    uniform = table.seq_len(bucketed[j]) == first;
  if (uniform) {
    it.measured.push_back(0.0);  // degree 1: mb.cost already is what was measured
    for (int64_t d = 2; d <= top; d *= 2)
      it.measured.push_back(cm.measured_share(first, mb.count(), d));
  }
  // With a memory policy each member holds its share's tokens (member 0's, the most) and
  // every sample's text: it checkpoints the blocks that share needs, and runs slower by their
  // factor. The cost model's cost is the fully checkpointed one, which shares split.
  const bool memory = table.has_memory_policy();
  if (memory) {
    BatchStats whole;
    for (int64_t j = mb.begin; j < mb.end; ++j)
      whole.add(table.seq_len(bucketed[j]), table.sample_cost(bucketed[j]));
    it.compute = cm.batch_cost(whole);
    it.fixed = std::min(kept, it.compute);
  }
  it.min_degree = 2 * top;
  for (int64_t d = 1; d <= top; d *= 2) {
    BatchStats share;
    for (int64_t j = mb.begin; j < mb.end; ++j)
      share.add(share_tokens(table.seq_len(bucketed[j]), d, 0), 0.0);
    int64_t blocks = 0;
    if (memory) {
      // At a degree the heads do not divide, a member also holds the whole samples' keys and
      // values for its head shard (MemoryPolicy::held_per_token).
      blocks = table.memory_policy().share_blocks(share, mb.tokens, d);
      it.checkpointed.push_back(blocks);
      it.factor.push_back(blocks < 0 ? 1.0 : table.memory_policy().model.time_factor(blocks));
    }
    if (share.tokens <= o.max_tokens && blocks >= 0 && it.min_degree > top) it.min_degree = d;
  }
  return it;
}

// assign_window with sequence parallelism: each step's degrees, groups and rank lists (`out`),
// and the steps' mean predicted loss, the share of rank time spent waiting or on what splitting
// adds (SpStep::lost): a window whose steps mix only by splitting everything balances well and
// still runs slower, so the tolerance bounds both. `limit` > 0: as assign_window's (a step's
// loss is >= 0 but for rounding).
double assign_window_sp(const std::vector<Item>& arranged, int64_t steps, int64_t W,
                        int64_t per_step, const std::vector<SpItem>& info,
                        const SequenceParallel& sp, std::vector<SpStep>& out, double limit = 0.0) {
  out.resize(steps);
  std::vector<SpItem> step_items(per_step);
  double lost = 0.0;
  for (int64_t c = 0; c < steps; ++c) {
    for (int64_t j = 0; j < per_step; ++j) step_items[j] = info[arranged[c * per_step + j].second];
    out[c] = assign_with_degrees(step_items, W, sp);
    lost += out[c].lost(W);
    if (limit > 0.0 && lost > limit * static_cast<double>(steps) + 1e-9) return limit + 1.0;
  }
  return steps > 0 ? lost / static_cast<double>(steps) : 0.0;
}

// The window's arrangement under the representative rule (PlanOptions::representative). The
// candidates: the window's cost strata 1, 2, 4, ... and one per step, mixed (mix_window), and
// kShuffleDraws uniform shuffles of its micro-batches cut into steps; the shuffles' mean measure
// is the bar (window_mix.h). Those within the bar (and one stratum, the most representative
// arrangement, always) are tried from the most representative on, and a less representative one
// is taken only where it lowers the predicted imbalance by kBalanceStep or more: at about equal
// speed, the closer mix. Returns the strata (0: a shuffle won); `arranged` holds the steps (each
// in decreasing cost) and `ranks` / `sp_steps` their ranks, as the tolerance's trial does.
int64_t representative_window(const std::vector<Item>& sorted,
                              const std::vector<int32_t>& item_group,
                              const std::vector<MicroBatch>& mbs, const PlanOptions& o, int64_t t0,
                              int64_t steps, const std::vector<SpItem>& sp_info,
                              std::vector<Item>& arranged, std::vector<int64_t>& ranks,
                              std::vector<SpStep>& sp_steps) {
  constexpr int kShuffleDraws = 8;
  constexpr double kBalanceStep = 0.005;
  const int64_t W = o.num_replicas, K = o.micro_batches_per_step, per_step = W * K;
  const int64_t first = t0 * per_step, n = steps * per_step;
  std::vector<int32_t> group(n);
  std::vector<int64_t> tokens(n), samples(n);
  for (int64_t i = 0; i < n; ++i) {
    group[i] = item_group[first + i];
    tokens[i] = mbs[first + i].tokens;
    samples[i] = mbs[first + i].count();
  }
  WindowMix window(first, group, tokens, samples);
  struct Candidate {
    std::vector<Item> steps;
    StepMix mix;
    int64_t strata;  // 0: a shuffle
  };
  std::vector<Candidate> candidates;
  // The shuffles have a stream of their own, so that the plan's other draws stay those of the
  // tolerance's rule.
  Rng rng(o.seed ^ 0x9e3779b97f4a7c15ULL, (static_cast<uint64_t>(o.epoch) << 32) + t0);
  StepMix bar;
  // A shuffle of `sorted` cut into steps, each step then in decreasing cost: the positions are
  // shuffled (the same draws as shuffling the items), and `sorted`, read in order, is dealt to
  // the steps its items land in, which leaves each step sorted (by_decreasing_cost is a total
  // order) without sorting.
  std::vector<int64_t> position(n), step_of(n), fill(steps);
  for (int d = 0; d < kShuffleDraws; ++d) {
    Candidate c{std::vector<Item>(n), {}, 0};
    std::iota(position.begin(), position.end(), int64_t{0});
    shuffle_in_place(position, rng);
    for (int64_t p = 0; p < n; ++p) step_of[position[p]] = p / per_step;
    for (int64_t t = 0; t < steps; ++t) fill[t] = t * per_step;
    for (int64_t i = 0; i < n; ++i) c.steps[fill[step_of[i]]++] = sorted[i];
    c.mix = window.measure(c.steps, steps, per_step);
    bar.add(c.mix, 1.0 / kShuffleDraws);
    candidates.push_back(std::move(c));
  }
  int64_t top = 1;
  while (top * 2 < steps) top *= 2;
  for (int64_t s = steps; s >= 1; s = (s == steps ? top : s / 2)) {
    Candidate c{{}, {}, s};
    if (s == steps && steps > 1) {
      c.steps = sorted;
    } else {
      mix_window(sorted, item_group, steps, s, per_step, c.steps);
    }
    c.mix = window.measure(c.steps, steps, per_step);
    candidates.push_back(std::move(c));
    if (s == 1) break;
  }
  // The most representative first: distance relative to the bar's, by tokens and by samples.
  auto distance = [&](const StepMix& m) {
    return m.tokens / std::max(bar.tokens, 1e-12) + m.samples / std::max(bar.samples, 1e-12);
  };
  std::vector<int64_t> order;
  for (int64_t i = 0; i < static_cast<int64_t>(candidates.size()); ++i)
    if (candidates[i].strata == 1 || candidates[i].mix.within(bar)) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return distance(candidates[a].mix) < distance(candidates[b].mix);
  });
  const bool sp_on = o.sequence_parallel.enabled();
  std::vector<int64_t> trial_ranks;
  std::vector<SpStep> trial_sp;
  double best = std::numeric_limits<double>::infinity();
  int64_t strata = 1;
  for (int64_t i : order) {
    Candidate& c = candidates[i];
    const double limit = std::isfinite(best) ? best - kBalanceStep : 0.0;
    if (std::isfinite(best) && limit <= 0.0) break;     // nothing can buy kBalanceStep more
    const bool whole = c.strata == steps && steps > 1;  // as sorted: exchanges do not pay
    const double imbalance =
        sp_on ? assign_window_sp(c.steps, steps, W, per_step, sp_info, o.sequence_parallel,
                                 trial_sp, limit)
              : assign_window(c.steps, steps, W, K, o.uneven_counts, !whole, trial_ranks, limit);
    if (!std::isfinite(best) || imbalance <= limit) {
      best = imbalance;
      strata = c.strata;
      arranged.swap(c.steps);
      ranks.swap(trial_ranks);
      sp_steps.swap(trial_sp);
    }
  }
  return strata;
}

// Flattens a plan with sequence parallelism: the steps' listings in order, each with its
// member's share of the micro-batch's tokens and cost; plan.rank_offsets holds each (step,
// rank)'s count of listings on entry and their first ids on return.
void flatten_listings(const SampleTable& table, const std::vector<int64_t>& bucketed,
                      const std::vector<MicroBatch>& mbs,
                      const std::vector<std::vector<Listing>>& listings, const SequenceParallel& sp,
                      const std::vector<SpItem>& info, EpochPlan& plan) {
  int64_t total = 0;
  for (const auto& step : listings) total += static_cast<int64_t>(step.size());
  int64_t first = 0;
  for (size_t tr = 0; tr + 1 < plan.rank_offsets.size(); ++tr) {
    const int64_t count = plan.rank_offsets[tr];
    plan.rank_offsets[tr] = first;
    first += count;
  }
  plan.rank_offsets.back() = total;
  plan.offsets.assign(1, 0);
  plan.offsets.reserve(total + 1);
  for (const auto& step : listings) {
    for (const Listing& l : step) {
      const MicroBatch& mb = mbs[l.mb];
      int64_t tokens = 0;
      for (int64_t j = mb.begin; j < mb.end; ++j)
        tokens += share_tokens(table.seq_len(bucketed[j]), l.degree, l.member);
      plan.samples.insert(plan.samples.end(), bucketed.begin() + mb.begin,
                          bucketed.begin() + mb.end);
      plan.offsets.push_back(static_cast<int64_t>(plan.samples.size()));
      plan.costs.push_back(share_cost(info[l.mb], l.degree, sp));
      if (table.has_memory_policy()) {
        const size_t level = degree_level(l.degree);
        plan.checkpointed.push_back(static_cast<int32_t>(info[l.mb].checkpointed[level]));
      }
      plan.tokens.push_back(tokens);
      plan.padding.push_back(mb.padding ? 1 : 0);
      plan.degrees.push_back(l.degree);
      plan.members.push_back(l.member);
    }
  }
}

}  // namespace

SampleTable::SampleTable(const int64_t* seq_lens, int64_t n, const int64_t* group_ids,
                         CostModel cost, const MemoryPolicy* memory)
    : cost_(cost) {
  cost_.validate();
  if (memory) {
    memory->model.validate();
    if (!(memory->budget > 0.0) || !std::isfinite(memory->budget))
      invalid("memory budget must be finite and > 0 bytes, got " + std::to_string(memory->budget));
    memory_ = *memory;
    has_memory_ = true;
  }
  if (n < 0) invalid("number of samples must be >= 0");
  if (n > 0 && seq_lens == nullptr) invalid("seq_lens is null");
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (seq_lens[i] < 1 || seq_lens[i] > kMaxSeqLen)
      invalid("seq_lens[" + std::to_string(i) + "] = " + std::to_string(seq_lens[i]) +
              ": sequence lengths must be in [1, 2^40 - 1] tokens");
    if (seq_lens[i] > kMaxTokens - total)
      invalid("the samples hold more than 2^62 tokens in all, more than a plan's int64 sums hold");
    total += seq_lens[i];
  }

  group_.resize(n);
  if (group_ids) {
    // The caller's dense ids (the Python sampler numbers its keys in sorted key order):
    // validated, not renumbered.
    for (int64_t i = 0; i < n; ++i) {
      if (group_ids[i] < 0 || group_ids[i] >= n ||
          group_ids[i] > std::numeric_limits<int32_t>::max())
        invalid("group_ids[" + std::to_string(i) + "] = " + std::to_string(group_ids[i]) +
                ": group ids must be dense, in [0, number of groups)");
      group_[i] = static_cast<int32_t>(group_ids[i]);
      num_groups_ = std::max<int64_t>(num_groups_, group_ids[i] + 1);
    }
  } else {
    // The key is the sequence length: distinct lengths numbered in increasing order.
    std::vector<int64_t> distinct(seq_lens, seq_lens + n);
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    for (int64_t i = 0; i < n; ++i)
      group_[i] = static_cast<int32_t>(
          std::lower_bound(distinct.begin(), distinct.end(), seq_lens[i]) - distinct.begin());
    num_groups_ = static_cast<int64_t>(distinct.size());
  }
  group_max_len_.assign(num_groups_, 0);
  group_size_.assign(num_groups_, 0);
  group_uniform_len_.assign(num_groups_, -1);  // -1: no sample seen yet
  samples_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t g = group_[i];
    group_max_len_[g] = std::max(group_max_len_[g], seq_lens[i]);
    ++group_size_[g];
    if (group_uniform_len_[g] != seq_lens[i])
      group_uniform_len_[g] = group_size_[g] == 1 ? seq_lens[i] : 0;
    samples_[i] = {seq_lens[i], cost_.sample_cost(seq_lens[i])};
  }
  for (int64_t g = 0; g < num_groups_; ++g)
    if (group_size_[g] == 0)
      invalid("group_ids skip id " + std::to_string(g) +
              ": group ids must be dense, in [0, number of groups)");
}

SampleTable SampleTable::of_lengths(const int32_t* length_of, const int64_t* lengths,
                                    const double* costs, const int32_t* group_ids, int64_t n,
                                    int64_t num_groups, const CostModel& cost) {
  SampleTable t;
  t.cost_ = cost;
  t.num_groups_ = num_groups;
  t.samples_.reserve(n);
  t.group_.assign(group_ids, group_ids + n);
  t.group_max_len_.assign(num_groups, 0);
  t.group_size_.assign(num_groups, 0);
  t.group_uniform_len_.assign(num_groups, -1);  // -1: no sample seen yet
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = lengths[length_of[i]];
    const int32_t g = group_ids[i];
    t.group_max_len_[g] = std::max(t.group_max_len_[g], len);
    ++t.group_size_[g];
    if (t.group_uniform_len_[g] != len) t.group_uniform_len_[g] = t.group_size_[g] == 1 ? len : 0;
    t.samples_.push_back({len, costs[length_of[i]]});
  }
  return t;
}

double SampleTable::stats_cost(const BatchStats& b) const {
  return micro_batch_cost(cost_, memory(), b, checkpointed_blocks(b));
}

double SampleTable::batch_cost(const int64_t* indices, int64_t count) const {
  BatchStats stats;
  for (int64_t j = 0; j < count; ++j)
    stats.add(samples_[indices[j]].seq_len, samples_[indices[j]].cost);
  return stats_cost(stats);
}

double SampleTable::single_cost(int64_t i) const {
  BatchStats stats;
  stats.add(samples_[i].seq_len, samples_[i].cost);
  return stats_cost(stats);
}

double SampleTable::default_max_cost(int64_t max_tokens, int64_t max_batch_size) const {
  DefaultCap cap(cost_, memory(), max_tokens, max_batch_size);
  for (const Sample& s : samples_) cap.sample(s.seq_len, s.cost);
  // Per group, the longest sample that fits whole and how many do (a pass over the samples only
  // where some group's longest does not).
  std::vector<int64_t> max_len = group_max_len_, members = group_size_;
  if (std::any_of(max_len.begin(), max_len.end(),
                  [&](int64_t len) { return !cap.fits_whole(len); })) {
    std::fill(max_len.begin(), max_len.end(), 0);
    std::fill(members.begin(), members.end(), 0);
    for (int64_t i = 0; i < size(); ++i) {
      if (!cap.fits_whole(samples_[i].seq_len)) continue;
      max_len[group_[i]] = std::max(max_len[group_[i]], samples_[i].seq_len);
      ++members[group_[i]];
    }
  }
  for (int64_t g = 0; g < num_groups_; ++g) cap.group(max_len[g], members[g]);
  return cap.value();
}

bool SampleTable::exceeds_caps(int64_t i, int64_t max_tokens, double max_cost,
                               int64_t max_degree) const {
  return Caps(cost_, memory(), max_tokens, 0, max_cost, max_degree)
      .exceeds(samples_[i].seq_len, samples_[i].cost);
}

std::vector<int64_t> SampleTable::oversize_samples(int64_t max_tokens, double max_cost,
                                                   int64_t max_degree) const {
  const Caps caps(cost_, memory(), max_tokens, 0, max_cost, max_degree);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < size(); ++i)
    if (caps.exceeds(samples_[i].seq_len, samples_[i].cost)) out.push_back(i);
  return out;
}

namespace {

// The items by decreasing cost, equal costs in increasing index: a stable sort, skipped where
// the costs already decrease (the planner's steps come sorted).
std::vector<int64_t> decreasing_order(const double* costs, int64_t n_items) {
  std::vector<int64_t> order(n_items);
  std::iota(order.begin(), order.end(), 0);
  if (!std::is_sorted(costs, costs + n_items, std::greater<double>()))
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  return order;
}

}  // namespace

namespace {

using Bin = std::pair<double, int64_t>;  // (load, bin): ties go to the lower bin

// LPT with a heap of the open bins.
std::vector<int64_t> lpt_heap(const double* costs, const std::vector<int64_t>& order,
                              int64_t num_bins, int64_t per_bin) {
  std::priority_queue<Bin, std::vector<Bin>, std::greater<Bin>> open;
  for (int64_t b = 0; b < num_bins; ++b) open.push({0.0, b});
  std::vector<int64_t> fill(num_bins, 0), bin_of(order.size());
  for (int64_t item : order) {
    auto [load, b] = open.top();
    open.pop();
    bin_of[item] = b;
    if (++fill[b] < per_bin) open.push({load + costs[item], b});
  }
  return bin_of;
}

// The same LPT with two sorted queues instead of the heap, for items whose costs come in few
// runs of equal cost. Within a run of cost c, bins leave in increasing (load, bin) order and
// come back as (load + c, bin): in increasing order again, so they queue behind one another
// (`back`), and the least open bin is the lesser of the two queues' fronts. At each new run the
// queues are merged. Rounding can give two loads one sum and put a higher bin first; there it
// returns false and the heap decides.
bool lpt_runs(const double* costs, const std::vector<int64_t>& order, int64_t num_bins,
              int64_t per_bin, std::vector<int64_t>& bin_of) {
  std::vector<Bin> front(num_bins), back, merged;
  for (int64_t b = 0; b < num_bins; ++b) front[b] = {0.0, b};
  back.reserve(num_bins);
  std::vector<int64_t> fill(num_bins, 0);
  bin_of.resize(order.size());
  size_t f = 0, k = 0;  // the queues' fronts
  double run = std::numeric_limits<double>::quiet_NaN();
  for (int64_t item : order) {
    const double c = costs[item];
    if (!(c == run)) {
      merged.clear();
      std::merge(front.begin() + f, front.end(), back.begin() + k, back.end(),
                 std::back_inserter(merged));
      front.swap(merged);
      back.clear();
      f = k = 0;
      run = c;
    }
    const Bin least =
        k < back.size() && (f == front.size() || back[k] < front[f]) ? back[k++] : front[f++];
    bin_of[item] = least.second;
    if (++fill[least.second] < per_bin) {
      const Bin next{least.first + c, least.second};
      if (!back.empty() && next < back.back()) return false;
      back.push_back(next);
    }
  }
  return true;
}

}  // namespace

std::vector<int64_t> assign_to_ranks(const double* costs, int64_t n_items, int64_t num_bins,
                                     int64_t per_bin) {
  if (num_bins < 1 || per_bin < 1 || n_items != num_bins * per_bin)
    invalid("assign_to_ranks: need n_items == num_bins * per_bin");
  std::vector<int64_t> order = decreasing_order(costs, n_items);
  // The queues merge once per run of equal costs: worth it while runs are few.
  int64_t runs = 0;
  for (int64_t j = 0; j < n_items && runs <= kLptMaxRuns; ++j)
    runs += j == 0 || costs[order[j]] != costs[order[j - 1]];
  std::vector<int64_t> bin_of;
  if (runs <= kLptMaxRuns && lpt_runs(costs, order, num_bins, per_bin, bin_of)) return bin_of;
  return lpt_heap(costs, order, num_bins, per_bin);
}

std::vector<int64_t> assign_to_ranks_heap(const double* costs, int64_t n_items, int64_t num_bins,
                                          int64_t per_bin) {
  if (num_bins < 1 || per_bin < 1 || n_items != num_bins * per_bin)
    invalid("assign_to_ranks: need n_items == num_bins * per_bin");
  return lpt_heap(costs, decreasing_order(costs, n_items), num_bins, per_bin);
}

std::vector<int64_t> assign_uneven(const double* costs, int64_t n_items, int64_t num_bins) {
  if (num_bins < 1 || n_items < num_bins) invalid("assign_uneven: need n_items >= num_bins >= 1");
  std::vector<int64_t> order = decreasing_order(costs, n_items);
  std::vector<double> load(num_bins, 0.0);
  std::vector<int64_t> count(num_bins, 0), bin_of(n_items);
  using Bin = std::pair<double, int64_t>;  // (load, bin): ties go to the lower bin
  std::priority_queue<Bin, std::vector<Bin>, std::greater<Bin>> open;
  for (int64_t j = 0; j < n_items; ++j) {
    const int64_t item = order[j];
    int64_t b = j;  // the num_bins largest items open a bin each: every bin gets one
    if (j >= num_bins) {
      b = open.top().second;
      open.pop();
    }
    bin_of[item] = b;
    load[b] += costs[item];
    ++count[b];
    open.push({load[b], b});
  }
  // Moves of one item, or swaps of two, between the most and the least loaded bins. Each
  // lowers the sum of squared loads (it shifts d with load[l] + d < load[h]), so the loop
  // ends; the cap only bounds its time.
  std::vector<int64_t> in_h, in_l;
  for (int64_t rounds = 0; rounds < 4 * n_items; ++rounds) {
    const int64_t h = std::max_element(load.begin(), load.end()) - load.begin();
    const int64_t l = std::min_element(load.begin(), load.end()) - load.begin();
    in_h.clear();
    in_l.clear();
    for (int64_t i = 0; i < n_items; ++i) {
      if (bin_of[i] == h) in_h.push_back(i);
      if (bin_of[i] == l) in_l.push_back(i);
    }
    int64_t give = -1, take = -1;
    double best = load[h];
    for (int64_t a : in_h) {
      if (count[h] >= 2) {
        const double after = std::max(load[h] - costs[a], load[l] + costs[a]);
        if (after < best) best = after, give = a, take = -1;
      }
      for (int64_t b : in_l) {
        const double d = costs[a] - costs[b];
        const double after = std::max(load[h] - d, load[l] + d);
        if (d > 0 && after < best) best = after, give = a, take = b;
      }
    }
    if (give < 0) break;
    const double d = costs[give] - (take >= 0 ? costs[take] : 0.0);
    bin_of[give] = l;
    if (take >= 0) {
      bin_of[take] = h;
    } else {
      --count[h];
      ++count[l];
    }
    load[h] -= d;
    load[l] += d;
  }
  if (n_items % num_bins == 0) {
    std::vector<int64_t> even = assign_to_ranks(costs, n_items, num_bins, n_items / num_bins);
    if (largest_bin(costs, n_items, num_bins, even) <=
        largest_bin(costs, n_items, num_bins, bin_of))
      return even;
  }
  return bin_of;
}

namespace {

// The plan's arrays from each slot's micro-batch (slot_item[slot]: its index into mbs).
void flatten_slots(const SampleTable& table, const std::vector<int64_t>& bucketed,
                   const std::vector<MicroBatch>& mbs, const std::vector<int64_t>& slot_item,
                   EpochPlan& plan) {
  const int64_t m = static_cast<int64_t>(slot_item.size());
  plan.offsets.resize(m + 1);
  plan.costs.resize(m);
  plan.tokens.resize(m);
  plan.padding.resize(m);
  if (table.has_memory_policy()) plan.checkpointed.resize(m);
  plan.samples.reserve(bucketed.size());
  plan.offsets[0] = 0;
  for (int64_t slot = 0; slot < m; ++slot) {
    const MicroBatch& mb = mbs[slot_item[slot]];
    plan.samples.insert(plan.samples.end(), bucketed.begin() + mb.begin, bucketed.begin() + mb.end);
    plan.offsets[slot + 1] = static_cast<int64_t>(plan.samples.size());
    plan.costs[slot] = mb.cost;
    plan.tokens[slot] = mb.tokens;
    plan.padding[slot] = mb.padding ? 1 : 0;
    if (table.has_memory_policy()) plan.checkpointed[slot] = mb.checkpointed;
  }
}

// The samples of this epoch within the caps (the others skipped or refused), grouped: a stable
// counting sort by group id (group g is [group_begin[g], group_begin[g + 1])), each group then
// shuffled. The same as a full shuffle followed by a stable sort by group, but every pass over
// the dataset reads it in order.
std::vector<int64_t> bucket_samples(const SampleTable& table, const PlanOptions& o,
                                    const uint8_t* exclude, std::vector<int64_t>& group_begin,
                                    EpochPlan& plan) {
  const int64_t n = table.size();
  const int64_t G = table.num_groups();
  group_begin.assign(G + 1, 0);
  std::vector<uint8_t> take(n, 0);
  const Caps caps = table.caps(o);
  for (int64_t i = 0; i < n; ++i) {
    if (exclude && exclude[i]) continue;
    if (caps.exceeds(table.seq_len(i), table.sample_cost(i))) {
      if (o.oversize == OversizePolicy::kSkip) {
        plan.skipped.push_back(i);
        continue;
      }
      caps.refuse(i, table.seq_len(i), table.sample_cost(i));
    }
    take[i] = 1;
    ++group_begin[table.group(i) + 1];
  }
  for (int64_t g = 0; g < G; ++g) group_begin[g + 1] += group_begin[g];
  std::vector<int64_t> bucketed(group_begin[G]);
  {
    std::vector<int64_t> cursor(group_begin.begin(), group_begin.end() - 1);
    for (int64_t i = 0; i < n; ++i)
      if (take[i]) bucketed[cursor[table.group(i)]++] = i;
  }
  std::vector<uint8_t>().swap(take);
  if (o.shuffle) {
    Rng rng(o.seed, 2 * static_cast<uint64_t>(o.epoch));
    for (int64_t g = 0; g < G; ++g)
      shuffle_range(bucketed.data() + group_begin[g], group_begin[g + 1] - group_begin[g], rng);
  }
  return bucketed;
}

}  // namespace

void check_plan_options(const PlanOptions& options) { validate_options(options); }

EpochPlan plan_epoch(const SampleTable& table, const PlanOptions& o, const uint8_t* exclude) {
  validate_options(o);
  EpochPlan plan;
  // 1. The samples of this epoch, grouped and each group shuffled.
  std::vector<int64_t> group_begin;
  std::vector<int64_t> bucketed = bucket_samples(table, o, exclude, group_begin, plan);
  Rng order_rng(o.seed, 2 * static_cast<uint64_t>(o.epoch) + 1);
  plan_bucketed(table, o, bucketed, group_begin, order_rng, plan);
  return plan;
}

void plan_bucketed(const SampleTable& table, const PlanOptions& o, std::vector<int64_t>& bucketed,
                   const std::vector<int64_t>& group_begin, Rng& order_rng, EpochPlan& plan) {
  validate_options(o);
  const int64_t W = o.num_replicas, K = o.micro_batches_per_step, per_step = W * K;
  plan.num_replicas = W;
  plan.micro_batches_per_step = K;

  // 3. Micro-batches under both caps, then in random order.
  std::vector<MicroBatch> mbs = pack_groups(table, table.caps(o), bucketed, group_begin);
  if (o.shuffle) shuffle_in_place(mbs, order_rng);
  fit_to_steps(table, o, bucketed, mbs, plan);

  const int64_t m = static_cast<int64_t>(mbs.size());
  plan.num_steps = m / per_step;

  // 4. Slot of each micro-batch: slot_item[(t * W + r) * K + k] = index into mbs.
  std::vector<int64_t> slot_item(m);
  if (o.uneven_counts) {
    plan.rank_offsets.assign(plan.num_steps * W + 1, 0);
    plan.rank_offsets.back() = m;
  }
  const bool sp_on = o.sequence_parallel.enabled();
  std::vector<SpItem> sp_info;                 // per micro-batch, with sequence parallelism
  std::vector<SpStep> sp_steps, sp_mixed;      // per step of a window
  std::vector<std::vector<Listing>> listings;  // per step: rank after rank
  if (sp_on) {
    sp_info.reserve(m);
    for (const MicroBatch& mb : mbs) sp_info.push_back(sp_item(table, o, bucketed, mb));
    listings.resize(plan.num_steps);
  }
  if (o.balance) {
    const int64_t L = o.lookahead_steps;
    std::vector<Item> items, mixed, scratch;  // (cost, micro-batch): sorted, and as mixed
    const std::vector<uint8_t> cost_rank = cost_ranks(mbs);
    std::vector<int32_t> item_group(m);
    for (int64_t i = 0; i < m; ++i) item_group[i] = table.group(bucketed[mbs[i].begin]);
    std::vector<int64_t> chunk_order, ranks, mixed_ranks, fill(W);
    for (int64_t t0 = 0; t0 < plan.num_steps; t0 += L) {
      const int64_t steps = std::min(L, plan.num_steps - t0);
      items.resize(steps * per_step);
      for (int64_t j = 0; j < steps * per_step; ++j)
        items[j] = {mbs[t0 * per_step + j].cost, t0 * per_step + j};
      // Decreasing cost; equal costs keep their order.
      sort_by_decreasing_cost(items, cost_rank, scratch);
      chunk_order.resize(steps);
      std::iota(chunk_order.begin(), chunk_order.end(), 0);
      if (o.shuffle) shuffle_in_place(chunk_order, order_rng);
      // The window's steps: cost strata, one per step (steps of similar cost: the best
      // balance), unless fewer, wider strata whose steps mix the groups keep the predicted
      // imbalance within the tolerance; the fewest such strata are taken.
      int64_t strata = steps;
      const std::vector<Item>* arranged = &items;
      if (o.representative) {
        strata = representative_window(items, item_group, mbs, o, t0, steps, sp_info, mixed, ranks,
                                       sp_steps);
        arranged = &mixed;
      } else if (o.mix_tolerance > 0.0) {
        for (int64_t s = 1; s < steps; s *= 2) {
          mix_window(items, item_group, steps, s, per_step, mixed);
          const double imbalance = sp_on ? assign_window_sp(mixed, steps, W, per_step, sp_info,
                                                            o.sequence_parallel, sp_mixed)
                                         : assign_window(mixed, steps, W, K, o.uneven_counts, true,
                                                         mixed_ranks, o.mix_tolerance);
          if (imbalance <= o.mix_tolerance) {
            strata = s;
            arranged = &mixed;
            ranks.swap(mixed_ranks);
            sp_steps.swap(sp_mixed);
            break;
          }
        }
      }
      if (strata == steps && !o.representative) {
        if (sp_on) {
          assign_window_sp(items, steps, W, per_step, sp_info, o.sequence_parallel, sp_steps);
        } else {
          assign_window(items, steps, W, K, o.uneven_counts, false, ranks);
        }
      }
      plan.window_strata.push_back(strata);
      for (int64_t c = 0; c < steps; ++c) {
        const Item* chunk = arranged->data() + c * per_step;
        const int64_t t = t0 + chunk_order[c];
        if (sp_on) {
          // Each rank's listings of the step side by side, in the order it runs them.
          const SpStep& st = sp_steps[c];
          for (int64_t r = 0; r < W; ++r) {
            plan.rank_offsets[t * W + r] = static_cast<int64_t>(st.rank_items[r].size());
            for (int64_t item : st.rank_items[r])
              listings[t].push_back({chunk[item].second, static_cast<int32_t>(st.degree[item]),
                                     static_cast<int32_t>(r - st.first_rank[item])});
          }
          continue;
        }
        const int64_t* rank_of = ranks.data() + c * per_step;
        std::fill(fill.begin(), fill.end(), 0);
        if (o.uneven_counts) {
          // Each rank's micro-batches of the step side by side, in decreasing cost.
          std::vector<int64_t> first(W + 1, 0);
          for (int64_t j = 0; j < per_step; ++j) ++first[rank_of[j] + 1];
          first[0] = t * per_step;
          for (int64_t r = 0; r < W; ++r) {
            first[r + 1] += first[r];
            plan.rank_offsets[t * W + r] = first[r];
          }
          for (int64_t j = 0; j < per_step; ++j) {
            const int64_t r = rank_of[j];
            slot_item[first[r] + fill[r]++] = chunk[j].second;
          }
          continue;
        }
        for (int64_t j = 0; j < per_step; ++j) {
          const int64_t r = rank_of[j];
          slot_item[(t * W + r) * K + fill[r]++] = chunk[j].second;
        }
      }
    }
  } else {
    // Consecutive micro-batches go to consecutive ranks, as bucket samplers do.
    for (int64_t t = 0; t < plan.num_steps; ++t)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t r = 0; r < W; ++r) slot_item[(t * W + r) * K + k] = t * per_step + k * W + r;
  }

  // 5. Flatten.
  if (sp_on) {
    flatten_listings(table, bucketed, mbs, listings, o.sequence_parallel, sp_info, plan);
    return;
  }
  flatten_slots(table, bucketed, mbs, slot_item, plan);
}

}  // namespace adaptiveload
