#include "pipeline/split_backward.hpp"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace keel {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

// The gradients a branch node received in the input pass (the weight pass removes the hook
// before it runs the node again).
struct SplitBackward::Capture : torch::autograd::FunctionPreHook {
  variable_list grads;
  variable_list operator()(const variable_list& inputs) override {
    grads = inputs;
    return inputs;
  }
};

namespace {

// A pre-hook that forwards to a shared Capture, so the pass can read it after the node owns
// the hook.
struct CaptureHook : torch::autograd::FunctionPreHook {
  explicit CaptureHook(std::shared_ptr<torch::autograd::FunctionPreHook> target) : target_(std::move(target)) {}
  variable_list operator()(const variable_list& inputs) override { return (*target_)(inputs); }
  std::shared_ptr<torch::autograd::FunctionPreHook> target_;
};

bool is_accumulator(const Node* node) { return dynamic_cast<const torch::autograd::AccumulateGrad*>(node) != nullptr; }

}  // namespace

SplitBackward::SplitBackward(const at::Tensor& output, const at::Tensor& input) {
  if (!output.requires_grad()) throw std::invalid_argument("split backward: the output does not require grad");
  root_ = torch::autograd::impl::gradient_edge(output);
  const Node* input_node = nullptr;
  if (input.defined()) {
    if (!input.requires_grad() || input.grad_fn())
      throw std::invalid_argument("split backward: the input must be a leaf that requires grad");
    input_edge_ = torch::autograd::impl::gradient_edge(input);
    input_node = input_edge_.function.get();
  }

  // Every node of the graph in post-order (children first), by iterative depth-first search:
  // a deep model's graph would overflow the stack of a recursive one.
  std::unordered_map<Node*, size_t> index;
  std::vector<NodePtr> nodes;
  std::vector<std::pair<NodePtr, size_t>> stack;
  std::unordered_map<Node*, bool> entered;
  stack.emplace_back(root_.function, 0);
  entered[root_.function.get()] = true;
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    const edge_list& edges = node->next_edges();
    if (next < edges.size()) {
      const Edge& edge = edges[next++];
      if (edge.is_valid() && !entered[edge.function.get()]) {
        entered[edge.function.get()] = true;
        stack.emplace_back(edge.function, 0);
      }
      continue;
    }
    index[node.get()] = nodes.size();
    nodes.push_back(node);
    stack.pop_back();
  }

  // Which nodes lead to the input, and which to a parameter (any accumulator but the input's).
  std::vector<bool> to_input(nodes.size(), false), to_weight(nodes.size(), false);
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node* node = nodes[i].get();
    if (node == input_node) {
      to_input[i] = true;
      continue;
    }
    if (is_accumulator(node)) {
      to_weight[i] = true;
      continue;
    }
    for (const Edge& edge : node->next_edges()) {
      if (!edge.is_valid()) continue;
      const size_t child = index.at(edge.function.get());
      to_input[i] = to_input[i] || to_input[child];
      to_weight[i] = to_weight[i] || to_weight[child];
    }
  }
  for (size_t i = 0; i < nodes.size(); ++i)
    if (to_input[i]) on_input_path_.insert(nodes[i].get());
  const size_t root = index.at(root_.function.get());
  root_reaches_input_ = to_input[root];
  if (!root_reaches_input_) return;  // the weight pass is the whole backward pass

  // Branch nodes: on the input's path with a child that leads to parameters only. They are
  // where the input pass stops computing and the weight pass starts again.
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!to_input[i] || nodes[i].get() == input_node) continue;
    bool branch = false;
    for (const Edge& edge : nodes[i]->next_edges())
      if (edge.is_valid()) {
        const size_t child = index.at(edge.function.get());
        branch = branch || (!to_input[child] && to_weight[child]);
      }
    if (branch) {
      auto capture = std::make_shared<Capture>();
      nodes[i]->add_pre_hook(std::make_unique<CaptureHook>(capture));
      branches_.push_back(nodes[i]);
      captures_.push_back(std::move(capture));
    } else {
      input_only_.push_back(nodes[i]);
    }
  }
  for (size_t i = 0; i < nodes.size(); ++i)
    if (is_accumulator(nodes[i].get()) && nodes[i].get() != input_node) parameters_.emplace_back(nodes[i], uint32_t{0});
}

at::Tensor SplitBackward::input_pass(const at::Tensor& grad) {
  if (input_done_) throw std::logic_error("split backward: the input pass ran twice");
  input_done_ = true;
  root_grad_ = grad;
  if (!root_reaches_input_) return at::Tensor();
  auto& engine = torch::autograd::Engine::get_default_engine();
  variable_list result = engine.execute({root_}, {grad}, /*keep_graph=*/true, /*create_graph=*/false,
                                        /*accumulate_grad=*/false, {input_edge_});
  for (auto& node : input_only_) node->release_variables();  // never run again
  input_only_.clear();
  return result.at(0);
}

void SplitBackward::weight_pass() {
  if (!input_done_) throw std::logic_error("split backward: the weight pass ran before the input pass");
  auto& engine = torch::autograd::Engine::get_default_engine();
  if (!root_reaches_input_) {
    engine.execute({root_}, {root_grad_}, /*keep_graph=*/false, /*create_graph=*/false, /*accumulate_grad=*/true);
    root_ = Edge();
    return;
  }
  edge_list roots;
  variable_list grads;
  for (size_t b = 0; b < branches_.size(); ++b) {
    Node& node = *branches_[b];
    Capture& capture = *captures_[b];
    // Cut the branch's edges into the input's path, so that only its parameter-side gradients
    // are computed and nothing the input pass ran runs again; the hooks it ran there do not run
    // twice either.
    for (Edge& edge : node.next_edges())
      if (edge.is_valid() && reaches_input(edge.function.get())) edge = Edge();
    node.tensor_pre_hooks().clear();
    node.retains_grad_hooks().clear();
    node.pre_hooks().clear();
    node.post_hooks().clear();
    for (size_t i = 0; i < capture.grads.size(); ++i)
      if (capture.grads[i].defined()) {
        roots.emplace_back(branches_[b], static_cast<uint32_t>(i));
        grads.push_back(capture.grads[i]);
      }
  }
  if (!roots.empty())
    engine.execute(roots, grads, /*keep_graph=*/false, /*create_graph=*/false, /*accumulate_grad=*/true, parameters_);
  branches_.clear();
  captures_.clear();
  parameters_.clear();
  root_ = Edge();
}

}  // namespace keel
