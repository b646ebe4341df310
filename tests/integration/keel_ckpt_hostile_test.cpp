// keel-ckpt and keel-train on crafted or damaged checkpoints: each is refused with exit 2 and a
// message naming the file and key — never a crash, never a c10 stack trace, never "ok" or
// "identical", never a plugin loaded from a path the checkpoint names.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_reader.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint_forge.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

std::string keel_ckpt(const std::string& args) { return "timeout 120 " + test::bin_dir() + "/keel-ckpt " + args; }

// Runs keel-ckpt `args`; expects exit 2 with every one of `parts` in its output and no crash
// or LibTorch stack trace.
void expect_refused(const std::string& args, const std::vector<std::string>& parts) {
  SCOPED_TRACE("keel-ckpt " + args);
  auto r = test::run_command(keel_ckpt(args));
  EXPECT_EQ(r.status, 2) << r.output;
  for (const std::string& part : parts) EXPECT_HAS(r.output, part);
  EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
}

class HostileCheckpoint : public test::ForgedCheckpointTest {
 protected:
  void SetUp() override {
    ForgedCheckpointTest::SetUp();
    test::forge_checkpoint(sound_root());  // an undamaged copy to diff against
  }
  std::string sound_root() const { return dir_.path() + "/sound"; }
  // verify, diff against the sound copy (both ways) and export --keel all refuse it.
  void expect_every_command_refuses(const std::vector<std::string>& parts) {
    expect_refused("verify " + step(), parts);
    expect_refused("diff " + sound_root() + "/step-1 " + step(), parts);
    expect_refused("diff " + step() + " " + sound_root() + "/step-1", parts);
    expect_refused("export --keel " + (dir_ / "out.safetensors") + " " + step(), parts);
  }
};

TEST_F(HostileCheckpoint, TheForgedCheckpointVerifiesAndDiffsIdentical) {
  auto verify = test::run_command(keel_ckpt("verify " + root()));
  EXPECT_EQ(verify.status, 0) << verify.output;
  auto diff = test::run_command(keel_ckpt("diff " + root() + " " + sound_root()));
  EXPECT_EQ(diff.status, 0) << diff.output;
  EXPECT_HAS(diff.output, "identical: 2 entries");
}

TEST_F(HostileCheckpoint, WrappedDataOffsets) {
  test::edit_safetensors_header(shard(1), [](nlohmann::ordered_json& h, uint64_t data_start) {
    const uint64_t end = std::numeric_limits<uint64_t>::max() - data_start + 1 + 16;  // data_start + end wraps
    h["model.w"]["data_offsets"] = {end - 24, end};
  });
  expect_every_command_refuses({"rank-00001.safetensors", "model.w", "data_offsets"});
}

TEST_F(HostileCheckpoint, NegativeDimensionsInAShardFile) {
  test::edit_safetensors_header(shard(1), [](nlohmann::ordered_json& h, uint64_t) {
    h["model.w"]["shape"] = {-2, -3};
  });
  expect_every_command_refuses({"rank-00001.safetensors", "model.w", "negative"});
}

TEST_F(HostileCheckpoint, AnElementCountThatOverflows) {
  test::edit_safetensors_header(shard(1), [](nlohmann::ordered_json& h, uint64_t) {
    h["model.w"]["shape"] = {uint64_t{1099511627781}, uint64_t{8116567128549412046}};  // product 6 mod 2^64
  });
  expect_every_command_refuses({"rank-00001.safetensors", "model.w", "overflows"});
}

TEST_F(HostileCheckpoint, AShardWithEmptyOffsets) {
  craft([](Manifest& m) { m.entries["model.w"].shards[1].offsets.clear(); });
  expect_every_command_refuses({step() + "/manifest.json", "model.w", "offsets"});
}

TEST_F(HostileCheckpoint, AnEntryWithoutShards) {
  craft([](Manifest& m) { m.entries["model.b"].shards.clear(); });
  expect_every_command_refuses({step() + "/manifest.json", "model.b", "shards"});
}

TEST_F(HostileCheckpoint, AWrongEntryShape) {
  craft([](Manifest& m) { m.entries["model.w"].shape = {5, 3}; });
  expect_every_command_refuses({step() + "/manifest.json", "model.w", "[5, 3]"});
}

