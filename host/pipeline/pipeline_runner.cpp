#include "pipeline/pipeline_runner.hpp"

#include <c10/core/GradMode.h>

#include <chrono>
#include <deque>
#include <memory>
#include <stdexcept>
#include <utility>

#include "common/text.hpp"
#include "device/autocast.hpp"

namespace keel {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Activations and their gradients travel on distinct tags per microbatch.
int activation_tag(int microbatch) { return 2 * microbatch; }
int gradient_tag(int microbatch) { return 2 * microbatch + 1; }

}  // namespace

PipelineRunner::PipelineRunner(ModelPart& part, Group& pp, const std::string& schedule, int microbatches,
                               int64_t hidden_size, at::ScalarType compute_dtype, at::Device device)
    : part_(part),
      pp_(pp),
      hidden_size_(hidden_size),
      activation_options_(at::TensorOptions().dtype(at::kFloat).device(device)),
      compute_dtype_(compute_dtype),
      device_(device),
      stage_(part.spec().stage_index),
      stages_(part.spec().num_stages) {
  if (pp.size() != stages_)
    throw std::invalid_argument(cat("pipeline: the pp group has ", pp.size(), " ranks for ", stages_, " stages"));
  actions_ = stage_actions(schedule, stage_, stages_, microbatches);
  for (size_t i = 0; i < actions_.size(); ++i)
    if (actions_[i].kind != PipelineAction::forward) last_backward_ = i;
}

at::Tensor PipelineRunner::receive(const std::vector<int64_t>& shape, int peer, int tag) {
  at::Tensor buffer = at::empty(shape, activation_options_);
  std::unique_ptr<Work> work = pp_.irecv(buffer, peer, tag);
  if (work) work->wait();
  return buffer;
}

at::Tensor PipelineRunner::outgoing(at::Tensor output, const std::vector<int64_t>& shape) const {
  // The stream between stages is fp32 whatever a part computes in (a differentiable cast).
  if (output.is_floating_point() && output.scalar_type() != at::kFloat) output = output.to(at::kFloat);
  if (output.sizes() != at::IntArrayRef(shape) || output.scalar_type() != activation_options_.dtype())
    throw std::runtime_error(cat("pipeline: stage ", stage_, " produced an activation of shape ", output.sizes(),
                                 " and dtype ", output.scalar_type(), "; the next stage expects ",
                                 at::IntArrayRef(shape), " of ", activation_options_.dtype(),
                                 " (batch, seq, the model's hidden_size)"));
  return output;
}

at::Tensor PipelineRunner::run(const std::vector<at::Tensor>& tokens, const std::vector<at::Tensor>& labels,
                               double loss_divisor) {
  const auto microbatches = static_cast<int>(tokens.size());
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  struct InFlight {
    at::Tensor input;   ///< the received activation (requires grad), non-first stages
    at::Tensor output;  ///< the activation sent on, or the loss sum on the last stage
  };
  std::vector<InFlight> flight(static_cast<size_t>(microbatches));
  std::vector<std::unique_ptr<Work>> sends;
  at::Tensor loss_total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  timing_ = {};
  const Clock::time_point start = Clock::now();

  for (size_t index = 0; index < actions_.size(); ++index) {
    const PipelineAction& action = actions_[index];
    const int mb = action.microbatch;
    if (mb >= microbatches) throw std::logic_error("pipeline: schedule and batch disagree on microbatches");
    InFlight& f = flight[static_cast<size_t>(mb)];
    const std::vector<int64_t> shape = {tokens[static_cast<size_t>(mb)].size(0),
                                        tokens[static_cast<size_t>(mb)].size(1), hidden_size_};
    if (action.kind == PipelineAction::forward) {
      if (!first) f.input = receive(shape, stage_ - 1, activation_tag(mb)).requires_grad_(true);
      at::Tensor t = tokens[static_cast<size_t>(mb)].to(device_), l = labels[static_cast<size_t>(mb)].to(device_);
      const Clock::time_point busy = Clock::now();
      {
        AutocastScope autocast(device_, compute_dtype_);
        f.output = part_.forward(t, l, first ? nullptr : &f.input, mb, microbatches);
      }
      timing_.busy_seconds += seconds_since(busy);
      if (last) {
        loss_total.add_(f.output.detach());
        continue;
      }
      f.output = outgoing(f.output, shape);
      sends.push_back(pp_.isend(f.output.detach(), stage_ + 1, activation_tag(mb)));
    } else {
      at::Tensor grad;
      if (!last) grad = receive(shape, stage_ + 1, gradient_tag(mb));
      if (index == last_backward_ && before_last_backward_) before_last_backward_();
      const Clock::time_point busy = Clock::now();
      if (last)
        (f.output / loss_divisor).backward();
      else
        f.output.backward(grad);
      timing_.busy_seconds += seconds_since(busy);
      if (!first) {
        at::Tensor input_grad = f.input.grad();
        if (!input_grad.defined()) input_grad = at::zeros(shape, activation_options_);
        sends.push_back(pp_.isend(input_grad, stage_ - 1, gradient_tag(mb)));
      }
      f = InFlight{};  // the microbatch's graph and activations are freed here
    }
  }
  for (auto& work : sends)
    if (work) work->wait();
  timing_.total_seconds = seconds_since(start);
  return loss_total;
}

at::Tensor PipelineRunner::evaluate(const std::vector<at::Tensor>& tokens, const std::vector<at::Tensor>& labels) {
  c10::NoGradGuard no_grad;
  const auto microbatches = static_cast<int>(tokens.size());
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  at::Tensor loss_total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  // Sends complete in order (the next stage receives in microbatch order); waiting for the one
  // before last bounds the activations alive to two whatever the number of microbatches.
  std::deque<std::pair<std::unique_ptr<Work>, at::Tensor>> sends;
  for (int mb = 0; mb < microbatches; ++mb) {
    const at::Tensor& mb_tokens = tokens[static_cast<size_t>(mb)];
    const std::vector<int64_t> shape = {mb_tokens.size(0), mb_tokens.size(1), hidden_size_};
    at::Tensor input;
    if (!first) input = receive(shape, stage_ - 1, activation_tag(mb));
    at::Tensor output;
    {
      AutocastScope autocast(device_, compute_dtype_);
      output = part_.forward(mb_tokens.to(device_), labels[static_cast<size_t>(mb)].to(device_),
                             first ? nullptr : &input, mb, microbatches);
    }
    if (last) {
      loss_total.add_(output);
      continue;
    }
    if (sends.size() == 2) {
      if (sends.front().first) sends.front().first->wait();
      sends.pop_front();
    }
    output = outgoing(output, shape);
    std::unique_ptr<Work> work = pp_.isend(output, stage_ + 1, activation_tag(mb));
    sends.emplace_back(std::move(work), output);
  }
  for (auto& [work, kept] : sends)
    if (work) work->wait();
  return loss_total;
}

}  // namespace keel
