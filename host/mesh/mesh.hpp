// The process mesh: pipeline x data parallel ranks, experts sharded over ep | dp. The layout
// rule is computed here once: rank = pp_index * dp + dp_index, ep_index = dp_index % ep.
#pragma once

#include <memory>
#include <vector>

#include <keel/keel.h>

#include "mesh/c10d_group.hpp"
#include "mesh/group.hpp"

namespace keel {

/// How many link groups the mesh builds over each pp group.
inline constexpr int kMeshPipelineLinks = 4;

/// One rank's coordinates in a pp x dp mesh with ep | dp.
struct MeshLayout {
  int pp = 1, dp = 1, ep = 1;
  int rank = 0;
  int pp_index = 0, dp_index = 0, ep_index = 0, edp_index = 0;

  /// Ranks in the world.
  int world() const { return pp * dp; }
  /// Data-parallel replicas of each expert shard.
  int edp() const { return dp / ep; }
  /// The coordinates of `rank`; throws std::invalid_argument on an impossible layout.
  static MeshLayout compute(int pp, int dp, int ep, int rank);
  /// World rank of the mesh point (pp_index, dp_index).
  int rank_of(int pp_index, int dp_index) const { return pp_index * dp + dp_index; }
  /// The ABI view.
  keel_mesh_info info() const;
};

/// The mesh's groups for this rank, and sub-groups plugins create during setup.
class Mesh {
 public:
  /// A mesh without a rendezvous: every group holds this rank alone. The mesh of a
  /// single-rank job, or one rank's view of a layout for a dry run (no collective may run).
  explicit Mesh(const MeshLayout& layout);
  /// Joins the job's rendezvous and builds this rank's pp, dp, ep, edp and world groups and the
  /// pipeline's link groups on c10d (groups of one rank stay local). [collective: world]
  Mesh(const MeshLayout& layout, const Rendezvous& rendezvous);
  /// A mesh whose groups are built later by connect(): its layout is known at once, so a job
  /// validates everything it can before it waits for the other ranks.
  static std::unique_ptr<Mesh> unconnected(const MeshLayout& layout);
  /// Joins the rendezvous and builds the groups of an unconnected mesh. [collective: world]
  void connect(const Rendezvous& rendezvous);
  ~Mesh();
  /// This rank's layout.
  const MeshLayout& layout() const { return layout_; }
  /// The group of that kind; throws std::logic_error before connect().
  Group& group(keel_group_kind kind);
  /// Link group `link` (0 .. kMeshPipelineLinks - 1) over this rank's pp ranks: groups of the
  /// same members as the pp group but their own communicators, one per kind of pipeline
  /// transfer and direction (pipeline/links.hpp); throws std::logic_error before connect().
  Group& pipeline_link(int link);
  /// A sub-group of the given world ranks; nullptr when this rank is not a member.
  /// [collective: world] (every rank calls it with the same lists in the same order)
  Group* new_group(const std::vector<int>& world_ranks);
  /// The world ranks of the group of `kind` that holds `rank` — the layout rule, in one place.
  static std::vector<int> members(const MeshLayout& layout, keel_group_kind kind);

 private:
  struct Unconnected {};
  Mesh(const MeshLayout& layout, Unconnected) : layout_(layout) {}
  std::unique_ptr<Group> make(const std::string& name, const std::vector<int>& members);

  MeshLayout layout_;
  std::unique_ptr<C10dWorld> world_;
  int sub_groups_made_ = 0;
  std::vector<std::unique_ptr<Group>> groups_;  // by keel_group_kind
  std::vector<std::unique_ptr<Group>> sub_groups_;
  std::vector<std::unique_ptr<Group>> pipeline_links_;
};

}  // namespace keel
