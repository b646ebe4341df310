// What one forward of a model part keeps until its backward, measured from the CPU
// allocator's reports: the check of a model's activation estimate.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <keel/recompute_mode.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/autocast.hpp"
#include "pipeline/split_backward.hpp"
#include "plugins/components.hpp"

namespace keel::test {

/// The CPU allocator's reports while it is installed: the bytes allocated since, net of those
/// freed (a block allocated before is not reported when freed).
class AllocationCounter : public c10::MemoryReportingInfoBase {
 public:
  bool memoryProfilingEnabled() const override { return true; }
  void reportMemoryUsage(void*, int64_t bytes, size_t, size_t, c10::Device) override { live += bytes; }
  int64_t live = 0;
};

/// The bytes one forward of `part` on random [batch, seq] tokens of `vocab` allocates and
/// still holds once it has returned (its output held); a first forward fills the part's
/// caches. A later stage reads a [batch, seq, dim] activation. With `until_weight_pass`, what
/// it holds after the input pass of a split backward (split_backward.hpp) too: the saved
/// tensors the weight pass still needs, the gradients it starts from and the output the
/// pipeline keeps until then, not the input's gradient, sent on at once. With a `compute`
/// dtype other than fp32 each forward runs under autocast, as the pipeline runs it, held open
/// over both forwards as over a step's. Run it on one thread: every allocation is then made,
/// and reported, on this one.
inline int64_t measured_kept_bytes(ModelPart& part, int64_t batch, int64_t seq, int64_t vocab, int64_t dim,
                                   bool until_weight_pass = false, at::ScalarType compute = at::kFloat) {
  at::manual_seed(3);
  const at::Tensor tokens = at::randint(vocab, {batch, seq}, at::kLong);
  const at::Tensor labels = at::randint(vocab, {batch, seq}, at::kLong);
  const at::Tensor input = part.spec().stage_index > 0 ? at::randn({batch, seq, dim}).requires_grad_() : at::Tensor();
  const at::Tensor* activation = input.defined() ? &input : nullptr;
  const AutocastCache step_cache(compute != at::kFloat);
  {
    AutocastScope autocast(at::kCPU, compute);
    (void)part.forward(tokens, labels, activation, 0, 1);
  }
  // The gradient from the next stage arrives in a buffer of its own, freed after the input pass.
  const bool last = part.spec().stage_index == part.spec().num_stages - 1;
  const at::Tensor grad = last ? at::ones({}) : at::randn({batch, seq, dim});
  auto counter = std::make_shared<AllocationCounter>();
  at::Tensor out;
  std::unique_ptr<SplitBackward> split;
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, counter);
    {
      AutocastScope autocast(at::kCPU, compute);
      out = part.forward(tokens, labels, activation, 0, 1);
    }
    if (until_weight_pass) {
      split = std::make_unique<SplitBackward>(out, input);
      const at::Tensor input_grad = split->input_pass(grad);
      if (input_grad.defined()) counter->live -= static_cast<int64_t>(input_grad.nbytes());
    }
  }
  return counter->live;
}

/// One part's activation estimate and what its forward measurably keeps.
struct KeptBytes {
  std::string mode;  ///< the recompute mode
  keel_part_spec spec;
  double estimate = 0, measured = 0;
};

/// Under each recompute mode, each part of each split of the model (the specs of one way to
/// split it into stages), built by `make` and initialised: the model's estimate for a [batch,
/// seq] microbatch against measured_kept_bytes. With `until_weight_pass`, what is held between
/// the input and weight passes instead, under the modes the zero-bubble schedules take ("full"
/// is refused there; "lean" likewise). With `compute` bf16, the parts compute under autocast.
/// Sets one thread while it measures.
inline std::vector<KeptBytes> estimates_against_kept_bytes(const std::function<std::unique_ptr<Model>()>& make,
                                                           const std::vector<std::vector<keel_part_spec>>& splits,
                                                           int64_t batch, int64_t seq, int64_t vocab, int64_t dim,
                                                           bool until_weight_pass = false,
                                                           at::ScalarType compute = at::kFloat) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  std::vector<KeptBytes> out;
  for (const keel::RecomputeName& name : keel::kRecomputeNames)
    for (std::vector<keel_part_spec> split : splits) {
      const std::string mode(name.name);
      const auto abi = static_cast<keel_recompute_mode>(name.mode);
      if (until_weight_pass && (abi == KEEL_RECOMPUTE_FULL || abi == KEEL_RECOMPUTE_LEAN)) continue;
      std::unique_ptr<Model> model = make();
      if (abi != KEEL_RECOMPUTE_NONE) model->set_recompute(mode, "training.recompute");
      for (keel_part_spec& spec : split) {
        if (compute == at::kBFloat16) spec.compute_dtype = KEEL_DTYPE_BF16;
        ModelPart& part = model->build_part(spec);
        part.init_weights(1);
        const double measured =
            static_cast<double>(measured_kept_bytes(part, batch, seq, vocab, dim, until_weight_pass, compute));
        const double estimate = static_cast<double>(model->activation_bytes(spec, batch, seq, abi).value_or(-1));
        out.push_back({mode, spec, estimate, measured});
      }
    }
  at::set_num_threads(threads);
  return out;
}

}  // namespace keel::test
