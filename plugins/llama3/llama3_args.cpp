#include "llama3_args.hpp"

#include <keel/fields.hpp>

#include <cmath>
#include <vector>

namespace llama3 {

namespace {

// Every [model] key: the member it sets and, for integers, the least value it may take.
const std::vector<keel::Field<Args>>& fields() {
  static const std::vector<keel::Field<Args>> table = {
      {"dim", &Args::dim, 1},
      {"n_layers", &Args::n_layers, 1},
      {"n_heads", &Args::n_heads, 1},
      {"n_kv_heads", &Args::n_kv_heads, 1},
      {"ffn_hidden", &Args::ffn_hidden, 1},
      {"vocab_size", &Args::vocab_size, 1},
      {"rope_theta", &Args::rope_theta},
      {"rope_scaling", &Args::rope_scaling},
      {"rope_factor", &Args::rope_factor},
      {"rope_low_freq_factor", &Args::rope_low_freq_factor},
      {"rope_high_freq_factor", &Args::rope_high_freq_factor},
      {"rope_original_max_position", &Args::rope_original_max_position, 1},
      {"norm_eps", &Args::norm_eps},
      {"tie_embeddings", &Args::tie_embeddings},
  };
  return table;
}

// The named sizes, one per line; a member a row leaves out keeps its default in Args.
const std::vector<keel::Flavor<Args>>& flavors() {
  // clang-format off
  static const std::vector<keel::Flavor<Args>> table = {
      {"tiny",  {.dim = 64,   .n_layers = 2,  .n_heads = 4,  .n_kv_heads = 2, .ffn_hidden = 128,   .vocab_size = 256,    .rope_theta = 10000.0}},
      {"debug", {.dim = 256,  .n_layers = 4,  .n_heads = 8,  .n_kv_heads = 4, .ffn_hidden = 768,   .vocab_size = 2048,   .rope_theta = 10000.0}},
      {"8b",    {.dim = 4096, .n_layers = 32, .n_heads = 32, .n_kv_heads = 8, .ffn_hidden = 14336, .vocab_size = 128256, .rope_theta = 500000.0}},
      // Meta's published Llama 3.1, 3.2 and 3.3 shapes (their config.json files): RoPE scaled for
      // a 128 K context from the original 8192.
      {"3.1-8b",   {.dim = 4096,  .n_layers = 32,  .n_heads = 32,  .n_kv_heads = 8, .ffn_hidden = 14336, .vocab_size = 128256, .rope_theta = 500000.0, .rope_scaling = "llama3", .rope_factor = 8.0}},
      {"3.1-70b",  {.dim = 8192,  .n_layers = 80,  .n_heads = 64,  .n_kv_heads = 8, .ffn_hidden = 28672, .vocab_size = 128256, .rope_theta = 500000.0, .rope_scaling = "llama3", .rope_factor = 8.0}},
      {"3.1-405b", {.dim = 16384, .n_layers = 126, .n_heads = 128, .n_kv_heads = 8, .ffn_hidden = 53248, .vocab_size = 128256, .rope_theta = 500000.0, .rope_scaling = "llama3", .rope_factor = 8.0}},
      {"3.2-1b",   {.dim = 2048,  .n_layers = 16,  .n_heads = 32,  .n_kv_heads = 8, .ffn_hidden = 8192,  .vocab_size = 128256, .rope_theta = 500000.0, .rope_scaling = "llama3", .rope_factor = 32.0, .tie_embeddings = true}},
      {"3.2-3b",   {.dim = 3072,  .n_layers = 28,  .n_heads = 24,  .n_kv_heads = 8, .ffn_hidden = 8192,  .vocab_size = 128256, .rope_theta = 500000.0, .rope_scaling = "llama3", .rope_factor = 32.0, .tie_embeddings = true}},
      {"3.3-70b",  {.dim = 8192,  .n_layers = 80,  .n_heads = 64,  .n_kv_heads = 8, .ffn_hidden = 28672, .vocab_size = 128256, .rope_theta = 500000.0, .rope_scaling = "llama3", .rope_factor = 8.0}},
  };
  // clang-format on
  return table;
}

}  // namespace

std::vector<keel::ConfigKey> config_keys() { return keel::field_keys(flavors(), fields(), "debug"); }

Args read_args(keel::Config& config) {
  Args a = keel::read_fields(config, flavors(), fields(), "debug");
  if (a.dim % a.n_heads != 0)
    config.invalid("n_heads", "must divide dim (" + std::to_string(a.dim) + "), got " + std::to_string(a.n_heads));
  if (a.n_heads % a.n_kv_heads != 0)
    config.invalid("n_kv_heads",
                   "must divide n_heads (" + std::to_string(a.n_heads) + "), got " + std::to_string(a.n_kv_heads));
  if (a.head_dim() % 2 != 0) config.invalid("n_heads", "dim / n_heads must be even for rotary embeddings");
  if (!(a.rope_theta > 0)) config.invalid("rope_theta", "must be positive");
  if (a.rope_scaling != "none" && a.rope_scaling != "llama3")
    config.invalid("rope_scaling", "must be \"none\" or \"llama3\", got \"" + a.rope_scaling + "\"");
  if (a.rope_scaling == "llama3") {
    // transformers' own validity rules for rope_type "llama3".
    if (!(a.rope_factor >= 1) || !std::isfinite(a.rope_factor))
      config.invalid("rope_factor", "must be finite and at least 1");
    if (!(a.rope_low_freq_factor > 0) || !std::isfinite(a.rope_low_freq_factor))
      config.invalid("rope_low_freq_factor", "must be finite and positive");
    if (!(a.rope_high_freq_factor > a.rope_low_freq_factor) || !std::isfinite(a.rope_high_freq_factor))
      config.invalid("rope_high_freq_factor", "must be finite and above rope_low_freq_factor");
  }
  if (!(a.norm_eps > 0)) config.invalid("norm_eps", "must be positive");
  return a;
}

}  // namespace llama3
