#include "train/dry_run.hpp"

#include <keel/recompute_mode.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <vector>

#include "common/text.hpp"
#include "device/device.hpp"
#include "memory/state_memory.hpp"
#include "pipeline/schedule.hpp"

namespace keel {

namespace {

void add(ParamCount& count, const ParamRef& p) {
  int64_t numel = p.tensor().numel();
  // A shard counts as its share of the global tensor; the report is of the logical model.
  if (p.shard_dim() >= 0 && p.tensor().dim() > p.shard_dim() && p.tensor().size(p.shard_dim()) > 0)
    numel = numel / p.tensor().size(p.shard_dim()) * p.global_dim_size();
  if (p.replica()) {
    count.replicas += numel;
    return;
  }
  count.total += numel;
  count.activated += static_cast<double>(numel) * p.active_fraction();
}

std::string line(const std::string& label, const ParamCount& c) {
  return format(
      "  %-10s %14ld parameters (%s), activated %s%s\n", label.c_str(), static_cast<long>(c.total),
      human_count(static_cast<double>(c.total)).c_str(), human_count(c.activated).c_str(),
      c.replicas > 0 ? format(", replicas %s", human_count(static_cast<double>(c.replicas)).c_str()).c_str() : "");
}

// One rank's part: where it sits, what it holds here (local elements, expert range, replicas).
std::string describe_part(const ModelPart& part, const std::vector<int>& ranks) {
  const keel_part_spec& s = part.spec();
  int64_t elements = 0;
  std::string experts;
  std::vector<std::string> replicas;
  for (const ParamRef& p : part.parameters()) {
    elements += p.tensor().numel();
    if (p.expert() && experts.empty() && p.shard_dim() >= 0)
      experts = format(", experts %ld-%ld of %ld", static_cast<long>(p.shard_offset()),
                       static_cast<long>(p.shard_offset() + p.tensor().size(p.shard_dim()) - 1),
                       static_cast<long>(p.global_dim_size()));
    if (p.replica()) replicas.push_back(p.fqn());
  }
  std::vector<std::string> rank_names;
  for (int r : ranks) rank_names.push_back(std::to_string(r));
  std::string layers = s.num_layers > 0
                           ? format("layers %d-%d (%d)", s.first_layer, s.first_layer + s.num_layers - 1, s.num_layers)
                           : std::string("no layers");
  return format("rank%s %s: stage %d/%d, %s%s, %zu parameter tensors (%s elements here), %zu buffers%s\n",
                ranks.size() > 1 ? "s" : "", join(rank_names, ",").c_str(), s.stage_index, s.num_stages, layers.c_str(),
                experts.c_str(), part.parameters().size(), human_count(static_cast<double>(elements)).c_str(),
                part.buffers().size(), replicas.empty() ? "" : cat(", REPLICA: ", join(replicas, ", ")).c_str());
}

// What one rank's forwards keep for backward: the model's estimate per microbatch for each of
// its stages, held as its schedule holds them (one stage: times the microbatches in flight).
struct ActivationPlan {
  int64_t per_microbatch = 0;  ///< over the rank's stages
  int stages = 1;              ///< on this rank (interleaving: several)
  int in_flight = 0;           ///< the most (microbatch, stage) passes held at once
  int64_t peak = 0;            ///< the most bytes held at once (saturates)
  /// `base + bytes * times`, or INT64_MAX where that overflows.
  static int64_t saturating_add(int64_t base, int64_t bytes, int64_t times) {
    int64_t product = 0, sum = 0;
    if (__builtin_mul_overflow(bytes, times, &product) || __builtin_add_overflow(base, product, &sum))
      return std::numeric_limits<int64_t>::max();
    return sum;
  }
};

keel_recompute_mode recompute_mode(const std::string& name) {
  return static_cast<keel_recompute_mode>(keel::recompute_named(name).value_or(keel::Recompute::none));
}

// The activations of `view`'s parts, or nullopt when its model offers no estimate.
std::optional<ActivationPlan> plan_activations(Job& view) {
  const JobConfig& c = view.config();
  const MeshLayout mesh = view.mesh().layout();
  const int64_t batch = c.training.global_batch / (mesh.dp * c.parallelism.microbatches);
  ActivationPlan plan;
  std::vector<int64_t> per_stage;
  for (ModelPart* part : view.parts()) {
    // The part as it will train: on the configured device, not the dry run's meta device (a
    // model's kernels, and so what they keep, may differ by device).
    keel_part_spec spec = part->spec();
    spec.device_type = c.training.device == "cuda" ? KEEL_DEVICE_CUDA : KEEL_DEVICE_CPU;
    spec.device_index = 0;
    const std::optional<int64_t> bytes =
        view.model().activation_bytes(spec, batch, c.training.seq_len, recompute_mode(c.training.recompute));
    if (!bytes) return std::nullopt;
    per_stage.push_back(*bytes);
    plan.per_microbatch = ActivationPlan::saturating_add(plan.per_microbatch, *bytes, 1);
  }
  const std::vector<PipelineAction> actions = stage_actions(c.parallelism.schedule, mesh.pp_index, mesh.pp,
                                                            c.parallelism.microbatches, c.parallelism.stages_per_rank);
  plan.stages = static_cast<int>(per_stage.size());
  plan.in_flight = peak_in_flight(actions);
  plan.peak = peak_held_bytes(actions, per_stage);
  return plan;
}

// Below fp32 the products read a cast copy of each weight, made once a step and shared by the
// step's microbatches (AutocastCache): at most half the fp32 parameters' bytes (a weight no
// product reads, such as an embedding table, is never cast).
int64_t cast_weight_bytes(const JobConfig& config, const StateBytes& state) {
  return config.training.dtype == "bf16" ? state.parameters / 2 : 0;
}

// The plan's verdict against the memory of one device: the configured figure, else the GPU's.
// `activations` is empty when the model offers no estimate: then the verdict is of the state.
void print_fit(const JobConfig& config, const std::vector<StateBytes>& state,
               const std::optional<std::vector<ActivationPlan>>& activations) {
  const std::optional<double> gpu = cuda_device_memory_bytes();
  const double limit =
      config.training.device_memory_gb > 0 ? config.training.device_memory_gb * double(1 << 30) : gpu.value_or(0);
  if (limit <= 0) {
    std::printf("  no device memory to check against (set training.device_memory_gb)\n");
    return;
  }
  const char* source = config.training.device_memory_gb > 0 ? "training.device_memory_gb" : "this machine's GPU";
  const char* scope = activations ? "with the activation estimate" : "before activations";
  std::vector<size_t> over;
  int64_t largest = 0;
  for (size_t rank = 0; rank < state.size(); ++rank) {
    const int64_t held = ActivationPlan::saturating_add(state[rank].total(), cast_weight_bytes(config, state[rank]), 1);
    const int64_t total = ActivationPlan::saturating_add(held, activations ? (*activations)[rank].peak : 0, 1);
    largest = std::max(largest, total);
    if (static_cast<double>(total) > limit) over.push_back(rank);
  }
  if (over.empty()) {
    std::printf("  every rank fits in %s per device (%s), %s: the largest takes %s, %.0f %%\n",
                human_bytes(limit).c_str(), source, scope, human_bytes(static_cast<double>(largest)).c_str(),
                100.0 * static_cast<double>(largest) / limit);
    return;
  }
  std::printf("  WARNING: %zu rank(s) will not fit in %s per device (%s), %s: rank(s) %s; the largest needs %s\n",
              over.size(), human_bytes(limit).c_str(), source, scope, describe_ranks(over).c_str(),
              human_bytes(static_cast<double>(largest)).c_str());
}

// One line per stage: the estimate per microbatch, the microbatches in flight, their product.
void print_activations(const JobConfig& config, const std::vector<ActivationPlan>& by_rank, const MeshLayout& mesh) {
  const int64_t batch = config.training.global_batch / (mesh.dp * config.parallelism.microbatches);
  std::printf("activation estimate per rank (recompute %s, schedule %s, microbatches of %ld x %ld tokens):\n",
              config.training.recompute.c_str(), config.parallelism.schedule.c_str(), static_cast<long>(batch),
              static_cast<long>(config.training.seq_len));
  for (int stage = 0; stage < mesh.pp; ++stage) {
    std::vector<size_t> ranks;
    for (int d = 0; d < mesh.dp; ++d) ranks.push_back(static_cast<size_t>(mesh.rank_of(stage, d)));
    std::sort(ranks.begin(), ranks.end());
    const ActivationPlan& a = by_rank[ranks.front()];
    if (a.stages == 1)
      std::printf("  rank%s %s: %ld B (%s) per microbatch x %d in flight = %s\n", ranks.size() > 1 ? "s" : "",
                  describe_ranks(ranks).c_str(), static_cast<long>(a.per_microbatch),
                  human_bytes(static_cast<double>(a.per_microbatch)).c_str(), a.in_flight,
                  human_bytes(static_cast<double>(a.peak)).c_str());
    else
      std::printf(
          "  rank%s %s: %ld B (%s) per microbatch through its %d stages, at most %d stage passes in flight = "
          "%s\n",
          ranks.size() > 1 ? "s" : "", describe_ranks(ranks).c_str(), static_cast<long>(a.per_microbatch),
          human_bytes(static_cast<double>(a.per_microbatch)).c_str(), a.stages, a.in_flight,
          human_bytes(static_cast<double>(a.peak)).c_str());
  }
}

}  // namespace

std::map<std::string, ParamCount> count_parameters(const Job& job) {
  std::map<std::string, ParamCount> counts;
  for (ModelPart* part : job.parts())
    for (const ParamRef& p : part->parameters()) {
      add(counts[p.module_group()], p);
      add(counts[""], p);
    }
  return counts;
}

void print_dry_run(const RunOptions& options) {
  std::unique_ptr<Job> first = Job::offline(options, 0);
  const MeshLayout mesh = first->mesh().layout();
  const JobConfig config = first->config();  // `first` is handed on below
  std::printf("model %s from %s\n", first->config().model.component.c_str(), first->model_path().c_str());
  std::printf("clipper %s from %s\n", first->config().clipper.component.c_str(), first->clipper_path().c_str());
  const int stages_per_rank = config.parallelism.stages_per_rank;
  std::printf("mesh: pp %d x dp %d (ep %d, edp %d), %d rank(s), schedule %s%s, %d microbatch(es)\n", mesh.pp, mesh.dp,
              mesh.ep, mesh.edp(), mesh.world(), config.parallelism.schedule.c_str(),
              stages_per_rank > 1 ? format(" (%d stages per rank)", stages_per_rank).c_str() : "",
              config.parallelism.microbatches);
  // Ranks differ only by stage and expert shard: the dp replicas of a shard hold the same part.
  std::map<std::string, ParamCount> totals;
  std::vector<StateBytes> state_by_rank(static_cast<size_t>(mesh.world()));
  std::optional<std::vector<ActivationPlan>> activations_by_rank(static_cast<size_t>(mesh.world()));
  for (int stage = 0; stage < mesh.pp; ++stage)
    for (int shard = 0; shard < mesh.ep; ++shard) {
      std::unique_ptr<Job> view =
          stage == 0 && shard == 0 ? std::move(first) : Job::offline(options, mesh.rank_of(stage, shard));
      std::vector<int> ranks;
      for (int d = shard; d < mesh.dp; d += mesh.ep) ranks.push_back(mesh.rank_of(stage, d));
      for (ModelPart* part : view->parts()) std::fputs(describe_part(*part, ranks).c_str(), stdout);
      const std::optional<ActivationPlan> activations = plan_activations(*view);
      if (!activations) activations_by_rank.reset();
      for (int r : ranks) {
        // The dp replicas of a part differ only in the optimizer rows they step, if sharded.
        const int d = r % mesh.dp;
        const OptimizerLayout optimizer{config.parallelism.shard_optimizer,
                                        config.parallelism.grad_bucket_mb << 20,
                                        {mesh.dp, d},
                                        {mesh.edp(), d / mesh.ep}};
        state_by_rank[static_cast<size_t>(r)] = planned_state_bytes(view->parts(), optimizer);
        if (activations_by_rank) (*activations_by_rank)[static_cast<size_t>(r)] = *activations;
      }
      if (shard != 0) continue;  // shards are counted at their global size once per stage
      for (const auto& [group, count] : count_parameters(*view)) {
        ParamCount& t = totals[group];
        t.total += count.total;
        t.activated += count.activated;
        t.replicas += count.replicas;
      }
    }
  for (const auto& [group, count] : totals)
    if (!group.empty()) std::fputs(line(group, count).c_str(), stdout);
  std::fputs(line("total", totals[""]).c_str(), stdout);
  // The state a trainer allocates per rank (the trainer logs the same lines from its tensors);
  // activations come on top, from the model's estimate and the schedule.
  std::printf("memory plan, training state per rank (parameters, gradients, AdamW%s, buffers; activations on top):\n",
              config.parallelism.shard_optimizer ? " sharded over dp/edp" : "");
  for (const std::string& l : state_lines_by_rank(state_by_rank)) std::printf("  %s\n", l.c_str());
  if (config.training.dtype == "bf16") {
    int64_t most = 0;
    for (const StateBytes& s : state_by_rank) most = std::max(most, cast_weight_bytes(config, s));
    std::printf("  weights cast to %s for the products, once a step: at most %ld B (%s) on a rank\n",
                config.training.dtype.c_str(), static_cast<long>(most), human_bytes(static_cast<double>(most)).c_str());
  }
  if (activations_by_rank)
    print_activations(config, *activations_by_rank, mesh);
  else
    std::printf("activation estimate: none, %s offers no KEEL_EXTENSION_MODEL_MEMORY (SDK 1.6)\n",
                config.model.component.c_str());
  print_fit(config, state_by_rank, activations_by_rank);
  std::fflush(stdout);
}

}  // namespace keel
