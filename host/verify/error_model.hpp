// The error model for comparing two runs of one job that differ only in how the arithmetic is
// ordered: another parallel layout (another reduction order, other GEMM shapes), or another
// LibTorch CPU kernel set (ATEN_CPU_CAPABILITY=default, avx2, avx512: other vector widths, so
// other summation orders). Each bound below is derived from what the step does, never measured
// on one machine; the suites print each comparison's worst deviation as a fraction of its bound.
//
// The model, per quantity (n = optimizer steps taken, lr = peak learning rate, G = the
// clipper's max_norm, which bounds the 2-norm of every gradient AdamW sees):
//
// 1. Loss and grad norm: rtol 1e-5. Each is a reduction of fp32 values computed through a few
//    layers; another order moves each partial result by O(2^-24) relative, a few hundred such
//    roundings in a row stay below 1e-5 with a margin of about ten.
//
// 2. Gradients, normwise: another reduction order moves every element of a gradient by at most
//    kGradientRtol x its 2-norm (normwise, not elementwise: an element that nearly cancels
//    has a large relative error but a small absolute one). Since ||g|| <= G:
//      |dg_i| <= kGradientRtol G =: e.
//    AdamW's first moment is linear in the gradients, with weights summing to (1 - b1^n):
//      m = (1-b1) sum_k b1^(n-k) g_k      ->  |dm_i| <= (1 - b1^n) e.
//    Its second moment is quadratic, but sqrt(v_i) is a weighted 2-norm of element i's gradient
//    history, sqrt(sum_k (1-b2) b2^(n-k) g_k,i^2), so the triangle inequality gives
//      |d sqrt(v_i)| <= sqrt((1-b2) sum_k b2^(n-k)) e = sqrt(1 - b2^n) e;
//    v is compared through its square root (a bound on v itself would need |g_i| <= G, far
//    looser). The model takes the gradients of both runs at the same parameters; that the
//    parameters' own difference (point 3: large only in the few elements whose gradient
//    cancels) moves the gradients less than e is the model's assumption, checked by every
//    comparison of the moments.
//
// 3. Parameters after AdamW: elementwise, only Adam's own bound holds. The update of an element
//    is lr m_hat / (sqrt(v_hat) + eps): normalised by the element's own gradient RMS, so where a
//    gradient element nearly cancels, a last-bit difference in it (its sign, at the extreme)
//    moves the update anywhere in [-lr U_t, lr U_t]. U_t, the largest |m_hat / sqrt(v_hat)| at
//    step t over every gradient sequence, follows from Cauchy-Schwarz on m's sum against v's:
//      |sum_k b1^(t-k) g_k| <= sqrt(sum_j (b1^2/b2)^j) sqrt(sum_k b2^(t-k) g_k^2), so
//      U_t = (1-b1)/(1-b1^t) sqrt((1-b2^t)/(1-b2)) sqrt(sum_{j<t} (b1^2/b2)^j)
//    (U_1 = 1, exactly the sign of g; U_t is attained, so the bound is tight). Decoupled weight
//    decay multiplies both runs' parameters by the same (1 - lr wd) <= 1, which only shrinks a
//    difference, so after n steps two runs differ by at most
//      |dp_i| <= 2 lr sum_{t<=n} U_t        (the atol; rtol 1e-5 covers fp32 rounding of p).
//    This bound is sound on any CPU and for any layout, and it is loose by design: it holds
//    for any gradients at all, so it catches damaged or mis-loaded parameters, never a wrong
//    gradient. Wrong gradients are caught by (1) and (2), which are tight; and where bitwise
//    equality is guaranteed (the same layout resumed, GPipe against 1F1B) the suites compare
//    bitwise.
//
// 4. DeepSeek-V3's expert bias (aux-loss-free balancing): each step adds c sign(mean - load),
//    centred, so each element moves by at most 2c per step; a token routed to another expert
//    near a score tie flips a sign: |db_i| <= 4 c n.
//
// 5. Step counters (AdamW's, the clipper's): integers, compared exactly.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace keel {

