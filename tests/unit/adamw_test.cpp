// Keel's fused AdamW against torch::optim::AdamW.
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "common/text.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"

namespace keel {
namespace {

struct ParamCopies {
  std::vector<at::Tensor> ours, theirs;
};

ParamCopies make_params(bool with_grads = true) {
  at::manual_seed(7);
  ParamCopies s;
  for (auto shape : std::vector<std::vector<int64_t>>{{8, 4}, {17}, {3, 3, 3}}) {
    at::Tensor p = at::randn(shape).requires_grad_(true);
    if (with_grads) p.mutable_grad() = at::zeros_like(p);
    s.ours.push_back(p);
    at::Tensor q = p.detach().clone().requires_grad_(true);
    q.mutable_grad() = at::zeros_like(q);
    s.theirs.push_back(q);
  }
  return s;
}

TEST(AdamW, MatchesTorchAdamWOverTwentySteps) {
  ParamCopies s = make_params();
  std::vector<OptimParam> params;
  for (size_t i = 0; i < s.ours.size(); ++i) params.push_back({cat("p", i), s.ours[i], i != 1});
  AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  AdamW ours(params, o);
  // The same split into a decayed and an undecayed group.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{s.theirs[0], s.theirs[2]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
  groups.emplace_back(std::vector<at::Tensor>{s.theirs[1]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)));
  torch::optim::AdamW theirs(std::move(groups));

  LrSchedule schedule(1e-2, 5, 20, "cosine", 0.1);
  at::Tensor lr = at::zeros({});
  at::Tensor no_inf = at::zeros({});
  at::Generator gen = at::detail::createCPUGenerator(11);
  for (int step = 1; step <= 20; ++step) {
    for (size_t i = 0; i < s.ours.size(); ++i) {
      at::Tensor g = at::randn(s.ours[i].sizes(), gen);
      s.ours[i].mutable_grad().copy_(g);
      s.theirs[i].mutable_grad().copy_(g);
    }
    lr.fill_(schedule.at(step));
    for (auto& group : theirs.param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(schedule.at(step));
    ours.step(lr, no_inf);
    theirs.step();
  }
  for (size_t i = 0; i < s.ours.size(); ++i) {
    EXPECT_TRUE(at::allclose(s.ours[i], s.theirs[i], 1e-6, 1e-7))
        << "param " << i << " max diff " << (s.ours[i] - s.theirs[i]).abs().max().item<double>();
    auto& state = static_cast<torch::optim::AdamWParamState&>(*theirs.state().at(s.theirs[i].unsafeGetTensorImpl()));
    // The fused kernel updates the moments with lerp, torch::optim with mul and add: the same
    // arithmetic rounded differently, a few ulps of these O(1) values after 20 steps.
    EXPECT_TRUE(at::allclose(ours.exp_avg()[i], state.exp_avg(), 1e-6, 1e-6))
        << "exp_avg " << i << " max diff " << (ours.exp_avg()[i] - state.exp_avg()).abs().max().item<double>();
    EXPECT_TRUE(at::allclose(ours.exp_avg_sq()[i], state.exp_avg_sq(), 1e-6, 1e-6))
        << "exp_avg_sq " << i << " max diff " << (ours.exp_avg_sq()[i] - state.exp_avg_sq()).abs().max().item<double>();
    EXPECT_EQ(ours.steps()[i].item<double>(), 20.0);
  }
}

TEST(AdamW, FoundInfSkipsTheUpdateAndTheStepCount) {
  ParamCopies s = make_params();
  std::vector<OptimParam> params;
  for (size_t i = 0; i < s.ours.size(); ++i) params.push_back({cat("p", i), s.ours[i], true});
  AdamW ours(params, AdamWOptions{0.9, 0.95, 1e-8, 0.1});
  std::vector<at::Tensor> before;
  for (at::Tensor& p : s.ours) {
    p.mutable_grad().normal_();
    before.push_back(p.detach().clone());
  }
  ours.step(at::full({}, 1e-2), at::ones({}));
  for (size_t i = 0; i < s.ours.size(); ++i) {
    EXPECT_TRUE(at::equal(s.ours[i], before[i]));
    EXPECT_EQ(ours.steps()[i].item<double>(), 0.0);
  }
  ours.step(at::full({}, 1e-2), at::zeros({}));
  EXPECT_FALSE(at::equal(s.ours[0], before[0]));
  EXPECT_EQ(ours.steps()[0].item<double>(), 1.0);
}

TEST(LrSchedule, WarmupThenDecayToTheFloor) {
  LrSchedule cosine(1.0, 10, 110, "cosine", 0.1);
  EXPECT_DOUBLE_EQ(cosine.at(1), 0.1);
  EXPECT_DOUBLE_EQ(cosine.at(10), 1.0);
  EXPECT_NEAR(cosine.at(60), 0.55, 1e-12);
  EXPECT_DOUBLE_EQ(cosine.at(110), 0.1);
  LrSchedule linear(2.0, 0, 100, "linear", 0.0);
  EXPECT_DOUBLE_EQ(linear.at(50), 1.0);
  EXPECT_DOUBLE_EQ(linear.at(100), 0.0);
  LrSchedule constant(0.5, 4, 100, "constant", 0.1);
  EXPECT_DOUBLE_EQ(constant.at(2), 0.25);
  EXPECT_DOUBLE_EQ(constant.at(99), 0.5);
}

}  // namespace
}  // namespace keel
