#include "metrics/step_metrics.hpp"

#include <stdexcept>

#include "common/text.hpp"

namespace keel {

void StepMetrics::report(const std::string& name, const at::Tensor& value, keel_metric_reduce reduce) {
  if (!value.defined() || value.numel() != 1)
    throw std::invalid_argument(cat("metric '", name, "' must be a one-element tensor"));
  at::Tensor v = value.detach().reshape({}).to(at::kDouble);
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
  std::map<std::string, double> out;
  for (const auto& [name, e] : entries_) {
    double v = e.value.item<double>();
    out[name] = e.reduce == KEEL_METRIC_MEAN ? v / static_cast<double>(e.count) : v;
  }
  return out;
}

}  // namespace keel
