// The tokens a run has drawn from each source of a mixture ([[data.sources]]), for its log.
// Every rank knows the whole stream (a sample's source is a function of its index), so the
// tally needs no collective and a resumed run recounts the steps before it exactly.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/token_source.hpp"

namespace keel {

class MixtureSource;

/// Counts the samples of each mixture source up to a stream position.
class SourceTally {
 public:
  /// Tallies nothing unless `source` is a mixture; `seq_len` tokens count per sample.
  SourceTally(const TokenSource& source, int64_t seq_len);
  /// Tokens drawn from each source by the samples [0, position), by source name; empty when
  /// the run's data is not a mixture.
  std::map<std::string, double> tokens_until(uint64_t position);

 private:
  const MixtureSource* mixture_;
  int64_t seq_len_;
  std::vector<std::string> names_;
  std::vector<uint64_t> samples_;
  uint64_t counted_ = 0;  ///< samples [0, counted_) are in samples_
};

}  // namespace keel
