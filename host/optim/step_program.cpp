#include "optim/step_program.hpp"

#include <stdexcept>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "common/trace_scope.hpp"

#ifdef KEEL_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace keel {

std::vector<StepHook> step_hooks(const Model& model, const Clipper& clipper) {
  std::vector<StepHook> hooks;
  if (model.vtable().pre_clip != nullptr)
    hooks.push_back({model.label(), "pre_clip", (model.vtable().hook_flags & KEEL_HOOK_PRE_CLIP_CAPTURE_SAFE) != 0});
  hooks.push_back({clipper.label(), "clip", (clipper.vtable().hook_flags & KEEL_HOOK_CLIP_CAPTURE_SAFE) != 0});
  return hooks;
}

CaptureDecision decide_capture(const std::string& policy, bool cuda, const std::vector<StepHook>& hooks) {
  if (policy == "off") return {false, "optimizer.graph_capture = \"off\""};
  if (!cuda) {
    if (policy == "on") throw InputError("optimizer.graph_capture = \"on\" needs training.device = \"cuda\"");
    return {false, "CUDA graphs need a CUDA device; the CPU runs the step program eagerly"};
  }
  std::vector<std::string> unsafe;
  for (const StepHook& h : hooks)
    if (!h.capture_safe)
      unsafe.push_back(cat(h.owner, " does not declare ", h.hook, "() capture-safe (KEEL_HOOK_",
                           h.hook == "clip" ? "CLIP" : "PRE_CLIP", "_CAPTURE_SAFE)"));
  if (unsafe.empty()) return {true, "every hook of the step program is capture-safe"};
  std::string why = join(unsafe, "; ");
  if (policy == "on") throw InputError(cat("optimizer.graph_capture = \"on\" is refused: ", why));
  return {false, cat("optimizer.graph_capture = \"auto\" runs the step program eagerly: ", why)};
}

// The captured graph (empty in builds without CUDA, which never capture).
struct StepProgram::Graph {
#ifdef KEEL_WITH_CUDA
  at::cuda::CUDAGraph graph;
#endif
};

StepProgram::StepProgram(Model& model, Clipper& clipper, AdamW& optimizer, std::vector<const keel_param_info*> params,
                         at::Tensor lr, Group& agree, CaptureDecision decision, int64_t warmup, int64_t validate,
                         ParameterGather* gather)
    : model_(model),
      clipper_(clipper),
      optimizer_(optimizer),
      gather_(gather),
      params_(std::move(params)),
      lr_(std::move(lr)),
      agree_(agree),
      decision_(std::move(decision)),
      warmup_(warmup),
      validate_(validate) {}

StepProgram::~StepProgram() = default;

StepProgram::Result StepProgram::eager() {
  {
    KEEL_TRACE_SCOPE("keel::pre_clip");
    model_.pre_clip();
  }
  std::vector<std::pair<std::string, at::Tensor*>> clipper_state = clipper_.state();
  std::vector<at::Tensor> state_before;
  for (const auto& [name, tensor] : clipper_state) state_before.push_back(tensor->clone());
  Result r;
  {
    KEEL_TRACE_SCOPE("keel::clip");
    r.norm = clipper_.clip(params_);
  }
  // The guard: a non-finite step skips the update on the device (no host branch), and takes
  // back what clip() counted.
  r.found_inf = nonfinite_flag(r.norm);
  KEEL_TRACE_SCOPE("keel::optimizer_step");
  optimizer_.step(lr_, r.found_inf);
  if (gather_ != nullptr) gather_->run();  // a skipped step gathers the unchanged rows
  const at::Tensor skipped = r.found_inf.to(at::kBool);
  for (size_t i = 0; i < clipper_state.size(); ++i) {
    at::Tensor& now = *clipper_state[i].second;
    now.copy_(at::where(skipped.to(now.device()), state_before[i], now));
  }
  return r;
}

at::Tensor any_nonfinite(std::vector<at::Tensor> grads) {
  // AMP's unscale kernel with an inverse scale of 1, which leaves every value as it is: it tests
  // each element itself (a sum of |g| would also flag an overflow of finite values), in one
  // pass on CPU — about a third of the time of _foreach_norm(grads, 1), which has no fast path
  // there (BENCHMARKS.md) — and in one fused kernel on CUDA, capture-safe.
  const at::TensorOptions f32 = grads.front().options().dtype(at::kFloat);
  at::Tensor found = at::zeros({1}, f32);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found, at::ones({1}, f32));
  return found.reshape({});
}

