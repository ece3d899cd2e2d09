#include "sampler/stream.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "sampler/rng.h"
#include "sampler/sequence_parallel.h"

namespace adaptiveload {

namespace {

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument(what); }

inline uint64_t mix(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Lengths below this are looked up in a dense table (8 MiB of int32 at most); longer ones by
// bisection of the distinct lengths.
constexpr int64_t kDenseLength = int64_t{1} << 21;

int64_t read_at(const void* base, int width, int64_t i) {
  return width == 4 ? static_cast<const int32_t*>(base)[i] : static_cast<const int64_t*>(base)[i];
}

}  // namespace

StreamTable::StreamTable(const void* seq_lens, int lens_width, int64_t n, const void* group_ids,
                         int group_width, CostModel cost)
    : lens_(seq_lens),
      lens_width_(lens_width),
      n_(n),
      groups_(group_ids),
      group_width_(group_width),
      cost_(cost) {
  cost_.validate();
  if (lens_width != 4 && lens_width != 8)
    invalid("seq_lens must be int32 or int64, got " + std::to_string(lens_width) + "-byte values");
  if (group_ids && group_width != 4 && group_width != 8)
    invalid("group_ids must be int32 or int64, got " + std::to_string(group_width) +
            "-byte values");
  if (n < 0) invalid("number of samples must be >= 0");
  if (n > 0 && seq_lens == nullptr) invalid("seq_lens is null");

  // One pass: validate, count per length and per group, digest (four lanes, so that the
  // multiplications of consecutive samples overlap).
  std::vector<int64_t> dense_count;
  std::vector<int64_t> long_lengths;
  uint64_t lane[4] = {1, 2, 3, 4};
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = seq_len(i);
    if (len < 1 || len > kMaxSeqLen)
      invalid("seq_lens[" + std::to_string(i) + "] = " + std::to_string(len) +
              ": sequence lengths must be in [1, 2^40 - 1] tokens");
    if (len > kMaxTokens - total)
      invalid("the samples hold more than 2^62 tokens in all, more than a plan's int64 sums hold");
    total += len;
    if (len < kDenseLength) {
      if (len >= static_cast<int64_t>(dense_count.size()))
        dense_count.resize(std::min(kDenseLength, std::max<int64_t>(2 * len, 1024)), 0);
      ++dense_count[len];
    } else {
      long_lengths.push_back(len);
    }
    uint64_t key = static_cast<uint64_t>(len);
    if (groups_) {
      const int64_t g = read_at(groups_, group_width_, i);
      if (g < 0 || g >= n || g > std::numeric_limits<int32_t>::max())
        invalid("group_ids[" + std::to_string(i) + "] = " + std::to_string(g) +
                ": group ids must be dense, in [0, number of groups)");
      if (g >= num_groups_) {
        num_groups_ = g + 1;
        if (g >= static_cast<int64_t>(group_size_.size())) {
          group_size_.resize(std::max<int64_t>(2 * g, 64), 0);
          group_max_len_.resize(group_size_.size(), 0);
        }
      }
      ++group_size_[g];
      group_max_len_[g] = std::max(group_max_len_[g], len);
      key ^=
          (static_cast<uint64_t>(g) + 1) * 0xff51afd7ed558ccdULL;  // never 0: ids differ from none
    }
    lane[i & 3] = (lane[i & 3] ^ key) * 0x9e3779b97f4a7c15ULL;
  }
  digest_ = mix(mix(mix(mix(static_cast<uint64_t>(n)) ^ lane[0]) ^ lane[1]) ^ lane[2]) ^ lane[3];

  for (int64_t len = 0; len < static_cast<int64_t>(dense_count.size()); ++len)
    if (dense_count[len] > 0) {
      lengths_.push_back(len);
      length_count_.push_back(dense_count[len]);
    }
  std::sort(long_lengths.begin(), long_lengths.end());
  for (size_t j = 0; j < long_lengths.size(); ++j) {
    if (j > 0 && long_lengths[j] == long_lengths[j - 1]) {
      ++length_count_.back();
      continue;
    }
    lengths_.push_back(long_lengths[j]);
    length_count_.push_back(1);
  }
  length_slot_.assign(dense_count.size(), -1);
  for (size_t j = 0; j < lengths_.size() && lengths_[j] < kDenseLength; ++j)
    length_slot_[lengths_[j]] = static_cast<int32_t>(j);
  for (int64_t len : lengths_) length_cost_.push_back(cost_.sample_cost(len));

