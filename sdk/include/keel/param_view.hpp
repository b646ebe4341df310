// keel/param_view.hpp — ParamView, the one C++ accessor for a parameter record
// (keel_param_info): what a clipper receives and what a host or model reads back.
#pragma once

#include <ATen/ATen.h>

#include <keel/keel.h>
#include <keel/host.hpp>

#include <cstddef>
#include <vector>

namespace keel {

/// A cheap, copyable view of one keel_param_info: its version is checked once, on
/// construction; the record must outlive the view.
class ParamView {
 public:
  /// Views `info`; throws Error(KEEL_ERROR_INVALID_ARGUMENT) when it is NULL or older than
  /// SDK 1.0.
  explicit ParamView(const keel_param_info* info) : info_(info) {
    if (info == nullptr || info->struct_size < KEEL_PARAM_INFO_SIZE_1_0)
      throw Error(KEEL_ERROR_INVALID_ARGUMENT, "keel_param_info is NULL or older than SDK 1.0");
  }

  /// The canonical fully qualified name ("layers.3.attn.wq.weight"); never NULL.
  const char* fqn() const { return info_->fqn != nullptr ? info_->fqn : ""; }
  /// The parameter tensor (this rank's shard of it when sharded).
  at::Tensor& tensor() const { return keel::tensor(info_->tensor); }
  /// The tensor's gradient; undefined when it has none (yet).
  at::Tensor grad() const { return tensor().grad(); }
  /// A physical copy of a logical parameter owned elsewhere: excluded from norms and from
  /// checkpoints' writers (KEEL_PARAM_REPLICA).
  bool replica() const { return (info_->flags & KEEL_PARAM_REPLICA) != 0; }
  /// This rank's slice of a tensor sharded over the ep group (KEEL_PARAM_EXPERT).
  bool expert() const { return (info_->flags & KEEL_PARAM_EXPERT) != 0; }
  /// A buffer saved in checkpoints (KEEL_PARAM_PERSISTENT).
  bool persistent() const { return (info_->flags & KEEL_PARAM_PERSISTENT) != 0; }
  /// The sharded dimension, -1 when the tensor is the whole parameter.
  int32_t shard_dim() const { return info_->shard_dim; }
  /// Where this shard starts along shard_dim() in the global tensor.
  int64_t shard_offset() const { return info_->shard_offset; }
  /// The global tensor's size along shard_dim().
  int64_t global_dim_size() const { return info_->global_dim_size; }
  /// The fraction of the parameter one token uses (top_k / n_experts for routed experts).
  double active_fraction() const { return info_->active_fraction; }
  /// The module group the parameter counts under in reports; "main" when the record has none.
  const char* module_group() const { return info_->module_group != nullptr ? info_->module_group : "main"; }
  /// The record itself, for passing back across the ABI.
  const keel_param_info* raw() const { return info_; }

 private:
  const keel_param_info* info_;
};

/// Views of `count` records, in order; throws like ParamView on the first bad one.
inline std::vector<ParamView> param_views(const keel_param_info* const* params, size_t count) {
  std::vector<ParamView> views;
  views.reserve(count);
  for (size_t i = 0; i < count; ++i) views.emplace_back(params[i]);
  return views;
}

}  // namespace keel
