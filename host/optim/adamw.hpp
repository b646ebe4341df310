// AdamW through ATen's fused kernel (at::_fused_adamw_), with a tensor learning rate, device
// step counts and a device found-inf flag, so a step never reads device data on the host.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "optim/optimizer_shards.hpp"

namespace keel {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
};

/// One parameter under the optimizer.
struct OptimParam {
  std::string fqn;
  at::Tensor param;   ///< the parameter (its .grad() is read)
  bool decay = true;  ///< weight decay applies
};

/// AdamW state and step over pieces of the parameters (every parameter whole, or this rank's
/// shard of them: optim/optimizer_shards.hpp). Pieces with and without weight decay are
/// stepped as two fused groups; every tensor list is built once.
class AdamW {
 public:
  /// State for `pieces` of `params` (empty: every parameter whole); a step count per parameter.
  AdamW(std::vector<OptimParam> params, AdamWOptions options, std::vector<OptimPiece> pieces = {});
  /// One update with learning rate `lr` (0-dim tensor on the parameters' device); when
  /// `found_inf` (0-dim float, 1.0 = skip) is set the update and the step count are skipped
  /// on device.
  void step(const at::Tensor& lr, const at::Tensor& found_inf);
  /// The managed parameters, in order.
  const std::vector<OptimParam>& params() const { return params_; }
  /// The pieces this optimizer steps, in order.
  const std::vector<OptimPiece>& pieces() const { return pieces_; }
  /// First moments, by piece.
  const std::vector<at::Tensor>& exp_avg() const { return exp_avg_; }
  /// Second moments, by piece.
  const std::vector<at::Tensor>& exp_avg_sq() const { return exp_avg_sq_; }
  /// Step counts (0-dim float tensors), by parameter.
  const std::vector<at::Tensor>& steps() const { return steps_; }
  /// The slice of `tensor` (a parameter, its gradient or a tensor of its shape) `piece` covers.
  static at::Tensor piece_of(const at::Tensor& tensor, const OptimPiece& piece);
  /// Bytes of state AdamW allocates for `pieces` of `params`: two moments of each piece's
  /// shape and dtype and a 4-byte step count per parameter (what the constructor allocates; a
  /// memory plan reads it).
  static int64_t state_bytes(const std::vector<at::Tensor>& params, const std::vector<OptimPiece>& pieces);

 private:
  struct Group {
    double weight_decay = 0;
    std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq, steps;
  };
  std::vector<OptimParam> params_;
  std::vector<OptimPiece> pieces_;
  AdamWOptions options_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_, steps_;
  std::vector<Group> groups_;
};

}  // namespace keel
