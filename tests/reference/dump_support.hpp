// Pieces the reference dump tools share: loading a consolidated Keel-named safetensors file
// (keel-ckpt export --keel) into a part, and a keel_export_sink that collects a model's export.
#pragma once

#include <c10/core/GradMode.h>
#include <keel/keel.hpp>

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.hpp"
#include "config/config_tree.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/component_config.hpp"
#include "plugins/host_context.hpp"

namespace keel::dump {

/// A single-rank host for a dump tool: what a model's argument reader and parts talk to.
struct DumpHost {
  keel::Mesh mesh{keel::MeshLayout::compute(1, 1, 1, 0)};
  keel::StepMetrics metrics;
  keel::HostContext context;

  explicit DumpHost(const std::string& label) : context(label, {&mesh, &metrics}) {}
  std::optional<std::vector<keel::DeclaredConfigKey>> undeclared;  // a dump reads whatever the table holds
  std::deque<keel::ComponentConfig> configs;

  /// Typed access to a config table through this host (valid while the host lives).
  keel::Config config(const keel::ConfigSection& section) {
    configs.emplace_back(section, undeclared);
    return keel::Config(context.raw(), keel::HostContext::config_handle(configs.back()));
  }
};

/// The spec of one stage holding all `layers` layers, on the CPU in fp32.
inline keel_part_spec whole_model_spec(int64_t layers) {
  keel_part_spec spec{};
  spec.struct_size = sizeof(spec);
  spec.num_stages = 1;
  spec.num_layers = static_cast<int32_t>(layers);
  return spec;
}

/// Copies every parameter and persistent buffer of `part` from the file `path` (canonical FQNs);
/// a tensor missing from the file, or one in the file the part does not have, is an error.
inline void load_weights(keel::Part& part, const std::string& path) {
  keel::SafetensorsFile file = keel::read_safetensors(path);
  std::set<std::string> used;
  c10::NoGradGuard no_grad;
  auto load = [&](keel::ParamTable& table, bool persistent_only) {
    for (const auto& r : table.records()) {
      if (persistent_only && !r->persistent()) continue;
      auto it = file.tensors.find(r->fqn());
      if (it == file.tensors.end()) throw std::runtime_error(path + ": no tensor '" + std::string(r->fqn()) + "'");
      r->tensor().detach().copy_(it->second);
      used.insert(r->fqn());
    }
  };
  load(part.parameters(), false);
  load(part.buffers(), true);
  for (const auto& [name, tensor] : file.tensors)
    if (used.count(name) == 0) throw std::runtime_error(path + ": '" + name + "' is not a tensor of this model");
}

/// What a model handed to a collecting sink.
struct Collected {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> files;
};

/// A keel_export_sink that copies everything into `out`.
inline keel_export_sink collecting_sink(Collected& out) {
  keel_export_sink sink{};
  sink.struct_size = sizeof(sink);
  sink.context = &out;
  sink.tensor = [](void* context, const char* name, const keel_tensor* value) -> keel_status {
    static_cast<Collected*>(context)->tensors.emplace_back(name, keel::tensor(value).detach().clone());
    return KEEL_OK;
  };
  sink.file = [](void* context, const char* name, const char* text) -> keel_status {
    static_cast<Collected*>(context)->files[name] = text;
    return KEEL_OK;
  };
  return sink;
}

}  // namespace keel::dump
