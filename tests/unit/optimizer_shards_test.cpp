// The sharded optimizer's cuts: every element of a bucket is stepped by exactly one member, a
// cut inside a parameter falls on a row boundary 64 elements aligned (or the parameter is not
// cut), the ranges are about equal, and AdamW over the pieces is bitwise AdamW over the whole.
#include <gtest/gtest.h>

#include <numeric>

#include "common/text.hpp"
#include "optim/adamw.hpp"
#include "optim/optimizer_shards.hpp"
#include "param_refs.hpp"
#include "train/gradient_scatter.hpp"

namespace keel {
namespace {

struct Params {
  std::vector<at::Tensor> tensors;
  std::vector<ParamRef> refs;
  explicit Params(const std::vector<std::vector<int64_t>>& shapes) {
    tensors.reserve(shapes.size());  // the records point at these tensors
    for (const auto& shape : shapes) tensors.push_back(at::zeros(shape));
    for (size_t i = 0; i < shapes.size(); ++i) refs.push_back(test::param_ref(cat("p", i), tensors[i]));
  }
};

// Each element of every parameter, counted over every member's pieces.
std::vector<at::Tensor> coverage(const Params& p, const BucketLayout& layout, int members) {
  std::vector<at::Tensor> seen;
  for (const at::Tensor& t : p.tensors) seen.push_back(at::zeros(t.sizes(), at::kInt));
  for (int j = 0; j < members; ++j)
    for (const OptimPiece& piece : optimizer_pieces(layout, p.refs, true, {members, j}, {1, 0}))
      AdamW::piece_of(seen[piece.param], piece).add_(1);
  return seen;
}

TEST(OptimizerShards, EveryElementIsSteppedByExactlyOneMember) {
  Params p({{100, 64}, {7}, {3, 5}, {0}, {256}, {33, 12}, {}});
  for (int64_t bucket_bytes : {int64_t{0}, int64_t{4096}, int64_t{1} << 30})
    for (int members : {1, 2, 3, 4, 7}) {
      const BucketLayout layout = plan_buckets(p.refs, bucket_bytes);
      for (const at::Tensor& count : coverage(p, layout, members))
        EXPECT_TRUE(at::equal(count, at::ones_like(count))) << bucket_bytes << " B buckets, " << members << " members";
    }
}

TEST(OptimizerShards, CutsFallOnAlignedRowBoundariesAndAreNearEqual) {
  Params p({{100, 64}, {7}, {256}, {33, 12}});
  const BucketLayout layout = plan_buckets(p.refs, int64_t{1} << 30);  // one bucket of 6 956 elements
  ASSERT_EQ(layout.buckets.size(), 1u);
  const BucketSpan& bucket = layout.buckets.front();
  for (int members : {2, 3, 4}) {
    const std::vector<int64_t> cuts = shard_cuts(bucket, p.refs, members);
    ASSERT_EQ(cuts.size(), static_cast<size_t>(members) + 1);
    EXPECT_EQ(cuts.front(), 0);
    EXPECT_EQ(cuts.back(), bucket.numel);
    for (size_t j = 1; j < cuts.size(); ++j) {
      EXPECT_LE(cuts[j - 1], cuts[j]);
      // Within 64 elements of the ideal (the 100 × 64 matrix can be cut at every row; [33, 12]
      // only every 16 rows, 192 elements: it lies past the cuts here).
      const int64_t ideal = bucket.numel * static_cast<int64_t>(j) / members;
      if (j < cuts.size() - 1) {
        EXPECT_LE(std::abs(cuts[j] - ideal), 64) << members << " members, cut " << j;
      }
      for (const BucketMember& m : bucket.members)
        if (cuts[j] > m.offset && cuts[j] < m.offset + m.numel) {
          const int64_t inside = cuts[j] - m.offset;
          EXPECT_EQ(inside % 64, 0);
          EXPECT_EQ(inside % (m.numel / p.tensors[m.param].size(0)), 0);
        }
    }
  }
}

TEST(OptimizerShards, ParametersOfAnotherShardDimensionAreNeverCut) {
  at::Tensor t = at::zeros({4, 128});
  keel_param_info entry{sizeof(keel_param_info),
                        "experts.w",
                        reinterpret_cast<keel_tensor*>(&t),
                        KEEL_PARAM_EXPERT,
                        1,
                        128,
                        256,
                        1.0,
                        nullptr};
  std::vector<ParamRef> refs{ParamRef(entry)};
  const BucketLayout layout = plan_buckets(refs, int64_t{1} << 30);
  const std::vector<int64_t> cuts = shard_cuts(layout.buckets.front(), refs, 2);
  EXPECT_TRUE(cuts[1] == 0 || cuts[1] == 512) << cuts[1];
}

TEST(OptimizerShards, UnshardedEveryParameterIsWhole) {
  Params p({{4, 4}, {3}});
  const std::vector<OptimPiece> pieces = optimizer_pieces(plan_buckets(p.refs, 0), p.refs, false, {4, 2}, {2, 1});
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0], (OptimPiece{0, true, 0, 0}));
  EXPECT_EQ(pieces[1], (OptimPiece{1, true, 0, 0}));
}

