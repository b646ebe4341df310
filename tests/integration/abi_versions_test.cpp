// Plugins of every ABI minor load, train and (from 1.1) export in this host: the same raw-ABI
// model and clipper built as 1.0 to 1.9 and a future 1.10 (tests/plugins/versioned_model.cpp),
// each with traps beyond its struct sizes that a host reading too far would trip over.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "checkpoint/safetensors.hpp"
#include "data/token_file.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

class AbiVersions : public ::testing::TestWithParam<int> {
 protected:
  std::string plugin() const { return "versioned_1_" + std::to_string(GetParam()); }
  std::string plugin_paths() const {
    return " --plugin-path " + test::test_plugin_dir() + " --plugin-path " + test::plugin_dir();
  }
  // Trains 4 steps with the versioned model and clipper, saving a checkpoint at the end.
  test::CommandResult train(const test::TempDir& dir) const {
    test::write_file(dir / "job.toml", "[model]\nplugin = \"" + plugin() +
                                           "\"\ncomponent = \"model\"\n[clipper]\nplugin = \"" + plugin() +
                                           "\"\ncomponent = \"clipper\"\n[training]\nsteps = 4\nseq_len = 8\n"
                                           "global_batch = 2\nthreads = 1\n[optimizer]\nlr = 0.05\n"
                                           "[metrics]\nlog_interval = 1\n[checkpoint]\ninterval = 4\n");
    return test::run_command(test::bin_dir() + "/keel-train --config " + (dir / "job.toml") + plugin_paths() +
                             " --set job.run_dir=\\\"" + (dir / "run") + "\\\"");
  }
};

TEST_P(AbiVersions, TrainsWithTheModelAndTheClipperOfThatMinor) {
  test::TempDir dir;
  test::CommandResult r = train(dir);
  ASSERT_EQ(r.status, 0) << r.output;
  std::string metrics = test::read_file(dir / "run/metrics.jsonl");
  EXPECT_NE(metrics.find("\"step\":4"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("nan"), std::string::npos) << metrics;
  // From 1.5 the model also reports its loss per token, as a ratio.
  EXPECT_EQ(metrics.find("\"token_loss\":") != std::string::npos, GetParam() >= 5) << metrics;
}

TEST_P(AbiVersions, ExportsFromOneOneOnAndRefusesNamingTheVersionBefore) {
  test::TempDir dir;
  ASSERT_EQ(train(dir).status, 0);
  test::CommandResult r = test::run_command(test::bin_dir() + "/keel-ckpt export --hf " + (dir / "hf") + " " +
                                            (dir / "run/checkpoints/step-4") + plugin_paths());
  if (GetParam() == 0) {
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("cannot export"), std::string::npos) << r.output;
    return;
  }
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(test::read_file(dir / "hf/config.json").find("\"versioned_minor\": " + std::to_string(GetParam())),
            std::string::npos);
  EXPECT_EQ(read_safetensors(dir / "hf/model.safetensors").tensors.count("head.weight"), 1u);
}

TEST_P(AbiVersions, InspectListsExportAndIgnoredExtensions) {
  test::CommandResult r = test::run_command(test::bin_dir() + "/keel-plugin inspect " + plugin() + plugin_paths());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("abi        1." + std::to_string(GetParam())), std::string::npos) << r.output;
  const bool exports = r.output.find("export_state") != std::string::npos;
  EXPECT_EQ(exports, GetParam() >= 1) << r.output;
  EXPECT_EQ(r.output.find("[extension; formats: hf]") != std::string::npos, GetParam() >= 2) << r.output;
  // 0x7e57: the 1.10 plugin's extension that this host cannot know.
  EXPECT_EQ(r.output.find("does not know (ignored): 32343") != std::string::npos, GetParam() == 10) << r.output;
  // From 1.3 the clipper declares its one key; the model declares none.
  const bool listed =
      r.output.find(
          "config keys ([clipper.clipper], or [clipper] beside plugin = ...):\n"
          "             bound  float    1.0  gradients are clamped to [-bound, bound]") != std::string::npos;
  EXPECT_EQ(listed, GetParam() >= 3) << r.output;
  EXPECT_NE(r.output.find("config keys: not declared"), std::string::npos) << r.output;
}

