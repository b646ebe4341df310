#include "memory/state_memory.hpp"

#include <sstream>
#include <stdexcept>

#include "common/text.hpp"

namespace keel {

namespace {

int64_t bytes_of(const at::Tensor& t) { return static_cast<int64_t>(t.nbytes()); }

std::string figure(const char* label, int64_t bytes) {
  return format("%s %ld B (%s)", label, static_cast<long>(bytes), human_bytes(static_cast<double>(bytes)).c_str());
}

}  // namespace

StateBytes planned_state_bytes(const std::vector<ModelPart*>& parts, const OptimizerLayout& optimizer) {
  StateBytes s;
  std::vector<ParamRef> params;
  std::vector<at::Tensor> tensors;
  for (const ModelPart* part : parts) {
    for (const ParamRef& p : part->parameters()) {
      s.parameters += bytes_of(p.tensor());
      s.gradients += bytes_of(p.tensor());
      params.push_back(p);
      tensors.push_back(p.tensor());
    }
    for (const ParamRef& b : part->buffers()) s.buffers += bytes_of(b.tensor());
  }
  const BucketLayout layout = plan_buckets(params, optimizer.bucket_bytes);
  s.optimizer =
      AdamW::state_bytes(tensors, optimizer_pieces(layout, params, optimizer.shard, optimizer.dense, optimizer.expert));
  if (optimizer.shard)
    s.optimizer += ParameterGather::staging_bytes(layout, params, optimizer.dense.size, optimizer.expert.size);
  return s;
}

StateBytes held_state_bytes(const std::vector<ModelPart*>& parts, const GradientBuckets& grads, const AdamW& optimizer,
                            const ParameterGather* gather) {
  StateBytes s;
  for (const ModelPart* part : parts) {
    for (const ParamRef& p : part->parameters()) s.parameters += bytes_of(p.tensor());
    for (const ParamRef& b : part->buffers()) s.buffers += bytes_of(b.tensor());
  }
  s.gradients = grads.bytes();
  for (const std::vector<at::Tensor>* state : {&optimizer.exp_avg(), &optimizer.exp_avg_sq(), &optimizer.steps()})
    for (const at::Tensor& t : *state) s.optimizer += bytes_of(t);
  if (gather != nullptr) s.optimizer += gather->bytes();
  return s;
}

// "0,1", "0-63,128-191": runs of three or more ranks as ranges (a layout of a thousand ranks
// stays one short line per distinct figure).
std::string describe_ranks(const std::vector<size_t>& ranks) {
  std::vector<std::string> items;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (j - i >= 2) {
      items.push_back(cat(ranks[i], "-", ranks[j]));
    } else {
      for (size_t k = i; k <= j; ++k) items.push_back(std::to_string(ranks[k]));
    }
    i = j + 1;
  }
  return join(items, ",");
}

std::string describe_state_bytes(const StateBytes& b) {
  return join({figure("parameters", b.parameters), figure("gradients", b.gradients), figure("optimizer", b.optimizer),
               figure("buffers", b.buffers), figure("total", b.total())},
              ", ");
}

std::vector<std::string> state_lines_by_rank(const std::vector<StateBytes>& by_rank) {
  std::vector<std::pair<StateBytes, std::vector<size_t>>> distinct;
  for (size_t rank = 0; rank < by_rank.size(); ++rank) {
    auto it = distinct.begin();
    while (it != distinct.end() && !(it->first == by_rank[rank])) ++it;
    if (it == distinct.end()) it = distinct.insert(distinct.end(), {by_rank[rank], {}});
    it->second.push_back(rank);
  }
  std::vector<std::string> lines;
  for (const auto& [bytes, ranks] : distinct)
    lines.push_back(
        cat(ranks.size() > 1 ? "ranks " : "rank ", describe_ranks(ranks), ": ", describe_state_bytes(bytes)));
  return lines;
}

std::string encode_state_bytes(const StateBytes& b) {
  return cat(b.parameters, " ", b.gradients, " ", b.optimizer, " ", b.buffers);
}

StateBytes decode_state_bytes(const std::string& text) {
  StateBytes b;
  std::istringstream in(text);
  if (!(in >> b.parameters >> b.gradients >> b.optimizer >> b.buffers) || !(in >> std::ws).eof())
    throw std::runtime_error(cat("state memory figures from another rank are malformed: '", text, "'"));
  return b;
}

}  // namespace keel
