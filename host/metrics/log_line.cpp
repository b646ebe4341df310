#include "metrics/log_line.hpp"

#include <cmath>
#include <limits>
#include <set>

#include "common/text.hpp"

namespace keel {

std::vector<LogFigure> log_figures(const std::map<std::string, double>& metrics) {
  std::map<std::string, std::vector<double>> families;
  for (const auto& [name, value] : metrics) families[name.substr(0, name.find('.'))].push_back(value);
  std::vector<LogFigure> out;
  std::set<std::string> shown;
  for (const auto& [name, value] : metrics) {
    const std::string family = name.substr(0, name.find('.'));
    const std::vector<double>& members = families.at(family);
    if (members.size() < 2) {
      out.push_back({name, value});
      continue;
    }
    if (!shown.insert(family).second) continue;
    double largest = -std::numeric_limits<double>::infinity();
    for (double v : members) largest = std::isnan(v) || std::isnan(largest) ? std::nan("") : std::max(largest, v);
    out.push_back({family + " max", largest});
  }
  return out;
}

std::vector<std::string> step_lines(const StepRecord& r, size_t width) {
  std::vector<std::string> items = {format("step %ld/%ld", static_cast<long>(r.step), static_cast<long>(r.total_steps)),
                                    format("loss %.4f", r.loss),
                                    format("grad_norm %.4f", r.grad_norm),
                                    format("lr %.3e", r.lr),
                                    human_count(r.tokens_per_second) + " tok/s",
                                    "eta " + human_duration(r.eta_seconds),
                                    "mem " + human_bytes(r.peak_memory_bytes)};
  for (const LogFigure& f : log_figures(r.plugin_metrics)) items.push_back(format("%s %.4f", f.label.c_str(), f.value));
  if (r.skipped) items.push_back("update skipped (non-finite gradients)");
  std::vector<std::string> lines = {items.front()};
  for (size_t i = 1; i < items.size(); ++i) {
    if (lines.back().size() + 3 + items[i].size() <= width)
      lines.back() += " | " + items[i];
    else
      lines.push_back("  " + items[i]);
  }
  return lines;
}

}  // namespace keel