// Writes a 2-step job of `plugin`'s model and clipper with `tables` appended; returns the
// keel-train command that runs it.
std::string versioned_job(const test::TempDir& dir, const std::string& plugin, const std::string& tables) {
  const std::string paths = " --plugin-path " + test::test_plugin_dir() + " --plugin-path " + test::plugin_dir();
  test::write_file(dir / "job.toml", "[model]\nplugin = \"" + plugin +
                                         "\"\ncomponent = \"model\"\n[clipper]\nplugin = \"" + plugin +
                                         "\"\ncomponent = \"clipper\"\n" + tables +
                                         "[training]\nsteps = 2\nseq_len = 8\nglobal_batch = 2\nthreads = 1\n");
  return test::bin_dir() + "/keel-train --config " + (dir / "job.toml") + paths + " --set job.run_dir=\\\"" +
         (dir / "run") + "\\\"";
}

// A declared key set in the clipper's own table takes effect; an undeclared one is refused
// naming the clipper and the keys it reads.
TEST(AbiVersions, TheDeclaredKeyOfAOneThreeClipperIsReadFromItsTable) {
  test::TempDir dir;
  const std::string train = versioned_job(dir, "versioned_1_3", "[clipper.clipper]\nbound = 0.5\n");
  test::CommandResult r = test::run_command(train);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(test::read_file(dir / "run/config.toml").find("[clipper.clipper]\nbound = 0.5\n"), std::string::npos);
  r = test::run_command(train + " --set clipper.clipper.bund=0.5");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--set clipper.clipper.bund=0.5: unknown key 'clipper.clipper.bund'; the clipper component "
                          "'clipper' (plugin versioned_1_3) reads bound (keel-plugin inspect versioned_1_3)"),
            std::string::npos)
      << r.output;
}

// A model without the import extension (every plugin before 1.4, and a 1.4 one that does not
// import) is refused by name; OUT is not created.
TEST(AbiVersions, ImportNamesAModelWithoutTheImportExtension) {
  test::TempDir dir;
  test::write_file(dir / "hf/config.json", "{\"architectures\": [\"BigramForCausalLM\"]}\n");
  write_safetensors(dir / "hf/model.safetensors", {{"head.weight", at::zeros({4, 4})}});
  const std::string paths = " --plugin-path " + test::test_plugin_dir() + " --plugin-path " + test::plugin_dir();
  for (const char* plugin : {"versioned_1_3", "versioned_1_4"}) {
    test::CommandResult r = test::run_command(test::bin_dir() + "/keel-ckpt import --hf " + (dir / "hf") + " " +
                                              (dir / "out") + " --plugin " + plugin + paths);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(std::string("plugin ") + plugin + " has no model that imports"), std::string::npos)
        << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  }
}

// A model without the recompute extension (every plugin before 1.6, and a 1.6 one that does
// not recompute) is refused by name when the job asks for recomputation, before any step.
TEST(AbiVersions, RecomputeNamesAModelWithoutTheRecomputeExtension) {
  test::TempDir dir;
  test::CommandResult r =
      test::run_command(versioned_job(dir, "versioned_1_6", "") + " --set training.recompute=\\\"full\\\"");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("training.recompute = \"full\": model model (versioned_1_6) does not recompute "
                          "activations (its plugin offers no KEEL_EXTENSION_MODEL_RECOMPUTE, SDK 1.6)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run/metrics.jsonl"));
}

