// Activation recomputation for plugin authors (ABI 1.6, KEEL_EXTENSION_MODEL_RECOMPUTE).
//
// keel::recompute(fn, inputs) runs fn(inputs) keeping nothing of what autograd would save
// inside it but the inputs; the backward pass runs fn again, with gradients, and
// differentiates that. A model calls it around each transformer block (full recomputation) or
// around its cheap parts (selective). LibTorch's C++ API has no torch.utils.checkpoint, so
// this is the reentrant checkpoint written out: a custom autograd function whose backward
// reruns the forward and calls backward on it (the parameters' gradients accumulate there).
//
// The rerun must compute bitwise what the first run computed, so a recomputed step equals a
// kept one: the CPU generator is put back to its state before the first run for the rerun
// (and restored after it), autocast is as it was for the first run (bf16 compute), and
// keel::recomputing() is true during the rerun, so a model keeps
// side effects — statistics, reported metrics — to the first run. fn may call collectives
// (expert parallelism's all-to-all): every rank of a group reruns the same blocks in the same
// backward order. fn must not keep its own references to tensors between the runs.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <keel/keel.h>
#include <keel/recompute_mode.hpp>

#include <functional>
#include <mutex>
#include <vector>

namespace keel {

namespace detail {

inline thread_local int recompute_depth = 0;

// Autocast of the CPU and CUDA as the first run had it, put back around the rerun (backward
// runs outside the host's autocast scope; on CUDA on another thread).
struct AutocastState {
  struct Of {
    at::DeviceType type;
    bool enabled = false;
    at::ScalarType dtype = at::kFloat;
  };
  Of cpu{at::kCPU}, cuda{at::kCUDA};

  static AutocastState now() {
    AutocastState s;
    for (Of* of : {&s.cpu, &s.cuda}) {
      of->enabled = at::autocast::is_autocast_enabled(of->type);
      of->dtype = at::autocast::get_autocast_dtype(of->type);
    }
    return s;
  }
};

// Applies an AutocastState for its lifetime, as a host's autocast scope does: nested, and the
// cache of cast weights dropped when the outermost scope closes (it would go stale after the
// optimizer step).
class AutocastAs {
 public:
  explicit AutocastAs(const AutocastState& wanted) : before_(AutocastState::now()), wanted_(wanted) {
    apply(wanted_);
    if (any(wanted_)) at::autocast::increment_nesting();
  }
  ~AutocastAs() {
    if (any(wanted_) && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    apply(before_);
  }
  AutocastAs(const AutocastAs&) = delete;
  AutocastAs& operator=(const AutocastAs&) = delete;

 private:
  static bool any(const AutocastState& s) { return s.cpu.enabled || s.cuda.enabled; }
  static void apply(const AutocastState& s) {
    for (const AutocastState::Of* of : {&s.cpu, &s.cuda}) {
      at::autocast::set_autocast_enabled(of->type, of->enabled);
      at::autocast::set_autocast_dtype(of->type, of->dtype);
    }
  }
  AutocastState before_, wanted_;
};

// Autocast's cache of cast weights off for its lifetime.
class FreshCasts {
 public:
  FreshCasts() : before_(at::autocast::is_autocast_cache_enabled()) { at::autocast::set_autocast_cache_enabled(false); }
  ~FreshCasts() { at::autocast::set_autocast_cache_enabled(before_); }
  FreshCasts(const FreshCasts&) = delete;
  FreshCasts& operator=(const FreshCasts&) = delete;

 private:
  bool before_;
};

struct RecomputeClosure : torch::CustomClassHolder {
  std::function<at::Tensor(const std::vector<at::Tensor>&)> fn;
  at::Tensor generator_state;  ///< the CPU generator before the first run
  AutocastState autocast;      ///< autocast during the first run
};

struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                            c10::intrusive_ptr<RecomputeClosure> closure) {
    {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      closure->generator_state = generator.get_state();
    }
    closure->autocast = AutocastState::now();
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["closure"] = c10::IValue::make_capsule(closure);
    // Autograd runs forward() with gradients off: nothing inside fn is kept. A weight autocast
    // casts here has no gradient function, so it stays out of autocast's cache: met there by a
    // later forward or by the rerun, it would cut the weight off from its gradient.
    const FreshCasts fresh;
    return closure->fn(inputs.vec());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto closure = c10::static_intrusive_pointer_cast<RecomputeClosure>(ctx->saved_data["closure"].toCapsule());
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < saved.size(); ++i)
      inputs.push_back(saved[i].defined() ? saved[i].detach().requires_grad_(ctx->needs_input_grad(i)) : saved[i]);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    at::Tensor after;
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      after = generator.get_state();
      generator.set_state(closure->generator_state);
    }
    at::Tensor output;
    {
      at::AutoGradMode with_gradients(true);
      AutocastAs autocast(closure->autocast);
      // The rerun casts afresh too. Its inputs are leaves that autocast would cache: their
      // products would then share one cast and sum their gradients below fp32, where the kept
      // run sums them in fp32; and a leaf freed after the rerun may leave its address to
      // another, which a cache held over the step would hand the stale cast.
      const FreshCasts fresh;
      ++recompute_depth;
      try {
        output = closure->fn(inputs);
      } catch (...) {
        --recompute_depth;
        throw;
      }
      --recompute_depth;
    }
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(after);
    }
    if (output.requires_grad()) torch::autograd::backward({output}, {grads[0]});
    torch::autograd::variable_list out;
    for (const at::Tensor& x : inputs) out.push_back(x.defined() && x.requires_grad() ? x.grad() : at::Tensor());
    out.emplace_back();  // the closure
    return out;
  }
};

}  // namespace detail

/// True while keel::recompute reruns a forward in backward: a model skips side effects then.
inline bool recomputing() { return detail::recompute_depth > 0; }

/// fn(inputs), its inner activations recomputed in backward instead of kept (see above).
inline at::Tensor recompute(std::function<at::Tensor(const std::vector<at::Tensor>&)> fn,
                            const std::vector<at::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return fn(inputs);  // evaluation keeps nothing anyway
  auto closure = c10::make_intrusive<detail::RecomputeClosure>();
  closure->fn = std::move(fn);
  std::vector<at::Tensor> tracked = inputs;
  bool any_requires_grad = false;
  for (const at::Tensor& x : tracked) any_requires_grad = any_requires_grad || (x.defined() && x.requires_grad());
  // With no input requiring grad, autograd would not record the function and fn's parameters
  // would get no gradient: the first input then stands in as a leaf that does.
  if (!any_requires_grad && at::GradMode::is_enabled() && !tracked.empty() && tracked[0].is_floating_point())
    tracked[0] = tracked[0].detach().requires_grad_(true);
  return detail::RecomputeFunction::apply(at::TensorList(tracked), closure);
}

}  // namespace keel
