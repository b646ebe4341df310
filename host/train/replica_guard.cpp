#include "train/replica_guard.hpp"

#include <c10/core/GradMode.h>
#include <xxhash.h>

#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/text.hpp"

namespace keel {

namespace {

uint64_t content_hash(const at::Tensor& t) {
  at::Tensor bytes = t.detach().to(at::kCPU).contiguous();
  return XXH64(bytes.data_ptr(), bytes.numel() * bytes.element_size(), 0);
}

std::string hex(uint64_t value) { return format("%016llx", static_cast<unsigned long long>(value)); }

}  // namespace

size_t check_replicas(const std::vector<ParamRef>& params, Group& world, int64_t step) {
  nlohmann::json mine = nlohmann::json::array();
  for (const ParamRef& p : params)
    mine.push_back({p.fqn, p.shard_dim >= 0 ? p.shard_offset : -1, hex(content_hash(*p.tensor)), p.replica()});
  std::vector<std::string> gathered = all_gather_bytes(world, mine.dump());

  // (fqn, shard offset or -1) -> hash -> the ranks holding it, "R" or "R (REPLICA)".
  std::map<std::pair<std::string, int64_t>, std::map<std::string, std::vector<std::string>>> copies;
  for (size_t rank = 0; rank < gathered.size(); ++rank)
    for (const auto& entry : nlohmann::json::parse(gathered[rank])) {
      std::string who = std::to_string(rank) + (entry[3].get<bool>() ? " (REPLICA)" : "");
      copies[{entry[0].get<std::string>(), entry[1].get<int64_t>()}][entry[2].get<std::string>()].push_back(who);
    }
  for (const auto& [id, by_hash] : copies) {
    if (by_hash.size() == 1) continue;
    std::vector<std::string> groups;
    for (const auto& [hash, ranks] : by_hash)
      groups.push_back(cat("rank(s) ", join(ranks, ", "), " hold xxh64 ", hash));
    std::string shard = id.second >= 0 ? cat(" (the shard at offset ", id.second, ")") : std::string();
    throw std::runtime_error(cat("replica guard after step ", step, ": the copies of '", id.first, "'", shard,
                                 " differ: ", join(groups, "; ")));
  }
  return copies.size();
}

size_t perturb_replicas(const std::vector<ParamRef>& params) {
  c10::NoGradGuard no_grad;
  size_t changed = 0;
  for (const ParamRef& p : params)
    if (p.replica() && p.tensor->numel() > 0) {
      p.tensor->detach().view({-1})[0].add_(1.0);
      ++changed;
    }
  return changed;
}

}  // namespace keel
