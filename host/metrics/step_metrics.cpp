#include "metrics/step_metrics.hpp"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
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
    entries_[name] = Entry{v.clone(), reduce, 1, at::Tensor()};
    return;
  }
  Entry& e = it->second;
  if (e.denominator.defined())
    throw std::invalid_argument(cat("metric '", name, "' reported both as a ratio and as a plain value"));
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

void StepMetrics::report_ratio(const std::string& name, const at::Tensor& numerator, const at::Tensor& denominator) {
  for (const at::Tensor* t : {&numerator, &denominator})
    if (!t->defined() || t->numel() != 1)
      throw std::invalid_argument(cat("metric '", name, "': numerator and denominator must be one-element tensors"));
  at::Tensor n = numerator.detach().reshape({}).to(at::kDouble), d = denominator.detach().reshape({}).to(at::kDouble);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    entries_[name] = Entry{n.clone(), KEEL_METRIC_SUM, 1, d.clone()};
    return;
  }
  Entry& e = it->second;
  if (!e.denominator.defined())
    throw std::invalid_argument(cat("metric '", name, "' reported both as a ratio and as a plain value"));
  e.value.add_(n);
  e.denominator.add_(d);
  ++e.count;
}

namespace {

double ratio(double numerator, double denominator) {
  return denominator == 0 ? std::numeric_limits<double>::quiet_NaN() : numerator / denominator;
}

}  // namespace

std::map<std::string, double> StepMetrics::resolve() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, double> out;
  for (const auto& [name, e] : entries_) {
    double v = e.value.item<double>();
    if (e.denominator.defined())
      out[name] = ratio(v, e.denominator.item<double>());
    else
      out[name] = e.reduce == KEEL_METRIC_MEAN ? v / static_cast<double>(e.count) : v;
  }
  return out;
}

std::map<std::string, double> StepMetrics::resolve_across(Group& world) const {
  if (world.size() == 1) return resolve();
  nlohmann::json mine = nlohmann::json::object();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, e] : entries_) {
      mine[name] = {json_number(e.value.item<double>()), e.count, static_cast<int>(e.reduce)};
      if (e.denominator.defined()) mine[name].push_back(json_number(e.denominator.item<double>()));
    }
  }
  struct Merged {
    double value = 0;
    int64_t count = 0;
    int reduce = 0;
    std::optional<double> denominator;  // a ratio's
  };
  std::map<std::string, Merged> merged;
  for (const std::string& text : all_gather_bytes(world, mine.dump())) {
    const nlohmann::json reports = nlohmann::json::parse(text);
    for (const auto& [name, entry] : reports.items()) {
      double value = number_from_json(entry[0]);
      int64_t count = entry[1].get<int64_t>();
      std::optional<double> denominator;
      if (entry.size() > 3) denominator = number_from_json(entry[3]);
      auto [it, fresh] = merged.try_emplace(name, Merged{value, count, entry[2].get<int>(), denominator});
      if (fresh) continue;
      Merged& m = it->second;
      if (m.denominator.has_value() != denominator.has_value())
        throw std::invalid_argument(cat("metric '", name, "' reported as a ratio on some ranks, not on others"));
      if (denominator) *m.denominator += *denominator;
      if (m.reduce == KEEL_METRIC_MAX) m.value = std::isnan(value) ? value : std::max(m.value, value);  // nan wins
      if (m.reduce == KEEL_METRIC_MEAN || m.reduce == KEEL_METRIC_SUM) m.value += value;
      m.count += count;  // LAST keeps the lowest rank's value
    }
  }
  std::map<std::string, double> out;
  for (const auto& [name, m] : merged)
    out[name] = m.denominator                  ? ratio(m.value, *m.denominator)
                : m.reduce == KEEL_METRIC_MEAN ? m.value / static_cast<double>(m.count)
                                               : m.value;
  return out;
}

}  // namespace keel
