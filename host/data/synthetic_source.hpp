// The built-in synthetic data: a random bigram process with a known entropy. Each next token
// is successor[previous] + r (mod vocab), r uniform in [0, branching): a model that learns
// the successor table reaches a mean loss of exactly ln(branching) and no model can go lower.
#pragma once

#include <vector>

#include "data/token_source.hpp"

namespace keel {

/// Synthetic sequences with an exactly known loss floor of ln(branching).
class SyntheticSource final : public TokenSource {
 public:
  /// `branching` in [1, vocab]; the successor table is drawn from `seed`. The validation
  /// stream draws its samples from index 2^63 on, which training (below 2^62) never reaches.
  SyntheticSource(int64_t vocab_size, int64_t branching, uint64_t seed, bool validation = false);
  void sample(uint64_t index, int64_t length, int64_t* out) const override;
  int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override;
  std::optional<double> loss_floor() const override;

 private:
  int64_t vocab_;
  int64_t branching_;
  uint64_t seed_;
  uint64_t first_index_;
  std::vector<int64_t> successor_;
};

}  // namespace keel
