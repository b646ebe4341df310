// keel/replica.hpp — one logical parameter held on the first and on the last pipeline stage.
//
// A model whose last stage needs a tensor the first stage owns (a tied output head reading the
// token embedding, DeepSeek-V3's MTP embedding its future tokens) declares it on both stages
// under the same FQN, the last stage's copy flagged KEEL_PARAM_REPLICA, and keeps the copies
// exact itself (the host checks, it never repairs):
//   - post_init: each copy receives the first stage's bits (broadcast over the {first stage,
//     last stage} group of its data-parallel replica);
//   - pre_clip, after the host's data-parallel reduction: each copy's gradient becomes the sum
//     of both (SUM all-reduce over the same group; a + b == b + a, so both hold the same bits).
// StageReplicas does both. Where one rank holds both stages (the V of parallelism.schedule =
// "zbv" puts the first and the last stage on pipeline rank 0; SDK 1.8), the copies sit side by
// side: post_init copies the owner's bits into the REPLICA and pre_clip adds the two gradients
// in place (owner += replica, then replica = owner: the bits a two-member SUM gives either
// copy), with no collective. Use:
//   build_part:  if (part holds the tensor) replicas_.hold(tensor, /*replica=*/stage != 0);
//   post_init:   replicas_.post_init(host_, /*shared=*/config says a replica exists);
//   pre_clip:    replicas_.pre_clip(host_);
// pre_clip is capture-safe (no host sync, no allocation: the same collectives on the same
// tensors every step), so a model may declare KEEL_HOOK_PRE_CLIP_CAPTURE_SAFE; it reads only
// the copies' gradients, so a model whose pre_clip does nothing else may also declare
// KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY (the host then reduce-scatters the other gradients when
// the optimizer is sharded, and all-reduces the copies' buckets whole).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <keel/host.hpp>

#include <string>
#include <vector>

namespace keel {

/// The copies, on the first and the last pipeline stage, of parameters the first stage owns.
class StageReplicas {
 public:
  /// Registers a copy this rank holds, the owner (first stage) or the REPLICA (last stage), in
  /// the same order on both stages. The tensor must outlive this object. (SDK 1.8)
  void hold(at::Tensor& copy, bool replica) { (replica ? replicas_ : owners_).push_back(&copy); }
  /// Registers a copy without saying which (before SDK 1.8). It cannot tell two copies on one
  /// rank apart, and under zbv that rank would wait in post_init for a peer holding neither.
  [[deprecated("say which copy: hold(tensor, /*replica=*/stage_index != 0)")]] void hold(at::Tensor& copy) {
    owners_.push_back(&copy);
  }

  /// [once][collective: world] Creates, when `shared` (the layout-independent fact that the
  /// model holds a replica under pipeline parallelism; equal on every rank) and pp > 1, the
  /// {first stage, last stage} group of every data-parallel replica, each rank for every
  /// replica in the same order; then each copy receives the first stage's bits.
  void post_init(const Host& host, bool shared) {
    const keel_mesh_info mesh = host.mesh();
    group_ = nullptr;
    side_by_side_ = !owners_.empty() && !replicas_.empty();
    if (side_by_side_ && owners_.size() != replicas_.size())
      throw Error(KEEL_ERROR_INTERNAL, "StageReplicas: this rank holds " + std::to_string(owners_.size()) +
                                           " owner(s) and " + std::to_string(replicas_.size()) + " REPLICA(s)");
    if (shared && mesh.pp > 1)
      for (int32_t r = 0; r < mesh.dp; ++r) {
        // rank = pp_index * dp + dp_index: replica r's first stage is rank r, its last (pp-1)dp + r.
        keel_group* g = host.new_group({r, (mesh.pp - 1) * mesh.dp + r});
        if (g != nullptr) group_ = g;
      }
    c10::NoGradGuard no_grad;
    if (side_by_side_) {  // both stages here: the other member of the group holds neither
      for (size_t i = 0; i < owners_.size(); ++i) replicas_[i]->detach().copy_(owners_[i]->detach());
      return;
    }
    if (group_ == nullptr) {
      if (shared && mesh.pp > 1 && !(owners_.empty() && replicas_.empty()))
        throw Error(KEEL_ERROR_INTERNAL,
                    "StageReplicas: a copy is held on a rank of neither the first nor the last stage");
      return;
    }
    for (at::Tensor* copy : owners_.empty() ? replicas_ : owners_) {
      at::Tensor data = copy->detach();
      host.broadcast(group_, data, /*root=*/0);  // group rank 0 is the first stage
    }
  }

  /// [every step][collective: {first, last}][capture-safe] After the data-parallel
  /// reduction: every copy's gradient becomes the sum of both copies' gradients.
  void pre_clip(const Host& host) const {
    if (side_by_side_) {
      for (size_t i = 0; i < owners_.size(); ++i) {
        at::Tensor owner = owners_[i]->mutable_grad(), replica = replicas_[i]->mutable_grad();
        if (!owner.defined() || !replica.defined()) continue;
        owner.add_(replica);
        replica.copy_(owner);
      }
      return;
    }
    if (group_ == nullptr) return;
    for (at::Tensor* copy : owners_.empty() ? replicas_ : owners_)
      if (copy->grad().defined()) {
        at::Tensor grad = copy->mutable_grad();
        host.all_reduce(group_, grad, KEEL_REDUCE_SUM);
      }
  }

  /// This rank's {first stage, last stage} group, or nullptr when it holds no shared copy.
  keel_group* group() const { return group_; }

 private:
  std::vector<at::Tensor*> owners_, replicas_;
  keel_group* group_ = nullptr;
  bool side_by_side_ = false;  ///< this rank holds the owners and the REPLICAs
};

}  // namespace keel
