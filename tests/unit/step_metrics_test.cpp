// A ratio metric (ABI 1.5): the sums of its numerators and denominators, divided once.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "metrics/step_metrics.hpp"

namespace keel {
namespace {

at::Tensor scalar(double v) { return at::full({}, v, at::kFloat); }

TEST(StepMetricsRatio, IsTheSumOfNumeratorsOverTheSumOfDenominators) {
  StepMetrics metrics;
  // Two microbatches: 3 tokens at loss 2 and 1 token at loss 6. Weighted: 12 / 4 = 3; the mean
  // of the two means would be 4.
  metrics.report_ratio("lm_loss", scalar(6.0), scalar(3.0));
  metrics.report_ratio("lm_loss", scalar(6.0), scalar(1.0));
  metrics.report("plain", scalar(2.0), KEEL_METRIC_MEAN);
  metrics.report("plain", scalar(6.0), KEEL_METRIC_MEAN);
  const auto values = metrics.resolve();
  EXPECT_DOUBLE_EQ(values.at("lm_loss"), 3.0);
  EXPECT_DOUBLE_EQ(values.at("plain"), 4.0);
}

TEST(StepMetricsRatio, NoDenominatorGivesNan) {
  StepMetrics metrics;
  metrics.report_ratio("mtp_loss.1", scalar(0.0), scalar(0.0));
  EXPECT_TRUE(std::isnan(metrics.resolve().at("mtp_loss.1")));
}

TEST(StepMetricsRatio, ANameIsEitherARatioOrAPlainMetric) {
  StepMetrics metrics;
  metrics.report_ratio("loss", scalar(1.0), scalar(1.0));
  EXPECT_THROW(metrics.report("loss", scalar(1.0), KEEL_METRIC_MEAN), std::invalid_argument);
  metrics.report("other", scalar(1.0), KEEL_METRIC_SUM);
  EXPECT_THROW(metrics.report_ratio("other", scalar(1.0), scalar(1.0)), std::invalid_argument);
  EXPECT_THROW(metrics.report_ratio("x", at::ones({2}), scalar(1.0)), std::invalid_argument);
}

TEST(StepMetricsRatio, SwapAndClearMoveRatiosWhole) {
  StepMetrics step, aside;
  step.report_ratio("lm_loss", scalar(4.0), scalar(2.0));
  step.swap(aside);
  EXPECT_TRUE(step.resolve().empty());
  EXPECT_DOUBLE_EQ(aside.resolve().at("lm_loss"), 2.0);
  aside.clear();
  EXPECT_TRUE(aside.resolve().empty());
}

}  // namespace
}  // namespace keel
