#include "train/dry_run.hpp"

#include <cstdio>

#include "common/text.hpp"

namespace keel {

namespace {

void add(ParamCount& count, const ParamRef& p) {
  int64_t numel = p.tensor->numel();
  // A shard counts as its share of the global tensor; the report is of the logical model.
  if (p.shard_dim >= 0 && p.tensor->dim() > p.shard_dim && p.tensor->size(p.shard_dim) > 0)
    numel = numel / p.tensor->size(p.shard_dim) * p.global_dim_size;
  if (p.replica()) {
    count.replicas += numel;
    return;
  }
  count.total += numel;
  count.activated += static_cast<double>(numel) * p.active_fraction;
}

std::string line(const std::string& label, const ParamCount& c) {
  return format(
      "  %-10s %14ld parameters (%s), activated %s%s\n", label.c_str(), static_cast<long>(c.total),
      human_count(static_cast<double>(c.total)).c_str(), human_count(c.activated).c_str(),
      c.replicas > 0 ? format(", replicas %s", human_count(static_cast<double>(c.replicas)).c_str()).c_str() : "");
}

}  // namespace

std::map<std::string, ParamCount> count_parameters(const Job& job) {
  std::map<std::string, ParamCount> counts;
  for (ModelPart* part : job.parts())
    for (const ParamRef& p : part->parameters()) {
      add(counts[p.module_group], p);
      add(counts[""], p);
    }
  return counts;
}

void print_dry_run(const Job& job) {
  const MeshLayout& mesh = job.mesh().layout();
  std::printf("model %s from %s\n", job.config().model.component.c_str(), job.model_path().c_str());
  std::printf("clipper %s from %s\n", job.config().clipper.component.c_str(), job.clipper_path().c_str());
  std::printf("mesh: pp %d x dp %d (ep %d), %d rank(s)\n", mesh.pp, mesh.dp, mesh.ep, mesh.world());
  for (ModelPart* part : job.parts()) {
    const keel_part_spec& s = part->spec();
    std::printf("rank %d: stage %d/%d, layers %d-%d (%d), %zu parameter tensors, %zu buffers\n", mesh.rank,
                s.stage_index, s.num_stages, s.first_layer, s.first_layer + s.num_layers - 1, s.num_layers,
                part->parameters().size(), part->buffers().size());
  }
  std::map<std::string, ParamCount> counts = count_parameters(job);
  for (const auto& [group, count] : counts)
    if (!group.empty()) std::fputs(line(group, count).c_str(), stdout);
  std::fputs(line("total", counts[""]).c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace keel
