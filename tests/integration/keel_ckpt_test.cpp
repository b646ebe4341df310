// keel-ckpt on checkpoints that keel-train wrote: ls, verify (and its refusal of a damaged
// shard), diff within one run, across steps and across layouts, and export --keel.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_reader.hpp"
#include "checkpoint/safetensors.hpp"
#include "test_support.hpp"
#include "tolerance.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;

// The tiny DeepSeek-V3 with MTP, checkpoints at steps 2 and 4. Checkpoints of two layouts are
// compared under the error model of tests/support/tolerance.hpp (kBounds below).
const char* kJob = R"([model]
plugin = "deepseek_v3_mtp"
flavor = "tiny"
[clipper]
plugin = "norm_clipper"
max_norm = 1.0
[training]
steps = 4
seq_len = 16
global_batch = 8
seed = 3
threads = 1
[parallelism]
timeout_s = 60
[optimizer]
lr = 3e-4
[checkpoint]
interval = 2
save_final = false
)";

// What the error model needs to know of kJob, at step 2.
test::TrainingBounds bounds_at_step_2() {
  test::TrainingBounds b;
  b.lr = 3e-4, b.steps = 2, b.max_grad_norm = 1.0, b.load_balance_coeff = 1e-3;
  return b;
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

std::string keel_ckpt(const std::string& args) { return test::bin_dir() + "/keel-ckpt " + args; }

// Trains kJob on `ranks` processes; returns the run's checkpoint root.
std::string train(const test::TempDir& dir, const std::string& name, int ranks, const std::string& sets = "") {
  const std::string run_dir = dir / name;
  test::write_file(dir / (name + ".toml"), kJob);
  auto r =
      test::run_command("timeout 300 " + test::source_dir() + "/tools/keel-launch --nproc " + std::to_string(ranks) +
                        " -- " + test::bin_dir() + "/keel-train --plugin-path " + test::plugin_dir() + " --config " +
                        (dir / (name + ".toml")) + " --set job.run_dir=\\\"" + run_dir + "\\\" " + sets);
  EXPECT_EQ(r.status, 0) << r.output;
  return run_dir + "/checkpoints";
}

class KeelCkpt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    root_ = new std::string(train(*dir_, "single", 1));
  }
  static void TearDownTestSuite() {
    delete root_;
    delete dir_;
  }
  static std::string step(int n) { return *root_ + "/step-" + std::to_string(n); }

  static test::TempDir* dir_;
  static std::string* root_;
};
test::TempDir* KeelCkpt::dir_ = nullptr;
std::string* KeelCkpt::root_ = nullptr;

TEST_F(KeelCkpt, LsOfARootListsTheLatestCheckpointAndEveryEntry) {
  auto r = test::run_command(keel_ckpt("ls " + *root_));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_HAS(r.output, "checkpoint  " + step(4));
  EXPECT_HAS(r.output, "step        4 (tokens seen 512");
  EXPECT_HAS(r.output, "data        position 32");
  EXPECT_HAS(r.output, "mesh        pp 1 x dp 1, ep 1 (1 rank)");
  EXPECT_HAS(r.output, "model       deepseek_v3_mtp (plugin deepseek_v3_mtp)");
  EXPECT_HAS(r.output, "model.layers.1.moe.experts.w1  F32 [8, 32, 64]  1 shard: rank-00000.safetensors @ [0, 0, 0]");
  const size_t entries = CheckpointReader(step(4)).manifest().entries.size();
  size_t lines = 0;
  for (size_t at = 0; (at = r.output.find(" shard", at)) != std::string::npos; ++at) ++lines;
  EXPECT_EQ(lines, entries);
}

TEST_F(KeelCkpt, VerifyChecksEveryShard) {
  auto r = test::run_command(keel_ckpt("verify " + step(2)));
  ASSERT_EQ(r.status, 0) << r.output;
  const size_t entries = CheckpointReader(step(2)).manifest().entries.size();
  EXPECT_HAS(r.output,
             "ok: " + std::to_string(entries) + " shards of " + std::to_string(entries) + " entries verified");
}

