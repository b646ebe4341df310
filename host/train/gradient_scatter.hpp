// Whether a sharded-optimizer job reduce-scatters its gradients, and what the clipper then
// clips. Each member of a reduction group steps only its range of every gradient bucket
// (optim/optimizer_shards.hpp), so only that range needs the reduced sum: a reduce-scatter
// moves half the bytes of an all-reduce. Two hooks read gradients before the optimizer:
//   - the clipper, which must then count and scale only the owned rows (it offers
//     KEEL_EXTENSION_CLIPPER_SHARDS), or every gradient stays whole;
//   - the model's pre_clip, which under KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY reads only REPLICA
//     copies and their owners: the buckets holding those stay all-reduced; a pre_clip without
//     the flag keeps every gradient whole.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include <keel/keel.h>

#include "config/job_config.hpp"
#include "mesh/group.hpp"
#include "optim/optimizer_shards.hpp"
#include "plugins/components.hpp"

namespace keel {

/// Why the job's gradients are all-reduced whole although its optimizer is sharded, for the
/// log; "" when they may be reduce-scattered.
std::string why_gradients_stay_whole(const JobConfig& config, const Model& model, const Clipper& clipper);

/// Indices into `params` of the parameters that have a REPLICA copy somewhere in the world or
/// are one (by FQN), which a model's pre_clip reads whole. [collective: world]
std::vector<size_t> replicated_parameters(const std::vector<ParamRef>& params, Group& world);

/// The rows of this rank's gradients that its optimizer steps: one flat view per piece of
/// `pieces` (into params[piece.param]'s gradient), and the record each view belongs to.
struct OwnedGradients {
  std::vector<at::Tensor> rows;
  std::vector<const keel_param_info*> owners;
};
OwnedGradients owned_gradients(const std::vector<ParamRef>& params, const std::vector<OptimPiece>& pieces);

}  // namespace keel
