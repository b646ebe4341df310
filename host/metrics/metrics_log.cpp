#include "metrics/metrics_log.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "metrics/json_number.hpp"
#include "metrics/log_line.hpp"

namespace keel {

MetricsLog::MetricsLog(const std::string& jsonl_path, int64_t resume_after_step) {
  if (jsonl_path.empty()) return;
  std::vector<std::string> kept;
  // Something else under the log's name (a FIFO would block the read and the write, a folder
  // fail them) is refused before either.
  std::error_code ec;
  if (std::filesystem::exists(jsonl_path, ec) && !is_regular_input(jsonl_path))
    throw InputError(cat("job.run_dir: ", jsonl_path, " is ", file_kind(jsonl_path),
                         ", expected the run's metrics log (a regular file) or nothing"));
  {
    std::ifstream old(jsonl_path);
    for (std::string line; std::getline(old, line);) {
      auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (record.is_object() && record.value("step", int64_t{0}) <= resume_after_step) kept.push_back(line);
    }
  }
  jsonl_.emplace(jsonl_path, std::ios::trunc);
  for (const std::string& line : kept) *jsonl_ << line << '\n';
  if (!*jsonl_) throw std::runtime_error(cat("cannot open ", jsonl_path, " for writing"));
}

void MetricsLog::write(const StepRecord& r) {
  for (const std::string& line : step_lines(r)) log_info(line);
  if (!jsonl_) return;
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["loss"] = json_number(r.loss);
  j["grad_norm"] = json_number(r.grad_norm);
  j["lr"] = json_number(r.lr);
  j["tokens_per_second"] = json_number(r.tokens_per_second);
  j["eta_seconds"] = json_number(r.eta_seconds);
  j["peak_memory_bytes"] = json_number(r.peak_memory_bytes);
  nlohmann::json by_rank = nlohmann::json::array();
  for (double bytes : r.peak_memory_by_rank) by_rank.push_back(json_number(bytes));
  j["peak_memory_bytes_by_rank"] = by_rank;
  j["skipped"] = r.skipped;
  for (const auto& [name, value] : r.plugin_metrics) j[name] = json_number(value);
  for (const auto& [name, value] : r.validation) j[name] = json_number(value);
  for (const auto& [name, tokens] : r.source_tokens) j["tokens." + name] = json_number(tokens);
  if (!r.profile_traces.empty()) j["profile_traces"] = r.profile_traces;
  *jsonl_ << j.dump() << '\n';
  jsonl_->flush();
}

}  // namespace keel