// Flips one byte inside `key`'s data in safetensors file `file`; the header stays valid.
void flip_data_byte(const std::string& file, const std::string& key) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_size = 0;
  f.read(reinterpret_cast<char*>(&header_size), 8);
  std::string header(header_size, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_size));
  const auto begin = nlohmann::json::parse(header).at(key).at("data_offsets").at(0).get<uint64_t>();
  const auto at = static_cast<std::streamoff>(8 + header_size + begin + 2);
  char byte = 0;
  f.seekg(at);
  f.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x10);
  f.seekp(at);
  f.write(&byte, 1);
}

TEST_F(KeelCkpt, VerifyRefusesAFlippedDataByteNamingFileAndKey) {
  test::TempDir copy;
  const std::string damaged = copy / "step-2";
  fs::copy(step(2), damaged, fs::copy_options::recursive);
  const std::string key = "model.norm.weight";
  flip_data_byte(damaged + "/rank-00000.safetensors", key);
  auto r = test::run_command(keel_ckpt("verify " + damaged));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_HAS(r.output, "file rank-00000.safetensors, key '" + key + "': damaged");
}

// diff reads each shard once, yet names no difference before every shard it compares is
// verified: the damaged entry sorts after entries that differ.
TEST_F(KeelCkpt, DiffRefusesADamagedCheckpointBeforeNamingAnyDifference) {
  test::TempDir copy;
  const std::string damaged = copy / "step-4";
  fs::copy(step(4), damaged, fs::copy_options::recursive);
  std::string last;
  const CheckpointReader reader(damaged);
  for (const auto& [key, entry] : reader.manifest().entries)
    if (!key.starts_with("rng.") && entry.shards.front().file == "rank-00000.safetensors") last = key;
  ASSERT_FALSE(last.empty());
  flip_data_byte(damaged + "/rank-00000.safetensors", last);
  auto r = test::run_command(keel_ckpt("diff " + step(2) + " " + damaged));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_HAS(r.output, "key '" + last + "': damaged");
  EXPECT_EQ(r.output.find("differs"), std::string::npos) << r.output;
}

TEST_F(KeelCkpt, DiffOfACheckpointWithItselfIsIdentical) {
  auto r = test::run_command(keel_ckpt("diff " + step(2) + " " + step(2)));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_HAS(r.output, "identical: ");
}

TEST_F(KeelCkpt, DiffOfTwoStepsNamesWhatDiffers) {
  auto r = test::run_command(keel_ckpt("diff " + step(2) + " " + step(4)));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_HAS(r.output, "differs    model.norm.weight  max |diff| ");
  EXPECT_HAS(r.output, "differ: ");
  EXPECT_EQ(r.output.find("rng.cpu.rank0"), std::string::npos) << r.output;
}

// The entries of checkpoint `dir` by the error model's class, rng.* left out (per rank) and
// exp_avg_sq too: the model bounds it through its square root, which keel-ckpt diff does not
// take (the parity suite compares it).
std::map<std::string, std::vector<std::string>> keys_by_class(const std::string& dir) {
  std::map<std::string, std::vector<std::string>> keys;
  const CheckpointReader reader(dir);
  for (const auto& [key, entry] : reader.manifest().entries)
    if (key.rfind("rng.", 0) != 0 && test::state_class(key) != "exp_avg_sq")
      keys[test::state_class(key)].push_back(key);
  return keys;
}

// keel-ckpt diff of `a` and `b` over `keys` (each one a --prefix), with the tolerance's
// --rtol/--atol (none: bitwise).
test::CommandResult diff_within(const std::string& a, const std::string& b, const std::vector<std::string>& keys,
                                const test::Tolerance& tol) {
  std::string args = "diff " + a + " " + b;
  for (const std::string& key : keys) args += " --prefix " + key;
  if (tol.rtol > 0 || tol.atol > 0) {
    char numbers[96];
    std::snprintf(numbers, sizeof(numbers), " --rtol %.17g --atol %.17g", tol.rtol, tol.atol);
    args += numbers;
  }
  return test::run_command(keel_ckpt(args));
}

