// Llama 3 hyper-parameters: named flavors, overridable key by key from the [model] table.
#pragma once

#include <keel/keel.hpp>
#include <keel/recompute_mode.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace llama3 {

struct Args {
  /// What backward recomputes (the host's training.recompute, set before any part is built;
  /// not a key of the model's table).
  keel::Recompute recompute = keel::Recompute::none;
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t ffn_hidden = 0;
  int64_t vocab_size = 0;
  double rope_theta = 500000.0;
  /// "none" (plain RoPE, Llama 3) or "llama3" (Llama 3.1+'s frequency scaling: wavelengths
  /// beyond the original context divided by rope_factor, those between the two cut-offs blended).
  std::string rope_scaling = "none";
  double rope_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position = 8192;
  double norm_eps = 1e-5;
  bool tie_embeddings = false;  ///< the output head is the token embedding (Llama 3.2 1B/3B)

  int64_t head_dim() const { return dim / n_heads; }
};

/// The flavor named in `model.flavor` (tiny, debug, 8b, 3.1-8b, …) with every key of the table applied
/// on top; impossible shapes are config errors naming the key.
Args read_args(keel::Config& config);

/// Every key read_args() reads: `flavor` and one per field, each with every flavor's value.
std::vector<keel::ConfigKey> config_keys();

}  // namespace llama3