  if (groups_) {
    group_size_.resize(num_groups_);
    group_max_len_.resize(num_groups_);
    for (int64_t g = 0; g < num_groups_; ++g)
      if (group_size_[g] == 0)
        invalid("group_ids skip id " + std::to_string(g) +
                ": group ids must be dense, in [0, number of groups)");
  } else {
    // The key is the length: distinct lengths numbered in increasing order.
    num_groups_ = static_cast<int64_t>(lengths_.size());
    group_max_len_ = lengths_;
    group_size_ = length_count_;
  }
}

int32_t StreamTable::long_length_index(int64_t i, int64_t len) const {
  const auto it = std::lower_bound(lengths_.begin(), lengths_.end(), len);
  if (it == lengths_.end() || *it != len) length_changed(i, len);
  return static_cast<int32_t>(it - lengths_.begin());
}

void StreamTable::length_changed(int64_t i, int64_t len) const {
  throw DataChanged("the lengths changed under the sampler: index " + std::to_string(i) +
                    " holds " + std::to_string(len) +
                    " tokens, which it did not when the sampler was made (a file rewritten in "
                    "place while mapped?); write a new file and rename it over the old one, then "
                    "make a new sampler");
}

void StreamTable::group_changed(int64_t i, int64_t g) const {
  throw DataChanged("the group ids changed under the sampler: index " + std::to_string(i) +
                    " holds group " + std::to_string(g) + ", outside the [0, " +
                    std::to_string(num_groups_) +
                    ") it was made with (a file rewritten in place while mapped?); write a new "
                    "file and rename it over the old one, then make a new sampler");
}

double StreamTable::default_max_cost(int64_t max_tokens, int64_t max_batch_size) const {
  DefaultCap cap(cost_, nullptr, max_tokens, max_batch_size);
  for (size_t j = 0; j < lengths_.size(); ++j) cap.sample(lengths_[j], length_cost_[j]);
  // Per group, the longest sample that fits whole and how many do (a pass over the data only
  // where some group's longest does not).
  std::vector<int64_t> max_len = group_max_len_, members = group_size_;
  if (std::any_of(max_len.begin(), max_len.end(),
                  [&](int64_t len) { return !cap.fits_whole(len); })) {
    std::fill(max_len.begin(), max_len.end(), 0);
    std::fill(members.begin(), members.end(), 0);
    for (int64_t i = 0; i < n_; ++i) {
      const int64_t len = lengths_[length_index(i, seq_len(i))];
      if (!cap.fits_whole(len)) continue;
      const int32_t g = group(i);
      max_len[g] = std::max(max_len[g], len);
      ++members[g];
    }
  }
  for (int64_t g = 0; g < num_groups_; ++g) cap.group(max_len[g], members[g]);
  return cap.value();
}

std::pair<int64_t, int64_t> StreamTable::oversize(int64_t max_tokens, double max_cost,
                                                  int64_t max_degree) const {
  const Caps caps(cost_, nullptr, max_tokens, 0, max_cost, max_degree);
  std::vector<uint8_t> over(lengths_.size(), 0);
  int64_t count = 0;
  for (size_t j = 0; j < lengths_.size(); ++j)
    if (caps.exceeds(lengths_[j], length_cost_[j])) {
      over[j] = 1;
      count += length_count_[j];
    }
  if (count == 0) return {0, -1};
  for (int64_t i = 0; i < n_; ++i)
    if (over[length_index(i, seq_len(i))]) return {count, i};
  return {count, -1};  // not reached
}