TEST_F(HostileCheckpoint, AnUnknownDtype) {
  craft([](Manifest& m) { m.entries["model.b"].dtype = "F99"; });
  expect_every_command_refuses({step() + "/manifest.json", "model.b", "F99"});
}

TEST_F(HostileCheckpoint, ADtypeThatDisagreesWithTheFile) {
  craft([](Manifest& m) { m.entries["model.b"].dtype = "I32"; });
  expect_every_command_refuses({"rank-00000.safetensors", "model.b", "dtype F32 in the file, I32 in the manifest"});
}

TEST_F(HostileCheckpoint, ADuplicatedShard) {
  craft([](Manifest& m) { m.entries["model.b"].shards.push_back(m.entries["model.b"].shards[0]); });
  expect_every_command_refuses({step() + "/manifest.json", "model.b", "duplicated shard"});
}

TEST_F(HostileCheckpoint, OverlappingShards) {
  craft([](Manifest& m) {
    m.entries["model.w"].shards[0].shape = {3, 3};
    m.entries["model.w"].shards[1].offsets = {1, 0};
    m.entries["model.w"].shards[1].shape = {1, 3};
  });
  expect_every_command_refuses({step() + "/manifest.json", "model.w", "overlap"});
}

TEST_F(HostileCheckpoint, AFlippedByteInTheManifestConfig) {
  test::replace_in_file(step() + "/manifest.json", "llama3\\\"", "llamb3\\\"");
  expect_every_command_refuses({step() + "/manifest.json", "damaged manifest"});
}

TEST_F(HostileCheckpoint, AnExtraTensorInAShardFile) {
  write_safetensors(shard(1),
                    {{"model.w", test::forged_w().narrow(0, 2, 2).contiguous()}, {"model.extra", at::zeros({2})}});
  expect_every_command_refuses({"rank-00001.safetensors", "model.extra", "not in the manifest"});
}

TEST_F(HostileCheckpoint, AGarbageLatestPointer) {
  test::write_file(root() + "/latest", "../../etc\n");
  expect_refused("verify " + root(), {root() + "/latest", "not a checkpoint pointer"});
  expect_refused("ls " + root(), {root() + "/latest"});
  expect_refused("diff " + root() + " " + sound_root(), {root() + "/latest"});
}

// The manifest names a real plugin by path: export must not load it (its constructor would run).
TEST_F(HostileCheckpoint, APluginPathInTheManifestIsNeverLoaded) {
  craft([](Manifest& m) { m.model_plugin = test::plugin_dir() + "/llama3.so"; });
  expect_refused("export --hf " + (dir_ / "hf") + " " + step() + " --plugin-path " + test::plugin_dir(),
                 {step() + "/manifest.json", "model.plugin", "is not a name"});
  expect_refused("verify " + step(), {"model.plugin"});
  EXPECT_FALSE(fs::exists(dir_ / "hf"));
}

// Bytes that fail their checksum (a sound structure) are damage: exit 1, every shard named.
TEST_F(HostileCheckpoint, ChecksumMismatchesAreDamageAndAllReported) {
  craft([](Manifest& m) {
    m.entries["model.b"].shards[0].xxh64 = "0123456789abcdef";
    m.entries["model.w"].shards[1].xxh64 = "0123456789abcdef";
  });
  auto r = test::run_command(keel_ckpt("verify " + step()));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_HAS(r.output, "file rank-00000.safetensors, key 'model.b': damaged");
  EXPECT_HAS(r.output, "file rank-00001.safetensors, key 'model.w': damaged");
}

// --- a checkpoint keel-train wrote ----------------------------------------------------------

const char* kJob = R"([model]
plugin = "deepseek_v3_mtp"
flavor = "tiny"
[clipper]
plugin = "norm_clipper"
max_norm = 1.0
[training]
steps = 2
seq_len = 16
global_batch = 4
seed = 3
threads = 1
[parallelism]
timeout_s = 60
[checkpoint]
interval = 2
save_final = false
)";

class TrainedCheckpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    test::write_file(*dir_ / "job.toml", kJob);
    auto r = train("");
    ASSERT_EQ(r.status, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static test::CommandResult train(const std::string& sets) {
    return test::run_command("timeout 300 " + test::bin_dir() + "/keel-train --plugin-path " + test::plugin_dir() +
                             " --config " + (*dir_ / "job.toml") + " --set job.run_dir=\\\"" + (*dir_ / "run") +
                             "\\\" " + sets);
  }
  // A copy of the trained checkpoint under `name`, so each test damages its own.
  static std::string copy(const std::string& name) {
    const std::string root = *dir_ / name;
    fs::create_directories(root);
    fs::copy(*dir_ / "run/checkpoints/step-2", root + "/step-2", fs::copy_options::recursive);
    test::write_file(root + "/latest", "step-2\n");
    return root;
  }
  static test::TempDir* dir_;
};
test::TempDir* TrainedCheckpoint::dir_ = nullptr;

// The issue's crash (exit 139): a resume from a shard whose data_offsets wrap 2^64.
TEST_F(TrainedCheckpoint, AResumeFromACraftedShardExitsTwoNamingTheFile) {
  const std::string root = copy("crafted");
  const std::string file = root + "/step-2/rank-00000.safetensors";
  std::string key;
  test::edit_safetensors_header(file, [&](nlohmann::ordered_json& h, uint64_t data_start) {
    for (auto& [name, e] : h.items())
      if (name != "__metadata__" && e["data_offsets"][1].get<uint64_t>() > e["data_offsets"][0].get<uint64_t>()) {
        key = name;
        const uint64_t size = e["data_offsets"][1].get<uint64_t>() - e["data_offsets"][0].get<uint64_t>();
        const uint64_t end = std::numeric_limits<uint64_t>::max() - data_start + 1 + 16;
        e["data_offsets"] = {end - size, end};
        break;
      }
  });
  ASSERT_FALSE(key.empty());
  auto r =
      train("--set training.steps=4 --set checkpoint.load=\\\"latest\\\" --set checkpoint.dir=\\\"" + root + "\\\"");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_HAS(r.output, "rank-00000.safetensors");
  EXPECT_HAS(r.output, key);
  EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
}

TEST_F(TrainedCheckpoint, AResumeFromAManifestWithANegativeStepExitsTwo) {
  const std::string root = copy("negative_step");
  Manifest m = read_manifest(root + "/step-2");
  m.step = -1;  // the learning rate of step 0 would be NaN
  test::write_manifest(root + "/step-2", m);
  auto r =
      train("--set training.steps=4 --set checkpoint.load=\\\"latest\\\" --set checkpoint.dir=\\\"" + root + "\\\"");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_HAS(r.output, "manifest.json: step: -1 is out of range");
}

// A checkpoint of a deeper model: the weights of the layer this model lacks would be dropped
// silently; every rank refuses them instead, naming one.
TEST_F(TrainedCheckpoint, ModelEntriesThisModelHasNoPlaceForAreRefused) {
  const std::string root = copy("deeper");
  auto r = train(
      "--set model.n_layers=1 --set checkpoint.interval=0 --set checkpoint.load_model_only=true "
      "--set checkpoint.load=\\\"" +
      root + "/step-2\\\"");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_HAS(r.output, "this model has no place for (model.layers.1.");
}

// export --hf looks the manifest's plugin up by name; --plugin replaces it.
TEST_F(TrainedCheckpoint, ExportTakesThePluginByNameOrFromPluginOption) {
  const std::string root = copy("renamed_plugin");
  Manifest m = read_manifest(root + "/step-2");
  m.model_plugin = "no_such_plugin";
  test::write_manifest(root + "/step-2", m);
  const std::string out = *dir_ / "hf";
  expect_refused("export --hf " + out + " " + root + " --plugin-path " + test::plugin_dir(),
                 {"plugin 'no_such_plugin' not found"});
  auto r = test::run_command(
      keel_ckpt("export --hf " + out + " " + root + " --plugin deepseek_v3_mtp --plugin-path " + test::plugin_dir()));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(out + "/config.json")) << r.output;
  EXPECT_TRUE(fs::exists(out + "/model.safetensors")) << r.output;
}

}  // namespace
}  // namespace keel
