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
  for (int kind = KEEL_GROUP_WORLD; kind <= KEEL_GROUP_EDP; ++kind)
    groups_.push_back(std::make_unique<SoloGroup>(layout.rank));
  for (int link = 0; link < kMeshPipelineLinks; ++link)
    pipeline_links_.push_back(std::make_unique<SoloGroup>(layout.rank));
}

Mesh::Mesh(const MeshLayout& layout, const Rendezvous& rendezvous) : layout_(layout) { connect(rendezvous); }

std::unique_ptr<Mesh> Mesh::unconnected(const MeshLayout& layout) {
  return std::unique_ptr<Mesh>(new Mesh(layout, Unconnected{}));
}

void Mesh::connect(const Rendezvous& rendezvous) {
  if (!groups_.empty()) throw std::logic_error("the mesh is already connected");
  const MeshLayout& layout = layout_;
  if (rendezvous.world_size != layout.world() || rendezvous.rank != layout.rank)
    throw std::invalid_argument(cat("rendezvous of rank ", rendezvous.rank, "/", rendezvous.world_size,
                                    " does not match the layout's rank ", layout.rank, "/", layout.world()));
  if (layout.world() > 1) world_ = std::make_unique<C10dWorld>(rendezvous);
  const char* names[] = {"world", "pp", "dp", "ep", "edp"};
  // Every rank builds its groups in this order, so each group's members meet in it.
  for (int kind = KEEL_GROUP_WORLD; kind <= KEEL_GROUP_EDP; ++kind) {
    std::vector<int> list = members(layout, static_cast<keel_group_kind>(kind));
    std::vector<std::string> ranks;
    for (int r : list) ranks.push_back(std::to_string(r));
    groups_.push_back(make(cat(names[kind], ".", join(ranks, "-")), list));
  }
  const std::vector<int> pp = members(layout, KEEL_GROUP_PP);
  std::vector<std::string> pp_ranks;
  for (int r : pp) pp_ranks.push_back(std::to_string(r));
  for (int link = 0; link < kMeshPipelineLinks; ++link)
    pipeline_links_.push_back(make(cat("pp.", join(pp_ranks, "-"), ".link", link), pp));
}

Mesh::~Mesh() = default;

std::vector<int> Mesh::members(const MeshLayout& m, keel_group_kind kind) {
  std::vector<int> out;
  switch (kind) {
    case KEEL_GROUP_WORLD:
      for (int r = 0; r < m.world(); ++r) out.push_back(r);
      break;
    case KEEL_GROUP_PP:
      for (int p = 0; p < m.pp; ++p) out.push_back(m.rank_of(p, m.dp_index));
      break;
    case KEEL_GROUP_DP:
      for (int d = 0; d < m.dp; ++d) out.push_back(m.rank_of(m.pp_index, d));
      break;
    case KEEL_GROUP_EP:
      for (int e = 0; e < m.ep; ++e) out.push_back(m.rank_of(m.pp_index, m.edp_index * m.ep + e));
      break;
    case KEEL_GROUP_EDP:
      for (int x = 0; x < m.edp(); ++x) out.push_back(m.rank_of(m.pp_index, x * m.ep + m.ep_index));
      break;
  }
  return out;
}

std::unique_ptr<Group> Mesh::make(const std::string& name, const std::vector<int>& list) {
  if (list.size() == 1 || world_ == nullptr) return std::make_unique<SoloGroup>(layout_.rank);
  return world_->make_group(name, list);
}

Group& Mesh::group(keel_group_kind kind) {
  if (kind < KEEL_GROUP_WORLD || kind > KEEL_GROUP_EDP)
    throw std::invalid_argument(cat("unknown group kind ", static_cast<int>(kind)));
  if (groups_.empty())
    throw std::logic_error(
        "mesh groups exist only after the rendezvous: components get them from build_part on, "
        "not in create()");
  return *groups_[static_cast<size_t>(kind)];
}

Group& Mesh::pipeline_link(int link) {
  if (link < 0 || link >= kMeshPipelineLinks) throw std::invalid_argument(cat("unknown pipeline link ", link));
  if (pipeline_links_.empty())
    throw std::logic_error("mesh groups exist only after the rendezvous: the pipeline's links too");
  return *pipeline_links_[static_cast<size_t>(link)];
}

Group* Mesh::new_group(const std::vector<int>& world_ranks) {
  if (world_ranks.empty()) throw std::invalid_argument("new_group: empty rank list");
  if (!std::is_sorted(world_ranks.begin(), world_ranks.end()) ||
      std::adjacent_find(world_ranks.begin(), world_ranks.end()) != world_ranks.end())
    throw std::invalid_argument("new_group: ranks must be sorted and distinct");
  for (int r : world_ranks)
    if (r < 0 || r >= layout_.world()) throw std::invalid_argument(cat("new_group: rank ", r, " outside the world"));
  int index = sub_groups_made_++;
  if (std::find(world_ranks.begin(), world_ranks.end(), layout_.rank) == world_ranks.end()) return nullptr;
  sub_groups_.push_back(make(cat("sub.", index), world_ranks));
  return sub_groups_.back().get();
}

}  // namespace keel