TEST_F(KeelCkpt, DiffAcrossLayoutsAgreesWithinTolerance) {
  const std::string two = train(*dir_, "dp2_ep2", 2, "--set parallelism.dp=2 --set parallelism.ep=2");
  auto layout = test::run_command(keel_ckpt("ls " + two + "/step-2"));
  ASSERT_EQ(layout.status, 0) << layout.output;
  ASSERT_NE(layout.output.find("mesh        pp 1 x dp 2, ep 2 (2 ranks)"), std::string::npos) << layout.output;

  const test::TrainingBounds bounds = bounds_at_step_2();
  const auto classes = keys_by_class(step(2));
  ASSERT_EQ(classes.size(), 4u);  // parameters, expert_bias, exp_avg, counters
  CheckpointReader single(step(2)), parallel(two + "/step-2");
  for (const auto& [cls, keys] : classes) {
    const test::Tolerance tol = test::state_tolerance(keys.front(), bounds);
    auto r = diff_within(step(2), two + "/step-2", keys, tol);
    EXPECT_EQ(r.status, 0) << cls << ": " << r.output;
    EXPECT_HAS(r.output, "identical: " + std::to_string(keys.size()) + " entries");
    // The same comparison in process, for the worst deviation as a fraction of the bound.
    double worst = 0;
    for (const std::string& key : keys)
      worst = std::max(worst, test::deviation(parallel.read_whole(key), single.read_whole(key), tol));
    std::printf("DIFF | single vs DP2 EP2, step 2 | %-11s | %zu entries | worst %.2g of the bound (atol %.3g)\n",
                cls.c_str(), keys.size(), worst, tol.atol);
  }

  // The tolerance has teeth: the other layout's step 4 is not the single run's step 2 (its
  // moments and counters are two steps further), whatever the CPU.
  for (const char* cls : {"exp_avg", "counters"}) {
    const std::vector<std::string>& keys = classes.at(cls);
    auto r = diff_within(step(2), two + "/step-4", keys, test::state_tolerance(keys.front(), bounds));
    EXPECT_EQ(r.status, 1) << cls << ": " << r.output;
    EXPECT_HAS(r.output, "differ: ");
  }
}

TEST_F(KeelCkpt, ExportKeelWritesTheConsolidatedModelUnderCanonicalNames) {
  test::TempDir out;
  auto r = test::run_command(keel_ckpt("export --keel " + (out / "model.safetensors") + " " + step(2)));
  ASSERT_EQ(r.status, 0) << r.output;
  SafetensorsFile file = read_safetensors(out / "model.safetensors");
  CheckpointReader reader(step(2));
  size_t model_entries = 0;
  for (const auto& [key, entry] : reader.manifest().entries) {
    if (key.rfind("model.", 0) != 0) continue;
    ++model_entries;
    auto it = file.tensors.find(key.substr(6));
    ASSERT_NE(it, file.tensors.end()) << key;
    EXPECT_TRUE(at::equal(it->second, reader.read_whole(key))) << key;
  }
  EXPECT_EQ(file.tensors.size(), model_entries);
  EXPECT_EQ(file.metadata.at("step"), "2");
}

TEST_F(KeelCkpt, BadInputExitsTwoNamingWhatIsWrong) {
  auto missing = test::run_command(keel_ckpt("ls " + (dir_->path() + "/nowhere")));
  EXPECT_EQ(missing.status, 2) << missing.output;
  EXPECT_HAS(missing.output, dir_->path() + "/nowhere");
  auto one = test::run_command(keel_ckpt("diff " + step(2)));
  EXPECT_EQ(one.status, 2) << one.output;
  auto neither = test::run_command(keel_ckpt("export " + step(2)));
  EXPECT_EQ(neither.status, 2) << neither.output;
  EXPECT_HAS(neither.output, "exactly one of --hf OUT and --keel");
  auto unknown = test::run_command(keel_ckpt("frobnicate"));
  EXPECT_EQ(unknown.status, 2) << unknown.output;
}

}  // namespace
}  // namespace keel
