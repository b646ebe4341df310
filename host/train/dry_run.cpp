#include "train/dry_run.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <vector>

#include "common/text.hpp"
#include "device/device.hpp"
#include "memory/state_memory.hpp"

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

// The plan's verdict against the memory of one device: the configured figure, else the GPU's.
void print_fit(const JobConfig& config, const std::vector<StateBytes>& by_rank) {
  const std::optional<double> gpu = cuda_device_memory_bytes();
  const double limit =
      config.training.device_memory_gb > 0 ? config.training.device_memory_gb * double(1 << 30) : gpu.value_or(0);
  if (limit <= 0) {
    std::printf("  no device memory to check against (set training.device_memory_gb)\n");
    return;
  }
  const char* source = config.training.device_memory_gb > 0 ? "training.device_memory_gb" : "this machine's GPU";
  std::vector<size_t> over;
  int64_t largest = 0;
  for (size_t rank = 0; rank < by_rank.size(); ++rank) {
    largest = std::max(largest, by_rank[rank].total());
    if (static_cast<double>(by_rank[rank].total()) > limit) over.push_back(rank);
  }
  if (over.empty()) {
    std::printf("  every rank's state fits in %s per device (%s): the largest takes %s, %.0f %%, before activations\n",
                human_bytes(limit).c_str(), source, human_bytes(static_cast<double>(largest)).c_str(),
                100.0 * static_cast<double>(largest) / limit);
    return;
  }
  std::printf(
      "  WARNING: %zu rank(s) will not fit in %s per device (%s), before activations: rank(s) %s; the largest "
      "needs %s\n",
      over.size(), human_bytes(limit).c_str(), source, describe_ranks(over).c_str(),
      human_bytes(static_cast<double>(largest)).c_str());
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
  std::printf("mesh: pp %d x dp %d (ep %d, edp %d), %d rank(s), schedule %s, %d microbatch(es)\n", mesh.pp, mesh.dp,
              mesh.ep, mesh.edp(), mesh.world(), first->config().parallelism.schedule.c_str(),
              first->config().parallelism.microbatches);
  // Ranks differ only by stage and expert shard: the dp replicas of a shard hold the same part.
  std::map<std::string, ParamCount> totals;
  std::vector<StateBytes> state_by_rank(static_cast<size_t>(mesh.world()));
  for (int stage = 0; stage < mesh.pp; ++stage)
    for (int shard = 0; shard < mesh.ep; ++shard) {
      std::unique_ptr<Job> view =
          stage == 0 && shard == 0 ? std::move(first) : Job::offline(options, mesh.rank_of(stage, shard));
      std::vector<int> ranks;
      for (int d = shard; d < mesh.dp; d += mesh.ep) ranks.push_back(mesh.rank_of(stage, d));
      for (ModelPart* part : view->parts()) std::fputs(describe_part(*part, ranks).c_str(), stdout);
      for (int r : ranks) {
        // The dp replicas of a part differ only in the optimizer rows they step, if sharded.
        const int d = r % mesh.dp;
        const OptimizerLayout optimizer{config.parallelism.shard_optimizer,
                                        config.parallelism.grad_bucket_mb << 20,
                                        {mesh.dp, d},
                                        {mesh.edp(), d / mesh.ep}};
        state_by_rank[static_cast<size_t>(r)] = planned_state_bytes(view->parts(), optimizer);
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
  // activations come on top and depend on the schedule: not estimated here.
  std::printf("memory plan, training state per rank (parameters, gradients, AdamW%s, buffers; activations on top):\n",
              config.parallelism.shard_optimizer ? " sharded over dp/edp" : "");
  for (const std::string& l : state_lines_by_rank(state_by_rank)) std::printf("  %s\n", l.c_str());
  print_fit(config, state_by_rank);
  std::fflush(stdout);
}

}  // namespace keel
