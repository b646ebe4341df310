#include "train/gradient_scatter.hpp"

#include <set>

#include "common/text.hpp"

namespace keel {

std::string why_gradients_stay_whole(const JobConfig& config, const Model& model, const Clipper& clipper) {
  if (!config.parallelism.reduce_scatter_grads) return "parallelism.reduce_scatter_grads = false";
  if (!clipper.takes_gradient_shards())
    return cat(clipper.label(), " offers no KEEL_EXTENSION_CLIPPER_SHARDS (it clips whole gradients)");
  const keel_model_vtable& v = model.vtable();
  if (v.pre_clip != nullptr && (v.hook_flags & KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY) == 0)
    return cat(model.label(),
               " has a pre_clip hook without KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY (it may read any gradient)");
  return "";
}

std::vector<size_t> replicated_parameters(const std::vector<ParamRef>& params, Group& world) {
  // Every rank's REPLICA FQNs, each ended by a NUL (a C string's FQN holds none).
  std::string mine;
  for (const ParamRef& p : params)
    if (p.replica()) mine.append(p.fqn()).push_back('\0');
  std::set<std::string> replicated;
  for (const std::string& text : all_gather_bytes(world, mine))
    for (size_t from = 0, end; from < text.size(); from = end + 1) {
      end = text.find('\0', from);
      if (end == std::string::npos) end = text.size();
      replicated.insert(text.substr(from, end - from));
    }
  std::vector<size_t> out;
  for (size_t i = 0; i < params.size(); ++i)
    if (replicated.count(params[i].fqn()) > 0) out.push_back(i);
  return out;
}

OwnedGradients owned_gradients(const std::vector<ParamRef>& params, const std::vector<OptimPiece>& pieces) {
  OwnedGradients out;
  for (const OptimPiece& piece : pieces) {
    const ParamRef& p = params.at(piece.param);
    at::Tensor grad = p.tensor().grad();
    if (!piece.whole) grad = grad.narrow(0, piece.first_row, piece.rows);
    out.rows.push_back(grad.view({-1}));  // a dim-0 slice of a contiguous view: contiguous
    out.owners.push_back(p.info());
  }
  return out;
}

}  // namespace keel