TEST(OptimizerShards, AdamWOverPiecesIsBitwiseAdamWOverTheWhole) {
  // Two members' pieces stepped by two optimizers against one optimizer over every parameter:
  // the cuts fall inside the matrices, so the fused kernel sees parts of them.
  at::manual_seed(5);
  Params whole({{96, 64}, {5, 130}, {37}}), split({{96, 64}, {5, 130}, {37}});
  for (size_t i = 0; i < whole.tensors.size(); ++i) {
    whole.tensors[i].normal_();
    split.tensors[i].copy_(whole.tensors[i]);
    whole.tensors[i].mutable_grad() = at::zeros_like(whole.tensors[i]);
    split.tensors[i].mutable_grad() = at::zeros_like(split.tensors[i]);
  }
  auto optim_params = [](Params& p) {
    std::vector<OptimParam> out;
    for (size_t i = 0; i < p.tensors.size(); ++i) out.push_back({cat("p", i), p.tensors[i], i != 2});
    return out;
  };
  const AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  AdamW reference(optim_params(whole), o);
  const BucketLayout layout = plan_buckets(split.refs, int64_t{1} << 30);
  std::vector<std::unique_ptr<AdamW>> members;
  size_t pieces_inside = 0;
  for (int j = 0; j < 3; ++j) {
    std::vector<OptimPiece> pieces = optimizer_pieces(layout, split.refs, true, {3, j}, {1, 0});
    for (const OptimPiece& piece : pieces) pieces_inside += piece.whole ? 0 : 1;
    members.push_back(std::make_unique<AdamW>(optim_params(split), o, pieces));
  }
  EXPECT_GE(pieces_inside, 2u);
  const at::Tensor lr = at::full({}, 1e-2), no_inf = at::zeros({});
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < whole.tensors.size(); ++i) {
      at::Tensor g = at::randn(whole.tensors[i].sizes());
      whole.tensors[i].mutable_grad().copy_(g);
      split.tensors[i].mutable_grad().copy_(g);
    }
    reference.step(lr, no_inf);
    for (auto& m : members) m->step(lr, no_inf);
  }
  for (size_t i = 0; i < whole.tensors.size(); ++i)
    EXPECT_TRUE(at::equal(whole.tensors[i], split.tensors[i])) << "parameter " << i;
  for (auto& m : members)
    for (size_t k = 0; k < m->pieces().size(); ++k) {
      const OptimPiece& piece = m->pieces()[k];
      EXPECT_TRUE(at::equal(m->exp_avg()[k], AdamW::piece_of(reference.exp_avg()[piece.param], piece)));
      EXPECT_TRUE(at::equal(m->exp_avg_sq()[k], AdamW::piece_of(reference.exp_avg_sq()[piece.param], piece)));
    }
}

// What a clipper of reduce-scattered gradients receives: one flat view per piece, aliasing the
// rows of the parameter's gradient that the member steps, the pieces of all members covering
// every gradient element once.
TEST(OptimizerShards, OwnedGradientsAreViewsOfEachMembersRows) {
  Params p({{100, 64}, {7}, {3, 5}, {0}, {256}, {33, 12}});
  for (at::Tensor& t : p.tensors) t.mutable_grad() = at::arange(t.numel(), at::kFloat).view(t.sizes());
  const BucketLayout layout = plan_buckets(p.refs, 4096);
  int64_t covered = 0, total = 0;
  for (const at::Tensor& t : p.tensors) total += t.numel();
  for (int j = 0; j < 3; ++j) {
    const std::vector<OptimPiece> pieces = optimizer_pieces(layout, p.refs, true, {3, j}, {1, 0});
    OwnedGradients owned = owned_gradients(p.refs, pieces);
    ASSERT_EQ(owned.rows.size(), pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
      const at::Tensor& grad = p.tensors[pieces[i].param].grad();
      EXPECT_EQ(owned.owners[i], p.refs[pieces[i].param].info());
      EXPECT_EQ(owned.rows[i].dim(), 1);
      EXPECT_TRUE(at::equal(owned.rows[i], AdamW::piece_of(grad, pieces[i]).reshape({-1})));
      owned.rows[i].fill_(-1);  // a view: the gradient's rows change with it
      EXPECT_TRUE(AdamW::piece_of(grad, pieces[i]).eq(-1).all().item<bool>());
      covered += owned.rows[i].numel();
    }
  }
  EXPECT_EQ(covered, total);
  for (const at::Tensor& t : p.tensors) EXPECT_TRUE(t.grad().eq(-1).all().item<bool>());
}

}  // namespace
}  // namespace keel
