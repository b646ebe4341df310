// keel-ckpt export: the consolidated model of a checkpoint, under Keel's canonical names
// (--keel) or in Hugging Face transformers' format through the model plugin's export_state
// (--hf). The config comes from the checkpoint's manifest; the plugin too, by name on the
// search path (a checkpoint is untrusted: it never names a file to load), unless --plugin
// names it.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.hpp"
#include "ckpt_commands.hpp"
#include "common/error.hpp"
#include "common/text.hpp"
#include "config/component_table.hpp"
#include "config/config_tree.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/components.hpp"
#include "plugins/plugin_registry.hpp"

namespace keel::ckpt {

namespace fs = std::filesystem;

namespace {

const std::string kModel = "model.";

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw InputError(cat(path.string(), ": cannot write"));
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> model_state(CheckpointReader& reader) {
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& [key, entry] : reader.manifest().entries)
    if (key.compare(0, kModel.size(), kModel) == 0)
      state.emplace_back(key.substr(kModel.size()), reader.read_whole(key));
  if (state.empty()) throw InputError(cat("checkpoint ", reader.dir(), ": no model.* entries"));
  return state;
}

int export_keel(const std::string& path, const std::string& out) {
  CheckpointReader reader(checkpoint_dir(path));
  const Manifest& m = reader.manifest();
  std::vector<std::pair<std::string, at::Tensor>> state = model_state(reader);
  if (fs::path(out).has_parent_path()) fs::create_directories(fs::path(out).parent_path());
  // The format of keel-train's final weights.
  write_safetensors(out, state,
                    {{"format", "keel-weights"}, {"step", std::to_string(m.step)}, {"model", m.model_plugin}});
  std::printf("exported %zu tensors of %s (step %ld) to %s\n", state.size(), reader.dir().c_str(),
              static_cast<long>(m.step), out.c_str());
  return 0;
}

int export_hf(const std::string& path, const std::string& out, const std::vector<std::string>& plugin_dirs,
              const std::string& plugin) {
  CheckpointReader reader(checkpoint_dir(path));
  const Manifest& m = reader.manifest();
  PluginRegistry registry(plugin_search_path(plugin_dirs));
  const LoadedPlugin& loaded = plugin.empty() ? registry.load_by_name(m.model_plugin) : registry.load(plugin);
  const keel_component& component = PluginRegistry::component_of(loaded, m.model_component, KEEL_COMPONENT_MODEL);
  // The model exactly as the run configured it, on one rank: export needs no parts.
  ConfigTree tree = ConfigTree::from_string(m.config, (fs::path(reader.dir()) / "manifest.json").string());
  ConfigSection section = component_table(tree, "model", m.model_component).section;
  Mesh mesh(MeshLayout::compute(1, 1, 1, 0));
  StepMetrics metrics;
  Model model(component, loaded.descriptor->plugin_name, section, HostServices{&mesh, &metrics});
  ModelExport exported = model.export_state("hf", model_state(reader));
  fs::create_directories(out);
  // transformers refuses safetensors files without the "format" metadata.
  write_safetensors((fs::path(out) / "model.safetensors").string(), exported.tensors, {{"format", "pt"}});
  for (const auto& [name, text] : exported.files) write_text(fs::path(out) / name, text);
  std::vector<std::string> files = {"model.safetensors"};
  for (const auto& [name, text] : exported.files) files.push_back(name);
  std::printf("exported %s (step %ld) as Hugging Face %s: %zu tensors, %s -> %s\n", reader.dir().c_str(),
              static_cast<long>(m.step), m.model_component.c_str(), exported.tensors.size(), join(files, ", ").c_str(),
              out.c_str());
  return 0;
}

}  // namespace keel::ckpt
