// The pipeline's point-to-point links. NCCL pairs the transfers between two ranks of one
// communicator in the order they are issued, whatever their tags, and runs them in that order on
// one stream (ProcessGroupNCCL keeps one communicator and stream per pair of ranks for them, on a
// group not bound to a device, as the mesh's are): a receive queued behind a send waits until
// the peer takes that send ("blocking for the GPU", NCCL's documentation of ncclSend). Two
// ranks that each send before they receive from the other (1F1B's steady state: an activation
// goes one way while a gradient comes the other) would wait on each other once the transfers
// outgrow NCCL's buffers. So the pipeline uses four groups over the pp ranks, one per kind of
// transfer and direction (pipeline_link), and on each of them, between two ranks, one rank only
// sends and the other only receives. Gloo matches tags and needs none of this; the same links
// are used on both, so the CPU tests run the routing that NCCL needs. What remains assumed is
// what every NCCL pipeline assumes: kernels of different communicators progress side by side
// (NCCL does not promise it; PyTorch's and Megatron's pipelines rely on it too).
#pragma once

#include <ATen/ATen.h>

#include <compare>
#include <string>
#include <vector>

#include "mesh/group.hpp"
#include "mesh/mesh.hpp"
#include "pipeline/schedule.hpp"

namespace keel {

/// What one pipeline transfer carries.
enum class TransferKind { activation, gradient };

/// The link group (0 .. kMeshPipelineLinks - 1) that carries `kind` from pp rank `from` to pp rank
/// `to`: one per kind and direction (toward a higher or a lower rank).
int pipeline_link(TransferKind kind, int from, int to);

/// One transfer of a pass, seen from the rank that runs the pass.
struct PassTransfer {
  bool sending = false;  ///< a send after the pass; else a receive before it
  TransferKind kind = TransferKind::activation;
  int peer = 0;      ///< the other pp rank (this rank itself: a hand-over in memory)
  int boundary = 0;  ///< the lower virtual stage of the two it joins
  int microbatch = 0;
};

/// The transfers of pass `action` of pp rank `rank` (of `ranks`) under `schedule`, in the order
/// the pipeline runner issues them (the receive before the pass, the send after it).
std::vector<PassTransfer> pass_transfers(const std::string& schedule, int rank, int ranks, int chunks,
                                         const PipelineAction& action);

/// One direction of one link between two pp ranks.
struct LinkUse {
  int link = 0, from = 0, to = 0;
  auto operator<=>(const LinkUse&) const = default;
};

/// Every link direction that some rank of `schedule` sends on, in a training step or an
/// evaluation, in ascending order; hand-overs in memory excluded.
std::vector<LinkUse> links_in_use(const std::string& schedule, int ranks, int microbatches, int chunks);

/// Whether, on every link and between every two ranks, the sender issues its transfers in the
/// order the receiver takes them, in a training step and in an evaluation (evaluation_actions):
/// then NCCL, which pairs them in issue order, pairs each transfer with itself.
bool transfers_pair_in_order(const std::string& schedule, int ranks, int microbatches, int chunks);

/// Sends one element on every use of `uses` that involves pp rank `rank`, one at a time in an
/// order all ranks derive from `uses` alone, so that each link's communicator exists before the
/// first step: NCCL builds one at a pair's first transfer and blocks the host until both ranks
/// arrive, which in the middle of a schedule could close a cycle. A shared order is free of
/// deadlock: the first pending use is always the next of both its ranks. [collective: pp]
void open_pipeline_links(const std::vector<Group*>& links, int rank, const std::vector<LinkUse>& uses,
                         at::Device device);

}  // namespace keel
