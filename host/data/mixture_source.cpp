#include "data/mixture_source.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/text.hpp"

namespace keel {

MixtureSource::MixtureSource(std::vector<MixturePart> parts, uint64_t seed) : parts_(std::move(parts)), seed_(seed) {
  if (parts_.empty()) throw std::invalid_argument("a mixture needs at least one source");
  double total = 0;
  for (const MixturePart& p : parts_) {
    if (!(p.weight > 0) || !std::isfinite(p.weight))
      throw std::invalid_argument(cat("mixture source ", p.name, ": weight ", p.weight, " is not finite and positive"));
    total += p.weight;
  }
  // Thresholds in 64-bit fixed point: part k owns draws in [thresholds[k-1], thresholds[k]).
  // Computed once from the weights in double; the draw itself is integer arithmetic only,
  // so every CPU maps an index to the same part.
  double cumulative = 0;
  for (size_t k = 0; k + 1 < parts_.size(); ++k) {
    cumulative += parts_[k].weight;
    const double share = std::min(cumulative / total, 1.0);
    thresholds_.push_back(share >= 1.0 ? UINT64_MAX : static_cast<uint64_t>(std::ldexp(share, 64)));
  }
}

size_t MixtureSource::part_of(uint64_t index) const {
  // A draw of its own: the parts' samples use (their seed, index), this (seed ^ a constant, index).
  uint64_t state = (seed_ ^ 0x6D69787475726521ULL) + index * 0x9E3779B97F4A7C15ULL;
  const uint64_t draw = splitmix64(state);
  return static_cast<size_t>(std::upper_bound(thresholds_.begin(), thresholds_.end(), draw) - thresholds_.begin());
}

void MixtureSource::sample(uint64_t index, int64_t length, int64_t* out) const {
  parts_[part_of(index)].source->sample(index, length, out);
}

int64_t MixtureSource::vocab_size() const {
  int64_t vocab = 0;
  for (const MixturePart& p : parts_) vocab = std::max(vocab, p.source->vocab_size());
  return vocab;
}

std::optional<int64_t> MixtureSource::eos_id() const { return parts_.front().source->eos_id(); }

std::string MixtureSource::describe() const {
  double total = 0;
  for (const MixturePart& p : parts_) total += p.weight;
  std::string out = cat("data: a mixture of ", parts_.size(), " sources");
  for (const MixturePart& p : parts_)
    out += cat("\n  ", p.name, " (", format("%.1f", 100 * p.weight / total), " %): ", p.source->describe());
  return out;
}

std::vector<std::string> MixtureSource::part_names() const {
  std::vector<std::string> names;
  for (const MixturePart& p : parts_) names.push_back(p.name);
  return names;
}

}  // namespace keel
