// A job assembled from its config: parsed and validated settings, the mesh, the loaded model
// and clipper components and this rank's model parts. Construction is the validation order:
// config -> mesh -> plugins -> component configs (unknown keys) -> model shape -> parts.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config_tree.hpp"
#include "config/job_config.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/components.hpp"
#include "plugins/plugin_registry.hpp"

namespace keel {

/// What keel-train was asked to do.
struct RunOptions {
  std::string config_path;
  std::vector<std::string> overrides;    ///< "section.key=value"
  std::vector<std::string> plugin_dirs;  ///< --plugin-path
  bool dry_run = false;
};

/// The assembled job of this rank.
class Job {
 public:
  /// Parses, validates and builds this process's rank (RANK / WORLD_SIZE from the
  /// environment, joining the rendezvous when the world has several ranks); with `meta` parts
  /// are built on the meta device (nothing is allocated). Throws InputError on bad input.
  Job(const RunOptions& options, bool meta);
  /// Builds rank `rank` of the configured layout on the meta device, alone: no rendezvous,
  /// every group holds only this rank (for dry runs of any layout from one process).
  static std::unique_ptr<Job> offline(const RunOptions& options, int rank);

  ConfigTree& tree() { return tree_; }
  const JobConfig& config() const { return config_; }
  Mesh& mesh() { return *mesh_; }
  const Mesh& mesh() const { return *mesh_; }
  StepMetrics& step_metrics() { return metrics_; }
  Model& model() { return *model_; }
  Clipper& clipper() { return *clipper_; }
  /// This rank's parts.
  const std::vector<ModelPart*>& parts() const { return parts_; }
  /// The device parameters live on.
  const at::Device& device() const { return device_; }
  /// The files the model and clipper came from.
  const std::string& model_path() const { return model_path_; }
  const std::string& clipper_path() const { return clipper_path_; }

 private:
  Job(const RunOptions& options, bool meta, int offline_rank);

  /// LibTorch's oneDNN switch as it was before the job set it (training.cpu_gemm), put back
  /// when the job is destroyed or fails to build.
  struct RestoreOneDnnSwitch {
    bool before = at::globalContext().userEnabledMkldnn();
    ~RestoreOneDnnSwitch() { at::globalContext().setUserEnabledMkldnn(before); }
  };

  RestoreOneDnnSwitch restore_onednn_switch_;
  ConfigTree tree_;
  JobConfig config_;
  std::unique_ptr<Mesh> mesh_;
  StepMetrics metrics_;
  std::unique_ptr<PluginRegistry> registry_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Clipper> clipper_;
  std::vector<ModelPart*> parts_;
  at::Device device_{at::kCPU};
  std::string model_path_, clipper_path_;
};

}  // namespace keel
