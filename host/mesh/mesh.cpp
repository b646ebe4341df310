#include "mesh/mesh.hpp"

#include <algorithm>
#include <stdexcept>

#include "common/text.hpp"

namespace keel {

MeshLayout MeshLayout::compute(int pp, int dp, int ep, int rank) {
  if (pp < 1 || dp < 1 || ep < 1) throw std::invalid_argument("mesh sizes must be positive");
  if (dp % ep != 0) throw std::invalid_argument(cat("ep (", ep, ") must divide dp (", dp, ")"));
  if (rank < 0 || rank >= pp * dp) throw std::invalid_argument(cat("rank ", rank, " outside a world of ", pp * dp));
  MeshLayout m;
  m.pp = pp;
  m.dp = dp;
  m.ep = ep;
  m.rank = rank;
  m.pp_index = rank / dp;
  m.dp_index = rank % dp;
  m.ep_index = m.dp_index % ep;
  m.edp_index = m.dp_index / ep;
  return m;
}

keel_mesh_info MeshLayout::info() const {
  keel_mesh_info info{};
  info.struct_size = sizeof(info);
  info.rank = rank;
  info.world_size = world();
  info.pp = pp;
  info.dp = dp;
  info.ep = ep;
  info.edp = edp();
  info.pp_index = pp_index;
  info.dp_index = dp_index;
  info.ep_index = ep_index;
  info.edp_index = edp_index;
  return info;
}

Mesh::Mesh(const MeshLayout& layout) : layout_(layout) {
  if (layout.world() != 1)
    throw std::invalid_argument(
        cat("this build runs single-rank meshes only; the layout asks for ", layout.world(), " ranks"));
  for (int kind = KEEL_GROUP_WORLD; kind <= KEEL_GROUP_EDP; ++kind)
    groups_.push_back(std::make_unique<SoloGroup>(layout.rank));
}

Group& Mesh::group(keel_group_kind kind) {
  if (kind < KEEL_GROUP_WORLD || kind > KEEL_GROUP_EDP)
    throw std::invalid_argument(cat("unknown group kind ", static_cast<int>(kind)));
  return *groups_[static_cast<size_t>(kind)];
}

Group* Mesh::new_group(const std::vector<int>& world_ranks) {
  if (world_ranks.empty()) throw std::invalid_argument("new_group: empty rank list");
  if (!std::is_sorted(world_ranks.begin(), world_ranks.end()) ||
      std::adjacent_find(world_ranks.begin(), world_ranks.end()) != world_ranks.end())
    throw std::invalid_argument("new_group: ranks must be sorted and distinct");
  for (int r : world_ranks)
    if (r < 0 || r >= layout_.world()) throw std::invalid_argument(cat("new_group: rank ", r, " outside the world"));
  if (std::find(world_ranks.begin(), world_ranks.end(), layout_.rank) == world_ranks.end()) return nullptr;
  sub_groups_.push_back(std::make_unique<SoloGroup>(layout_.rank));
  return sub_groups_.back().get();
}

}  // namespace keel
