// keel-bench-step: times whole training steps (forward, backward, clip, AdamW) of a job after
// warm-up and prints the median, the spread, the step program's own median (pre_clip, clip,
// AdamW: eager or a replayed CUDA graph), tokens/s, the activated parameters per token and the
// peak memory. With --profile, the timed steps run under LibTorch's profiler (CPU operators),
// whose Chrome trace tools/bench/profile_ops summarises.
//   keel-bench-step --config FILE [--plugin-path DIR] [--warmup N] [--steps N] [--set k=v]...
//                   [--profile TRACE.json]
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "device/device.hpp"
#include "train/dry_run.hpp"
#include "train/job.hpp"
#include "train/trainer.hpp"

int main(int argc, char** argv) {
  keel::RunOptions options;
  int warmup = 3, steps = 10;
  std::string profile;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--config")
      options.config_path = value;
    else if (flag == "--plugin-path")
      options.plugin_dirs.push_back(value);
    else if (flag == "--set")
      options.overrides.push_back(value);
    else if (flag == "--warmup")
      warmup = std::stoi(value);
    else if (flag == "--steps")
      steps = std::stoi(value);
    else if (flag == "--profile")
      profile = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    options.overrides.push_back("checkpoint.save_final=false");
    options.overrides.push_back("metrics.jsonl=false");
    options.overrides.push_back("training.steps=" + std::to_string(warmup + steps));
    options.overrides.push_back("lr_scheduler.warmup_steps=1");
    keel::Job job(options, false);
    keel::Trainer trainer(job);
    trainer.time_step_program(true);
    std::vector<double> times, program;
    namespace profiler = torch::autograd::profiler;
    for (int s = 1; s <= warmup + steps; ++s) {
      if (s == warmup + 1 && !profile.empty()) {
        const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
        const std::set<torch::profiler::impl::ActivityType> cpu{torch::profiler::impl::ActivityType::CPU};
        profiler::prepareProfiler(config, cpu);
        profiler::enableProfiler(config, cpu);
      }
      auto start = std::chrono::steady_clock::now();
      trainer.step(s, /*read_loss=*/true);  // reading the loss waits for the step to finish
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (s > warmup) {
        times.push_back(ms);
        program.push_back(trainer.step_program_seconds() * 1e3);
      }
    }
    if (!profile.empty()) profiler::disableProfiler()->save(profile);
    std::sort(times.begin(), times.end());
    std::sort(program.begin(), program.end());
    const keel::TrainingSection& t = job.config().training;
    const double tokens = static_cast<double>(t.global_batch * t.seq_len);
    std::printf("keel step: median %.1f ms, min %.1f ms, max %.1f ms over %d steps; peak memory %.0f MiB\n",
                times[times.size() / 2], times.front(), times.back(), steps,
                keel::peak_memory_bytes(job.device()) / (1024.0 * 1024.0));
    std::printf("step program (%s): median %.2f ms\n", trainer.step_program_captured() ? "CUDA graph" : "eager",
                program[program.size() / 2]);
    std::printf("tokens/s %.0f; activated parameters per token %.0f\n", tokens / (times[times.size() / 2] / 1e3),
                keel::count_parameters(job)[""].activated);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-bench-step: %s\n", e.what());
    return 1;
  }
}
