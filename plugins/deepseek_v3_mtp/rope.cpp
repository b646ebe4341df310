#include "rope.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace deepseek_v3 {

namespace {

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

double correction_dim(double rotations, double dim, double base, double max_positions) {
  return dim * std::log(max_positions / (rotations * 2 * M_PI)) / (2 * std::log(base));
}

}  // namespace

at::Tensor inverse_frequencies(const Args& a) {
  const int64_t dim = a.qk_rope_head_dim;
  at::Tensor exponents = at::arange(0, dim, 2, at::kFloat) / static_cast<double>(dim);
  at::Tensor pos_freqs = at::pow(a.rope_theta, exponents);
  at::Tensor extrapolation = 1.0 / pos_freqs;
  if (a.rope_factor <= 1.0) return extrapolation;
  at::Tensor interpolation = 1.0 / (a.rope_factor * pos_freqs);
  double low = std::floor(
      correction_dim(a.beta_fast, static_cast<double>(dim), a.rope_theta, static_cast<double>(a.original_seq_len)));
  double high = std::ceil(
      correction_dim(a.beta_slow, static_cast<double>(dim), a.rope_theta, static_cast<double>(a.original_seq_len)));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  at::Tensor extrapolation_factor = 1 - ramp;
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

double attention_factor(const Args& a) {
  if (a.rope_factor <= 1.0) return 1.0;
  if (a.mscale != 0 && a.mscale_all_dim != 0)
    return yarn_mscale(a.rope_factor, a.mscale) / yarn_mscale(a.rope_factor, a.mscale_all_dim);
  return yarn_mscale(a.rope_factor, 1.0);
}

double softmax_scale(const Args& a) {
  double scale = 1.0 / std::sqrt(static_cast<double>(a.qk_head_dim()));
  if (a.rope_factor > 1.0 && a.mscale_all_dim != 0) {
    double m = yarn_mscale(a.rope_factor, a.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

RopeTables rope_tables(const Args& a, int64_t seq, const at::TensorOptions& options) {
  at::Tensor freqs = at::outer(at::arange(seq, at::kFloat), inverse_frequencies(a));
  double factor = attention_factor(a);
  return {(freqs.cos() * factor).to(options), (freqs.sin() * factor).to(options)};
}

RopeTables at_positions(const RopeTables& t, const at::Tensor& positions) {
  const std::vector<int64_t> shape = {positions.size(0), positions.size(1), t.cos.size(1)};
  const at::Tensor flat = positions.flatten();
  return {t.cos.index_select(0, flat).view(shape), t.sin.index_select(0, flat).view(shape)};
}

at::Tensor apply_rope(const at::Tensor& x, const RopeTables& t) {
  auto sizes = x.sizes().vec();
  sizes.back() /= 2;
  sizes.push_back(2);
  at::Tensor pairs = x.reshape(sizes);
  at::Tensor even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
  auto per_position = [](const at::Tensor& table) {  // [batch or 1, seq, 1, rope_dim / 2]
    return table.dim() == 2 ? table.view({1, table.size(0), 1, table.size(1)})
                            : table.view({table.size(0), table.size(1), 1, table.size(2)});
  };
  at::Tensor cos = per_position(t.cos), sin = per_position(t.sin);
  return at::stack({even * cos - odd * sin, odd * cos + even * sin}, -1).flatten(-2);
}

}  // namespace deepseek_v3
