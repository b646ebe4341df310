// The order in which gradient buckets start reducing during the last backward pass: each
// group's buckets from its last to its first, a bucket once all its gradients are final.
#include <gtest/gtest.h>

#include "grad_sync/launch_order.hpp"

namespace keel {
namespace {

using Starts = std::vector<size_t>;

TEST(LaunchOrder, EachGroupStartsFromItsLastBucketOnceItsGradientsAreFinal) {
  // Buckets 0, 1, 3 reduce over group 0, bucket 2 over group 1.
  LaunchOrder order({0, 0, 1, 0}, {2, 1, 1, 2});
  EXPECT_EQ(order.gradient_final(3), Starts{});  // one of two
  EXPECT_EQ(order.gradient_final(1), Starts{});  // final, but bucket 3 of its group has not started
  EXPECT_EQ(order.gradient_final(3), (Starts{3, 1}));
  EXPECT_EQ(order.gradient_final(2), Starts{2});  // another group: not held back by group 0
  EXPECT_EQ(order.gradient_final(0), Starts{});
  EXPECT_EQ(order.gradient_final(0), Starts{0});
  EXPECT_EQ(order.started_early(), 4u);
  EXPECT_EQ(order.rest(), Starts{});
}

TEST(LaunchOrder, WhatNeverBecameFinalStartsAtTheEndInTheSameOrder) {
  // An expert that received no token never accumulates: its bucket and every earlier one of
  // its group start in reduce(), in the order every other rank uses.
  LaunchOrder order({0, 0, 0}, {1, 1, 1});
  EXPECT_EQ(order.gradient_final(2), Starts{2});
  EXPECT_EQ(order.gradient_final(0), Starts{});  // held back by bucket 1
  EXPECT_EQ(order.rest(), (Starts{1, 0}));
  EXPECT_EQ(order.started_early(), 1u);
  order.reset();
  EXPECT_EQ(order.started_early(), 0u);
  EXPECT_EQ(order.rest(), (Starts{2, 1, 0}));  // without overlap: everything, same order
}

TEST(LaunchOrder, AGradientCountedTwiceStartsNothingTwice) {
  LaunchOrder order({0}, {1});
  EXPECT_EQ(order.gradient_final(0), Starts{0});
  EXPECT_EQ(order.gradient_final(0), Starts{});
  EXPECT_EQ(order.rest(), Starts{});
}

}  // namespace
}  // namespace keel
