// The SDK's parameter table: one record per parameter at a stable address, the C view the
// host reads pointing at those records, and init rules written with the declaration.
#include <gtest/gtest.h>
#include <keel/init.hpp>
#include <keel/part.hpp>

#include <cstring>
#include <string>
#include <vector>

namespace {

// A part that only declares; forward is never called.
class Declaring : public keel::Part {
 public:
  Declaring() : keel::Part(nullptr, at::TensorOptions().dtype(at::kFloat)) {}
  void forward(const keel_forward_inputs&, keel_forward_outputs&) override {}
};

TEST(ParamTable, RecordsStayPutAndTheViewIsTheRecords) {
  Declaring part;
  at::Tensor& first = part.param("first.weight", {3, 2}, keel::init::Constant{1.0});
  const keel::ParamRecord* first_record = part.parameters().records()[0].get();
  for (int i = 0; i < 100; ++i) part.param(std::to_string(i) + ".weight", {2}, keel::init::Constant{0.0});
  part.param("experts", {2, 3}, keel::init::Normal{1.0}, keel::ParamOptions::experts(4, 8, 0.25));
  part.param("replica", {5}, keel::init::Normal{1.0},
             {.flags = KEEL_PARAM_REPLICA, .active_fraction = 0.5, .module_group = "mtp"});
  EXPECT_EQ(&first, &part.parameters().records()[0]->tensor());  // the slot did not move
  EXPECT_EQ(first_record, part.parameters().records()[0].get());

  auto [infos, count] = part.parameters().view();
  ASSERT_EQ(count, 103u);
  for (size_t i = 0; i < count; ++i) {
    const keel::ParamRecord& r = *part.parameters().records()[i];
    EXPECT_EQ(infos[i], r.raw());
    EXPECT_EQ(infos[i]->struct_size, sizeof(keel_param_info));
    EXPECT_EQ(infos[i]->fqn, r.fqn());  // the same string, not a copy
    EXPECT_EQ(infos[i]->tensor, keel::handle(r.tensor()));
  }
  const keel_param_info& experts = *infos[101];
  EXPECT_EQ(experts.flags, uint32_t{KEEL_PARAM_EXPERT});
  EXPECT_EQ(experts.shard_dim, 0);
  EXPECT_EQ(experts.shard_offset, 4);
  EXPECT_EQ(experts.global_dim_size, 8);
  EXPECT_EQ(experts.active_fraction, 0.25);
  EXPECT_STREQ(experts.module_group, "main");
  const keel_param_info& replica = *infos[102];
  EXPECT_EQ(replica.flags, uint32_t{KEEL_PARAM_REPLICA});
  EXPECT_EQ(replica.shard_dim, -1);
  EXPECT_EQ(replica.active_fraction, 0.5);
  EXPECT_STREQ(replica.module_group, "mtp");
  EXPECT_TRUE(keel::tensor(replica.tensor).requires_grad());

  // The record the table finds is the one the host reads, read through its ParamView.
  const keel::ParamRecord* found = part.parameters().find("replica");
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->raw(), &replica);
  EXPECT_TRUE(found->replica());
  EXPECT_FALSE(found->expert());
  EXPECT_EQ(found->active_fraction(), 0.5);
  EXPECT_STREQ(found->module_group(), "mtp");
  const keel::ParamView experts_view = *part.parameters().find("experts");
  EXPECT_TRUE(experts_view.expert());
  EXPECT_EQ(experts_view.shard_offset(), 4);
  EXPECT_EQ(experts_view.global_dim_size(), 8);
  EXPECT_EQ(part.parameters().find("absent"), nullptr);
}

TEST(ParamTable, DefaultInitWeightsDrawsEveryRecordByItsRule) {
  Declaring part;
  at::Tensor& normal = part.param("a.weight", {7, 5}, keel::init::Normal{0.5});
  at::Tensor& truncated = part.param("b.weight", {64, 3}, keel::init::TruncatedNormal{0.02, 2.0});
  at::Tensor& unit = part.param("c.norm.weight", {4}, keel::init::Constant{1.0});
  at::Tensor& bias = part.buffer("bias", {6}, keel::init::Constant{0.25}, /*persistent=*/true);
  part.init_weights(11);

  at::Tensor expected = at::empty({7, 5});
  keel::init::normal_(expected, 11, "a.weight", 0.5);
  EXPECT_TRUE(at::equal(normal, expected));
  expected = at::empty({64, 3});
  keel::init::truncated_normal_(expected, 11, "b.weight", 0.02, 2.0);
  EXPECT_TRUE(at::equal(truncated, expected));
  EXPECT_LE(truncated.abs().max().item<double>(), 2.0 * 0.02 * (1 + 1e-6));
  EXPECT_TRUE(at::equal(unit, at::ones({4})));
  EXPECT_TRUE(at::equal(bias, at::full({6}, 0.25)));
  EXPECT_EQ(bias.scalar_type(), at::kFloat);
  EXPECT_TRUE(part.buffers().records()[0]->persistent());
  EXPECT_EQ(part.buffers().records()[0]->raw()->flags, uint32_t{KEEL_PARAM_PERSISTENT});
  EXPECT_FALSE(at::equal(normal, at::zeros({7, 5})));
}

TEST(ParamTable, ExpertShardsDrawTheSlicesOfTheWholeTensor) {
  const keel::init::Rule rule = keel::init::TruncatedNormal{0.1};
  Declaring whole, low, high;
  at::Tensor& all = whole.param("moe.experts.w1", {8, 4, 3}, rule, keel::ParamOptions::experts(0, 8, 0.25));
  at::Tensor& first = low.param("moe.experts.w1", {4, 4, 3}, rule, keel::ParamOptions::experts(0, 8, 0.25));
  at::Tensor& second = high.param("moe.experts.w1", {4, 4, 3}, rule, keel::ParamOptions::experts(4, 8, 0.25));
  for (Declaring* p : {&whole, &low, &high}) p->init_weights(5);
  EXPECT_TRUE(at::equal(at::cat({first, second}, 0), all));
  EXPECT_FALSE(at::equal(first, second));  // each expert from its own generator
  at::Tensor slice = at::empty({4, 3});
  keel::init::truncated_normal_(slice, 5, "moe.experts.w1", 0.1, 3.0, /*index=*/6);
  EXPECT_TRUE(at::equal(second[2], slice));  // global expert 6
}

TEST(ParamTable, ARecordWithoutARuleIsAnErrorNamingIt) {
  Declaring part;
  at::Tensor& slot =
      part.parameters().add("ruleless.weight", at::zeros({2}), std::nullopt, {.active_fraction = 0.5}).tensor();
  EXPECT_EQ(&slot, &part.parameters().records()[0]->tensor());
  EXPECT_EQ(part.parameters().view().first[0]->active_fraction, 0.5);
  try {
    part.init_weights(1);
    FAIL() << "init_weights drew a parameter without a rule";
  } catch (const keel::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'ruleless.weight' was declared without an init rule"), std::string::npos)
        << e.what();
  }
}

}  // namespace
