#include "optim/adamw.hpp"

#include <stdexcept>

#include "common/text.hpp"

namespace keel {

AdamW::AdamW(std::vector<OptimParam> params, AdamWOptions options, std::vector<OptimPiece> pieces)
    : params_(std::move(params)), pieces_(std::move(pieces)), options_(options) {
  if (pieces_.empty())
    for (size_t i = 0; i < params_.size(); ++i) pieces_.push_back({i, true, 0, 0});
  for (OptimParam& p : params_) {
    if (!p.param.grad().defined())
      throw std::logic_error(cat("optimizer: parameter ", p.fqn, " has no gradient storage"));
    steps_.push_back(at::zeros({}, p.param.options().dtype(at::kFloat).requires_grad(false)));
  }
  Group decayed, plain;
  decayed.weight_decay = options.weight_decay;
  for (const OptimPiece& piece : pieces_) {
    if (piece.param >= params_.size()) throw std::logic_error("optimizer: a piece of no parameter");
    const OptimParam& p = params_[piece.param];
    at::Tensor data = piece_of(p.param.detach(), piece);
    exp_avg_.push_back(at::zeros_like(data, at::MemoryFormat::Preserve));
    exp_avg_sq_.push_back(at::zeros_like(data, at::MemoryFormat::Preserve));
    Group& g = p.decay ? decayed : plain;
    g.params.push_back(data);
    g.grads.push_back(piece_of(p.param.grad(), piece));
    g.exp_avg.push_back(exp_avg_.back());
    g.exp_avg_sq.push_back(exp_avg_sq_.back());
    // The kernel only reads the counts: pieces of one parameter share its count.
    g.steps.push_back(steps_[piece.param]);
  }
  for (Group* g : {&decayed, &plain})
    if (!g->params.empty()) groups_.push_back(std::move(*g));
}

at::Tensor AdamW::piece_of(const at::Tensor& tensor, const OptimPiece& piece) {
  return piece.whole ? tensor : tensor.narrow(0, piece.first_row, piece.rows);
}

int64_t AdamW::state_bytes(const std::vector<at::Tensor>& params, const std::vector<OptimPiece>& pieces) {
  int64_t total = static_cast<int64_t>(params.size() * sizeof(float));
  for (const OptimPiece& piece : pieces)
    total += 2 * static_cast<int64_t>(piece_of(params.at(piece.param), piece).nbytes());
  return total;
}

void AdamW::step(const at::Tensor& lr, const at::Tensor& found_inf) {
  // As torch.optim.AdamW(fused=True): the kernel reads the incremented step count and skips
  // its update when found_inf is 1; the count is then taken back by found_inf.
  if (!steps_.empty()) at::_foreach_add_(steps_, 1);
  for (Group& g : groups_) {
    at::_fused_adamw_(g.params, g.grads, g.exp_avg, g.exp_avg_sq, {}, g.steps, lr, options_.beta1, options_.beta2,
                      g.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt,
                      found_inf);
  }
  if (!steps_.empty()) at::_foreach_sub_(steps_, std::vector<at::Tensor>(steps_.size(), found_inf));
}

}  // namespace keel
