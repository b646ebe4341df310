// The step program: model.pre_clip -> clipper.clip -> the non-finite guard -> AdamW, the part
// of a step that runs after the gradients are reduced. On CUDA the host captures it once as a
// CUDA graph, after `warmup` eager steps, on a side stream, and replays it every step: the
// gradients keep their storage, the learning rate and step counts are device tensors written
// before the replay, the guard skips the update on the device, and the host reads the norm and
// the skip flag only when it logs. Capture needs every hook in the program declared
// capture-safe by its plugin (KEEL_HOOK_*_CAPTURE_SAFE).
//
// The non-finite guard is the host's, not the clipper's, so any clipper is safe: each rank
// raises a flag when one of its gradients (after clipping) or the norm is not finite, and the
// flags are summed over the world — a NaN that a MAX reduction of the norm dropped (Gloo's MAX
// keeps a finite value over a NaN) still makes every rank skip the step together. A skipped
// step leaves the clipper's state as it was (restored on the device), as AdamW leaves the
// parameters and moments; nothing here reads the device from the host.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "mesh/group.hpp"
#include "optim/adamw.hpp"
#include "optim/param_gather.hpp"
#include "plugins/components.hpp"

namespace keel {

/// A hook of the step program and what its plugin declares.
struct StepHook {
  std::string owner;  ///< "model deepseek_v3_mtp (deepseek_v3_mtp)"
  std::string hook;   ///< "pre_clip", "clip"
  bool capture_safe = false;
};

/// The step program's hooks that exist (a NULL pre_clip is not part of it).
std::vector<StepHook> step_hooks(const Model& model, const Clipper& clipper);

/// 1 (fp32 scalar on the gradients' device) when an element of the non-empty `grads` is inf or
/// NaN, else 0; no host read, and every gradient keeps its bits.
at::Tensor any_nonfinite(std::vector<at::Tensor> grads);

/// Whether the step program is captured, and why (for the log).
struct CaptureDecision {
  bool capture = false;
  std::string reason;
};

/// graph_capture "off", or a CPU device: eager. "on": capture, or an InputError naming every
/// hook that is not capture-safe and its plugin. "auto": capture on CUDA when every hook is
/// capture-safe; otherwise eager, the reason naming the hooks.
CaptureDecision decide_capture(const std::string& policy, bool cuda, const std::vector<StepHook>& hooks);

class StepProgram {
 public:
  /// The program over `params` (clip order) with learning rate `lr` (a 0-dim device tensor the
  /// caller updates before each run); the non-finite flag is summed over `agree` (the world).
  /// With `decision.capture`, the first `warmup` runs are eager, then the program is captured
  /// and replayed; the first `validate` replays are each checked against the eager program
  /// bitwise. With a sharded optimizer, `gather` (else NULL) brings every member's updated
  /// rows to the others after AdamW.
  StepProgram(Model& model, Clipper& clipper, AdamW& optimizer, std::vector<const keel_param_info*> params,
              at::Tensor lr, Group& agree, CaptureDecision decision, int64_t warmup, int64_t validate,
              ParameterGather* gather = nullptr);
  ~StepProgram();

  /// Runs this step's program. [collective: world]
  void run();
  /// The step's total gradient norm (a 0-dim fp32 device tensor; read it before the next run).
  const at::Tensor& total_norm() const { return norm_; }
  /// 1.0 when the step's update was skipped (non-finite gradients or norm on any rank of the
  /// world), else 0.0: the same on every rank (device).
  const at::Tensor& found_inf() const { return found_inf_; }
  /// Whether runs now replay a captured graph.
  bool captured() const { return graph_ != nullptr; }

 private:
  struct Result {
    at::Tensor norm, found_inf;
  };
  Result eager();
  at::Tensor nonfinite_flag(const at::Tensor& norm);
  void capture();
  void replay_validated();

  Model& model_;
  Clipper& clipper_;
  AdamW& optimizer_;
  ParameterGather* gather_;
  std::vector<const keel_param_info*> params_;
  at::Tensor lr_;
  Group& agree_;
  CaptureDecision decision_;
  int64_t warmup_, validate_;
  int64_t runs_ = 0, replays_ = 0;
  at::Tensor norm_, found_inf_;
  struct Graph;
  std::unique_ptr<Graph> graph_;
};

}  // namespace keel
