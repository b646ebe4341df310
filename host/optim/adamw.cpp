#include "optim/adamw.hpp"

#include <stdexcept>

#include "common/text.hpp"

namespace keel {

AdamW::AdamW(std::vector<OptimParam> params, AdamWOptions options) : params_(std::move(params)), options_(options) {
  Group decayed, plain;
  decayed.weight_decay = options.weight_decay;
  for (OptimParam& p : params_) {
    at::Tensor data = p.param.detach();
    if (!p.param.grad().defined())
      throw std::logic_error(cat("optimizer: parameter ", p.fqn, " has no gradient storage"));
    exp_avg_.push_back(at::zeros_like(data, at::MemoryFormat::Preserve));
    exp_avg_sq_.push_back(at::zeros_like(data, at::MemoryFormat::Preserve));
    steps_.push_back(at::zeros({}, data.options().dtype(at::kFloat)));
    Group& g = p.decay ? decayed : plain;
    g.params.push_back(data);
    g.grads.push_back(p.param.grad());
    g.exp_avg.push_back(exp_avg_.back());
    g.exp_avg_sq.push_back(exp_avg_sq_.back());
    g.steps.push_back(steps_.back());
  }
  for (Group* g : {&decayed, &plain})
    if (!g->params.empty()) groups_.push_back(std::move(*g));
}

int64_t AdamW::state_bytes(const at::Tensor& param) {
  return 2 * static_cast<int64_t>(param.nbytes()) + static_cast<int64_t>(sizeof(float));
}

void AdamW::step(const at::Tensor& lr, const at::Tensor& found_inf) {
  for (Group& g : groups_) {
    // As torch.optim.AdamW(fused=True): the kernel reads the incremented step count and skips
    // its update when found_inf is 1; the count is then taken back by found_inf.
    at::_foreach_add_(g.steps, 1);
    at::_fused_adamw_(g.params, g.grads, g.exp_avg, g.exp_avg_sq, {}, g.steps, lr, options_.beta1, options_.beta2,
                      g.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt,
                      found_inf);
    at::_foreach_sub_(g.steps, std::vector<at::Tensor>(g.steps.size(), found_inf));
  }
}

}  // namespace keel