/// Loss and grad norm across layouts and CPU kernels (model point 1).
constexpr double kLossRtol = 1e-5;
/// The normwise relative error of a gradient element: |dg_i| <= kGradientRtol ||g|| (point 2).
constexpr double kGradientRtol = 1e-5;
/// fp32 rounding of a value carried through a run: the rtol paired with every atol below.
constexpr double kValueRtol = 1e-5;

/// |a - b| <= atol + rtol |b|, elementwise (of sqrt(a) and sqrt(b) when `on_sqrt`); both 0
/// means bitwise.
struct Tolerance {
  double rtol = 0, atol = 0;
  bool on_sqrt = false;
};

/// The job facts the bounds depend on (defaults: Keel's AdamW defaults).
struct TrainingBounds {
  double lr = 3e-4;                  ///< the peak learning rate
  double beta1 = 0.9, beta2 = 0.95;  ///< AdamW's betas
  int64_t steps = 0;                 ///< optimizer steps taken by both runs
  double max_grad_norm = 1.0;        ///< the clipper's max_norm: bounds ||g|| as AdamW sees it
  double load_balance_coeff = 0;     ///< DeepSeek-V3's expert-bias rate (0: no such buffer)
};

/// U_t: the largest |m_hat / sqrt(v_hat)| bias-corrected Adam can reach at step t (point 3).
inline double adam_update_bound(double beta1, double beta2, int64_t t) {
  const double ratio = beta1 * beta1 / beta2;
  double geometric = 0, power = 1;
  for (int64_t j = 0; j < t; ++j) geometric += power, power *= ratio;
  return (1 - beta1) / (1 - std::pow(beta1, static_cast<double>(t))) *
         std::sqrt((1 - std::pow(beta2, static_cast<double>(t))) / (1 - beta2)) * std::sqrt(geometric);
}

/// Parameters after `b.steps` AdamW steps: 2 lr sum U_t (point 3).
inline Tolerance parameter_tolerance(const TrainingBounds& b) {
  double sum = 0;
  for (int64_t t = 1; t <= b.steps; ++t) sum += adam_update_bound(b.beta1, b.beta2, t);
  return {kValueRtol, 2 * b.lr * sum};
}

/// AdamW's first moment (point 2).
inline Tolerance exp_avg_tolerance(const TrainingBounds& b) {
  return {kValueRtol, (1 - std::pow(b.beta1, static_cast<double>(b.steps))) * kGradientRtol * b.max_grad_norm};
}

/// AdamW's second moment, compared through its square root (point 2).
inline Tolerance exp_avg_sq_tolerance(const TrainingBounds& b) {
  return {kValueRtol, std::sqrt(1 - std::pow(b.beta2, static_cast<double>(b.steps))) * kGradientRtol * b.max_grad_norm,
          /*on_sqrt=*/true};
}

/// The expert bias of DeepSeek-V3's aux-loss-free balancing (point 4).
inline Tolerance expert_bias_tolerance(const TrainingBounds& b) {
  return {kValueRtol, 4 * b.load_balance_coeff * static_cast<double>(b.steps)};
}

/// The largest |a - b| / (atol + rtol |b|) over the elements (<= 1 passes; bitwise: 0 when
/// equal, infinity otherwise). NaNs in the same places compare equal.
inline double deviation(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol) {
  if (actual.numel() == 0) return 0;
  at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  if (tol.on_sqrt) a = a.sqrt(), e = e.sqrt();
  at::Tensor both_nan = at::isnan(a) & at::isnan(e);
  at::Tensor diff = at::where(both_nan, at::zeros_like(a), (a - e).abs());
  if (at::isnan(diff).any().item<bool>()) return INFINITY;
  at::Tensor bound = tol.atol + tol.rtol * e.abs();
  at::Tensor zero_bound = bound == 0;
  at::Tensor ratio = at::where(zero_bound, at::where(diff == 0, at::zeros_like(a), at::full_like(a, INFINITY)),
                               diff / at::where(zero_bound, at::ones_like(bound), bound));
  return ratio.max().item<double>();
}

/// The relative difference of two scalars (loss, grad norm), to compare with kLossRtol.
inline double relative_difference(double actual, double expected) {
  return std::abs(actual - expected) / std::max(std::abs(expected), 1e-30);
}

}  // namespace keel