Permutation::Permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle)
    : n_(n), identity_(!shuffle || n <= 1) {
  if (n < 0) invalid("a permutation needs n >= 0");
  int bits = 2;
  while (bits < 62 && (int64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  mask_ = (uint64_t{1} << half_bits_) - 1;
  // A stream of its own: plan_epoch's are 2 * epoch and 2 * epoch + 1 of Rng(seed, .).
  Rng rng(seed ^ 0xd1b54a32d192ed03ULL, static_cast<uint64_t>(epoch));
  for (uint64_t& k : keys_) k = rng.next();
}

namespace {

// The network's four rounds on `count` independent values, in place: a plain loop that the
// compiler turns into vector code. Built for AVX-512DQ and AVX2 besides the baseline and
// chosen once by what the processor has (a 64-bit multiply is one vector instruction with
// AVX-512DQ, a few with AVX2, scalar otherwise); every build computes the same values.
inline __attribute__((always_inline)) void feistel_rounds(uint64_t* x, int64_t count,
                                                          const uint64_t* keys, int half_bits,
                                                          uint64_t mask) {
  const uint64_t k0 = keys[0], k1 = keys[1], k2 = keys[2], k3 = keys[3];
  for (int64_t j = 0; j < count; ++j) {
    uint64_t left = x[j] >> half_bits, right = x[j] & mask, next;
    next = left ^ (mix(right ^ k0) & mask);
    left = right;
    right = next;
    next = left ^ (mix(right ^ k1) & mask);
    left = right;
    right = next;
    next = left ^ (mix(right ^ k2) & mask);
    left = right;
    right = next;
    next = left ^ (mix(right ^ k3) & mask);
    x[j] = (right << half_bits) | next;
  }
}

void feistel_baseline(uint64_t* x, int64_t count, const uint64_t* keys, int half_bits,
                      uint64_t mask) {
  feistel_rounds(x, count, keys, half_bits, mask);
}

#if defined(__GNUC__) && defined(__x86_64__)
__attribute__((target("avx2"))) void feistel_avx2(uint64_t* x, int64_t count, const uint64_t* keys,
                                                  int half_bits, uint64_t mask) {
  feistel_rounds(x, count, keys, half_bits, mask);
}

__attribute__((target("avx512f,avx512dq"))) void feistel_avx512(uint64_t* x, int64_t count,
                                                                const uint64_t* keys, int half_bits,
                                                                uint64_t mask) {
  feistel_rounds(x, count, keys, half_bits, mask);
}
#endif

Permutation::FeistelFn feistel_for(VectorIsa isa) {
  switch (isa) {
#if defined(__GNUC__) && defined(__x86_64__)
    case VectorIsa::kAvx512:
      return feistel_avx512;
    case VectorIsa::kAvx2:
      return feistel_avx2;
#endif
    default:
      return feistel_baseline;
  }
}

VectorIsa best_isa() {
  for (VectorIsa isa : {VectorIsa::kAvx512, VectorIsa::kAvx2})
    if (Permutation::supports(isa)) return isa;
  return VectorIsa::kBaseline;
}

const Permutation::FeistelFn feistel_best = feistel_for(best_isa());

}  // namespace

uint64_t Permutation::feistel(uint64_t x) const {
  feistel_rounds(&x, 1, keys_, half_bits_, mask_);
  return x;
}

bool Permutation::supports(VectorIsa isa) {
#if defined(__GNUC__) && defined(__x86_64__)
  __builtin_cpu_init();
  if (isa == VectorIsa::kAvx512) return __builtin_cpu_supports("avx512dq");
  if (isa == VectorIsa::kAvx2) return __builtin_cpu_supports("avx2");
#endif
  return isa == VectorIsa::kBaseline;
}

void Permutation::fill(int64_t begin, int64_t count, int64_t* out) const {
  fill_blocks(feistel_best, begin, count, out);
}

void Permutation::fill_with(VectorIsa isa, int64_t begin, int64_t count, int64_t* out) const {
  if (!supports(isa)) invalid("Permutation::fill_with: this processor lacks the instruction set");
  fill_blocks(feistel_for(isa), begin, count, out);
}

void Permutation::fill_blocks(FeistelFn rounds, int64_t begin, int64_t count, int64_t* out) const {
  if (count < 0 || begin < 0 || begin > n_ - count)
    invalid("Permutation::fill: " + std::to_string(count) + " positions from " +
            std::to_string(begin) + " are not all in [0, " + std::to_string(n_) + ")");
  if (identity_) {
    for (int64_t j = 0; j < count; ++j) out[j] = begin + j;
    return;
  }
  // A block at a time: every position through the network once, then the values that landed
  // at or above n (cycle walking, as operator() does) gathered and sent round again until none
  // is left.
  constexpr int64_t kBlock = 256;
  uint64_t x[kBlock], again[kBlock];
  int64_t where[kBlock];
  const uint64_t n = static_cast<uint64_t>(n_);
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t m = std::min(kBlock, count - b);
    for (int64_t j = 0; j < m; ++j) x[j] = static_cast<uint64_t>(begin + b + j);
    rounds(x, m, keys_, half_bits_, mask_);
    int64_t k = 0;
    for (int64_t j = 0; j < m; ++j) {
      again[k] = x[j];
      where[k] = j;
      k += x[j] >= n;
    }
    while (k > 0) {
      rounds(again, k, keys_, half_bits_, mask_);
      int64_t left = 0;
      for (int64_t i = 0; i < k; ++i) {
        x[where[i]] = again[i];
        again[left] = again[i];
        where[left] = where[i];
        left += again[i] >= n;
      }
      k = left;
    }
    for (int64_t j = 0; j < m; ++j) out[b + j] = static_cast<int64_t>(x[j]);
  }
}

int64_t Permutation::operator()(int64_t position) const {
  if (identity_) return position;
  // Cycle walking: the network permutes [0, 4^half_bits); following it until it lands below n
  // permutes [0, n). At most 4 times as large, so about 4 rounds at worst on average.
  uint64_t x = static_cast<uint64_t>(position);
  do {
    x = feistel(x);
  } while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

namespace {

// Per distinct length (the table's order), whether a sample of it alone breaks a cap: that
// depends on its length only, so it is decided once per length, not per sample.
std::vector<uint8_t> over_caps(const StreamTable& t, const Caps& caps) {
  std::vector<uint8_t> over(t.num_lengths());
  for (int64_t j = 0; j < t.num_lengths(); ++j)
    over[j] = caps.exceeds(t.length(j), t.length_cost(j));
  return over;
}

}  // namespace

Segment next_segment(const StreamTable& t, const PlanOptions& o, const Permutation& perm,
                     int64_t begin, int64_t min_samples, const int64_t* prefix,
                     int64_t prefix_count) {
  check_plan_options(o);
  const int64_t n = perm.size();
  if (n != t.size()) invalid("the permutation and the table differ in size");
  if (begin < 0 || begin > n || (begin == n && prefix_count == 0))
    invalid("a segment must start in [0, " + std::to_string(n) + "), got " + std::to_string(begin));
  if (min_samples < 1) invalid("min_samples must be >= 1, got " + std::to_string(min_samples));
  if (prefix_count < 0 || (prefix_count > 0 && prefix == nullptr))
    invalid("next_segment: a prefix without samples");
  // A segment holds whole windows of lookahead_steps steps, so that its windows are those a
  // whole-epoch plan has: only the epoch's last may be shorter.
  const int64_t per_step = o.num_replicas * o.micro_batches_per_step;
  if (o.balance && o.lookahead_steps > (int64_t{1} << 40) / per_step)
    invalid("lookahead_steps * num_replicas * micro_batches_per_step must be <= 2^40, got " +
            std::to_string(o.lookahead_steps) + " * " + std::to_string(per_step));
  const int64_t per_window = per_step * (o.balance ? o.lookahead_steps : 1);
  // Packing as plan_bucketed packs (pack_groups), counting micro-batches only: each group's
  // open micro-batch, which a sample joins unless that breaks a cap. What a sample's length
  // decides (over a cap, its cost, its group without group ids) is looked up per distinct
  // length, once; a length or group id the table was not built from throws DataChanged.
  const Caps caps = t.caps(o);
  const std::vector<uint8_t> over = over_caps(t, caps);
  std::vector<double> cost(t.num_lengths());
  for (int64_t j = 0; j < t.num_lengths(); ++j) cost[j] = t.length_cost(j);
  // Per group, with group ids: its open micro-batch.
  std::vector<BatchStats> open(t.has_group_ids() ? t.num_groups() : 0);
  // Per distinct length, without group ids: the open micro-batch's count, the first count at
  // which one more sample breaks a cap (-1 until met), and the stats of the largest count
  // found within the caps so far.
  std::vector<int64_t> open_count, run;
  std::vector<BatchStats> probe;
  if (!t.has_group_ids()) {
    open_count.assign(t.num_lengths(), 0);
    run.assign(t.num_lengths(), -1);
    probe.resize(t.num_lengths());
    for (int64_t j = 0; j < t.num_lengths(); ++j) probe[j].add(t.length(j), cost[j]);
  }
  int64_t count = 0;
  Segment seg;
  seg.begin = begin;
  const int64_t least = std::min(n - begin, min_samples);  // no overflow for any min_samples
  const int64_t expected = std::min(n - begin, least + least / 4) + prefix_count;
  seg.samples.reserve(expected);
  seg.length_of.reserve(expected);
  seg.groups.reserve(expected);
  auto take = [&](int64_t i, int64_t len, int64_t g) {
    const int32_t j = t.length_index(i, len);
    if (over[j]) {
      if (o.oversize != OversizePolicy::kSkip) caps.refuse(i, len, cost[j]);
      seg.skipped.push_back(i);
      return;
    }
    seg.samples.push_back(i);
    seg.length_of.push_back(j);
    if (g < 0) {
      // Without group ids the key is the length: the group's micro-batches hold one length, so
      // whether a sample joins depends only on how many the open one holds (`run`, once known).
      seg.groups.push_back(j);
      int64_t& held = open_count[j];
      if (held == 0 || held == run[j]) {
        ++count;
        held = 1;
        return;
      }
      if (run[j] < 0 && held == probe[j].count) {
        BatchStats grown = probe[j];
        grown.add(len, cost[j]);
        if (caps.breaks(grown)) {
          run[j] = held;
          ++count;
          held = 1;
          return;
        }
        probe[j] = grown;
      }
      ++held;
      return;
    }
    seg.groups.push_back(static_cast<int32_t>(g));
    BatchStats& mb = open[g];
    BatchStats grown = mb;
    grown.add(len, cost[j]);
    if (mb.count == 0 || caps.breaks(grown)) {
      ++count;
      mb = BatchStats{};
      mb.add(len, cost[j]);
    } else {
      mb = grown;
    }
  };
  for (int64_t j = 0; j < prefix_count; ++j) {
    if (prefix[j] < 0 || prefix[j] >= n)
      invalid("next_segment: prefix sample " + std::to_string(prefix[j]) + " out of range");
    take(prefix[j], t.seq_len(prefix[j]), t.has_group_ids() ? t.group(prefix[j]) : -1);
  }
  // Positions a chunk at a time: the chunk's samples first (the permutation is arithmetic),
  // then their lengths and groups (independent random reads, which the processor overlaps; the
  // groups checked as read), then the packing. Reads past the segment's end are only reads.
  constexpr int64_t kChunk = 512;
  int64_t sample[kChunk], length[kChunk], group[kChunk];
  int64_t p = begin;
  bool done = false;
  while (p < n && !done) {
    const int64_t m = std::min(kChunk, n - p);
    perm.fill(p, m, sample);
    for (int64_t j = 0; j < m; ++j) length[j] = t.seq_len(sample[j]);
    if (t.has_group_ids())
      for (int64_t j = 0; j < m; ++j) group[j] = t.group(sample[j]);
    else
      std::fill(group, group + m, int64_t{-1});
    for (int64_t j = 0; j < m; ++j) {
      take(sample[j], length[j], group[j]);
      ++p;
      // A rest shorter than a segment joins this one: no epoch ends on a sliver of a segment.
      if (p - begin >= min_samples && count > 0 && count % per_window == 0 &&
          n - p >= min_samples) {
        done = true;
        break;
      }
    }
  }
  seg.end = p;
  return seg;
}

namespace {

// The plan of samples `keep` within the caps, with their lengths (as indices among the table's
// distinct lengths) and groups as read (`skipped`: those left out), as plan_epoch plans an
// epoch of them.
EpochPlan plan_kept(const StreamTable& t, const PlanOptions& o, std::vector<int64_t>&& keep,
                    std::vector<int32_t>&& length_of, std::vector<int32_t>&& group,
                    std::vector<int64_t>&& skipped, uint64_t key) {
  EpochPlan plan;
  plan.skipped = std::move(skipped);
  // A table of these samples alone (local index j is keep[j]); groups renumbered densely in
  // increasing order of the table's ids.
  const int64_t c = static_cast<int64_t>(keep.size());
  std::vector<int32_t> local_id(t.num_groups(), -1);
  for (int32_t g : group) local_id[g] = 0;
  int64_t G = 0;
  for (int32_t& id : local_id)
    if (id == 0) id = static_cast<int32_t>(G++);
  for (int32_t& g : group) g = local_id[g];
  const SampleTable local =
      SampleTable::of_lengths(length_of.data(), t.lengths_data(), t.length_costs_data(),
                              group.data(), c, G, t.cost_model());
  std::vector<int32_t>().swap(length_of);
  // Grouped in the given order (a stable counting sort): packing takes each group as given.
  std::vector<int64_t> group_begin(G + 1, 0);
  for (int32_t g : group) ++group_begin[g + 1];
  for (int64_t g = 0; g < G; ++g) group_begin[g + 1] += group_begin[g];
  std::vector<int64_t> bucketed(c);
  {
    std::vector<int64_t> next(group_begin.begin(), group_begin.end() - 1);
    for (int64_t j = 0; j < c; ++j) bucketed[next[group[j]]++] = j;
  }
  std::vector<int32_t>().swap(group);
  Rng order_rng(o.seed + 0x9e3779b97f4a7c15ULL * (key + 1), 2 * static_cast<uint64_t>(o.epoch) + 1);
  plan_bucketed(local, o, bucketed, group_begin, order_rng, plan);
  for (int64_t& s : plan.samples) s = keep[s];
  return plan;
}

}  // namespace

EpochPlan plan_segment(const StreamTable& t, const PlanOptions& o, Segment&& seg, uint64_t key) {
  if (seg.length_of.size() != seg.samples.size() || seg.groups.size() != seg.samples.size())
    invalid("plan_segment: the segment's lengths and groups do not match its samples");
  // Planning indexes by them: a segment from elsewhere than next_segment over this table is
  // refused rather than read out of bounds.
  const auto lengths = static_cast<uint64_t>(t.num_lengths());
  const auto groups = static_cast<uint64_t>(t.num_groups());
  for (size_t j = 0; j < seg.samples.size(); ++j)
    if (static_cast<uint64_t>(seg.samples[j]) >= static_cast<uint64_t>(t.size()) ||
        static_cast<uint32_t>(seg.length_of[j]) >= lengths ||
        static_cast<uint32_t>(seg.groups[j]) >= groups)
      invalid("plan_segment: sample " + std::to_string(j) +
              " of the segment is not one next_segment cut from this table");
  return plan_kept(t, o, std::move(seg.samples), std::move(seg.length_of), std::move(seg.groups),
                   std::move(seg.skipped), key);
}

EpochPlan plan_samples(const StreamTable& t, const PlanOptions& o, const int64_t* samples,
                       int64_t count, uint64_t key) {
  if (count < 0 || (count > 0 && samples == nullptr)) invalid("plan_samples: no samples given");
  std::vector<int64_t> keep, skipped;
  std::vector<int32_t> length_of, group;
  keep.reserve(count);
  length_of.reserve(count);
  group.reserve(count);
  const Caps caps = t.caps(o);
  const std::vector<uint8_t> over = over_caps(t, caps);
  for (int64_t j = 0; j < count; ++j) {
    const int64_t i = samples[j];
    if (i < 0 || i >= t.size())
      invalid("sample index " + std::to_string(i) + " out of range (" + std::to_string(t.size()) +
              " samples)");
    const int64_t len = t.seq_len(i);
    const int32_t x = t.length_index(i, len);
    if (over[x]) {
      if (o.oversize != OversizePolicy::kSkip) caps.refuse(i, len, t.length_cost(x));
      skipped.push_back(i);
      continue;
    }
    keep.push_back(i);
    length_of.push_back(x);
    group.push_back(t.has_group_ids() ? t.group(i) : x);  // x: by length
  }
  return plan_kept(t, o, std::move(keep), std::move(length_of), std::move(group),
                   std::move(skipped), key);
}

}  // namespace adaptiveload
