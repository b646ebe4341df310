// One microbatch's backward pass through a pipeline stage, split in two as zero-bubble
// schedules need: the input pass computes only the gradient of the stage's input (what the
// previous stage waits for), the weight pass later computes the parameters' gradients.
//
// Any LibTorch autograd graph splits this way, so a model needs nothing for it. The input pass
// runs the engine towards the input alone: a node that feeds both the input's path and a
// parameter (a matrix product's backward, say) then computes only its input-side gradient, and
// a hook on it keeps the gradients it received. The weight pass feeds those kept gradients to
// the same nodes again in one engine call, their edges into the input's path cut and the
// parameters the only targets, so each node now computes only its parameter-side gradient and
// nothing on the input's path runs twice (a parameter used in two layers is reached from both
// nodes, never through the path between them). Each parameter's gradient is the very product
// the whole backward pass computes, accumulated into `.grad` as that pass accumulates it
// (post-accumulate hooks fire). PyTorch's pipelining splits a stage's backward the same way
// (stage_backward_input / stage_backward_weight) but only in Python; LibTorch has no helper,
// hence this one against the C++ engine.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <unordered_set>
#include <vector>

namespace keel {

class SplitBackward {
 public:
  /// How an edge holds its node (a shared_ptr or an intrusive_ptr, by LibTorch version).
  using NodePtr = decltype(torch::autograd::Edge::function);

  /// Prepares the split of `output`'s graph (`output` requires grad). `input` is the stage's
  /// input, a leaf that requires grad, or undefined on the first stage (then the input pass
  /// does nothing and the weight pass is the whole backward pass).
  SplitBackward(const at::Tensor& output, const at::Tensor& input);

  /// Runs the input pass with `grad` as d(loss)/d(output) and returns d(loss)/d(input):
  /// undefined when the input is undefined or does not reach the output. Saved tensors only
  /// the input's path needed are freed here.
  at::Tensor input_pass(const at::Tensor& grad);

  /// Runs the weight pass after input_pass, accumulating every parameter's gradient, and
  /// releases the graph.
  void weight_pass();

  /// The nodes the weight pass starts from (0 when it is the whole backward pass).
  size_t branch_count() const { return branches_.size(); }

 private:
  struct Capture;
  bool reaches_input(const torch::autograd::Node* node) const { return on_input_path_.count(node) > 0; }

  torch::autograd::Edge root_;
  torch::autograd::Edge input_edge_;
  bool root_reaches_input_ = false;
  std::unordered_set<const torch::autograd::Node*> on_input_path_;
  std::vector<NodePtr> branches_;                   ///< where the weight pass starts
  std::vector<std::shared_ptr<Capture>> captures_;  ///< what each branch received
  std::vector<NodePtr> input_only_;                 ///< freed after the input pass
  std::vector<torch::autograd::Edge> parameters_;   ///< the accumulators it ends in
  at::Tensor root_grad_;
  bool input_done_ = false;
};

}  // namespace keel
