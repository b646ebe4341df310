#include "train/job.hpp"

#include <ATen/Parallel.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <tuple>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "config/component_table.hpp"
#include "device/device.hpp"
#include "pipeline/schedule.hpp"
#include "pipeline/stage_split.hpp"

namespace keel {

namespace {

int env_int(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0)
    throw InputError(cat("environment variable ", name, "='", text, "' is not a rank count"));
  return static_cast<int>(value);
}

// What an unknown key in a component's table is measured against: the keys the component
// declares, or where to look when it declares none.
std::string reads_hint(const std::string& role, const std::string& component, const std::string& plugin,
                       const ComponentExtensions& extensions, bool flat) {
  std::string hint;
  if (!extensions.config_keys) {
    hint = cat("the ", role, " component '", component, "' (plugin ", plugin, ") does not read it");
  } else {
    std::vector<std::string> names;
    for (const DeclaredConfigKey& key : *extensions.config_keys) names.push_back(key.name);
    hint = cat("the ", role, " component '", component, "' (plugin ", plugin, ") reads ",
               names.empty() ? std::string("no keys") : join(names, ", "), " (keel-plugin inspect ", plugin, ")");
  }
  // The flat form holds one component's keys: after a swap, the other one's keys land here.
  if (flat)
    hint += cat(". A job file with settings for several components keeps each in its own table, [", role,
                ".<component>]: then --set ", role, ".plugin=... alone swaps them");
  return hint;
}

ConfigTree load_tree(const RunOptions& options) {
  if (options.config_path.empty()) throw InputError("no job file given (--config FILE)");
  ConfigTree tree = ConfigTree::from_file(options.config_path);
  for (const std::string& assignment : options.overrides) tree.set(assignment);
  return tree;
}

}  // namespace

Job::Job(const RunOptions& options, bool meta) : Job(options, meta, -1) {}

std::unique_ptr<Job> Job::offline(const RunOptions& options, int rank) {
  return std::unique_ptr<Job>(new Job(options, /*meta=*/true, rank));
}

