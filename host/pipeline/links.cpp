#include "pipeline/links.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include "common/text.hpp"

namespace keel {

static_assert(kMeshPipelineLinks == 4, "pipeline_link: two kinds of transfer times two directions");

int pipeline_link(TransferKind kind, int from, int to) {
  if (from == to) throw std::invalid_argument(cat("pipeline: no link joins pp rank ", from, " to itself"));
  return 2 * (kind == TransferKind::gradient ? 1 : 0) + (from < to ? 0 : 1);
}

std::vector<PassTransfer> pass_transfers(const std::string& schedule, int rank, int ranks, int chunks,
                                         const PipelineAction& action) {
  const int stage = chunk_stage(schedule, rank, ranks, action.chunk), last = ranks * chunks - 1;
  std::vector<PassTransfer> out;
  auto add = [&](bool sending, TransferKind kind, int peer_stage, int boundary) {
    out.push_back({sending, kind, stage_rank(schedule, peer_stage, ranks), boundary, action.microbatch});
  };
  if (action.kind == PipelineAction::forward) {
    if (stage > 0) add(false, TransferKind::activation, stage - 1, stage - 1);
    if (stage < last) add(true, TransferKind::activation, stage + 1, stage);
  } else if (action.kind == PipelineAction::backward) {
    if (stage < last) add(false, TransferKind::gradient, stage + 1, stage);
    if (stage > 0) add(true, TransferKind::gradient, stage - 1, stage - 1);
  }
  return out;
}

namespace {

// Calls `visit(rank, transfer)` for every transfer of every rank of the schedule's training
// step, or of an evaluation's forward passes, each rank's in its issue order.
template <typename Visit>
void each_transfer(const std::string& schedule, int ranks, int microbatches, int chunks, bool evaluation, Visit visit) {
  for (int r = 0; r < ranks; ++r)
    for (const PipelineAction& a : evaluation ? evaluation_actions(microbatches, chunks)
                                              : stage_actions(schedule, r, ranks, microbatches, chunks))
      for (const PassTransfer& t : pass_transfers(schedule, r, ranks, chunks, a))
        if (t.peer != r) visit(r, t);
}

}  // namespace

std::vector<LinkUse> links_in_use(const std::string& schedule, int ranks, int microbatches, int chunks) {
  std::set<LinkUse> uses;
  for (bool evaluation : {false, true})
    each_transfer(schedule, ranks, microbatches, chunks, evaluation, [&](int r, const PassTransfer& t) {
      if (t.sending) uses.insert({pipeline_link(t.kind, r, t.peer), r, t.peer});
    });
  return {uses.begin(), uses.end()};
}

bool transfers_pair_in_order(const std::string& schedule, int ranks, int microbatches, int chunks) {
  // Per link direction, the transfers in the sender's issue order and in the receiver's.
  using Transfer = std::tuple<int, int, int>;  // kind, boundary, microbatch
  for (bool evaluation : {false, true}) {
    std::map<LinkUse, std::vector<Transfer>> sent, received;
    each_transfer(schedule, ranks, microbatches, chunks, evaluation, [&](int r, const PassTransfer& t) {
      const int from = t.sending ? r : t.peer, to = t.sending ? t.peer : r;
      auto& list = t.sending ? sent : received;
      list[{pipeline_link(t.kind, from, to), from, to}].emplace_back(static_cast<int>(t.kind), t.boundary,
                                                                     t.microbatch);
    });
    if (sent != received) return false;
  }
  return true;
}

void open_pipeline_links(const std::vector<Group*>& links, int rank, const std::vector<LinkUse>& uses,
                         at::Device device) {
  if (links.size() != static_cast<size_t>(kMeshPipelineLinks))
    throw std::invalid_argument(cat("pipeline: ", links.size(), " link groups, expected ", kMeshPipelineLinks));
  // A tag no transfer of a step uses (theirs count up from 0).
  const int tag = std::numeric_limits<int>::max();
  // Pairs whose lower rank is even first, then the odd ones, link by link: the order is shared
  // by all ranks and lets disjoint pairs open their communicators at once, where sorting by
  // rank would chain each rank's second pair behind its first along the pipeline.
  std::vector<LinkUse> order = uses;
  auto key = [](const LinkUse& u) {
    const int low = std::min(u.from, u.to);
    return std::tuple{u.link, low % 2, low, u.from, u.to};
  };
  std::sort(order.begin(), order.end(), [&](const LinkUse& a, const LinkUse& b) { return key(a) < key(b); });
  for (const LinkUse& use : order) {
    if (use.from != rank && use.to != rank) continue;
    at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
    Group& link = *links.at(static_cast<size_t>(use.link));
    try {
      if (use.from == rank)
        link.send(token, use.to, tag);
      else
        link.recv(token, use.from, tag);
    } catch (const c10::Error& e) {  // LibTorch's message without its C++ stack trace
      throw std::runtime_error(cat("pipeline: opening link ", use.link, " from pp rank ", use.from, " to pp rank ",
                                   use.to, " failed (did pp rank ", use.from == rank ? use.to : use.from,
                                   " stop during setup?): ", e.what_without_backtrace()));
    }
  }
}

}  // namespace keel
