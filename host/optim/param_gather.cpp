#include "optim/param_gather.hpp"

#include <algorithm>
#include <stdexcept>

#include "common/text.hpp"
#include "optim/adamw.hpp"

namespace keel {

namespace {

// The elements of the two staging buffers of each gradient buffer: the longest member range
// of its buckets (what a rank sends) and that times the group's size (what it receives).
std::vector<std::pair<int64_t, int64_t>> staging_elements(const BucketLayout& layout,
                                                          const std::vector<ParamRef>& params, int dense_members,
                                                          int expert_members) {
  std::vector<std::pair<int64_t, int64_t>> elements(layout.buffers.size(), {0, 0});
  for (const BucketSpan& span : layout.buckets) {
    const int members = span.expert ? expert_members : dense_members;
    if (members <= 1) continue;
    const std::vector<int64_t> cuts = shard_cuts(span, params, members);
    int64_t longest = 0;
    for (size_t j = 0; j + 1 < cuts.size(); ++j) longest = std::max(longest, cuts[j + 1] - cuts[j]);
    auto& [send, receive] = elements[span.buffer];
    send = std::max(send, longest);
    receive = std::max(receive, longest * members);
  }
  return elements;
}

}  // namespace

int64_t ParameterGather::staging_bytes(const BucketLayout& layout, const std::vector<ParamRef>& params,
                                       int dense_members, int expert_members) {
  int64_t bytes = 0;
  const auto elements = staging_elements(layout, params, dense_members, expert_members);
  for (size_t b = 0; b < elements.size(); ++b)
    bytes += (elements[b].first + elements[b].second) *
             static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(layout.buffers[b].options.dtype())));
  return bytes;
}

ParameterGather::ParameterGather(const BucketLayout& layout, const std::vector<ParamRef>& params, Mesh& mesh) {
  Group& dense = mesh.group(KEEL_GROUP_DP);
  Group& expert = mesh.group(KEEL_GROUP_EDP);
  // Staging buffers allocated once, for every step: no allocation churn in the step (a CPU
  // allocator keeps what it once held), and the static shapes a captured step program needs.
  const auto elements = staging_elements(layout, params, dense.size(), expert.size());
  for (size_t b = 0; b < elements.size(); ++b) {
    staging_.push_back({at::empty({elements[b].first}, layout.buffers[b].options),
                        at::empty({elements[b].second}, layout.buffers[b].options)});
  }
  for (const BucketSpan& span : layout.buckets) {
    Group& group = span.expert ? expert : dense;
    if (group.size() <= 1) continue;
    const std::vector<int64_t> cuts = shard_cuts(span, params, group.size());
    Bucket bucket;
    bucket.group = &group;
    for (int j = 0; j < group.size(); ++j) {
      const size_t member = static_cast<size_t>(j);
      bucket.longest = std::max(bucket.longest, cuts[member + 1] - cuts[member]);
      std::vector<at::Tensor> views;
      for (const OptimPiece& piece : pieces_in(span, params, cuts, j)) {
        const ParamRef& p = params[piece.param];
        if (!p.tensor().is_contiguous())
          throw std::logic_error(cat("parallelism.shard_optimizer: parameter ", p.fqn(), " is not contiguous"));
        views.push_back(AdamW::piece_of(p.tensor().detach(), piece).view({-1}));
      }
      bucket.by_member.push_back(std::move(views));
    }
    bucket.send = staging_[span.buffer].first.narrow(0, 0, bucket.longest);
    bucket.received = staging_[span.buffer].second.narrow(0, 0, bucket.longest * group.size());
    buckets_.push_back(std::move(bucket));
  }
}

int64_t ParameterGather::bytes() const {
  int64_t total = 0;
  for (const auto& [send, received] : staging_)
    total += static_cast<int64_t>(send.nbytes()) + static_cast<int64_t>(received.nbytes());
  return total;
}

void ParameterGather::run() {
  for (Bucket& b : buckets_) {
    if (b.longest == 0) continue;  // every member's range is empty on every rank alike
    const size_t me = static_cast<size_t>(b.group->rank());
    // A range shorter than the longest sends padding that no member reads.
    int64_t at_element = 0;
    for (const at::Tensor& v : b.by_member[me]) {
      b.send.narrow(0, at_element, v.numel()).copy_(v);
      at_element += v.numel();
    }
    b.group->all_gather(b.received, b.send);
    for (size_t j = 0; j < b.by_member.size(); ++j) {
      if (j == me) continue;
      int64_t offset = static_cast<int64_t>(j) * b.longest;
      for (at::Tensor& v : b.by_member[j]) {
        v.copy_(b.received.narrow(0, offset, v.numel()));
        offset += v.numel();
      }
    }
  }
}

}  // namespace keel
