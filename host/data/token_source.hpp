// Sources of training sequences. A source produces sample `index` of its global stream
// deterministically from its seed, so a run's data depends only on (seed, index): the same at
// any data-parallel width and after a resume.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace keel {

/// SplitMix64: a tiny, well-mixed counter-based generator (exactly specified, unlike the
/// standard library's distributions, so streams are identical across platforms).
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// A deterministic stream of token sequences.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  /// Writes `length` consecutive tokens of sample `index` into `out`.
  virtual void sample(uint64_t index, int64_t length, int64_t* out) const = 0;
  /// Every token is below this.
  virtual int64_t vocab_size() const = 0;
  /// One line describing the source.
  virtual std::string describe() const = 0;
  /// The exact minimum achievable mean next-token loss (nats), when known.
  virtual std::optional<double> loss_floor() const { return std::nullopt; }
  /// The id that ends each document, when the source records one.
  virtual std::optional<int64_t> eos_id() const { return std::nullopt; }
};

}  // namespace keel
