// A weighted mixture of token sources ([[data.sources]]): sample `index` comes from source k
// with probability weight_k / sum(weights), drawn from (seed, index) alone, and is that
// source's own sample `index`. The stream therefore depends only on (seed, index), as every
// source's does: the same at any data-parallel width and across a resume, bitwise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/token_source.hpp"

namespace keel {

/// One source of a mixture and its share.
struct MixturePart {
  std::string name;
  double weight = 1;
  std::unique_ptr<TokenSource> source;
};

/// Sources drawn from by weight, sample by sample.
class MixtureSource final : public TokenSource {
 public:
  /// `parts` non-empty with finite positive weights (the config reader checks, naming keys);
  /// they must agree on the EOS id (or its absence).
  MixtureSource(std::vector<MixturePart> parts, uint64_t seed);
  void sample(uint64_t index, int64_t length, int64_t* out) const override;
  /// The largest of the parts' vocabularies.
  int64_t vocab_size() const override;
  std::string describe() const override;
  std::optional<int64_t> eos_id() const override;
  /// Which part sample `index` is drawn from.
  size_t part_of(uint64_t index) const;
  /// The parts' names, in the order of the configuration.
  std::vector<std::string> part_names() const;

 private:
  std::vector<MixturePart> parts_;
  std::vector<uint64_t> thresholds_;  ///< the cumulative weights scaled to [0, 2^64), last one open
  uint64_t seed_;
};

}  // namespace keel
