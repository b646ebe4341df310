// Layout-independent weight initialisation for plugin authors: every tensor (every expert
// slice) is drawn from its own CPU generator seeded by (seed, FQN[, index]), then copied to
// the parameter's device, so a sharded or pipelined run starts from the single-rank weights.
// A rule is data (Normal, TruncatedNormal, Constant), written where the parameter is declared.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <string>
#include <variant>

namespace keel::init {

/// The generator seed of (seed, fqn, index): FNV-1a of the FQN mixed with both numbers.
inline uint64_t seed_for(uint64_t seed, const std::string& fqn, int64_t index = -1) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : fqn) h = (h ^ c) * 0x100000001b3ULL;
  h ^= seed + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
  h ^= static_cast<uint64_t>(index + 1) * 0xBF58476D1CE4E5B9ULL;
  h = (h ^ (h >> 31)) * 0x94D049BB133111EBULL;
  return h ^ (h >> 29);
}

/// Fills `param` (any device) with N(0, std^2) drawn on CPU from (seed, fqn, index).
inline void normal_(at::Tensor& param, uint64_t seed, const std::string& fqn, double std, int64_t index = -1) {
  c10::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed_for(seed, fqn, index));
  at::Tensor cpu = at::empty(param.sizes(), at::TensorOptions().dtype(at::kFloat));
  cpu.normal_(0.0, std, gen);
  param.copy_(cpu);
}

/// N(0, std^2) clamped to [-cutoff * std, cutoff * std]: clamping rather than redrawing keeps
/// the number of draws, and so the stream, fixed.
inline void truncated_normal_(at::Tensor& param, uint64_t seed, const std::string& fqn, double std, double cutoff = 3.0,
                              int64_t index = -1) {
  c10::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed_for(seed, fqn, index));
  at::Tensor cpu = at::empty(param.sizes(), at::TensorOptions().dtype(at::kFloat));
  cpu.normal_(0.0, std, gen).clamp_(-cutoff * std, cutoff * std);
  param.copy_(cpu);
}

/// Fills `param` with a constant.
inline void constant_(at::Tensor& param, double value) {
  c10::NoGradGuard no_grad;
  param.fill_(value);
}

/// N(0, std^2), as normal_.
struct Normal {
  double std = 1.0;
};

/// N(0, std^2) clamped at cutoff standard deviations, as truncated_normal_.
struct TruncatedNormal {
  double std = 0.02;
  double cutoff = 3.0;
};

/// A constant, as constant_.
struct Constant {
  double value = 0.0;
};

/// How a parameter or buffer starts: written with its declaration.
using Rule = std::variant<Normal, TruncatedNormal, Constant>;

/// Fills `param` by `rule`, drawing from (seed, fqn, index) as the functions above do.
inline void apply(const Rule& rule, at::Tensor& param, uint64_t seed, const std::string& fqn, int64_t index = -1) {
  if (const auto* n = std::get_if<Normal>(&rule)) {
    normal_(param, seed, fqn, n->std, index);
  } else if (const auto* t = std::get_if<TruncatedNormal>(&rule)) {
    truncated_normal_(param, seed, fqn, t->std, t->cutoff, index);
  } else {
    constant_(param, std::get<Constant>(rule).value);
  }
}

}  // namespace keel::init