Job::Job(const RunOptions& options, bool meta, int offline_rank) : tree_(load_tree(options)) {
  const bool offline = offline_rank >= 0;
  int world = offline ? 0 : env_int("WORLD_SIZE", 1);
  int rank = offline ? offline_rank : env_int("RANK", 0);
  int local_rank = offline ? 0 : env_int("LOCAL_RANK", 0);
  set_log_rank(rank);
  config_ = read_job_config(tree_, world, cuda_available());
  const ParallelismSection& par = config_.parallelism;
  if (offline) world = par.pp * par.dp;
  if (rank >= world) throw InputError(cat("RANK=", rank, " is outside the job's ", world, " rank(s) (WORLD_SIZE)"));
  MeshLayout layout = MeshLayout::compute(par.pp, par.dp, par.ep, rank);
  // A multi-rank job joins the rendezvous only after everything checkable alone was checked.
  const bool distributed = world > 1 && !offline;
  mesh_ = distributed ? Mesh::unconnected(layout) : std::make_unique<Mesh>(layout);
  device_ = meta ? at::Device(at::kMeta) : resolve_device(config_.training.device, local_rank);
  if (config_.training.threads > 0) at::set_num_threads(config_.training.threads);
  at::globalContext().setFlushDenormal(config_.training.flush_denormal);
  // LibTorch's own switch, which keel::linear (keel/linear.hpp) reads; restore_onednn_switch_
  // puts it back.
  at::globalContext().setUserEnabledMkldnn(config_.training.cpu_gemm == "onednn");

  registry_ = std::make_unique<PluginRegistry>(plugin_search_path(options.plugin_dirs));
  const keel_component& model_c =
      registry_->component(config_.model.plugin, config_.model.component, KEEL_COMPONENT_MODEL);
  const keel_component& clipper_c =
      registry_->component(config_.clipper.plugin, config_.clipper.component, KEEL_COMPONENT_CLIPPER);
  model_path_ = registry_->load(config_.model.plugin).path;
  clipper_path_ = registry_->load(config_.clipper.plugin).path;

  // zbv puts a REPLICA beside its owner on one rank; keel::StageReplicas learned that in SDK
  // 1.8, and an older model would wait forever in post_init. The same file on every rank, so
  // every rank refuses alike, before any rendezvous.
  if (const uint32_t minor = registry_->load(config_.model.plugin).descriptor->abi_minor;
      par.schedule == "zbv" && minor < 8)
    ConfigSection(tree_, "parallelism")
        .invalid("schedule", cat("\"zbv\" needs a model plugin built against SDK 1.8 or newer; ", model_path_,
                                 " was built against 1.", minor));
  HostServices services{mesh_.get(), &metrics_};
  const ComponentTable model_table = component_table(tree_, "model", config_.model.component);
  const ComponentTable clipper_table = component_table(tree_, "clipper", config_.clipper.component);
  const std::string model_plugin = registry_->load(config_.model.plugin).descriptor->plugin_name;
  const std::string clipper_plugin = registry_->load(config_.clipper.plugin).descriptor->plugin_name;
  // The components keep their own copy of the section (plugins/component_config.hpp).
  model_ = std::make_unique<Model>(model_c, model_plugin, model_table.section, services);
  clipper_ = std::make_unique<Clipper>(clipper_c, clipper_plugin, clipper_table.section, services);
  const std::string& model_name = model_table.section.name();
  const std::string& clipper_name = clipper_table.section.name();
  tree_.annotate(model_name, reads_hint("model", config_.model.component, model_plugin, model_->extensions(),
                                        model_name == "model"));
  tree_.annotate(clipper_name, reads_hint("clipper", config_.clipper.component, clipper_plugin, clipper_->extensions(),
                                          clipper_name == "clipper"));
  tree_.check_all_read();
  if (rank == 0)
    for (const auto& [role, choice, table] :
         {std::tuple{"model", &config_.model, &model_table}, std::tuple{"clipper", &config_.clipper, &clipper_table}}) {
      const std::string notice = ignored_tables_notice(role, choice->component, *table);
      if (!notice.empty()) log_info(notice);
    }

  const keel_model_info& info = model_->info();
  std::vector<StageLayers> stages;
  const bool explicit_split = !par.layers_per_stage.empty();
  const int virtual_stages = par.pp * par.stages_per_rank;
  // Interleaving splits the layers evenly, as Megatron-LM does: each chunk is an equal share
  // of a rank's work, which the schedule's order assumes. layers_per_stage can set any split.
  if (par.stages_per_rank > 1 && !explicit_split && info.num_layers % virtual_stages != 0)
    ConfigSection(tree_, "parallelism")
        .invalid("stages_per_rank", cat("the model's ", info.num_layers,
                                        " layers do not divide into pp x stages_per_rank = ", virtual_stages,
                                        " equal stages; set parallelism.layers_per_stage to split them unevenly"));
  try {
    stages = explicit_split ? split_layers(info.num_layers, par.layers_per_stage)
                            : split_layers(info.num_layers, virtual_stages);
  } catch (const std::invalid_argument& e) {
    ConfigSection(tree_, "parallelism")
        .invalid(explicit_split            ? "layers_per_stage"
                 : par.stages_per_rank > 1 ? "stages_per_rank"
                                           : "pp",
                 e.what());
  }
  // Before the rendezvous: a model that cannot recompute fails every rank at once.
  if (config_.training.recompute != "none") model_->set_recompute(config_.training.recompute, "training.recompute");
  if (config_.data.attention == "block_causal")
    model_->set_attention(
        KEEL_ATTENTION_BLOCK_CAUSAL | (config_.data.reset_positions ? uint32_t{KEEL_ATTENTION_RESET_POSITIONS} : 0u),
        "data.attention");
  if (distributed) {
    Rendezvous rendezvous = Rendezvous::from_environment(rank, world, std::chrono::seconds(par.timeout_s));
    rendezvous.nccl = device_.is_cuda();
    mesh_->connect(rendezvous);
  }
  // Chunk k of pipeline rank r is virtual stage r + k pp (one chunk without interleaving; zbv's
  // V: stages r and 2 pp - 1 - r).
  for (int chunk = 0; chunk < par.stages_per_rank; ++chunk) {
    keel_part_spec spec{};
    spec.struct_size = sizeof(spec);
    spec.stage_index = chunk_stage(par.schedule, mesh_->layout().pp_index, par.pp, chunk);
    spec.num_stages = virtual_stages;
    spec.first_layer = stages[static_cast<size_t>(spec.stage_index)].first;
    spec.num_layers = stages[static_cast<size_t>(spec.stage_index)].count;
    spec.device_type = device_.is_meta() ? KEEL_DEVICE_META : device_.is_cuda() ? KEEL_DEVICE_CUDA : KEEL_DEVICE_CPU;
    spec.device_index = device_.has_index() ? device_.index() : 0;
    spec.param_dtype = KEEL_DTYPE_FP32;
    spec.compute_dtype = config_.training.dtype == "bf16" ? KEEL_DTYPE_BF16 : KEEL_DTYPE_FP32;
    parts_.push_back(&model_->build_part(spec));
  }
}

}  // namespace keel
