#include "checkpoint/consolidate.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/text.hpp"

namespace keel {

namespace {

struct Arrived {
  TensorPiece piece;
  int rank = 0;
};

at::Tensor assemble(const std::string& key, std::vector<Arrived>& pieces) {
  const TensorPiece& head = pieces.front().piece;
  if (head.shard_dim < 0) {
    if (pieces.size() != 1)
      throw std::runtime_error(cat("consolidate: '", key, "' is written whole by ", pieces.size(), " ranks"));
    return head.tensor;
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const Arrived& a, const Arrived& b) { return a.piece.shard_offset < b.piece.shard_offset; });
  std::vector<int64_t> shape = head.tensor.sizes().vec();
  shape[static_cast<size_t>(head.shard_dim)] = head.global_dim_size;
  at::Tensor whole = at::empty(shape, head.tensor.options());
  int64_t next = 0;
  for (const Arrived& a : pieces) {
    const TensorPiece& p = a.piece;
    const int64_t size = p.tensor.size(p.shard_dim);
    if (p.shard_dim != head.shard_dim || p.shard_offset != next || p.shard_offset + size > head.global_dim_size)
      throw std::runtime_error(cat("consolidate: the shards of '", key, "' overlap or leave a gap at ", next, " (rank ",
                                   a.rank, " gives ", p.shard_offset, "+", size, " of ", head.global_dim_size, ")"));
    whole.narrow(p.shard_dim, p.shard_offset, size).copy_(p.tensor);
    next += size;
  }
  if (next != head.global_dim_size)
    throw std::runtime_error(cat("consolidate: the shards of '", key, "' cover ", next, " of ", head.global_dim_size));
  return whole;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> consolidate(const std::vector<TensorPiece>& mine, Group& world) {
  nlohmann::json described = nlohmann::json::array();
  for (const TensorPiece& p : mine)
    described.push_back({p.key, static_cast<int>(p.tensor.scalar_type()), p.tensor.sizes().vec(), p.shard_dim,
                         p.shard_offset, p.global_dim_size});
  std::vector<std::string> all = all_gather_bytes(world, described.dump());

  if (world.rank() != 0) {
    // Sent in listed order; rank 0 receives rank by rank in the same order.
    std::vector<std::unique_ptr<Work>> sends;
    for (size_t i = 0; i < mine.size(); ++i)
      // On the CPU, where rank 0 receives (over Gloo, whatever the training device).
      sends.push_back(world.isend(mine[i].tensor.detach().to(at::kCPU).contiguous(), 0, static_cast<int>(i)));
    for (auto& w : sends)
      if (w) w->wait();
    return {};
  }
  std::map<std::string, std::vector<Arrived>> by_key;
  for (size_t rank = 0; rank < all.size(); ++rank) {
    auto entries = nlohmann::json::parse(all[rank]);
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      TensorPiece piece;
      piece.key = e[0].get<std::string>();
      piece.shard_dim = e[3].get<int32_t>();
      piece.shard_offset = e[4].get<int64_t>();
      piece.global_dim_size = e[5].get<int64_t>();
      if (rank == 0) {
        piece.tensor = mine[i].tensor.detach().to(at::kCPU).contiguous();
      } else {
        auto dtype = static_cast<at::ScalarType>(e[1].get<int>());
        piece.tensor = at::empty(e[2].get<std::vector<int64_t>>(), at::TensorOptions().dtype(dtype));
        world.recv(piece.tensor, static_cast<int>(rank), static_cast<int>(i));
      }
      by_key[piece.key].push_back({std::move(piece), static_cast<int>(rank)});
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [key, pieces] : by_key) out.emplace_back(key, assemble(key, pieces));
  return out;
}

}  // namespace keel
