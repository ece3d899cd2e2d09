#include "sampler/window_mix.h"

#include <cmath>
#include <unordered_map>

namespace adaptiveload {

bool StepMix::within(const StepMix& bar) const {
  return tokens <= bar.tokens * (1.0 + kShuffleSlack) &&
         samples <= bar.samples * (1.0 + kShuffleSlack) && missing <= bar.missing &&
         lacking_kind <= bar.lacking_kind + kLackingSlack;
}

WindowMix::WindowMix(int64_t first, const std::vector<int32_t>& group,
                     const std::vector<int64_t>& tokens, const std::vector<int64_t>& samples)
    : first_(first) {
  std::unordered_map<int32_t, int32_t> place;
  entry_.resize(group.size());
  double all_tokens = 0.0, all_samples = 0.0;
  for (size_t i = 0; i < group.size(); ++i) {
    auto [it, added] = place.try_emplace(group[i], static_cast<int32_t>(share_tokens_.size()));
    if (added) {
      share_tokens_.push_back(0.0);
      share_samples_.push_back(0.0);
    }
    entry_[i] = {it->second, static_cast<int32_t>(samples[i]), tokens[i]};
    share_tokens_[it->second] += static_cast<double>(tokens[i]);
    share_samples_[it->second] += static_cast<double>(samples[i]);
    all_tokens += static_cast<double>(tokens[i]);
    all_samples += static_cast<double>(samples[i]);
  }
  const size_t G = share_tokens_.size();
  major_.assign(G, 0);
  for (size_t g = 0; g < G; ++g) {
    share_tokens_[g] /= all_tokens > 0.0 ? all_tokens : 1.0;
    share_samples_[g] /= all_samples > 0.0 ? all_samples : 1.0;
    major_[g] = share_tokens_[g] > kMajorShare || share_samples_[g] > kMajorShare;
    num_major_ += major_[g];
  }
  // The two kinds: groups by mean length, parted at the geometric mean of the extremes.
  std::vector<double> mean_len(G);
  double shortest = 0.0, longest = 0.0;
  for (size_t g = 0; g < G; ++g) {
    mean_len[g] = share_tokens_[g] * all_tokens / (share_samples_[g] * all_samples);
    shortest = g == 0 ? mean_len[g] : std::min(shortest, mean_len[g]);
    longest = std::max(longest, mean_len[g]);
  }
  const double part = std::sqrt(shortest * longest);
  double kind_tokens[2] = {0.0, 0.0}, kind_samples[2] = {0.0, 0.0};
  long_.assign(G, 0);
  for (size_t g = 0; g < G; ++g) {
    long_[g] = mean_len[g] > part;
    kind_tokens[long_[g]] += share_tokens_[g];
    kind_samples[long_[g]] += share_samples_[g];
  }
  for (int k = 0; k < 2; ++k)
    kinds_major_[k] = kind_tokens[k] > kMajorShare || kind_samples[k] > kMajorShare;
  step_tokens_.assign(G, 0);
  step_samples_.assign(G, 0);
}

StepMix WindowMix::measure(const std::vector<Item>& arranged, int64_t steps, int64_t per_step) {
  StepMix mix;
  for (int64_t c = 0; c < steps; ++c) {
    int64_t all_tokens = 0, all_samples = 0;
    touched_.clear();
    for (int64_t j = 0; j < per_step; ++j) {
      const Entry& e = entry_[arranged[c * per_step + j].second - first_];
      const int32_t g = e.place;
      if (step_tokens_[g] == 0 && step_samples_[g] == 0) touched_.push_back(g);
      step_tokens_[g] += e.tokens;
      step_samples_[g] += e.samples;
      all_tokens += e.tokens;
      all_samples += e.samples;
    }
    // Half the L1 distance over every group: the step's absent groups add their window share,
    // so the sum starts at 1 and each present group replaces its share by its difference.
    double tv_tokens = 1.0, tv_samples = 1.0;
    int64_t majors = 0;
    bool kind_seen[2] = {false, false};
    for (int32_t g : touched_) {
      kind_seen[long_[g]] = true;
      const double t = all_tokens > 0 ? static_cast<double>(step_tokens_[g]) / all_tokens : 0.0;
      const double s = all_samples > 0 ? static_cast<double>(step_samples_[g]) / all_samples : 0.0;
      tv_tokens += std::abs(t - share_tokens_[g]) - share_tokens_[g];
      tv_samples += std::abs(s - share_samples_[g]) - share_samples_[g];
      majors += major_[g];
      step_tokens_[g] = step_samples_[g] = 0;
    }
    mix.tokens += 0.5 * tv_tokens;
    mix.samples += 0.5 * tv_samples;
    if ((kinds_major_[0] && !kind_seen[0]) || (kinds_major_[1] && !kind_seen[1]))
      mix.lacking_kind += 1.0;
    if (num_major_ > 0) mix.missing += static_cast<double>(num_major_ - majors) / num_major_;
  }
  if (steps > 0) {
    mix.tokens /= static_cast<double>(steps);
    mix.samples /= static_cast<double>(steps);
    mix.missing /= static_cast<double>(steps);
    mix.lacking_kind /= static_cast<double>(steps);
  }
  return mix;
}

}  // namespace adaptiveload
