#include "llama3_args.hpp"

#include <map>

namespace llama3 {

namespace {

const std::map<std::string, Args>& flavors() {
  static const std::map<std::string, Args> table = {
      // name    dim   layers heads kv  ffn    vocab   theta     eps
      {"tiny", {64, 2, 4, 2, 128, 256, 10000.0, 1e-5}},
      {"debug", {256, 4, 8, 4, 768, 2048, 10000.0, 1e-5}},
      {"8b", {4096, 32, 32, 8, 14336, 128256, 500000.0, 1e-5}},
  };
  return table;
}

}  // namespace

Args read_args(keel::Config& config) {
  std::string flavor = config.string("flavor", "debug");
  auto it = flavors().find(flavor);
  if (it == flavors().end()) config.invalid("flavor", "unknown flavor '" + flavor + "'; known: tiny, debug, 8b");
  Args a = it->second;
  config.update("dim", a.dim);
  config.update("n_layers", a.n_layers);
  config.update("n_heads", a.n_heads);
  config.update("n_kv_heads", a.n_kv_heads);
  config.update("ffn_hidden", a.ffn_hidden);
  config.update("vocab_size", a.vocab_size);
  config.update("rope_theta", a.rope_theta);
  config.update("norm_eps", a.norm_eps);

  auto positive = [&](const char* key, int64_t v) {
    if (v < 1) config.invalid(key, "must be at least 1, got " + std::to_string(v));
  };
  positive("dim", a.dim);
  positive("n_layers", a.n_layers);
  positive("n_heads", a.n_heads);
  positive("n_kv_heads", a.n_kv_heads);
  positive("ffn_hidden", a.ffn_hidden);
  positive("vocab_size", a.vocab_size);
  if (a.dim % a.n_heads != 0)
    config.invalid("n_heads", "must divide dim (" + std::to_string(a.dim) + "), got " + std::to_string(a.n_heads));
  if (a.n_heads % a.n_kv_heads != 0)
    config.invalid("n_kv_heads",
                   "must divide n_heads (" + std::to_string(a.n_heads) + "), got " + std::to_string(a.n_kv_heads));
  if (a.head_dim() % 2 != 0) config.invalid("n_heads", "dim / n_heads must be even for rotary embeddings");
  if (!(a.rope_theta > 0)) config.invalid("rope_theta", "must be positive");
  if (!(a.norm_eps > 0)) config.invalid("norm_eps", "must be positive");
  return a;
}

}  // namespace llama3
