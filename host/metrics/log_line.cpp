#include "metrics/log_line.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "common/text.hpp"

namespace keel {

namespace {

// The family of a dotted name ("load.layers.3" -> "load"); undotted names belong to none.
std::optional<std::string> family_of(const std::string& name) {
  const size_t dot = name.find('.');
  if (dot == std::string::npos) return std::nullopt;
  return name.substr(0, dot);
}

// Whether the part after the family is a plain number ("mtp_loss.2"): one figure per depth.
bool numbered(const std::string& name, const std::string& family) {
  const std::string rest = name.substr(family.size() + 1);
  return !rest.empty() && std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::vector<LogFigure> log_figures(const std::map<std::string, double>& metrics) {
  std::map<std::string, std::vector<double>> families;
  std::set<std::string> folded;  // families with a member that is not simply numbered
  for (const auto& [name, value] : metrics)
    if (const auto family = family_of(name)) {
      families[*family].push_back(value);
      if (!numbered(name, *family)) folded.insert(*family);
    }
  std::vector<LogFigure> out;
  std::set<std::string> shown;
  for (const auto& [name, value] : metrics) {
    const auto family = family_of(name);
    if (!family || !folded.count(*family) || families.at(*family).size() < 2) {
      out.push_back({name, value});
      continue;
    }
    if (!shown.insert(*family).second) continue;
    double largest = -std::numeric_limits<double>::infinity();
    for (double v : families.at(*family))
      largest = std::isnan(v) || std::isnan(largest) ? std::nan("") : std::max(largest, v);
    out.push_back({*family + " max", largest});
  }
  return out;
}

namespace {

// Items joined by " | " into lines of at most `width` characters, continuation lines indented.
std::vector<std::string> wrapped(const std::vector<std::string>& items, size_t width) {
  std::vector<std::string> lines = {items.front()};
  for (size_t i = 1; i < items.size(); ++i) {
    if (lines.back().size() + 3 + items[i].size() <= width)
      lines.back() += " | " + items[i];
    else
      lines.push_back("  " + items[i]);
  }
  return lines;
}

// Which rank the peak is, when there are several.
std::string peak_rank(const StepRecord& r) {
  if (r.peak_memory_by_rank.size() < 2) return "";
  const auto largest = std::max_element(r.peak_memory_by_rank.begin(), r.peak_memory_by_rank.end());
  return format(" max (rank %ld)", static_cast<long>(largest - r.peak_memory_by_rank.begin()));
}

}  // namespace

std::vector<std::string> step_lines(const StepRecord& r, size_t width) {
  std::vector<std::string> items = {format("step %ld/%ld", static_cast<long>(r.step), static_cast<long>(r.total_steps)),
                                    format("loss %.4f", r.loss),
                                    format("grad_norm %.4f", r.grad_norm),
                                    format("lr %.3e", r.lr),
                                    human_count(r.tokens_per_second) + " tok/s",
                                    "eta " + human_duration(r.eta_seconds),
                                    "mem " + human_bytes(r.peak_memory_bytes) + peak_rank(r)};
  for (const LogFigure& f : log_figures(r.plugin_metrics)) items.push_back(format("%s %.4f", f.label.c_str(), f.value));
  if (r.skipped) items.push_back("update skipped (non-finite gradients)");
  std::vector<std::string> lines = wrapped(items, width);
  if (!r.validation.empty()) {
    std::map<std::string, double> figures = r.validation;
    const double tokens = figures["val_tokens"], seconds = figures["val_seconds"];
    figures.erase("val_tokens");
    figures.erase("val_seconds");
    figures.erase("val_loss");
    std::vector<std::string> validation = {
        format("validation after step %ld: val_loss %.4f", static_cast<long>(r.step), r.validation.at("val_loss"))};
    for (const LogFigure& f : log_figures(figures)) validation.push_back(format("%s %.4f", f.label.c_str(), f.value));
    validation.push_back(format("%s tokens in %.3f s", human_count(tokens).c_str(), seconds));
    for (std::string& line : wrapped(validation, width)) lines.push_back(std::move(line));
  }
  if (!r.profile_traces.empty())
    lines.push_back(format("profiler traces of the window ending at step %ld: %s/rank-*.json",
                           static_cast<long>(r.step), r.profile_traces.c_str()));
  return lines;
}

}  // namespace keel
