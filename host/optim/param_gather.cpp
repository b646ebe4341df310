#include "optim/param_gather.hpp"

#include <algorithm>
#include <stdexcept>

#include "common/text.hpp"
#include "optim/adamw.hpp"

namespace keel {

ParameterGather::ParameterGather(const BucketLayout& layout, const std::vector<ParamRef>& params, Mesh& mesh) {
  for (const BucketSpan& span : layout.buckets) {
    Group& group = mesh.group(span.expert ? KEEL_GROUP_EDP : KEEL_GROUP_DP);
    if (group.size() <= 1) continue;
    const std::vector<int64_t> cuts = shard_cuts(span, params, group.size());
    Bucket bucket;
    bucket.group = &group;
    bucket.options = layout.buffers[span.buffer].options;
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
    buckets_.push_back(std::move(bucket));
  }
}

void ParameterGather::run() {
  for (Bucket& b : buckets_) {
    if (b.longest == 0) continue;  // every member's range is empty on every rank alike
    const size_t me = static_cast<size_t>(b.group->rank());
    const std::vector<at::Tensor>& mine = b.by_member[me];
    at::Tensor send = at::zeros({b.longest}, b.options);
    int64_t at_element = 0;
    for (const at::Tensor& v : mine) {
      send.narrow(0, at_element, v.numel()).copy_(v);
      at_element += v.numel();
    }
    at::Tensor all = at::empty({b.longest * b.group->size()}, b.options);
    b.group->all_gather(all, send);
    for (size_t j = 0; j < b.by_member.size(); ++j) {
      if (j == me) continue;
      int64_t offset = static_cast<int64_t>(j) * b.longest;
      for (at::Tensor& v : b.by_member[j]) {
        v.copy_(all.narrow(0, offset, v.numel()));
        offset += v.numel();
      }
    }
  }
}

}  // namespace keel
