#include "data/synthetic_source.hpp"

#include <cmath>
#include <numeric>
#include <stdexcept>

#include "common/text.hpp"

namespace keel {

SyntheticSource::SyntheticSource(int64_t vocab_size, int64_t branching, uint64_t seed, bool validation)
    : vocab_(vocab_size),
      branching_(branching),
      seed_(seed),
      first_index_(validation ? uint64_t{1} << 63 : 0),
      successor_(static_cast<size_t>(vocab_size)) {
  if (vocab_size < 1 || branching < 1 || branching > vocab_size)
    throw std::invalid_argument(
        cat("synthetic data needs 1 <= branching <= vocab; got branching ", branching, ", vocab ", vocab_size));
  std::iota(successor_.begin(), successor_.end(), int64_t{0});
  uint64_t state = seed ^ 0x5EEDDA7AULL;
  for (size_t i = successor_.size(); i > 1; --i) std::swap(successor_[i - 1], successor_[splitmix64(state) % i]);
}

void SyntheticSource::sample(uint64_t index, int64_t length, int64_t* out) const {
  uint64_t state = seed_ * 0x9E3779B97F4A7C15ULL + (first_index_ + index);
  splitmix64(state);
  if (length <= 0) return;
  auto vocab = static_cast<uint64_t>(vocab_);
  auto branching = static_cast<uint64_t>(branching_);
  out[0] = static_cast<int64_t>(splitmix64(state) % vocab);
  for (int64_t t = 1; t < length; ++t) {
    auto offset = static_cast<int64_t>(splitmix64(state) % branching);
    out[t] = (successor_[static_cast<size_t>(out[t - 1])] + offset) % vocab_;
  }
}

std::string SyntheticSource::describe() const {
  return format("synthetic bigram data%s: vocab %ld, branching %ld, loss floor ln(%ld) = %.4f",
                first_index_ != 0 ? " (validation stream: samples training never draws)" : "",
                static_cast<long>(vocab_), static_cast<long>(branching_), static_cast<long>(branching_),
                std::log(static_cast<double>(branching_)));
}

std::optional<double> SyntheticSource::loss_floor() const { return std::log(static_cast<double>(branching_)); }

}  // namespace keel