TEST(AbiVersions, BlockCausalNamesAModelWithoutTheAttentionExtension) {
  test::TempDir dir;
  std::vector<uint32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = i % 100 == 99 ? 0u : static_cast<uint32_t>(1 + i % 7);
  keel::write_token_file(dir / "docs.tok", tokens, 16, 0, 40);
  test::CommandResult r = test::run_command(versioned_job(
      dir, "versioned_1_9",
      "[data]\nsource = \"tokens\"\npath = \"" + (dir / "docs.tok") + "\"\nattention = \"block_causal\"\n"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("data.attention = \"block_causal\": model model (versioned_1_9) cannot mask attention by "
                          "document (its plugin offers no KEEL_EXTENSION_MODEL_ATTENTION, SDK 1.9)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run/metrics.jsonl"));
}

// Under a sharded optimizer at DP2, gradients are reduce-scattered only where the model's
// pre_clip and the clipper allow it (SDK 1.7): a pre_clip without KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY
// (1.6) or a clipper without the shards extension keeps them whole, said in the log.
TEST(AbiVersions, ShardedGradientsAreReduceScatteredOnlyWhereModelAndClipperAllowIt) {
  const std::string sharded = " --set parallelism.dp=2 --set parallelism.shard_optimizer=true";
  const std::string norm_clipper =
      " --set clipper.plugin=\\\"norm_clipper\\\" --set clipper.component=\\\"norm_clipper\\\"";
  struct Case {
    std::string plugin, sets, expected;
  };
  const std::vector<Case> cases = {
      {"versioned_1_6", norm_clipper,
       "gradients all-reduced whole: model model (versioned_1_6) has a pre_clip hook without "
       "KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY (it may read any gradient)"},
      {"versioned_1_7", "",
       "gradients all-reduced whole: clipper clipper (versioned_1_7) offers no KEEL_EXTENSION_CLIPPER_SHARDS (it "
       "clips whole gradients)"},
      {"versioned_1_7", norm_clipper, "gradients reduce-scattered in 1 of 1 bucket(s)"},
  };
  for (const Case& c : cases) {
    test::TempDir dir;
    test::CommandResult r = test::run_command(test::source_dir() + "/tools/keel-launch --nproc 2 -- " +
                                              versioned_job(dir, c.plugin, "") + sharded + c.sets);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.plugin << c.sets << "\n" << r.output;
    const std::string metrics = test::read_file(dir / "run/metrics.jsonl");
    EXPECT_NE(metrics.find("\"step\":2"), std::string::npos) << metrics;
    EXPECT_EQ(metrics.find("nan"), std::string::npos) << metrics;
  }
}

TEST(HeaderExample, TheRawAbiClipperInKeelHTrainsTheTinyLlama) {
  test::TempDir dir;
  test::write_file(dir / "job.toml",
                   "[model]\nplugin = \"llama3\"\nflavor = \"tiny\"\n[clipper]\nplugin = \"clamp\"\n"
                   "[training]\nsteps = 3\nseq_len = 16\nglobal_batch = 2\nthreads = 1\n"
                   "[metrics]\nlog_interval = 1\n");
  test::CommandResult r = test::run_command(test::bin_dir() + "/keel-train --config " + (dir / "job.toml") +
                                            " --plugin-path " + test::test_plugin_dir() + " --plugin-path " +
                                            test::plugin_dir() + " --set job.run_dir=\\\"" + (dir / "run") + "\\\"");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(test::read_file(dir / "run/metrics.jsonl").find("\"step\":3"), std::string::npos);
}

// zbv puts a REPLICA beside its owner, which keel::StageReplicas handles from SDK 1.8: an older
// model is refused up front, on every rank alike, rather than left waiting in post_init.
TEST(AbiVersionsZeroBubbleV, AModelBuiltBeforeSdk18IsRefusedNamingTheVersion) {
  test::TempDir dir;
  test::write_file(dir / "job.toml",
                   "[model]\nplugin = \"versioned_1_7\"\ncomponent = \"model\"\n[training]\nsteps = 1\n"
                   "seq_len = 8\nglobal_batch = 2\nthreads = 1\n[parallelism]\npp = 2\nschedule = \"zbv\"\n"
                   "stages_per_rank = 2\n");
  test::CommandResult r = test::run_command(
      "RANK=0 WORLD_SIZE=2 MASTER_PORT=" + std::to_string(test::free_port()) + " timeout 60 " + test::bin_dir() +
      "/keel-train --config " + (dir / "job.toml") + " --plugin-path " + test::test_plugin_dir() + " --plugin-path " +
      test::plugin_dir() + " --set job.run_dir=\\\"" + (dir / "run") + "\\\"");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("parallelism.schedule: \"zbv\" needs a model plugin built against SDK 1.8 or newer; "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("versioned_1_7.so was built against 1.7"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Minor, AbiVersions, ::testing::Values(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
                         [](const ::testing::TestParamInfo<int>& info) { return "v1_" + std::to_string(info.param); });

}  // namespace
}  // namespace keel
