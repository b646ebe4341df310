// The error model of host/verify/error_model.hpp (which keel-train verify applies too), and
// the tests' view of it on whole states: each entry's class (parameters, Adam's moments,
// DeepSeek-V3's expert bias, counters) and its bound.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "verify/error_model.hpp"

namespace keel::test {

using keel::adam_update_bound;
using keel::deviation;
using keel::exp_avg_sq_tolerance;
using keel::exp_avg_tolerance;
using keel::expert_bias_tolerance;
using keel::kGradientRtol;
using keel::kLossRtol;
using keel::kValueRtol;
using keel::parameter_tolerance;
using keel::relative_difference;
using keel::Tolerance;
using keel::TrainingBounds;

/// The class of a state entry, as the model bounds it.
inline std::string state_class(const std::string& key) {
  if (key.rfind("optim.step.", 0) == 0 || key.rfind("clipper.", 0) == 0) return "counters";
  if (key.rfind("optim.exp_avg_sq.", 0) == 0) return "exp_avg_sq";
  if (key.rfind("optim.exp_avg.", 0) == 0) return "exp_avg";
  if (key.size() >= 11 && key.compare(key.size() - 11, 11, "expert_bias") == 0) return "expert_bias";
  return "parameters";
}

/// The tolerance for one entry of a consolidated state (a checkpoint's keys, or
/// debug.dump_state's): counters exact, moments, expert bias and parameters by the model.
inline Tolerance state_tolerance(const std::string& key, const TrainingBounds& b) {
  const std::string cls = state_class(key);
  if (cls == "counters") return {};
  if (cls == "exp_avg_sq") return exp_avg_sq_tolerance(b);
  if (cls == "exp_avg") return exp_avg_tolerance(b);
  if (cls == "expert_bias") return expert_bias_tolerance(b);
  return parameter_tolerance(b);
}

/// The outcome of comparing two consolidated states entry by entry under the model.
struct StateComparison {
  std::vector<std::string> failures;             ///< "KEY: why", one per entry outside its bound
  std::map<std::string, double> worst;           ///< per class (parameters, exp_avg, ...): worst deviation
  std::map<std::string, std::string> worst_key;  ///< per class: the entry that reached it
  size_t compared = 0;
};

/// Compares every entry of `expected` with the same key of `actual` (which must hold the same
/// keys and shapes), each under state_tolerance.
inline StateComparison compare_states(const std::map<std::string, at::Tensor>& actual,
                                      const std::map<std::string, at::Tensor>& expected, const TrainingBounds& b) {
  StateComparison c;
  for (const auto& [key, want] : expected) {
    auto it = actual.find(key);
    if (it == actual.end()) {
      c.failures.push_back(key + ": missing");
      continue;
    }
    if (it->second.sizes() != want.sizes()) {
      c.failures.push_back(key + ": another shape");
      continue;
    }
    const Tolerance tol = state_tolerance(key, b);
    const double d = deviation(it->second, want, tol);
    const std::string cls = state_class(key);
    if (!c.worst.count(cls) || d > c.worst[cls]) c.worst[cls] = d, c.worst_key[cls] = key;
    if (!(d <= 1)) c.failures.push_back(key + ": " + std::to_string(d) + " of its bound");
    ++c.compared;
  }
  for (const auto& [key, t] : actual)
    if (!expected.count(key)) c.failures.push_back(key + ": unexpected");
  return c;
}

}  // namespace keel::test
