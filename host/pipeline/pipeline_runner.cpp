#include "pipeline/pipeline_runner.hpp"

#include <c10/core/GradMode.h>

#include <chrono>
#include <deque>
#include <limits>
#include <memory>
#include <stdexcept>
#include <utility>

#include "common/text.hpp"
#include "common/trace_scope.hpp"
#include "device/autocast.hpp"
#include "pipeline/split_backward.hpp"

namespace keel {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Activations and their gradients travel on distinct tags per microbatch and per boundary
// between virtual stages (`from` and from + 1).
int activation_tag(int from, int microbatch, int microbatches) { return 2 * (from * microbatches + microbatch); }
int gradient_tag(int from, int microbatch, int microbatches) { return 2 * (from * microbatches + microbatch) + 1; }

}  // namespace

PipelineRunner::PipelineRunner(std::vector<ModelPart*> parts, Group& pp, std::vector<Group*> links,
                               const std::string& schedule, int microbatches, int64_t hidden_size,
                               at::ScalarType compute_dtype, at::Device device)
    : parts_(std::move(parts)),
      pp_(pp),
      links_(std::move(links)),
      schedule_(schedule),
      hidden_size_(hidden_size),
      activation_options_(at::TensorOptions().dtype(at::kFloat).device(device)),
      compute_dtype_(compute_dtype),
      device_(device),
      stage_(parts_.empty() ? 0 : parts_.front()->spec().stage_index),
      virtual_stages_(parts_.empty() ? 0 : parts_.front()->spec().num_stages) {
  const int chunks = static_cast<int>(parts_.size());
  if (chunks == 0 || pp.size() * chunks != virtual_stages_)
    throw std::invalid_argument(cat("pipeline: the pp group has ", pp.size(), " ranks and this rank ", chunks,
                                    " chunk(s) for ", virtual_stages_, " stages"));
  for (int k = 0; k < chunks; ++k)
    if (parts_[static_cast<size_t>(k)]->spec().stage_index != virtual_stage(k))
      throw std::invalid_argument(cat("pipeline: chunk ", k, " of pp rank ", stage_, " is stage ",
                                      parts_[static_cast<size_t>(k)]->spec().stage_index, ", expected ",
                                      virtual_stage(k)));
  actions_ = stage_actions(schedule, stage_, pp.size(), microbatches, chunks);
  split_ = has_weight_passes(actions_);
  // Gradients become final in the last pass that accumulates them: the weight pass where
  // backward passes are split.
  const PipelineAction::Kind accumulates = split_ ? PipelineAction::weight : PipelineAction::backward;
  last_backward_.assign(actions_.size(), false);
  std::vector<bool> seen(parts_.size(), false);
  for (size_t i = actions_.size(); i-- > 0;)
    if (actions_[i].kind == accumulates && !seen[static_cast<size_t>(actions_[i].chunk)]) {
      seen[static_cast<size_t>(actions_[i].chunk)] = true;
      last_backward_[i] = true;
    }
  // NCCL pairs a link's transfers in issue order, whatever their tags: a schedule whose ranks
  // sent in another order than their peers receive would swap activations silently.
  if (!transfers_pair_in_order(schedule, pp.size(), microbatches, chunks))
    throw std::logic_error(cat("pipeline: \"", schedule,
                               "\" sends on a link in another order than the receiver "
                               "takes its transfers"));
  open_pipeline_links(links_, stage_, links_in_use(schedule, pp.size(), microbatches, chunks), device);
}

at::Tensor PipelineRunner::receive(const std::vector<int64_t>& shape, TransferKind kind, int peer, int tag) {
  KEEL_TRACE_SCOPE("keel::pipeline_recv");
  at::Tensor buffer = at::empty(shape, activation_options_);
  std::unique_ptr<Work> work = link(kind, peer, stage_).irecv(buffer, peer, tag);
  if (work) work->wait();
  return buffer;
}

void PipelineRunner::send(const at::Tensor& tensor, TransferKind kind, int to, int tag,
                          std::vector<std::unique_ptr<Work>>& sends) {
  if (rank_of(to) != stage_) {
    KEEL_TRACE_SCOPE("keel::pipeline_send");
    sends.push_back(link(kind, stage_, rank_of(to)).isend(tensor, rank_of(to), tag));
    return;
  }
  // A copy: the receiving chunk must not share storage with the sender's autograd graph.
  handed_over_[tag] = tensor.detach().clone();
}

