#include "optim/optimizer_shards.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace keel {

namespace {

// Cuts inside a parameter fall on multiples of this many elements from its start: 64 covers
// the widest vector ATen uses (512 bits of bf16) and its 64-byte task units.
constexpr int64_t kCutAlignment = 64;

// The distance between two allowed cuts inside `p`, or 0 when it is never cut.
int64_t cut_step(const ParamRef& p) {
  const at::Tensor& t = p.tensor();
  if (t.dim() == 0 || t.size(0) == 0 || (p.shard_dim() != -1 && p.shard_dim() != 0)) return 0;
  const int64_t row = t.numel() / t.size(0);
  return row == 0 ? 0 : std::lcm(row, kCutAlignment);
}

}  // namespace

std::vector<int64_t> shard_cuts(const BucketSpan& bucket, const std::vector<ParamRef>& params, int members) {
  if (members < 1) throw std::logic_error("shard_cuts: a group has at least one member");
  std::vector<int64_t> cuts(static_cast<size_t>(members) + 1, 0);
  cuts.back() = bucket.numel;
  size_t m = 0;  // the member holding the target (targets only grow)
  for (int j = 1; j < members; ++j) {
    // j·numel/members without overflow: numel < 2^63 / members is not guaranteed.
    const int64_t target = static_cast<int64_t>(static_cast<__int128>(bucket.numel) * j / members);
    while (m + 1 < bucket.members.size() && bucket.members[m].offset + bucket.members[m].numel <= target) ++m;
    const BucketMember& b = bucket.members[m];
    int64_t lo = b.offset, hi = b.offset + b.numel;
    if (const int64_t step = cut_step(params[b.param]); step > 0) {
      lo = b.offset + (target - b.offset) / step * step;
      hi = std::min(lo + step, b.offset + b.numel);
    }
    const int64_t cut = target - lo <= hi - target ? lo : hi;
    cuts[static_cast<size_t>(j)] = std::max(cut, cuts[static_cast<size_t>(j) - 1]);
  }
  return cuts;
}

std::vector<OptimPiece> pieces_in(const BucketSpan& bucket, const std::vector<ParamRef>& params,
                                  const std::vector<int64_t>& cuts, int member) {
  const int64_t from = cuts.at(static_cast<size_t>(member)), to = cuts.at(static_cast<size_t>(member) + 1);
  std::vector<OptimPiece> pieces;
  for (const BucketMember& b : bucket.members) {
    if (b.numel == 0) {
      if (member == 0) pieces.push_back({b.param, true, 0, 0});
      continue;
    }
    const int64_t lo = std::max(from, b.offset), hi = std::min(to, b.offset + b.numel);
    if (lo >= hi) continue;
    if (lo == b.offset && hi == b.offset + b.numel) {
      pieces.push_back({b.param, true, 0, 0});
      continue;
    }
    const int64_t row = b.numel / params[b.param].tensor().size(0);
    pieces.push_back({b.param, false, (lo - b.offset) / row, (hi - lo) / row});
  }
  return pieces;
}

std::vector<OptimPiece> optimizer_pieces(const BucketLayout& layout, const std::vector<ParamRef>& params, bool shard,
                                         GroupSeat dense, GroupSeat expert) {
  std::vector<OptimPiece> pieces;
  if (!shard) {
    for (size_t i = 0; i < params.size(); ++i) pieces.push_back({i, true, 0, 0});
    return pieces;
  }
  for (const BucketSpan& bucket : layout.buckets) {
    const GroupSeat seat = bucket.expert ? expert : dense;
    const std::vector<int64_t> cuts = shard_cuts(bucket, params, seat.size);
    for (const OptimPiece& p : pieces_in(bucket, params, cuts, seat.index)) pieces.push_back(p);
  }
  return pieces;
}

}  // namespace keel
