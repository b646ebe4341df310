// [[data.sources]]: a weighted mixture of token files. The run reports the tokens drawn from
// each source, resumes on the exact same samples, evaluates on one source's held-out share,
// writes the mixture back into its resolved configuration, and refuses bad sources before
// training, naming the source and the key.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "data/token_file.hpp"
#include "job_runs.hpp"

namespace keel {
namespace {

using test::JobRun;

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// A token file of `tokens` random tokens below `vocab`, an EOS after every 24 of them.
std::string token_file(const test::TempDir& dir, const std::string& name, uint32_t seed, uint64_t vocab = 256,
                       uint32_t eos = 255) {
  std::mt19937 gen(seed);
  std::vector<uint32_t> tokens;
  uint64_t documents = 0;
  for (int i = 0; i < 6000; ++i) {
    if (i % 24 == 23) {
      tokens.push_back(eos);
      ++documents;
    } else {
      tokens.push_back(static_cast<uint32_t>(gen() % 200));
    }
  }
  const std::string path = dir / name;
  write_token_file(path, tokens, vocab, eos, documents);
  return path;
}

// The tiny Llama on a 3 : 1 mixture of two token files, checkpoints every 5 of 10 steps.
std::string mixture_job(const std::string& a, const std::string& b, const std::string& more = "") {
  return test::tiny_job("plugin = \"llama3\"\nflavor = \"tiny\"\n", "interval = 5\n") + "[data]\n" + more +
         "[[data.sources]]\npath = \"" + a + "\"\nweight = 3\n[[data.sources]]\nname = \"bee\"\npath = \"" + b +
         "\"\nweight = 1.0\n";
}

TEST(DataMixture, TrainsOnTheMixtureAndReportsTheTokensDrawnPerSource) {
  test::TempDir dir;
  const std::string job = mixture_job(token_file(dir, "a.tok", 1), token_file(dir, "b.tok", 2));
  JobRun run = test::run_job(dir, "run", 1, job, {});
  ASSERT_EQ(run.result.status, 0) << run.result.output;
  EXPECT_HAS(run.result.output, "data: a mixture of 2 sources");
  EXPECT_HAS(run.result.output, "a (75.0 %): token file");
  EXPECT_HAS(run.result.output, "bee (25.0 %): token file");
  ASSERT_EQ(run.source_tokens.size(), 2u);
  const std::vector<double>& a = run.source_tokens.at("a");
  const std::vector<double>& bee = run.source_tokens.at("bee");
  ASSERT_EQ(a.size(), 10u);
  for (size_t s = 0; s < 10; ++s) {
    EXPECT_EQ(a[s] + bee[s], static_cast<double>((s + 1) * 8 * 16)) << "step " << s + 1;  // every sample once
    if (s > 0) {
      EXPECT_GE(a[s], a[s - 1]);
    }
  }
  // 80 samples, 3 : 1: binomial, standard deviation sqrt(0.75 x 0.25 / 80) = 4.8 %; within six.
  EXPECT_NEAR(a.back() / (a.back() + bee.back()), 0.75, 6 * 0.048);
  // The resolved configuration holds the mixture as written, and trains again from it.
  const std::string resolved = test::read_file(run.dir + "/config.toml");
  EXPECT_HAS(resolved, "[[data.sources]]\npath = \"" + dir.path() + "/a.tok\"\nweight = 3.0\nname = \"a\"\n");
  EXPECT_HAS(resolved, "[[data.sources]]\npath = \"" + dir.path() + "/b.tok\"\nweight = 1.0\nname = \"bee\"\n");
  auto again = test::run_command(test::bin_dir() + "/keel-train --plugin-path " + test::plugin_dir() + " --config " +
                                 run.dir + "/config.toml --set training.steps=1 --set job.run_dir=\\\"" +
                                 (dir / "again") + "\\\" --set checkpoint.interval=0");
  EXPECT_EQ(again.status, 0) << again.output;
}

TEST(DataMixture, AResumeDrawsTheSameSamplesBitwise) {
  test::TempDir dir;
  const std::string job = mixture_job(token_file(dir, "a.tok", 1), token_file(dir, "b.tok", 2));
  JobRun straight = test::run_job(dir, "straight", 1, job, {});
  ASSERT_EQ(straight.result.status, 0) << straight.result.output;
  JobRun resumed =
      test::run_job(dir, "resumed", 1, job, {"checkpoint.load=\\\"" + straight.dir + "/checkpoints/step-5\\\""});
  ASSERT_EQ(resumed.result.status, 0) << resumed.result.output;
  ASSERT_EQ(resumed.steps, (std::vector<int64_t>{6, 7, 8, 9, 10}));
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(resumed.loss[i], straight.loss[i + 5]) << "step " << i + 6;
    EXPECT_EQ(resumed.grad_norm[i], straight.grad_norm[i + 5]) << "step " << i + 6;
    EXPECT_EQ(resumed.source_tokens.at("bee")[i], straight.source_tokens.at("bee")[i + 5]) << "step " << i + 6;
  }
  for (const auto& [key, t] : straight.state) EXPECT_TRUE(at::equal(t, resumed.state.at(key))) << key;
}

TEST(DataMixture, ValidationEvaluatesOnOneSourcesHeldOutShareOrOnTheMixtures) {
  test::TempDir dir;
  const std::string a = token_file(dir, "a.tok", 1), b = token_file(dir, "b.tok", 2);
  const std::string validation = "[validation]\ninterval = 5\nsplit = 0.2\nsplit_block = 240\n";
  JobRun one = test::run_job(dir, "one", 1, mixture_job(a, b) + validation + "source = \"bee\"\n", {});
  ASSERT_EQ(one.result.status, 0) << one.result.output;
  JobRun mixed = test::run_job(dir, "mixed", 1, mixture_job(a, b) + validation, {});
  ASSERT_EQ(mixed.result.status, 0) << mixed.result.output;
  ASSERT_EQ(one.validation.count(10), 1u) << one.result.output;
  ASSERT_EQ(mixed.validation.count(10), 1u) << mixed.result.output;
  // Training is the same; the held-out samples are not.
  EXPECT_EQ(one.loss, mixed.loss);
  EXPECT_NE(one.validation[10]["val_loss"], mixed.validation[10]["val_loss"]);
}

TEST(DataMixture, BadSourcesAreRefusedBeforeTrainingNamingTheSourceAndKey) {
  test::TempDir dir;
  const std::string a = token_file(dir, "a.tok", 1), b = token_file(dir, "b.tok", 2);
  const std::string other_eos = token_file(dir, "eos.tok", 3, 256, 254);
  const std::string wide = token_file(dir, "wide.tok", 4, 1000, 999);
  const std::string model = test::tiny_job("plugin = \"llama3\"\nflavor = \"tiny\"\n") + "[data]\n";
  auto source = [](const std::string& body) { return "[[data.sources]]\n" + body; };
  const std::pair<std::string, std::string> cases[] = {
      {source("path = \"" + a + "\"\nweight = 0\n"), "data.sources[0].weight: must be positive, got 0"},
      {source("path = \"" + a + "\"\nweight = -2\n"), "data.sources[0].weight: must be positive"},
      {source("path = \"" + a + "\"\nweight = nan\n"), "data.sources[0].weight: must be a finite number"},
      {source("path = \"" + a + "\"\n"), "data.sources[0].weight: missing"},
      {source("weight = 1\n"), "data.sources[0]"},
      {source("path = \"" + a + "\"\nweight = 1\n") + source("path = \"" + dir.path() + "/none.tok\"\nweight = 1\n"),
       "data.sources[1].path"},
      {source("path = \"" + a + "\"\nweight = 1\n") + source("path = \"" + other_eos + "\"\nweight = 1\n"),
       "every source must come from one tokenizer"},
      {source("path = \"" + a + "\"\nweight = 1\n") + source("path = \"" + wide + "\"\nweight = 1\n"),
       "data.sources[1].path: the token file's vocabulary (1000) exceeds the model's (256)"},
      {source("path = \"" + a + "\"\nweight = 1\n") + source("path = \"" + b + "\"\nweight = 1\nname = \"a\"\n"),
       "data.sources[1].name: 'a' names another source too"},
      {source("path = \"" + a + "\"\nweight = 1\nname = \"no spaces\"\n"), "data.sources[0].name: use letters"},
      {source("path = \"" + a + "\"\nwieght = 1\nweight = 1\n"), "unknown key 'data.sources[0].wieght'"},
      {"path = \"" + a + "\"\n" + source("path = \"" + b + "\"\nweight = 1\n"), "data.path: choose one"},
      {"sources = \"" + a + "\"\n", "data.sources: expected an array of tables ([[data.sources]])"},
      {"\"sources[99999999999999999999]\" = 1\n" + source("path = \"" + a + "\"\nweight = 1\n"),
       "unknown key 'data.\"sources[99999999999999999999]\"'"},
      {"source = \"synthetic\"\n" + source("path = \"" + b + "\"\nweight = 1\n"), "need source = \"tokens\""},
      {source("path = \"" + a + "\"\nweight = 1\n") + "[validation]\ninterval = 5\nsplit = 0.2\nsource = \"c\"\n",
       "validation.source: 'c' is not one of [[data.sources]] (a)"},
      {source("path = \"" + a + "\"\nweight = 1\n") + "[validation]\ninterval = 5\nsource = \"a\"\n",
       "validation.source: evaluates on that source's held-out share: it needs validation.split > 0"},
  };
  for (const auto& [body, message] : cases) {
    JobRun run = test::run_job(dir, "bad", 1, model + body, {});
    EXPECT_EQ(run.result.status, 2) << body << "\n" << run.result.output;
    EXPECT_HAS(run.result.output, message);
    EXPECT_EQ(run.result.output.find("step 1/"), std::string::npos) << "refused before training:\n" << body;
  }
}

}  // namespace
}  // namespace keel
