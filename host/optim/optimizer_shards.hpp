// Which rows of which parameters each member of a reduction group steps when the optimizer
// state is sharded (parallelism.shard_optimizer, ZeRO-1): every gradient bucket of the group
// is cut into one contiguous range per member, about equal. A cut falls between two
// parameters, or inside one at a row boundary (dim 0) that is also a multiple of 64 elements
// from the parameter's start: a piece is then a dim-0 slice (a checkpoint piece like an expert
// shard), and ATen's fused AdamW, which runs 64-byte-aligned chunks through the same vector
// code and only a tensor's last elements through scalar code, computes every element exactly
// as it does for the whole parameter — so the sharded step is bitwise the unsharded one, and
// two REPLICA copies cut at different places stay bitwise equal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "grad_sync/bucket_layout.hpp"

namespace keel {

/// Rows [first_row, first_row + rows) along dim 0 of parameter `param`, or all of it.
struct OptimPiece {
  size_t param = 0;
  bool whole = true;
  int64_t first_row = 0, rows = 0;  ///< when !whole
  bool operator==(const OptimPiece&) const = default;
};

/// The first element of each member's range in a bucket, and the bucket's end: member j steps
/// [cuts[j], cuts[j + 1]). Each cut is the allowed point nearest to j·numel/members (the lower
/// one on a tie). `params` gives the members' shapes (a parameter of another shard_dim than 0,
/// or of no dimension, is never cut).
std::vector<int64_t> shard_cuts(const BucketSpan& bucket, const std::vector<ParamRef>& params, int members);

/// The pieces of member `member`'s range of `bucket` under `cuts`, in bucket order (a
/// parameter of no elements is member 0's, whole).
std::vector<OptimPiece> pieces_in(const BucketSpan& bucket, const std::vector<ParamRef>& params,
                                  const std::vector<int64_t>& cuts, int member);

/// Where a reduction group stands for this rank: its size and this rank's index in it.
struct GroupSeat {
  int size = 1, index = 0;
};

/// Every piece this rank steps: with `shard`, its range of every bucket of `layout` (dense
/// buckets cut among `dense`, expert buckets among `expert`); without, every parameter whole.
std::vector<OptimPiece> optimizer_pieces(const BucketLayout& layout, const std::vector<ParamRef>& params, bool shard,
                                         GroupSeat dense, GroupSeat expert);

}  // namespace keel
