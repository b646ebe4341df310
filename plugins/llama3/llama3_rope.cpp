#include "llama3_rope.hpp"

#include <cmath>
#include <numbers>

namespace llama3 {

at::Tensor rope_frequencies(const Args& args, const at::TensorOptions& options) {
  const int64_t half = args.head_dim() / 2;
  at::Tensor freqs = at::pow(
      args.rope_theta, at::arange(half, options.dtype(at::kFloat)) * (-2.0 / static_cast<double>(args.head_dim())));
  if (args.rope_scaling != "llama3") return freqs;
  // Wavelengths shorter than original / high_freq_factor keep their frequency, those longer
  // than original / low_freq_factor are slowed by the factor, and those between are blended
  // linearly in original / wavelength.
  const double original = static_cast<double>(args.rope_original_max_position);
  const double low = args.rope_low_freq_factor, high = args.rope_high_freq_factor, factor = args.rope_factor;
  const at::Tensor wavelength = (2 * std::numbers::pi) / freqs;
  const at::Tensor slowed = at::where(wavelength > original / low, freqs / factor, freqs);
  const at::Tensor smooth = (original / wavelength - low) / (high - low);
  const at::Tensor blended = (1 - smooth) * slowed / factor + smooth * slowed;
  const at::Tensor medium = (wavelength >= original / high).logical_and(wavelength <= original / low);
  return at::where(medium, blended, slowed);
}

}  // namespace llama3