at::Tensor StepProgram::nonfinite_flag(const at::Tensor& norm) {
  // This rank's view: its gradients after clipping (a NaN stays NaN through any coefficient,
  // an inf becomes NaN through a zero one) and the norm the clipper returned.
  at::Tensor flag = norm.detach().to(at::kFloat).reshape({}).isfinite().logical_not().to(at::kFloat);
  std::vector<at::Tensor> grads;
  for (const OptimParam& p : optimizer_.params()) {
    const at::Tensor& grad = p.param.grad();
    if (grad.defined() && grad.numel() > 0) grads.push_back(grad);
  }
  if (!grads.empty()) flag = flag + any_nonfinite(std::move(grads)).to(flag.device());
  // Summed, not MAX-reduced: NaN never has to survive a comparison.
  agree_.all_reduce(flag, KEEL_REDUCE_SUM);
  return flag.gt(0).to(at::kFloat);
}

void StepProgram::run() {
  if (!decision_.capture || runs_ < warmup_) {
    Result r = eager();
    norm_ = r.norm;
    found_inf_ = r.found_inf;
    ++runs_;
    return;
  }
  KEEL_TRACE_SCOPE("keel::step_program_replay");  // pre_clip, clip, guard and AdamW as one CUDA graph
  if (!graph_) capture();
  if (replays_ < validate_)
    replay_validated();
  else {
#ifdef KEEL_WITH_CUDA
    graph_->graph.replay();
#endif
  }
  ++replays_;
  ++runs_;
}

void StepProgram::capture() {
#ifdef KEEL_WITH_CUDA
  // Capture records without running: the step of the capture is then run by its first replay.
  const c10::DeviceIndex device = lr_.device().index();
  c10::cuda::device_synchronize();
  graph_ = std::make_unique<Graph>();
  {
    c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device));
    graph_->graph.capture_begin();
    Result r = eager();
    graph_->graph.capture_end();
    // The outputs live in the graph's memory pool: every replay rewrites them in place.
    norm_ = r.norm;
    found_inf_ = r.found_inf;
  }
  c10::cuda::device_synchronize();
  log_info(cat("step program captured as a CUDA graph after ", runs_, " eager step(s): ", decision_.reason));
#else
  throw std::logic_error("step program capture needs a build with CUDA");
#endif
}

void StepProgram::replay_validated() {
#ifdef KEEL_WITH_CUDA
  // Everything the program writes, by name: parameters, gradients (pre_clip and clip write
  // them), AdamW's state (by piece) and the clipper's state.
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (size_t i = 0; i < optimizer_.params().size(); ++i) {
    const std::string& fqn = optimizer_.params()[i].fqn;
    const at::Tensor& p = optimizer_.params()[i].param;
    state.emplace_back("param " + fqn, p.detach());
    state.emplace_back("grad " + fqn, p.grad());
    state.emplace_back("step " + fqn, optimizer_.steps()[i]);
  }
  for (size_t k = 0; k < optimizer_.pieces().size(); ++k) {
    const OptimPiece& piece = optimizer_.pieces()[k];
    const std::string where = cat(optimizer_.params()[piece.param].fqn,
                                  piece.whole ? std::string() : cat(" rows ", piece.first_row, "+", piece.rows));
    state.emplace_back("exp_avg " + where, optimizer_.exp_avg()[k]);
    state.emplace_back("exp_avg_sq " + where, optimizer_.exp_avg_sq()[k]);
  }
  for (const auto& [name, tensor] : clipper_.state()) state.emplace_back("clipper " + name, *tensor);
  std::vector<at::Tensor> before, replayed;
  for (const auto& [name, t] : state) before.push_back(t.clone());
  graph_->graph.replay();
  for (const auto& [name, t] : state) replayed.push_back(t.clone());
  at::Tensor replayed_norm = norm_.clone(), replayed_found = found_inf_.clone();
  for (size_t i = 0; i < state.size(); ++i) state[i].second.copy_(before[i]);
  Result r = eager();
  auto differs = [&](const std::string& name) {
    throw std::runtime_error(cat("optimizer.graph_validate: replay ", replays_ + 1,
                                 " differs from the eager step program in ", name,
                                 "; the captured graph is not trustworthy (run with graph_capture = \"off\")"));
  };
  for (size_t i = 0; i < state.size(); ++i)
    if (!at::equal(state[i].second, replayed[i])) differs(state[i].first);
  if (!at::equal(r.norm, replayed_norm)) differs("the total norm");
  if (!at::equal(r.found_inf, replayed_found)) differs("the non-finite flag");
  norm_.copy_(r.norm);
  found_inf_.copy_(r.found_inf);
  log_info(cat("optimizer.graph_validate: replay ", replays_ + 1, " equals the eager step program bitwise"));
#endif
}

}  // namespace keel
