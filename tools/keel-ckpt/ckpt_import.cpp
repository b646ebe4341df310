// keel-ckpt import --hf: a Hugging Face checkpoint folder becomes the Keel checkpoint
// OUT/step-0/ through the model plugin's import extension. The host knows no model names: the
// plugin derives its config table from config.json and maps every tensor; the host reads the
// folder (validated up front), checks what the plugin produces against the model's own
// parameters and writes each tensor as it comes, so memory holds about one tensor at a time.
#include <malloc.h>
#include <sys/resource.h>

#include <keel/config_keys.hpp>
#include <keel/export.hpp>
#include <keel/import.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "checkpoint/checkpoint_writer.hpp"
#include "checkpoint/streamed_checkpoint.hpp"
#include "checkpoint/strict_json.hpp"
#include "ckpt_commands.hpp"
#include "common/durable_file.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "config/component_table.hpp"
#include "config/config_tree.hpp"
#include "interop/hf_checkpoint.hpp"
#include "interop/import_source.hpp"
#include "interop/model_import.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/components.hpp"
#include "plugins/plugin_registry.hpp"
#include "train/stop_signal.hpp"

namespace keel::ckpt {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double peak_rss_bytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;  // Linux reports KiB
}

// The model component that imports the checkpoint, and the table it derived.
struct Choice {
  const LoadedPlugin* plugin = nullptr;
  const keel_component* component = nullptr;
  std::vector<std::pair<std::string, std::string>> table;
};

std::vector<const keel_component*> importing_models(const LoadedPlugin& plugin, const std::string& component) {
  std::vector<const keel_component*> out;
  for (size_t i = 0; i < plugin.descriptor->num_components; ++i) {
    const keel_component* c = plugin.descriptor->components[i];
    if (c->kind != KEEL_COMPONENT_MODEL || (!component.empty() && component != c->name)) continue;
    if (read_extensions(plugin.descriptor->plugin_name, *c).model_import.import_config != nullptr) out.push_back(c);
  }
  return out;
}

// The plugin --plugin names, or else every plugin on the search path whose model imports the
// checkpoint: exactly one must accept it. The refusals are the message when none does.
Choice choose_model(PluginRegistry& registry, const std::string& plugin, const std::string& component, HfCheckpoint& hf,
                    HostServices services) {
  std::vector<std::string> candidates = plugin.empty() ? registry.available() : std::vector<std::string>{plugin};
  std::vector<Choice> accepted;
  std::vector<std::string> refusals;
  for (const std::string& name : candidates) {
    const LoadedPlugin* loaded = nullptr;
    try {
      loaded = &registry.load(name);
    } catch (const InputError& e) {
      if (!plugin.empty()) throw;
      refusals.push_back(cat(name, ": not loadable (", e.what(), ")"));
      continue;
    }
    const std::vector<const keel_component*> models = importing_models(*loaded, component);
    if (models.empty()) {
      // Searching, a plugin without an importing model (a clipper) is no candidate.
      if (plugin.empty()) continue;
      throw InputError(cat("plugin ", loaded->descriptor->plugin_name, " has no model",
                           component.empty() ? "" : cat(" '", component, "'"),
                           " that imports (a model with the import extension of SDK 1.4)"));
    }
    for (const keel_component* model : models) {
      try {
        accepted.push_back(
            {loaded, model, import_model_config(*model, loaded->descriptor->plugin_name, "hf", hf, services)});
      } catch (const InputError& e) {
        refusals.push_back(e.what());
      }
    }
  }
  if (accepted.size() == 1) return accepted.front();
  if (accepted.empty())
    throw InputError(cat("no model plugin imports ", hf.dir(), ":\n  ",
                         refusals.empty() ? cat("no plugin on the search path (", join(registry.search_path(), ", "),
                                                ") has a model that imports")
                                          : join(refusals, "\n  ")));
  std::vector<std::string> names;
  for (const Choice& c : accepted)
    names.push_back(cat(c.plugin->descriptor->plugin_name, " (model ", c.component->name, ")"));
  throw InputError(cat(hf.dir(), " is imported by ", join(names, ", "), ": choose one with --plugin and --component"));
}

// "model.KEY=V" or "model.<component>.KEY=V" as an assignment inside [model.<component>];
// keys the checkpoint's config.json determines are refused.
std::string component_assignment(const std::string& set, const std::string& component,
                                 const std::vector<std::pair<std::string, std::string>>& derived) {
  const std::string inside = "model." + component + ".";
  std::string rest;
  if (set.starts_with(inside))
    rest = set.substr(inside.size());
  else if (set.starts_with("model."))
    rest = set.substr(6);
  else
    throw InputError(cat("--set ", set, ": import sets model keys only (model.KEY=VALUE)"));
  const std::string key = rest.substr(0, rest.find('='));
  for (const auto& [name, value] : derived)
    if (name == key)
      throw InputError(cat("--set ", set, ": model.", key, " comes from config.json (", value,
                           "); the checkpoint's shapes cannot be overridden"));
  return inside + rest;
}

}  // namespace

