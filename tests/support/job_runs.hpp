// Runs keel-train jobs from tests: one or several ranks (keel-launch), a job file written from
// text, `--set` overrides, and what the run left behind (loss curve, final state).
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/safetensors.hpp"
#include "metrics/json_number.hpp"
#include "test_support.hpp"

namespace keel::test {

/// The job the parallel and checkpoint suites share, with `model` as the [model] table's lines
/// (tiny_deepseek_job: the tiny DeepSeek-V3 with MTP, 4 layers, so 4 stages fit): two
/// microbatches, 10 steps, clipping that bites every step, every copy of every parameter
/// checked after every step, the final state dumped. `checkpoint` holds extra
/// lines of the [checkpoint] table.
///
/// Runs of it in different layouts are compared under the error model of tolerance.hpp: loss
/// and grad norm within 1e-5, Adam's moments within the normwise gradient bound, parameters
/// within Adam's own per-step bound (lr 3e-4, 10 steps); none of it depends on one machine's
/// bits.
inline std::string tiny_job(const std::string& model, const std::string& checkpoint = "") {
  return "[model]\n" + model + R"([clipper]
max_norm = 0.05
[training]
steps = 10
seq_len = 16
global_batch = 8
seed = 3
threads = 1
[parallelism]
microbatches = 2
timeout_s = 60
[optimizer]
lr = 3e-4
[metrics]
log_interval = 1
[debug]
replica_check_interval = 1
dump_state = true
[checkpoint]
save_final = false
)" + checkpoint;
}

/// tiny_job() of the tiny DeepSeek-V3 with MTP (4 layers).
inline std::string tiny_deepseek_job(const std::string& checkpoint = "") {
  return tiny_job("plugin = \"deepseek_v3_mtp\"\nflavor = \"tiny\"\nn_layers = 4\n", checkpoint);
}

/// What one run of a job left behind.
struct JobRun {
  std::string dir;  ///< its job.run_dir
  CommandResult result;
  double seconds = 0;
  std::vector<int64_t> steps;  ///< the logged steps, in order
  std::vector<double> loss, grad_norm;
  std::map<int64_t, std::map<std::string, double>> validation;  ///< by step: its "val_*" figures
  std::map<std::string, std::vector<double>> pipeline;          ///< "pipeline_*" figures, step by step
  std::map<std::string, at::Tensor> state;                      ///< final/state.safetensors when debug.dump_state
  std::map<std::string, std::vector<double>> source_tokens;     ///< "tokens.<source>" figures, step by step
};

/// Runs `job` (TOML text) on `ranks` local processes with run_dir <dir>/<name> and `sets`
/// ("section.key=value") applied; reads its metrics.jsonl and final state when it succeeded.
inline JobRun run_job(const TempDir& dir, const std::string& name, int ranks, const std::string& job,
                      const std::vector<std::string>& sets) {
  JobRun run;
  run.dir = dir / name;
  write_file(dir / (name + ".toml"), job);
  std::string command = "timeout 300 " + source_dir() + "/tools/keel-launch --nproc " + std::to_string(ranks) + " -- " +
                        bin_dir() + "/keel-train --plugin-path " + plugin_dir() + " --config " +
                        (dir / (name + ".toml")) + " --set job.run_dir=\\\"" + run.dir + "\\\"";
  for (const std::string& s : sets) command += " --set " + s;
  auto start = std::chrono::steady_clock::now();
  run.result = run_command(command);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (run.result.status != 0) return run;
  std::istringstream in(read_file(run.dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    run.steps.push_back(j["step"]);
    run.loss.push_back(number_from_json(j["loss"]));
    run.grad_norm.push_back(number_from_json(j["grad_norm"]));
    for (const auto& [key, value] : j.items())
      if (key.rfind("val_", 0) == 0)
        run.validation[j["step"]][key] = number_from_json(value);
      else if (key.rfind("pipeline_", 0) == 0)
        run.pipeline[key].push_back(number_from_json(value));
      else if (key.rfind("tokens.", 0) == 0)
        run.source_tokens[key.substr(7)].push_back(number_from_json(value));
  }
  if (std::filesystem::exists(run.dir + "/final/state.safetensors"))
    run.state = read_safetensors(run.dir + "/final/state.safetensors").tensors;
  return run;
}

}  // namespace keel::test
