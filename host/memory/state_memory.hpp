// The bytes of training state a rank holds — parameters, their gradients, AdamW's state and
// the model's buffers — planned from a job's parts (the dry run builds them on the meta
// device) or counted from the tensors a trainer allocated, in one format so that the two can
// be compared line by line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "grad_sync/grad_buckets.hpp"
#include "optim/adamw.hpp"
#include "optim/param_gather.hpp"
#include "plugins/components.hpp"

namespace keel {

/// One rank's training state, in bytes.
struct StateBytes {
  int64_t parameters = 0, gradients = 0, optimizer = 0, buffers = 0;
  /// The sum of the four.
  int64_t total() const { return parameters + gradients + optimizer + buffers; }
  bool operator==(const StateBytes&) const = default;
};

/// How a rank's optimizer state is laid out: whole, or sharded over its groups' buckets.
struct OptimizerLayout {
  bool shard = false;        ///< parallelism.shard_optimizer
  int64_t bucket_bytes = 0;  ///< parallelism.grad_bucket_mb in bytes
  GroupSeat dense, expert;   ///< this rank in its dp and edp groups
};

/// What a trainer allocates for `parts`: every parameter, a gradient of its size in the flat
/// buffers, AdamW's state for the pieces this rank steps (AdamW::state_bytes; sharded, with the
/// parameter gather's staging buffers) and every buffer.
StateBytes planned_state_bytes(const std::vector<ModelPart*>& parts, const OptimizerLayout& optimizer);
/// What a trainer did allocate: the parameters, the gradient buffers, AdamW's tensors (and the
/// staging buffers of `gather`, when sharded) and the parts' buffers.
StateBytes held_state_bytes(const std::vector<ModelPart*>& parts, const GradientBuckets& grads, const AdamW& optimizer,
                            const ParameterGather* gather);

/// "parameters 1234 B (1.2 KiB), gradients ..., optimizer ..., buffers ..., total ...".
std::string describe_state_bytes(const StateBytes& bytes);
/// Ascending ranks as "0,1,4-9": runs of three or more as ranges.
std::string describe_ranks(const std::vector<size_t>& ranks);
/// One line per distinct figure, "ranks 0,2,4-9: <describe_state_bytes>", in order of first
/// rank (runs of three or more ranks as ranges).
std::vector<std::string> state_lines_by_rank(const std::vector<StateBytes>& by_rank);

/// StateBytes as text and back, to gather every rank's figures; parse throws on bad text.
std::string encode_state_bytes(const StateBytes& bytes);
StateBytes decode_state_bytes(const std::string& text);

}  // namespace keel
