// The step's log line: per-layer figures fold into their maximum, and every line fits a
// 120-column terminal (100 characters after the "[rank r] [keel r] " prefix).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/text.hpp"
#include "metrics/log_line.hpp"

namespace keel {
namespace {

TEST(LogLine, APerLayerFamilyShowsItsMaximumAndLoneNamesStay) {
  const std::vector<LogFigure> figures =
      log_figures({{"lm_loss", 6.0926},
                   {"load_max_over_mean.layers.1", 1.375},
                   {"load_max_over_mean.layers.2", 1.3125},
                   {"load_max_over_mean.mtp.0.block", 1.5},
                   {"load_max_over_mean-other", 2.0},  // sorts inside the family's names
                   {"mtp_loss", 6.1723},
                   {"routing.entropy", 0.25}});
  ASSERT_EQ(figures.size(), 5u);
  EXPECT_EQ(figures[0].label, "lm_loss");
  EXPECT_EQ(figures[1].label, "load_max_over_mean-other");
  EXPECT_EQ(figures[2].label, "load_max_over_mean max");
  EXPECT_EQ(figures[2].value, 1.5);
  EXPECT_EQ(figures[3].label, "mtp_loss");
  EXPECT_EQ(figures[4].label, "routing.entropy");  // alone: not a family
}

TEST(LogLine, PerDepthFiguresStayApartFromTheirTotal) {
  const std::vector<LogFigure> figures =
      log_figures({{"mtp_loss", 2.5}, {"mtp_loss.1", 2.25}, {"mtp_loss.2", 2.75}, {"val.x", 1.0}});
  ASSERT_EQ(figures.size(), 4u);
  EXPECT_EQ(figures[0].label, "mtp_loss");
  EXPECT_EQ(figures[0].value, 2.5);
  EXPECT_EQ(figures[1].label, "mtp_loss.1");
  EXPECT_EQ(figures[2].label, "mtp_loss.2");
  EXPECT_EQ(figures[2].value, 2.75);
}

TEST(LogLine, ANanInAFamilyIsNotHidden) {
  const std::vector<LogFigure> figures = log_figures({{"load.a", 1.0}, {"load.b", std::nan("")}, {"load.c", 3.0}});
  ASSERT_EQ(figures.size(), 1u);
  EXPECT_TRUE(std::isnan(figures[0].value));
}

TEST(LogLine, EveryLineFitsAndTheHostFiguresComeFirst) {
  StepRecord r;
  r.step = 1234567;
  r.total_steps = 10000000;
  r.loss = 7.8286;
  r.grad_norm = 2.1158;
  r.lr = 3e-5;
  r.tokens_per_second = 1.84e6;
  r.eta_seconds = 36000;
  r.peak_memory_bytes = 7.5e10;
  r.skipped = true;
  r.plugin_metrics = {{"lm_loss", 6.0926}, {"mtp_loss", 6.1723}, {"pipeline_bubble", 0.498}};
  for (int layer = 3; layer < 61; ++layer) r.plugin_metrics[cat("load_max_over_mean.layers.", layer)] = 1.0 + layer;
  const std::vector<std::string> lines = step_lines(r);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("step 1234567/10000000 | loss 7.8286 | grad_norm 2.1158 | lr 3.000e-05", 0), 0u);
  std::string all;
  for (const std::string& line : lines) {
    EXPECT_LE(line.size(), 100u) << line;
    all += line + "\n";
  }
  EXPECT_NE(all.find("load_max_over_mean max 61.0000"), std::string::npos) << all;
  EXPECT_EQ(all.find("layers.3"), std::string::npos) << all;
  EXPECT_NE(all.find("update skipped (non-finite gradients)"), std::string::npos) << all;
  EXPECT_LE(lines.size(), 3u) << all;
}

TEST(LogLine, ThePeakMemoryIsTheLargestRanksAndNamesIt) {
  StepRecord r;
  r.peak_memory_bytes = 3.0 * (1 << 30);
  r.peak_memory_by_rank = {1.0 * (1 << 30), 2.0 * (1 << 30), 3.0 * (1 << 30), 2.5 * (1 << 30)};
  EXPECT_NE(step_lines(r, 200)[0].find(" | mem 3.0 GiB max (rank 2)"), std::string::npos) << step_lines(r, 200)[0];
  r.peak_memory_by_rank = {3.0 * (1 << 30)};  // one rank: nothing to name
  EXPECT_NE(step_lines(r, 200)[0].find(" | mem 3.0 GiB"), std::string::npos);
  EXPECT_EQ(step_lines(r, 200)[0].find(" max (rank"), std::string::npos) << step_lines(r, 200)[0];
}

TEST(LogLine, FiguresThatFitStayOnTheFirstLine) {
  StepRecord r;
  r.step = 6;
  r.total_steps = 6;
  r.plugin_metrics = {{"lm_loss", 1.5}};
  const std::vector<std::string> lines = step_lines(r, 120);
  ASSERT_EQ(lines.size(), 1u) << lines[0] << "\n" << lines.back();
  EXPECT_NE(lines[0].find(" | lm_loss 1.5000"), std::string::npos) << lines[0];
}

TEST(LogLine, AnEvaluationGetsItsOwnLine) {
  StepRecord r;
  r.step = 40;
  r.total_steps = 100;
  r.plugin_metrics = {{"lm_loss", 1.5}};
  r.validation = {{"val_loss", 2.3125},    {"val_lm_loss", 2.25}, {"val_mtp_loss", 2.5},
                  {"val_mtp_loss.1", 2.5}, {"val_tokens", 4096},  {"val_seconds", 0.125}};
  const std::vector<std::string> lines = step_lines(r, 100);
  size_t v = 0;
  while (v < lines.size() && lines[v].rfind("validation", 0) != 0) ++v;
  ASSERT_EQ(lines.size(), v + 2) << lines[0];
  EXPECT_EQ(lines[v] + "\n" + lines[v + 1],
            "validation after step 40: val_loss 2.3125 | val_lm_loss 2.2500 | val_mtp_loss 2.5000\n"
            "  val_mtp_loss.1 2.5000 | " +
                human_count(4096) + " tokens in 0.125 s");
  for (size_t i = 0; i < v; ++i) EXPECT_EQ(lines[i].find("val_"), std::string::npos) << lines[i];
}

}  // namespace
}  // namespace keel
