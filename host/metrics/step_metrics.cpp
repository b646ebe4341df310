#include "metrics/step_metrics.hpp"

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/text.hpp"
#include "metrics/json_number.hpp"

namespace keel {

void StepMetrics::report(const std::string& name, const at::Tensor& value, keel_metric_reduce reduce) {
  if (!value.defined() || value.numel() != 1)
    throw std::invalid_argument(cat("metric '", name, "' must be a one-element tensor"));
  at::Tensor v = value.detach().reshape({}).to(at::kDouble);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    entries_[name] = Entry{v.clone(), reduce, 1};
    return;
  }
  Entry& e = it->second;
  if (e.reduce != reduce) throw std::invalid_argument(cat("metric '", name, "' reported with two reductions"));
  switch (reduce) {
    case KEEL_METRIC_MEAN:
    case KEEL_METRIC_SUM:
      e.value.add_(v);
      break;
    case KEEL_METRIC_MAX:
      e.value = at::maximum(e.value, v);
      break;
    case KEEL_METRIC_LAST:
      e.value = v.clone();
      break;
  }
  ++e.count;
}

std::map<std::string, double> StepMetrics::resolve() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, double> out;
  for (const auto& [name, e] : entries_) {
    double v = e.value.item<double>();
    out[name] = e.reduce == KEEL_METRIC_MEAN ? v / static_cast<double>(e.count) : v;
  }
  return out;
}

std::map<std::string, double> StepMetrics::resolve_across(Group& world) const {
  if (world.size() == 1) return resolve();
  nlohmann::json mine = nlohmann::json::object();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, e] : entries_)
      mine[name] = {json_number(e.value.item<double>()), e.count, static_cast<int>(e.reduce)};
  }
  struct Merged {
    double value = 0;
    int64_t count = 0;
    int reduce = 0;
  };
  std::map<std::string, Merged> merged;
  for (const std::string& text : all_gather_bytes(world, mine.dump())) {
    const nlohmann::json reports = nlohmann::json::parse(text);
    for (const auto& [name, entry] : reports.items()) {
      double value = number_from_json(entry[0]);
      int64_t count = entry[1].get<int64_t>();
      auto [it, fresh] = merged.try_emplace(name, Merged{value, count, entry[2].get<int>()});
      if (fresh) continue;
      Merged& m = it->second;
      if (m.reduce == KEEL_METRIC_MAX) m.value = std::isnan(value) ? value : std::max(m.value, value);  // nan wins
      if (m.reduce == KEEL_METRIC_MEAN || m.reduce == KEEL_METRIC_SUM) m.value += value;
      m.count += count;  // LAST keeps the lowest rank's value
    }
  }
  std::map<std::string, double> out;
  for (const auto& [name, m] : merged)
    out[name] = m.reduce == KEEL_METRIC_MEAN ? m.value / static_cast<double>(m.count) : m.value;
  return out;
}

}  // namespace keel
