#include "verify/verify_command.hpp"

#include <c10/core/GradMode.h>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_reader.hpp"
#include "common/error.hpp"
#include "common/text.hpp"
#include "config/config_tree.hpp"
#include "config/job_config.hpp"
#include "device/device.hpp"
#include "metrics/json_number.hpp"
#include "verify/error_model.hpp"
#include "verify/rank_launcher.hpp"

namespace keel {

namespace {

namespace fs = std::filesystem;
namespace po = boost::program_options;

struct Options {
  std::string config;
  std::vector<std::string> sets, plugin_dirs, against;
  int64_t steps = 3;
  bool keep = false;
};

// One side of the comparison: its layout, its overrides, and what its run left.
struct Side {
  std::string label, dir;
  std::vector<std::string> sets;
  int ranks = 1;
  std::string layout;
  std::map<int64_t, std::pair<double, double>> steps;  ///< step -> (loss, grad norm)
  double seconds = 0;
};

// The reference layout's overrides: one rank, one microbatch, the plain schedule; then --against.
std::vector<std::string> reference_sets(const std::vector<std::string>& against) {
  std::vector<std::string> sets = {"parallelism.pp=1",
                                   "parallelism.dp=1",
                                   "parallelism.ep=1",
                                   "parallelism.microbatches=1",
                                   "parallelism.stages_per_rank=1",
                                   "parallelism.schedule=\"1f1b\"",
                                   "parallelism.shard_optimizer=false"};
  for (const std::string& group : against) {
    std::stringstream in(group);
    for (std::string item; std::getline(in, item, ',');)
      if (!item.empty()) sets.push_back(item);
  }
  return sets;
}

JobConfig read_config(const Options& o, const std::vector<std::string>& extra) {
  ConfigTree tree = ConfigTree::from_file(o.config);
  for (const std::string& s : o.sets) tree.set(s);
  for (const std::string& s : extra) tree.set(s);
  return read_job_config(tree, 0, cuda_available());
}

std::string layout_text(const JobConfig& c) {
  const ParallelismSection& p = c.parallelism;
  return cat("pp ", p.pp, " x dp ", p.dp, ", ep ", p.ep, ", ", p.microbatches, " microbatch",
             p.microbatches == 1 ? "" : "es", ", ", p.schedule, p.shard_optimizer ? ", ZeRO-1" : "");
}

// Runs one side for `steps` steps with a checkpoint at the last one; the job's own run folder,
// logs and evaluations are left aside.
bool run_side(Side& side, const Options& o, const char* self) {
  std::vector<std::string> args = {"--config", o.config};
  for (const std::string& d : o.plugin_dirs) args.insert(args.end(), {"--plugin-path", d});
  std::vector<std::string> sets = o.sets;
  sets.insert(sets.end(), side.sets.begin(), side.sets.end());
  for (const std::string& s :
       {cat("job.run_dir=\"", side.dir, "\""), cat("checkpoint.dir=\"", side.dir, "/checkpoints\""),
        cat("checkpoint.interval=", o.steps), std::string("checkpoint.save_final=false"),
        std::string("checkpoint.keep_latest=0"), std::string("checkpoint.keep_best=0"),
        std::string("checkpoint.async=false"), std::string("metrics.log_interval=1"), std::string("metrics.jsonl=true"),
        std::string("metrics.tensorboard=false"), std::string("validation.interval=0"),
        std::string("profiling.enable=false")})
    sets.push_back(s);
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  std::printf("verify: running %s (%s, %d rank%s) ...\n", side.label.c_str(), side.layout.c_str(), side.ranks,
              side.ranks == 1 ? "" : "s");
  std::fflush(stdout);
  fs::create_directories(side.dir);
  const auto start = std::chrono::steady_clock::now();
  const LaunchResult r = launch_ranks(self, args, side.ranks, side.dir + "/rank-");
  side.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!r.ok) {
    std::string tail;
    std::ifstream log(cat(side.dir, "/rank-", r.failed_rank, ".log"));
    std::vector<std::string> lines;
    for (std::string line; std::getline(log, line);) lines.push_back(line);
    for (size_t i = lines.size() > 15 ? lines.size() - 15 : 0; i < lines.size(); ++i) tail += "  " + lines[i] + "\n";
    std::printf("verify: %s failed: rank %d exited with status %d; its last lines:\n%s", side.label.c_str(),
                r.failed_rank, r.status, tail.c_str());
    return false;
  }
  std::ifstream metrics(side.dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    side.steps[j.at("step").get<int64_t>()] = {number_from_json(j.at("loss")), number_from_json(j.at("grad_norm"))};
  }
  return true;
}

// The entries of two checkpoints compared under the error model: parameters (the entries the
// optimizer steps), Adam's moments, the step counters. Buffers and generator states are the
// model's and the layout's to bound, and are counted, not compared.
struct StateReport {
  double worst = 0, worst_relative = 0;
  std::string worst_key;
  std::map<std::string, double> worst_by_class;
  size_t compared = 0, skipped = 0;
  std::vector<std::string> failures;
};

StateReport compare_checkpoints(const std::string& a, const std::string& b, const TrainingBounds& bounds) {
  CheckpointReader x(a), y(b);
  StateReport report;
  std::set<std::string> stepped;  // parameters the optimizer holds moments for
  for (const auto& [key, entry] : y.manifest().entries)
    if (key.starts_with("optim.exp_avg.")) stepped.insert("model." + key.substr(14));
  c10::NoGradGuard no_grad;
  for (const auto& [key, entry] : y.manifest().entries) {
    std::string cls;
    Tolerance tol;
    if (stepped.count(key) != 0) {
      cls = "parameters", tol = parameter_tolerance(bounds);
    } else if (key.starts_with("optim.exp_avg_sq.")) {
      cls = "exp_avg_sq", tol = exp_avg_sq_tolerance(bounds);
    } else if (key.starts_with("optim.exp_avg.")) {
      cls = "exp_avg", tol = exp_avg_tolerance(bounds);
    } else if (key.starts_with("optim.step.")) {
      cls = "counters";
    } else {
      ++report.skipped;
      continue;
    }
    if (!x.has(key)) {
      report.failures.push_back(key + ": missing from your layout's checkpoint");
      continue;
    }
    const at::Tensor mine = x.read_whole(key), reference = y.read_whole(key);
    if (mine.sizes() != reference.sizes()) {
      report.failures.push_back(key + ": another shape");
      continue;
    }
    const double d = deviation(mine, reference, tol);
    ++report.compared;
    report.worst_by_class[cls] = std::max(report.worst_by_class[cls], d);
    if (cls == "parameters") {
      const at::Tensor a64 = mine.to(at::kDouble), b64 = reference.to(at::kDouble);
      const double relative =
          ((a64 - b64).abs().max() / std::max(b64.abs().max().item<double>(), 1e-30)).item<double>();
      if (relative > report.worst_relative || report.worst_key.empty())
        report.worst_relative = relative, report.worst = d, report.worst_key = key;
    }
    if (!(d <= 1)) report.failures.push_back(format("%s: %.3g of its bound", key.c_str(), d));
  }
  return report;
}

int verify(const Options& given, const char* self) {
  if (given.config.empty()) throw InputError("keel-train verify: --config is required");
  if (given.steps < 1 || given.steps > 1000)
    throw InputError(cat("keel-train verify: --steps must be in [1, 1000], got ", given.steps));
  // Both sides run N steps; a warm-up longer than that is cut to N on both (and said).
  Options o = given;
  const JobConfig original = read_config(o, {});
  o.sets.push_back(cat("training.steps=", o.steps));
  if (original.lr_scheduler.warmup_steps > o.steps) {
    o.sets.push_back(cat("lr_scheduler.warmup_steps=", o.steps));
    std::printf("verify: lr_scheduler.warmup_steps %ld cut to %ld, the steps compared, on both sides\n",
                static_cast<long>(original.lr_scheduler.warmup_steps), static_cast<long>(o.steps));
  }
  // Both layouts are read and validated before any rank starts.
  const JobConfig mine = read_config(o, {});
  const std::vector<std::string> reference_overrides = reference_sets(o.against);
  const JobConfig reference = read_config(o, reference_overrides);

  std::string work = (fs::temp_directory_path() / "keel-verify-XXXXXX").string();
  if (mkdtemp(work.data()) == nullptr) throw std::runtime_error("verify: cannot create a folder for its runs");
  Side yours{"your layout", work + "/yours", {}, mine.parallelism.pp * mine.parallelism.dp, layout_text(mine), {}, 0};
  Side ref{"the reference",
           work + "/reference",
           reference_overrides,
           reference.parallelism.pp * reference.parallelism.dp,
           layout_text(reference),
           {},
           0};
  const bool ran = run_side(yours, o, self) && run_side(ref, o, self);
  auto finish = [&](int status) {
    if (o.keep)
      std::printf("verify: the runs are kept in %s\n", work.c_str());
    else
      fs::remove_all(work);
    return status;
  };
  if (!ran) return finish(1);

  std::printf(
      "\nkeel-train verify: %s, %ld step%s\n  yours:     %s, %d rank%s (%.1f s)\n  reference: %s, %d rank%s "
      "(%.1f s)\n\n",
      o.config.c_str(), static_cast<long>(o.steps), o.steps == 1 ? "" : "s", yours.layout.c_str(), yours.ranks,
      yours.ranks == 1 ? "" : "s", yours.seconds, ref.layout.c_str(), ref.ranks, ref.ranks == 1 ? "" : "s",
      ref.seconds);
  std::printf("%5s  %14s %14s %9s   %14s %14s %9s\n", "step", "loss", "reference", "rel diff", "grad norm", "reference",
              "rel diff");
  std::vector<std::string> failures;
  double max_norm = 0;
  for (int64_t s = 1; s <= o.steps; ++s) {
    if (!yours.steps.count(s) || !ref.steps.count(s)) {
      failures.push_back(cat("step ", s, ": not logged by both runs"));
      continue;
    }
    const auto [loss, norm] = yours.steps[s];
    const auto [ref_loss, ref_norm] = ref.steps[s];
    const double dl = relative_difference(loss, ref_loss), dn = relative_difference(norm, ref_norm);
    max_norm = std::max(max_norm, ref_norm);
    std::printf("%5ld  %14.9f %14.9f %9.1e   %14.9f %14.9f %9.1e\n", static_cast<long>(s), loss, ref_loss, dl, norm,
                ref_norm, dn);
    if (!(dl <= kLossRtol))
      failures.push_back(format("step %ld: loss differs by %.2e relative", static_cast<long>(s), dl));
    if (!(dn <= kLossRtol))
      failures.push_back(format("step %ld: grad norm differs by %.2e relative", static_cast<long>(s), dn));
  }
  // The gradients AdamW saw are bounded by the reference's largest norm before clipping
  // (clipping only scales down), with the norms' own tolerance on top.
  TrainingBounds bounds;
  bounds.lr = reference.optimizer.lr;
  bounds.beta1 = reference.optimizer.beta1;
  bounds.beta2 = reference.optimizer.beta2;
  bounds.steps = o.steps;
  bounds.max_grad_norm = max_norm * (1 + kLossRtol);
  const std::string step_dir = cat("/checkpoints/step-", o.steps);
  const StateReport state = compare_checkpoints(yours.dir + step_dir, ref.dir + step_dir, bounds);
  failures.insert(failures.end(), state.failures.begin(), state.failures.end());
  const Tolerance params = parameter_tolerance(bounds);
  std::printf("\nafter step %ld: %zu entries compared (%zu buffers and generator states left out)\n",
              static_cast<long>(o.steps), state.compared, state.skipped);
  std::printf("  largest relative parameter difference %.2e (%s), %.3g of its bound\n", state.worst_relative,
              state.worst_key.c_str(), state.worst);
  for (const auto& [cls, worst] : state.worst_by_class)
    std::printf("  %-10s worst %.3g of its bound\n", cls.c_str(), worst);
  std::printf("\ntolerance (the test suite's error model, docs/testing.md):\n");
  std::printf("  loss, grad norm       rtol %.0e (fp32 sums in another order)\n", kLossRtol);
  std::printf(
      "  parameters            atol 2 lr sum_t U_t = %.3g, rtol %.0e (Adam's largest update; lr %.3g, betas "
      "%.3g, %.3g)\n",
      params.atol, params.rtol, bounds.lr, bounds.beta1, bounds.beta2);
  std::printf("  Adam's moments        the normwise gradient bound, %.0e x %.4g (the largest grad norm logged)\n",
              kGradientRtol, bounds.max_grad_norm);
  std::printf("  step counters         exact\n");
  if (!failures.empty()) {
    std::printf("\nFAIL: %zu difference%s beyond the tolerance:\n", failures.size(), failures.size() == 1 ? "" : "s");
    for (size_t i = 0; i < failures.size() && i < 20; ++i) std::printf("  %s\n", failures[i].c_str());
    return finish(1);
  }
  std::printf("\nPASS: your layout trains the reference's model within the tolerance\n");
  return finish(0);
}

}  // namespace

