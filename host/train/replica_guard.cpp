#include "train/replica_guard.hpp"

#include <c10/core/GradMode.h>
#include <xxhash.h>

#include <algorithm>
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
    mine.push_back({p.fqn(), p.shard_dim() >= 0 ? p.shard_offset() : -1, hex(content_hash(p.tensor())), p.replica()});
  std::vector<std::string> gathered = all_gather_bytes(world, mine.dump());

  // (fqn, shard offset or -1) -> hash -> the ranks holding it, ascending (gathered in rank order).
  struct Holder {
    size_t rank;
    bool replica;
  };
  std::map<std::pair<std::string, int64_t>, std::map<std::string, std::vector<Holder>>> copies;
  for (size_t rank = 0; rank < gathered.size(); ++rank)
    for (const auto& entry : nlohmann::json::parse(gathered[rank]))
      copies[{entry[0].get<std::string>(), entry[1].get<int64_t>()}][entry[2].get<std::string>()].push_back(
          {rank, entry[3].get<bool>()});
  for (const auto& [id, by_hash] : copies) {
    if (by_hash.size() == 1) continue;
    // The groups in the order of their lowest rank, not of their hashes: the hashes follow the
    // CPU's arithmetic, and the message must read the same on every machine.
    std::vector<std::pair<size_t, std::string>> groups;
    for (const auto& [hash, holders] : by_hash) {
      std::vector<std::string> ranks;
      for (const Holder& h : holders) ranks.push_back(std::to_string(h.rank) + (h.replica ? " (REPLICA)" : ""));
      groups.emplace_back(holders.front().rank, cat("rank(s) ", join(ranks, ", "), " hold xxh64 ", hash));
    }
    std::sort(groups.begin(), groups.end());
    std::vector<std::string> described;
    for (auto& group : groups) described.push_back(std::move(group.second));
    std::string shard = id.second >= 0 ? cat(" (the shard at offset ", id.second, ")") : std::string();
    throw std::runtime_error(cat("replica guard after step ", step, ": the copies of '", id.first, "'", shard,
                                 " differ: ", join(described, "; ")));
  }
  return copies.size();
}

size_t perturb_replicas(const std::vector<ParamRef>& params) {
  c10::NoGradGuard no_grad;
  size_t changed = 0;
  for (const ParamRef& p : params)
    if (p.replica() && p.tensor().numel() > 0) {
      p.tensor().detach().view({-1})[0].add_(1.0);
      ++changed;
    }
  return changed;
}

}  // namespace keel