at::Tensor PipelineRunner::receive_from(const std::vector<int64_t>& shape, TransferKind kind, int from, int tag) {
  if (rank_of(from) != stage_) return receive(shape, kind, rank_of(from), tag);
  auto kept = handed_over_.find(tag);
  if (kept == handed_over_.end())
    throw std::logic_error(cat("pipeline: stage ", from, " has not handed over tag ", tag, " on this rank"));
  at::Tensor tensor = std::move(kept->second);
  handed_over_.erase(kept);
  return tensor;
}

at::Tensor PipelineRunner::outgoing(at::Tensor output, const std::vector<int64_t>& shape, int virtual_stage) const {
  // The stream between stages is fp32 whatever a part computes in (a differentiable cast).
  if (output.is_floating_point() && output.scalar_type() != at::kFloat) output = output.to(at::kFloat);
  if (output.sizes() != at::IntArrayRef(shape) || output.scalar_type() != activation_options_.dtype())
    throw std::runtime_error(cat("pipeline: stage ", virtual_stage, " produced an activation of shape ", output.sizes(),
                                 " and dtype ", output.scalar_type(), "; the next stage expects ",
                                 at::IntArrayRef(shape), " of ", activation_options_.dtype(),
                                 " (batch, seq, the model's hidden_size)"));
  return output;
}

at::Tensor PipelineRunner::run(const std::vector<at::Tensor>& tokens, const std::vector<at::Tensor>& labels,
                               double loss_divisor) {
  const auto microbatches = static_cast<int>(tokens.size());
  struct InFlight {
    at::Tensor input;                      ///< the received activation (requires grad), non-first stages
    at::Tensor output;                     ///< the activation sent on, or the loss sum on the last stage
    std::unique_ptr<SplitBackward> split;  ///< between a split backward and its weight pass
  };
  // One slot per (chunk, microbatch).
  std::vector<InFlight> flight(parts_.size() * static_cast<size_t>(microbatches));
  std::vector<std::unique_ptr<Work>> sends;
  at::Tensor loss_total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  timing_ = {};
  handed_over_.clear();
  // Every microbatch's forward shares one cast of each weight (the optimizer steps after).
  const AutocastCache cast_once(compute_dtype_ != at::kFloat && !device_.is_meta());
  const Clock::time_point start = Clock::now();

  for (size_t index = 0; index < actions_.size(); ++index) {
    const PipelineAction& action = actions_[index];
    const int mb = action.microbatch, chunk = action.chunk;
    if (mb >= microbatches) throw std::logic_error("pipeline: schedule and batch disagree on microbatches");
    const int stage = virtual_stage(chunk);
    const bool first = stage == 0, last = stage == virtual_stages_ - 1;
    InFlight& f = flight[static_cast<size_t>(chunk) * static_cast<size_t>(microbatches) + static_cast<size_t>(mb)];
    const std::vector<int64_t> shape = {tokens[static_cast<size_t>(mb)].size(0),
                                        tokens[static_cast<size_t>(mb)].size(1), hidden_size_};
    if (action.kind == PipelineAction::forward) {
      if (!first)
        f.input = receive_from(shape, TransferKind::activation, stage - 1, activation_tag(stage - 1, mb, microbatches))
                      .requires_grad_(true);
      at::Tensor t = tokens[static_cast<size_t>(mb)].to(device_), l = labels[static_cast<size_t>(mb)].to(device_);
      const Clock::time_point busy = Clock::now();
      {
        KEEL_TRACE_SCOPE("keel::forward");
        AutocastScope autocast(device_, compute_dtype_);
        // The part reads a view of its input: autocast caches casts of leaves, and a received
        // activation freed with its microbatch may leave its address to a later one, which the
        // step's cache (cast_once) would hand the stale cast. A view is never cached.
        const at::Tensor input = first ? at::Tensor() : f.input.view_as(f.input);
        f.output = parts_[static_cast<size_t>(chunk)]->forward(t, l, first ? nullptr : &input, mb, microbatches);
      }
      timing_.busy_seconds += seconds_since(busy);
      if (last) {
        loss_total.add_(f.output.detach());
        continue;
      }
      f.output = outgoing(f.output, shape, stage);
      send(f.output.detach(), TransferKind::activation, stage + 1, activation_tag(stage, mb, microbatches), sends);
    } else if (action.kind == PipelineAction::weight) {
      if (!f.split) throw std::logic_error("pipeline: a weight pass before its backward pass");
      if (last_backward_[index] && before_last_backward_) before_last_backward_(chunk);
      const Clock::time_point busy = Clock::now();
      {
        KEEL_TRACE_SCOPE("keel::backward_weights");
        f.split->weight_pass();
      }
      timing_.busy_seconds += seconds_since(busy);
      f = InFlight{};  // the microbatch's graph and activations are freed here
    } else {
      at::Tensor grad;
      if (!last) grad = receive_from(shape, TransferKind::gradient, stage + 1, gradient_tag(stage, mb, microbatches));
      if (last_backward_[index] && before_last_backward_) before_last_backward_(chunk);
      const Clock::time_point busy = Clock::now();
      at::Tensor input_grad;
      KEEL_TRACE_SCOPE("keel::backward");
      if (split_) {
        // The input's gradient now, for the stage before; the parameters' in the weight pass.
        at::Tensor root = last ? f.output / loss_divisor : f.output;
        if (last) grad = at::ones({}, root.options());
        f.split = std::make_unique<SplitBackward>(root, f.input);
        input_grad = f.split->input_pass(grad);
      } else {
        if (last)
          (f.output / loss_divisor).backward();
        else
          f.output.backward(grad);
        if (!first) input_grad = f.input.grad();
      }
      timing_.busy_seconds += seconds_since(busy);
      if (!first) {
        if (!input_grad.defined()) input_grad = at::zeros(shape, activation_options_);
        send(input_grad, TransferKind::gradient, stage - 1, gradient_tag(stage - 1, mb, microbatches), sends);
      }
      if (!split_) f = InFlight{};  // the microbatch's graph and activations are freed here
    }
  }
  {
    KEEL_TRACE_SCOPE("keel::pipeline_send_wait");
    for (auto& work : sends)
      if (work) work->wait();
  }
  timing_.total_seconds = seconds_since(start);
  return loss_total;
}

