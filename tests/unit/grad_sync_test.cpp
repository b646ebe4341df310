// Gradient buffers, consolidation and the replica guard on one rank (the multi-rank paths run
// in the parallel-parity integration suite).
#include <gtest/gtest.h>

#include "checkpoint/consolidate.hpp"
#include "grad_sync/grad_buckets.hpp"
#include "mesh/mesh.hpp"
#include "param_refs.hpp"
#include "train/replica_guard.hpp"

namespace keel {
namespace {

TEST(GradientBuckets, GradientsAreViewsOfOneBufferThatAutogradAccumulatesInto) {
  at::Tensor a = at::randn({3, 4}).requires_grad_(true), b = at::randn({5}).requires_grad_(true);
  std::vector<ParamRef> refs{test::param_ref("a", a), test::param_ref("b", b)};
  Mesh mesh(MeshLayout::compute(1, 1, 1, 0));
  GradientBuckets grads(refs, mesh, /*bucket_bytes=*/16);
  const void* storage = a.grad().storage().data();
  EXPECT_EQ(b.grad().storage().data(), storage);  // one flat buffer
  (a.sum() * 2 + b.sum()).backward();
  (a.sum() * 2 + b.sum()).backward();
  EXPECT_TRUE(at::equal(a.grad(), at::full({3, 4}, 4.0f)));
  EXPECT_EQ(a.grad().storage().data(), storage);  // accumulated in place, never replaced
  grads.zero();
  EXPECT_EQ(b.grad().abs().sum().item<float>(), 0.0f);
  grads.reduce();  // a group of one: nothing to do
  EXPECT_EQ(grads.collectives_per_step(), 0u);
}

TEST(GradientBuckets, ExpertGradientsLiveInTheirOwnBuffer) {
  at::Tensor dense = at::randn({4}).requires_grad_(true), expert = at::randn({2, 4}).requires_grad_(true);
  std::vector<ParamRef> refs{test::param_ref("w", dense), test::param_ref("experts.w1", expert, KEEL_PARAM_EXPERT)};
  Mesh mesh(MeshLayout::compute(1, 1, 1, 0));
  GradientBuckets grads(refs, mesh, 1 << 20);
  EXPECT_NE(dense.grad().storage().data(), expert.grad().storage().data());
}

TEST(Consolidate, ShardsAreAssembledAlongTheirDimension) {
  Mesh mesh(MeshLayout::compute(1, 1, 1, 0));
  at::Tensor whole = at::arange(24, at::kFloat).view({4, 6});
  std::vector<TensorPiece> pieces = {{"experts", whole.narrow(0, 2, 2), 0, 2, 4},
                                     {"experts", whole.narrow(0, 0, 2), 0, 0, 4},
                                     {"dense", at::ones({3}), -1, 0, 0}};
  auto out = consolidate(pieces, mesh.group(KEEL_GROUP_WORLD));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].first, "dense");
  EXPECT_EQ(out[1].first, "experts");
  EXPECT_TRUE(at::equal(out[1].second, whole));
}

TEST(Consolidate, AGapOrATwiceWrittenTensorIsRefusedNamingTheKey) {
  Mesh mesh(MeshLayout::compute(1, 1, 1, 0));
  at::Tensor t = at::zeros({2, 3});
  try {
    consolidate({{"experts.w1", t, 0, 0, 4}}, mesh.group(KEEL_GROUP_WORLD));
    FAIL() << "a missing shard was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'experts.w1'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(consolidate({{"w", t, -1, 0, 0}, {"w", t, -1, 0, 0}}, mesh.group(KEEL_GROUP_WORLD)), std::runtime_error);
}

TEST(ReplicaGuard, ADriftedCopyStopsTheJobNamingTheParameterAndRanks) {
  Mesh mesh(MeshLayout::compute(1, 1, 1, 0));
  at::Tensor owner = at::randn({4, 2}), replica = owner.clone(), other = at::randn({3});
  std::vector<ParamRef> refs{test::param_ref("tok_embeddings.weight", owner),
                             test::param_ref("tok_embeddings.weight", replica, KEEL_PARAM_REPLICA),
                             test::param_ref("norm.weight", other)};
  EXPECT_EQ(check_replicas(refs, mesh.group(KEEL_GROUP_WORLD), 1), 2u);
  EXPECT_EQ(perturb_replicas(refs), 1u);
  try {
    check_replicas(refs, mesh.group(KEEL_GROUP_WORLD), 7);
    FAIL() << "a drifted replica passed";
  } catch (const std::runtime_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("after step 7: the copies of 'tok_embeddings.weight' differ"), std::string::npos) << m;
    EXPECT_NE(m.find("rank(s) 0 (REPLICA) hold"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace keel
