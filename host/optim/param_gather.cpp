#include "optim/param_gather.hpp"

#include <algorithm>
#include <stdexcept>

#include "common/text.hpp"
#include "optim/adamw.hpp"

namespace keel {

namespace {

// The elements of the staging buffer of each gradient buffer: the longest member range of its
// buckets (where a member's rows are packed to be sent, and where the others' arrive).
std::vector<int64_t> staging_elements(const BucketLayout& layout, const std::vector<ParamRef>& params,
                                      int dense_members, int expert_members) {
  std::vector<int64_t> elements(layout.buffers.size(), 0);
  for (const BucketSpan& span : layout.buckets) {
    const int members = span.expert ? expert_members : dense_members;
    if (members <= 1) continue;
    const std::vector<int64_t> cuts = shard_cuts(span, params, members);
    for (size_t j = 0; j + 1 < cuts.size(); ++j)
      elements[span.buffer] = std::max(elements[span.buffer], cuts[j + 1] - cuts[j]);
  }
  return elements;
}

}  // namespace

int64_t ParameterGather::staging_bytes(const BucketLayout& layout, const std::vector<ParamRef>& params,
                                       int dense_members, int expert_members) {
  int64_t bytes = 0;
  const std::vector<int64_t> elements = staging_elements(layout, params, dense_members, expert_members);
  for (size_t b = 0; b < elements.size(); ++b)
    bytes += elements[b] *
             static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(layout.buffers[b].options.dtype())));
  return bytes;
}

ParameterGather::ParameterGather(const BucketLayout& layout, const std::vector<ParamRef>& params, Mesh& mesh) {
  Group& dense = mesh.group(KEEL_GROUP_DP);
  Group& expert = mesh.group(KEEL_GROUP_EDP);
  // One staging buffer per gradient buffer, allocated once: no allocation in the step (a CPU
  // allocator keeps what it once held), and the static shapes a captured step program needs.
  for (int64_t elements : staging_elements(layout, params, dense.size(), expert.size()))
    staging_.push_back(at::empty({elements}, layout.buffers[staging_.size()].options));
  for (const BucketSpan& span : layout.buckets) {
    Group& group = span.expert ? expert : dense;
    if (group.size() <= 1) continue;
    const std::vector<int64_t> cuts = shard_cuts(span, params, group.size());
    Bucket bucket;
    bucket.group = &group;
    bucket.staging = staging_[span.buffer];
    for (int j = 0; j < group.size(); ++j) {
      std::vector<at::Tensor> views;
      for (const OptimPiece& piece : pieces_in(span, params, cuts, j)) {
        const ParamRef& p = params[piece.param];
        if (!p.tensor().is_contiguous())
          throw std::logic_error(cat("parallelism.shard_optimizer: parameter ", p.fqn(), " is not contiguous"));
        views.push_back(AdamW::piece_of(p.tensor().detach(), piece).view({-1}));
      }
      bucket.by_member.push_back(std::move(views));
      bucket.elements.push_back(cuts[static_cast<size_t>(j) + 1] - cuts[static_cast<size_t>(j)]);
    }
    buckets_.push_back(std::move(bucket));
  }
}

int64_t ParameterGather::bytes() const {
  int64_t total = 0;
  for (const at::Tensor& t : staging_) total += static_cast<int64_t>(t.nbytes());
  return total;
}

void ParameterGather::run() {
  // Each member broadcasts its rows in turn through the staging buffer, in place: the same
  // bytes as one all-gather, and unlike Gloo's all-gather (which stages the whole bucket in a
  // buffer of its own every call) nothing is allocated.
  for (Bucket& b : buckets_) {
    const int me = b.group->rank();
    for (int j = 0; j < b.group->size(); ++j) {
      const size_t member = static_cast<size_t>(j);
      if (b.elements[member] == 0) continue;  // every rank skips the same empty ranges
      at::Tensor rows = b.staging.narrow(0, 0, b.elements[member]);
      int64_t offset = 0;
      if (j == me)
        for (const at::Tensor& v : b.by_member[member]) {
          rows.narrow(0, offset, v.numel()).copy_(v);
          offset += v.numel();
        }
      b.group->broadcast(rows, j);
      if (j == me) continue;
      for (at::Tensor& v : b.by_member[member]) {
        v.copy_(rows.narrow(0, offset, v.numel()));
        offset += v.numel();
      }
    }
  }
}

}  // namespace keel
