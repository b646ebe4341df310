// CUDA checks; each skips with its reason where no GPU is present.
#include <gtest/gtest.h>

#include <cmath>

#include "device/device.hpp"
#include "test_support.hpp"
#include "train/job.hpp"
#include "train/trainer.hpp"

namespace keel {
namespace {

TEST(Gpu, TinyLlamaTrainsOnCudaAndTracksTheCpuRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible to LibTorch";
  test::TempDir dir;
  test::write_file(dir / "job.toml",
                   "[model]\nplugin = \"llama3\"\nflavor = \"tiny\"\n[training]\nsteps = 20\nseq_len = 32\n"
                   "global_batch = 8\n[metrics]\njsonl = false\n[checkpoint]\nsave_final = false\n");
  std::vector<double> losses[2];
  const char* devices[2] = {"cpu", "cuda"};
  for (int d = 0; d < 2; ++d) {
    RunOptions options;
    options.config_path = dir / "job.toml";
    options.plugin_dirs = {test::plugin_dir()};
    options.overrides = {std::string("training.device=") + devices[d], "job.run_dir=\"" + (dir / "run") + "\""};
    Job job(options, false);
    Trainer trainer(job);
    for (int s = 1; s <= 20; ++s) losses[d].push_back(trainer.step(s, true));
    if (d == 1) {
      EXPECT_TRUE(trainer.optimizer().params()[0].param.is_cuda());
    }
  }
  EXPECT_LT(losses[1].back(), losses[1].front());
  for (size_t s = 0; s < losses[0].size(); ++s)
    EXPECT_NEAR(losses[1][s], losses[0][s], 2e-3 * losses[0][s]) << "step " << s + 1;
}

}  // namespace
}  // namespace keel
