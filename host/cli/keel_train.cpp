// keel-train: trains a job described by a TOML file.
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <keel/keel.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "train/dry_run.hpp"
#include "train/job.hpp"
#include "train/trainer.hpp"
#include "verify/verify_command.hpp"

namespace po = boost::program_options;

namespace {

int train(const keel::RunOptions& options) {
  if (options.dry_run) {
    keel::print_dry_run(options);
    return 0;
  }
  keel::Job job(options, /*meta=*/false);
  std::string resolved = job.tree().resolved_toml();
  std::filesystem::path run_dir = job.config().job.run_dir;
  std::filesystem::create_directories(run_dir);
  const bool writer = job.mesh().layout().rank == 0;
  if (writer) {
    std::ofstream out(run_dir / "config.toml");
    out << "# resolved configuration of " << options.config_path << "\n" << resolved;
  }
  if (writer)
    keel::log_info(
        keel::cat("resolved configuration (saved to ", (run_dir / "config.toml").string(), "):\n", resolved));
  keel::Trainer trainer(job);
  keel::RunSummary summary = trainer.run();
  std::vector<std::string> parts = {keel::format("done: %ld steps, loss %.4f -> %.4f",
                                                 static_cast<long>(summary.steps_done), summary.first_loss,
                                                 summary.final_loss)};
  for (const auto& [name, last] : summary.final_metrics)
    if (name.find("loss") != std::string::npos && summary.first_metrics.count(name) != 0)
      parts.push_back(keel::format("%s %.4f -> %.4f", name.c_str(), summary.first_metrics.at(name), last));
  std::string line = keel::join(parts, ", ");
  if (summary.loss_floor) line.append(keel::format("; the data's next-token loss floor is %.4f", *summary.loss_floor));
  if (writer) keel::log_info(line);
  if (writer && summary.last_validation) {
    const keel::Evaluation& first = *summary.first_validation;
    const keel::Evaluation& last = *summary.last_validation;
    std::vector<std::string> figures = {keel::format("validation: val_loss %.4f (step %ld) -> %.4f (step %ld)",
                                                     first.loss, static_cast<long>(first.step), last.loss,
                                                     static_cast<long>(last.step))};
    for (const auto& [name, value] : last.metrics)
      if (name.find("loss") != std::string::npos) figures.push_back(keel::format("%s %.4f", name.c_str(), value));
    keel::log_info(keel::join(figures, ", "));
  }
  return 0;
}

// Runs `body`, turning what it throws into a message and an exit status (2: bad input).
template <class Body>
int guarded(Body&& body) {
  try {
    return body();
  } catch (const keel::InputError& e) {
    keel::log_line(keel::LogLevel::error, e.what());
    return 2;
  } catch (const c10::Error& e) {  // LibTorch's own message, without its C++ stack trace
    keel::log_line(keel::LogLevel::error, e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    keel::log_line(keel::LogLevel::error, e.what());
    return 1;
  } catch (...) {
    keel::log_line(keel::LogLevel::error, "an unknown exception stopped the run");
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "verify") {
    // Every rank it starts is this executable.
    std::error_code error;
    const std::string self = std::filesystem::read_symlink("/proc/self/exe", error).string();
    return guarded([&] { return keel::verify_main(argc - 1, argv + 1, error ? argv[0] : self.c_str()); });
  }
  po::options_description visible(
      "Usage: keel-train --config FILE [options]\n       keel-train verify --config FILE [--set ...] [--steps N] "
      "[--against SETS] (--help: what it compares)");
  visible.add_options()("help,h", "show this help")("version", "show versions")("config,c", po::value<std::string>(),
                                                                                "the job file (TOML)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override section.key=value (repeatable)")(
      "plugin-path", po::value<std::vector<std::string>>()->composing(),
      "a folder searched first for plugins (repeatable)")(
      "dry-run", "build the model on the meta device, print its parts and parameter counts, exit");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, visible), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "keel-train: %s\n%s", e.what(), keel::cat(visible).c_str());
    return 2;
  }
  if (vm.count("help") != 0) {
    std::cout << visible << "\nConfig reference: docs/config.md. Exit status: 0 done, 2 bad input, 1 failure.\n";
    return 0;
  }
  if (vm.count("version") != 0) {
    std::printf("keel-train %s (plugin ABI %d.%d, LibTorch %s)\n", KEEL_VERSION, KEEL_ABI_MAJOR, KEEL_ABI_MINOR,
                TORCH_VERSION);
    return 0;
  }
  keel::RunOptions options;
  if (vm.count("config") != 0) options.config_path = vm["config"].as<std::string>();
  if (vm.count("set") != 0) options.overrides = vm["set"].as<std::vector<std::string>>();
  if (vm.count("plugin-path") != 0) options.plugin_dirs = vm["plugin-path"].as<std::vector<std::string>>();
  options.dry_run = vm.count("dry-run") != 0;
  return guarded([&] { return train(options); });
}