at::Tensor PipelineRunner::evaluate(const std::vector<at::Tensor>& tokens, const std::vector<at::Tensor>& labels) {
  c10::NoGradGuard no_grad;
  const AutocastCache cast_once(compute_dtype_ != at::kFloat && !device_.is_meta());
  handed_over_.clear();
  const auto microbatches = static_cast<int>(tokens.size());
  at::Tensor loss_total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  // Each microbatch through this rank's chunks in order. With one chunk, sends complete in
  // order (the next stage receives in microbatch order), and waiting for the one before last
  // bounds the activations alive to two whatever the number of microbatches. With several,
  // sends to two peers interleave, and a wait could close a cycle: they are all waited for at
  // the end (one activation per chunk and microbatch, no autograd graph).
  const size_t bound = parts_.size() == 1 ? 2 : std::numeric_limits<size_t>::max();
  std::deque<std::pair<std::unique_ptr<Work>, at::Tensor>> sends;
  for (const PipelineAction& action : evaluation_actions(microbatches, static_cast<int>(parts_.size()))) {
    const int mb = action.microbatch, chunk = action.chunk;
    const int stage = virtual_stage(chunk);
    const bool first = stage == 0, last = stage == virtual_stages_ - 1;
    const at::Tensor& mb_tokens = tokens[static_cast<size_t>(mb)];
    const std::vector<int64_t> shape = {mb_tokens.size(0), mb_tokens.size(1), hidden_size_};
    at::Tensor input;
    if (!first)
      input = receive_from(shape, TransferKind::activation, stage - 1, activation_tag(stage - 1, mb, microbatches));
    at::Tensor output;
    {
      AutocastScope autocast(device_, compute_dtype_);
      output = parts_[static_cast<size_t>(chunk)]->forward(mb_tokens.to(device_),
                                                           labels[static_cast<size_t>(mb)].to(device_),
                                                           first ? nullptr : &input, mb, microbatches);
    }
    if (last) {
      loss_total.add_(output);
      continue;
    }
    output = outgoing(output, shape, stage);
    if (rank_of(stage + 1) == stage_) {  // the turn of a V: this rank's next chunk
      handed_over_[activation_tag(stage, mb, microbatches)] = output;
      continue;
    }
    if (sends.size() == bound) {
      if (sends.front().first) sends.front().first->wait();
      sends.pop_front();
    }
    std::unique_ptr<Work> work = link(TransferKind::activation, stage_, rank_of(stage + 1))
                                     .isend(output, rank_of(stage + 1), activation_tag(stage, mb, microbatches));
    sends.emplace_back(std::move(work), output);
  }
  for (auto& [work, kept] : sends)
    if (work) work->wait();
  return loss_total;
}

}  // namespace keel