int verify_main(int argc, char** argv, const char* self) {
  po::options_description visible(
      "Usage: keel-train verify --config FILE [--set section.key=value ...] [--steps N] [--against SETS]");
  Options o;
  visible.add_options()("help,h", "show this help")("config,c", po::value<std::string>(&o.config), "the job file")(
      "set", po::value<std::vector<std::string>>(&o.sets)->composing(), "override section.key=value (repeatable)")(
      "plugin-path", po::value<std::vector<std::string>>(&o.plugin_dirs)->composing(), "a plugin folder (repeatable)")(
      "steps", po::value<int64_t>(&o.steps)->default_value(3), "steps to compare")(
      "against", po::value<std::vector<std::string>>(&o.against)->composing(),
      "the reference layout: section.key=value overrides, comma-separated, on top of one rank, one microbatch")(
      "keep", "keep both runs' folders (their path is printed)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, visible), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "keel-train verify: %s\n%s", e.what(), cat(visible).c_str());
    return 2;
  }
  if (vm.count("help") != 0) {
    std::cout << visible
              << "\nRuns the job for N steps in its own layout and in the reference layout, launching the ranks "
                 "itself, and compares losses, grad norms and the final parameters under the test suite's error "
                 "model. Exit status: 0 PASS, 1 FAIL (or a run failed), 2 bad input.\n";
    return 0;
  }
  o.keep = vm.count("keep") != 0;
  return verify(o, self);
}

}  // namespace keel
