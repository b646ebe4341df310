// Runs one step's forward and backward passes on this rank's pipeline stage — its model chunks,
// one per virtual stage under interleaving — in the order of a schedule (pipeline/schedule.hpp).
// Activations go to the next virtual stage and their gradients back (where the schedule places
// each chunk: chunk_stage) over the pipeline's link groups, one per kind and direction
// (pipeline/links.hpp): sends are asynchronous (waited for at the end of the step), receives
// block, and on each link one rank of a pair only sends and the other only receives, so no
// transfer waits behind another on NCCL either (links.hpp says what that still assumes).
// Between two chunks of the same rank (the turn of zbv's V) they are handed over in memory.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mesh/group.hpp"
#include "pipeline/links.hpp"
#include "pipeline/schedule.hpp"
#include "plugins/components.hpp"

namespace keel {

/// Where one step's schedule spent its time on this rank.
struct ScheduleTiming {
  double total_seconds = 0;  ///< from the first action to the last send completed
  double busy_seconds = 0;   ///< inside forward and backward passes
};

class PipelineRunner {
 public:
  /// `parts` are this rank's chunks in virtual-stage order; activations between stages are
  /// [batch, seq, hidden_size] fp32 on `device` (the residual stream, whatever the compute
  /// dtype); forward passes run under autocast to `compute_dtype` unless it is fp32. Throws
  /// std::invalid_argument on an unknown schedule or parts that do not fit it. `links` are the
  /// mesh's pipeline link groups (Mesh::pipeline_link), opened here. [collective: pp]
  PipelineRunner(std::vector<ModelPart*> parts, Group& pp, std::vector<Group*> links, const std::string& schedule,
                 int microbatches, int64_t hidden_size, at::ScalarType compute_dtype, at::Device device);

  /// Runs forward and backward of every microbatch (`tokens` / `labels`: one [batch, seq] CPU
  /// tensor each per microbatch). The last stage divides each microbatch's loss sum by
  /// `loss_divisor` before its backward. Returns the sum of the last stage's (undivided) loss
  /// sums as a 0-dim fp32 device tensor, zero on other stages. [collective: pp]
  at::Tensor run(const std::vector<at::Tensor>& tokens, const std::vector<at::Tensor>& labels, double loss_divisor);
  /// Runs the forward pass of every microbatch in microbatch order, without autograd (the
  /// forward-only schedule of an evaluation: nothing is kept for a backward pass, and an
  /// activation is dropped once sent). Returns the sum of the last stage's loss sums as a 0-dim
  /// fp32 device tensor, zero on other stages. [collective: pp]
  at::Tensor evaluate(const std::vector<at::Tensor>& tokens, const std::vector<at::Tensor>& labels);
  /// `hook(chunk)` runs on every run() just before the step's last backward pass through each
  /// of this rank's chunks (its last weight pass, where the schedule splits backward passes),
  /// where that chunk's gradients become final (the overlapped gradient reduction arms there):
  /// with several chunks, in the order those passes run.
  void set_before_last_backward(std::function<void(int chunk)> hook) { before_last_backward_ = std::move(hook); }
  /// The timing of the last run().
  const ScheduleTiming& timing() const { return timing_; }

 private:
  at::Tensor receive(const std::vector<int64_t>& shape, TransferKind kind, int peer, int tag);
  // The link group carrying `kind` from pp rank `from` to pp rank `to`.
  Group& link(TransferKind kind, int from, int to) const {
    return *links_[static_cast<size_t>(pipeline_link(kind, from, to))];
  }
  at::Tensor outgoing(at::Tensor output, const std::vector<int64_t>& shape, int virtual_stage) const;
  // Sends `tensor` to virtual stage `to` on `tag`, or keeps it for this rank's own chunk.
  void send(const at::Tensor& tensor, TransferKind kind, int to, int tag, std::vector<std::unique_ptr<Work>>& sends);
  // Receives what virtual stage `from` sent on `tag`.
  at::Tensor receive_from(const std::vector<int64_t>& shape, TransferKind kind, int from, int tag);
  int virtual_stage(int chunk) const { return chunk_stage(schedule_, stage_, pp_.size(), chunk); }
  int rank_of(int virtual_stage) const { return stage_rank(schedule_, virtual_stage, pp_.size()); }

  std::vector<ModelPart*> parts_;
  Group& pp_;
  std::vector<Group*> links_;  ///< by pipeline_link()
  std::string schedule_;
  std::vector<PipelineAction> actions_;
  std::map<int, at::Tensor> handed_over_;  ///< by tag: what one of this rank's chunks sent another
  int64_t hidden_size_;
  at::TensorOptions activation_options_;
  at::ScalarType compute_dtype_;
  at::Device device_;
  int stage_;           ///< this rank's pp index
  int virtual_stages_;  ///< pp x chunks
  ScheduleTiming timing_;
  std::function<void(int)> before_last_backward_;
  std::vector<bool> last_backward_;  ///< by action: the chunk's last pass accumulating gradients
  bool split_ = false;               ///< backward passes split into input and weight passes
};

}  // namespace keel
