// One rank of a real multi-process mesh test: joins the rendezvous from torchrun's
// environment, builds the mesh on Gloo, and checks every host-API collective a plugin can
// call on its groups. Prints "rank R: ok" and exits 0, or names the first wrong result.
//   RANK=r WORLD_SIZE=w MASTER_PORT=p mesh_worker PP DP EP
#include <ATen/ATen.h>

#include <keel/autograd.hpp>
#include <keel/keel.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/host_context.hpp"

namespace {

int rank_ = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::printf("rank %d: FAILED %s\n", rank_, what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const int pp = std::atoi(argv[1]), dp = std::atoi(argv[2]), ep = std::atoi(argv[3]);
  rank_ = std::atoi(std::getenv("RANK"));
  const int world = std::atoi(std::getenv("WORLD_SIZE"));
  keel::MeshLayout layout = keel::MeshLayout::compute(pp, dp, ep, rank_);
  keel::Mesh mesh(layout, keel::Rendezvous::from_environment(rank_, world, std::chrono::seconds(60)));
  keel::StepMetrics metrics;
  keel::HostContext context("test", {&mesh, &metrics});
  keel::Host host(context.raw());
  const keel_mesh_info info = host.mesh();
  expect(info.rank == rank_ && info.world_size == world && info.pp_index == rank_ / dp, "mesh_info coordinates");

  // The pipeline's link groups: the pp group's members, each connected on its own.
  const std::vector<int> pp_members = keel::Mesh::members(layout, KEEL_GROUP_PP);
  for (int link = 0; link < keel::kMeshPipelineLinks; ++link) {
    keel::Group& g = mesh.pipeline_link(link);
    expect(g.world_ranks() == pp_members, "pipeline link membership");
    at::Tensor t = at::full({1}, static_cast<double>(rank_ + link), at::kDouble);
    g.all_reduce(t, KEEL_REDUCE_SUM);
    double sum = 0;
    for (int m : pp_members) sum += m + link;
    expect(t[0].item<double>() == sum, "pipeline link all_reduce");
  }

  for (keel_group_kind kind : {KEEL_GROUP_WORLD, KEEL_GROUP_PP, KEEL_GROUP_DP, KEEL_GROUP_EP, KEEL_GROUP_EDP}) {
    keel_group* g = host.group(kind);
    const int n = host.size(g), me = host.rank(g);
    std::vector<int> members = keel::Mesh::members(layout, kind);
    expect(n == static_cast<int>(members.size()) && members[static_cast<size_t>(me)] == rank_, "group membership");
    // SUM, MAX and AVG of the members' world ranks.
    double sum = 0, max = 0;
    for (int m : members) sum += m, max = std::max(max, static_cast<double>(m));
    at::Tensor t = at::full({3}, static_cast<double>(rank_), at::kDouble);
    host.all_reduce(g, t, KEEL_REDUCE_SUM);
    expect(t[0].item<double>() == sum, "all_reduce SUM");
    at::Tensor m = at::full({2}, static_cast<double>(rank_), at::kDouble);
    host.all_reduce(g, m, KEEL_REDUCE_MAX);
    expect(m[1].item<double>() == max, "all_reduce MAX");
    at::Tensor a = at::full({2}, static_cast<double>(rank_), at::kDouble);
    host.all_reduce(g, a, KEEL_REDUCE_AVG);
    expect(a[0].item<double>() == sum / n, "all_reduce AVG");
    // Broadcast from the last member.
    at::Tensor b = at::full({4}, static_cast<double>(rank_), at::kDouble);
    host.broadcast(g, b, n - 1);
    expect(b[3].item<double>() == members.back(), "broadcast");
    // All-gather and reduce-scatter through the raw ABI.
    at::Tensor mine = at::full({2}, static_cast<double>(rank_), at::kDouble);
    at::Tensor gathered = at::empty({2 * n}, at::kDouble);
    keel::check(context.raw()->api->all_gather(context.raw(), g, keel::handle(gathered), keel::handle(mine), nullptr));
    for (int i = 0; i < n; ++i) expect(gathered[2 * i].item<double>() == members[static_cast<size_t>(i)], "all_gather");
    at::Tensor input = at::arange(2 * n, at::kDouble), slice = at::empty({2}, at::kDouble);
    keel::check(context.raw()->api->reduce_scatter(context.raw(), g, keel::handle(slice), keel::handle(input),
                                                   KEEL_REDUCE_SUM, nullptr));
    expect(slice[0].item<double>() == 2.0 * me * n, "reduce_scatter");
    // The host's own reduce-scatter in place, uneven: member j receives j elements (member 0
    // none), the rest keeps this rank's values.
    {
      std::vector<int64_t> cuts{0};
      for (int j = 0; j < n; ++j) cuts.push_back(cuts.back() + j);
      at::Tensor flat = at::full({cuts.back()}, static_cast<double>(rank_ + 1), at::kDouble);
      std::unique_ptr<keel::Work> work = mesh.group(kind).reduce_scatter_async(flat, cuts, KEEL_REDUCE_SUM);
      if (work) work->wait();
      for (int64_t i = 0; i < flat.numel(); ++i) {
        const bool mine_row = i >= cuts[static_cast<size_t>(me)] && i < cuts[static_cast<size_t>(me) + 1];
        expect(flat[i].item<double>() == (mine_row ? sum + n : rank_ + 1.0), "reduce_scatter_async");
      }
    }
    // All-to-all with uneven splits: member i sends i + 1 rows to every member.
    std::vector<int64_t> in_splits(static_cast<size_t>(n), me + 1), out_splits;
    for (int i = 0; i < n; ++i) out_splits.push_back(i + 1);
    at::Tensor send = at::full({n * (me + 1), 2}, static_cast<double>(rank_), at::kDouble);
    at::Tensor recv = at::empty({n * (n + 1) / 2, 2}, at::kDouble);
    host.all_to_all(g, recv, send, out_splits, in_splits);
    for (int i = 0, row = 0; i < n; row += i + 1, ++i)
      expect(recv[row][0].item<double>() == members[static_cast<size_t>(i)], "all_to_all");
    // The differentiable all-to-all: forward as above, backward the reverse exchange. Each
    // receiver scales what it got by (its world rank + 1), so the rows this member sent to
    // member j come back with gradient members[j] + 1.
    at::Tensor rows = send.clone().requires_grad_(true);
    at::Tensor arrived = keel::autograd::all_to_all(host, g, rows, out_splits, in_splits);
    expect(at::equal(arrived.detach(), recv), "differentiable all_to_all forward");
    (arrived * static_cast<double>(rank_ + 1)).sum().backward();
    for (int j = 0; j < n; ++j)
      expect(rows.grad()[j * (me + 1)][0].item<double>() == members[static_cast<size_t>(j)] + 1.0,
             "differentiable all_to_all backward");
  }
  // Point to point between pipeline stages.
  if (pp > 1) {
    keel_group* g = host.group(KEEL_GROUP_PP);
    at::Tensor t = at::full({5}, static_cast<double>(rank_), at::kDouble);
    if (layout.pp_index == 0) {
      keel::check(context.raw()->api->send(context.raw(), g, keel::handle(t), 1, 7, nullptr));
    } else if (layout.pp_index == 1) {
      keel::check(context.raw()->api->recv(context.raw(), g, keel::handle(t), 0, 7, nullptr));
      expect(t[0].item<double>() == layout.rank_of(0, layout.dp_index), "send/recv");
    }
  }
  // A plugin-requested sub-group {0, world-1}, created by every rank.
  keel_group* sub = host.new_group({0, world - 1});
  if (rank_ == 0 || rank_ == world - 1) {
    at::Tensor t = at::ones({1}, at::kDouble);
    host.all_reduce(sub, t, KEEL_REDUCE_SUM);
    expect(t[0].item<double>() == 2.0, "sub-group all_reduce");
  } else {
    expect(sub == nullptr, "non-member gets no sub-group");
  }
  std::printf("rank %d: ok\n", rank_);
  return 0;
}