namespace {

// OUT is new or empty: an import never writes beside a run's checkpoints or its `latest`.
void check_destination(const std::string& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  if (!fs::is_directory(out, ec)) throw InputError(cat(out, ": exists and is not a folder"));
  std::vector<std::string> held;
  // An import killed before it could clean up (kill -9, a second Ctrl-C) leaves only its staging
  // folder, never a complete checkpoint: the next import replaces it.
  for (const auto& entry : fs::directory_iterator(out, ec))
    if (entry.path().filename() != "step-0.partial") held.push_back(entry.path().filename().string());
  std::sort(held.begin(), held.end());  // the listing's order is the file system's
  if (!held.empty())
    throw InputError(cat(out, ": not empty (it holds ", join(held, ", "),
                         "): an import writes into a new or empty folder, never beside another checkpoint or over a "
                         "`latest` pointer"));
}

// Every value an import writes is finite, whatever the plugin checked: a NaN stored in an FP8
// weight, or a block scale whose product overflows, shows only after dequantisation.
void check_finite(const std::string& name, const at::Tensor& value, const HfCheckpoint& hf) {
  if (!all_finite(value))
    throw InputError(cat(hf.dir(), ": the imported ", name,
                         " holds a NaN or an infinity (as converted, after any FP8 dequantisation): the folder's "
                         "weights are damaged"));
}

// Every Keel tensor comes from the folder, at most 4 bytes (fp32) per stored byte (FP8): a
// config.json whose shapes need more describes other weights. Checked before anything is
// written, whatever the shapes claim.
void check_size(const std::vector<SafetensorsLayout>& layout, const HfCheckpoint& hf) {
  uint64_t total = 0;
  for (const SafetensorsLayout& t : layout) {
    int64_t volume = 0;
    uint64_t bytes = 0;
    if (!checked_volume(t.shape, volume) ||
        __builtin_mul_overflow(static_cast<uint64_t>(volume), c10::elementSize(t.dtype), &bytes) ||
        __builtin_add_overflow(total, bytes, &total))
      total = UINT64_MAX;
    if (total == UINT64_MAX) break;
  }
  const uint64_t bound = hf.data_bytes() > UINT64_MAX / 4 ? UINT64_MAX : 4 * hf.data_bytes();
  if (total > bound)
    throw InputError(cat(hf.dir(), "/config.json: its shapes need ",
                         total == UINT64_MAX ? std::string("more than 2^64") : human_bytes(static_cast<double>(total)),
                         " of fp32 weights, more than the folder's ", human_bytes(static_cast<double>(hf.data_bytes())),
                         " of tensors can give (a config.json of another model? check vocab_size, hidden_size and "
                         "the layer counts)"));
}

}  // namespace

int import_hf(const ImportOptions& options) {
  // Each tensor is a large, short-lived allocation. glibc's threshold for serving those by mmap
  // grows with every one freed, after which they come from the heap, which then keeps what
  // it grew to: peak RSS would grow with the model. A fixed threshold returns each to the
  // system when freed, so memory holds about one tensor at a time.
  ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  const auto started = std::chrono::steady_clock::now();
  // Ctrl-C or SIGTERM stops the import between tensors: the staging folder is removed on the
  // way out, as on any failure, and the tool exits 130 or 143.
  install_stop_handlers();
  check_destination(options.out_dir);
  HfCheckpoint hf(options.hf_dir);
  log_info(
      cat("importing ", hf.dir(), ": ", hf.size(), " tensors, ", human_bytes(static_cast<double>(hf.data_bytes()))));
  Mesh mesh(MeshLayout::compute(1, 1, 1, 0));
  StepMetrics metrics;
  const HostServices services{&mesh, &metrics};
  PluginRegistry registry(plugin_search_path(options.plugin_dirs));
  Choice choice = choose_model(registry, options.plugin, options.component, hf, services);
  const std::string plugin_name = choice.plugin->descriptor->plugin_name, component = choice.component->name;

  // The job's [model] table: the plugin's keys, then --flavor and --set on top.
  std::string text = cat("[model]\nplugin = ", toml_text(plugin_name), "\ncomponent = ", toml_text(component),
                         "\n\n[model.", component, "]\n");
  if (!options.flavor.empty()) text += cat("flavor = ", toml_text(options.flavor), "\n");
  for (const auto& [key, value] : choice.table) text += cat(key, " = ", value, "\n");
  ConfigTree tree = ConfigTree::from_string(text, cat(hf.dir(), "/config.json (as imported)"));
  for (const std::string& set : options.sets) tree.set(component_assignment(set, component, choice.table));
  ConfigSection model_section = tree.section("model");
  model_section.string("plugin", "");
  model_section.string("component", "");
  ComponentTable table = component_table(tree, "model", component);
  Model model(*choice.component, plugin_name, table.section, services);
  tree.check_all_read();

  // What the model holds, from the whole model on the meta device: the checkpoint's layout.
  ModelPart& whole = model.build_part(whole_model_on_meta(model.info().num_layers));  // fp32 master weights
  std::vector<SafetensorsLayout> layout;
  auto plan = [&](const ParamRef& p) {
    std::vector<int64_t> shape = p.tensor().sizes().vec();
    if (p.shard_dim() >= 0) shape[static_cast<size_t>(p.shard_dim())] = p.global_dim_size();
    layout.push_back({"model." + p.fqn(), p.tensor().scalar_type(), shape});
  };
  for (const ParamRef& p : whole.parameters()) plan(p);
  for (const ParamRef& b : whole.buffers())
    if (b.persistent()) plan(b);
  check_size(layout, hf);

  const bool out_existed = fs::exists(options.out_dir);
  std::string written;
  try {
    StreamedCheckpoint out(options.out_dir, 0, layout);
    ImportSourceAdapter source(hf, model.context());
    size_t done = 0;
    auto last_report = std::chrono::steady_clock::now();
    model.import_state("hf", *source.raw(), [&](const std::string& fqn, const at::Tensor& value) {
      throw_if_stop_requested(cat("the import into ", options.out_dir));
      check_finite("model." + fqn, value, hf);
      out.write("model." + fqn, value);
      ++done;
      if (seconds_since(last_report) >= 2.0) {
        last_report = std::chrono::steady_clock::now();
        log_info(cat("imported ", done, " of ", layout.size(), " tensors (",
                     human_bytes(static_cast<double>(out.bytes_written())), " written)"));
      }
    });
    const std::vector<std::string> unknown = hf.unread();
    if (!unknown.empty())
      throw InputError(cat(
          hf.dir(), ": ", unknown.size(), " tensor(s) the model ", plugin_name,
          " has no place for (unknown names, or a config.json that does not match): ",
          join(std::vector<std::string>(unknown.begin(), unknown.begin() + std::min<size_t>(unknown.size(), 5)), ", "),
          unknown.size() > 5 ? ", ..." : ""));
    Manifest header;
    header.step = 0;
    header.run_id = new_run_id();
    header.model_plugin = plugin_name;
    header.model_component = component;
    header.clipper_plugin = header.clipper_component = "none";
    header.config = tree.resolved_toml();
    // The model's table first, the checkpoint's commit (a rename) last: a failure in between
    // (a full disk, a signal) leaves no complete checkpoint behind.
    write_durably(fs::path(options.out_dir) / "model.toml", header.config);
    throw_if_stop_requested(cat("the import into ", options.out_dir));
    written = out.commit(header);
  } catch (...) {
    // Nothing half-made stays behind: the partial checkpoint is gone (its writer removes it),
    // so is the model's table; a folder this import created is removed when it is empty.
    std::error_code ec;
    fs::remove(fs::path(options.out_dir) / "model.toml", ec);
    fs::remove(fs::path(options.out_dir) / "model.toml.partial", ec);
    fs::remove(fs::path(options.out_dir) / "latest", ec);  // OUT held no pointer before: this import's
    if (!out_existed && fs::is_empty(options.out_dir, ec)) fs::remove(options.out_dir, ec);
    // A stop raised inside the plugin's import reaches here as the plugin's error: named again.
    if (const int signal = stop_requested(); signal != 0)
      throw StopRequested(signal, cat("the import into ", options.out_dir));
    throw;
  }
  const double seconds = seconds_since(started);
  std::printf("imported %s as %s (plugin %s): %zu tensors, %s read in %.1f s (%.1f MB/s), peak RSS %s\n",
              hf.dir().c_str(), written.c_str(), plugin_name.c_str(), layout.size(),
              human_bytes(static_cast<double>(hf.data_bytes())).c_str(), seconds,
              static_cast<double>(hf.data_bytes()) / 1e6 / std::max(seconds, 1e-9),
              human_bytes(peak_rss_bytes()).c_str());
  std::printf(
      "the model's table is in %s; train from it with\n  --set checkpoint.load=%s --set "
      "checkpoint.load_model_only=true\n",
      (fs::path(options.out_dir) / "model.toml").c_str(), written.c_str());
  return 0;
}

}  // namespace keel::ckpt
