// keel/part.hpp — a model part's parameters and buffers as a plugin declares them, and the
// base class of a C++ model part.
#pragma once

#include <ATen/ATen.h>

#include <keel/keel.h>
#include <keel/host.hpp>
#include <keel/init.hpp>
#include <keel/param_view.hpp>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace keel {

// ------------------------------------------------------------------ parameters

/// Where a declared parameter sits and how it counts, beyond its name, shape and init rule.
/// An aggregate: `{.flags = KEEL_PARAM_REPLICA}`, or experts() for routed experts.
struct ParamOptions {
  uint32_t flags = 0;                 ///< KEEL_PARAM_REPLICA, KEEL_PARAM_EXPERT (buffers: PERSISTENT)
  int32_t shard_dim = -1;             ///< -1: the tensor is the whole parameter
  int64_t shard_offset = 0;           ///< this tensor is global[offset : offset + size(shard_dim)]
  int64_t global_dim_size = 0;        ///< the global tensor's size along shard_dim
  double active_fraction = 1.0;       ///< the fraction one token uses (top_k / n_experts for experts)
  std::string module_group = "main";  ///< the group reports count the parameter under

  /// Routed experts [first, first + size(0)) of `total`, sharded along dim 0; `active` of
  /// them serve one token.
  static ParamOptions experts(int64_t first, int64_t total, double active) {
    return {.flags = KEEL_PARAM_EXPERT,
            .shard_dim = 0,
            .shard_offset = first,
            .global_dim_size = total,
            .active_fraction = active};
  }
};

namespace detail {

/// What a ParamRecord's keel_param_info points into: the FQN, the tensor slot and the module
/// group, owned here so the C pointers stay valid while the record lives.
struct ParamStorage {
  ParamStorage(std::string fqn, at::Tensor tensor, std::optional<init::Rule> init_rule, const ParamOptions& options)
      : name(std::move(fqn)), slot(std::move(tensor)), group(options.module_group), rule(std::move(init_rule)) {
    info.struct_size = sizeof(keel_param_info);
    info.fqn = name.c_str();
    info.tensor = handle(slot);
    info.flags = options.flags;
    info.shard_dim = options.shard_dim;
    info.shard_offset = options.shard_offset;
    info.global_dim_size = options.global_dim_size;
    info.active_fraction = options.active_fraction;
    info.module_group = group.c_str();
  }

  std::string name;                // canonical FQN
  at::Tensor slot;                 // the tensor the host's keel_tensor handle points at
  std::string group;               // "main", "mtp", ...
  std::optional<init::Rule> rule;  // how initialise() draws it (none: the part draws it itself)
  keel_param_info info{};          // the C record the host reads
};

}  // namespace detail

/// One parameter or buffer: the keel_param_info the host reads, the storage its pointers point
/// to, and the init rule. Read it as the ParamView it is; raw() is the record the host holds.
/// The storage base is built first, so the view's record is complete when the view checks it.
class ParamRecord : private detail::ParamStorage, public ParamView {
 public:
  ParamRecord(std::string fqn, at::Tensor tensor, std::optional<init::Rule> init_rule, const ParamOptions& options)
      : detail::ParamStorage(std::move(fqn), std::move(tensor), std::move(init_rule), options), ParamView(&info) {}
  ParamRecord(const ParamRecord&) = delete;
  ParamRecord& operator=(const ParamRecord&) = delete;

  /// Draws the tensor by its rule from (seed, fqn). A tensor sharded along dim 0 draws slice e
  /// from index shard_offset + e, so any sharding draws the single-rank tensor's slices.
  void initialise(uint64_t seed) {
    if (!rule) throw Error(KEEL_ERROR_INTERNAL, "'" + name + "' was declared without an init rule");
    if (info.shard_dim != 0) return init::apply(*rule, slot, seed, name);
    for (int64_t e = 0; e < slot.size(0); ++e) {
      at::Tensor slice = slot.select(0, e);
      init::apply(*rule, slice, seed, name, info.shard_offset + e);
    }
  }
};

/// A part's parameters (or buffers): records at stable addresses, in declaration order.
class ParamTable {
 public:
  /// Adds a record (without a rule, initialise() refuses it); the record, and so its tensor
  /// slot, stays where it is while the table lives.
  ParamRecord& add(std::string fqn, at::Tensor tensor, std::optional<init::Rule> rule, const ParamOptions& options) {
    records_.push_back(std::make_unique<ParamRecord>(std::move(fqn), std::move(tensor), std::move(rule), options));
    pointers_.push_back(records_.back()->raw());
    return *records_.back();
  }
  /// The records, in declaration order.
  const std::vector<std::unique_ptr<ParamRecord>>& records() const { return records_; }
  /// The record named `fqn`, or nullptr.
  ParamRecord* find(const std::string& fqn) const {
    for (const auto& r : records_)
      if (fqn == r->fqn()) return r.get();
    return nullptr;
  }
  /// The number of records.
  size_t size() const { return records_.size(); }
  /// The C records, one per record, in declaration order.
  std::pair<const keel_param_info* const*, size_t> view() const { return {pointers_.data(), pointers_.size()}; }
  /// Draws every record by its rule (ParamRecord::initialise).
  void initialise(uint64_t seed) {
    for (auto& r : records_) r->initialise(seed);
  }

 private:
  std::vector<std::unique_ptr<ParamRecord>> records_;
  std::vector<const keel_param_info*> pointers_;
};

/// The tensor options of a part spec (device and parameter dtype).
inline at::TensorOptions part_options(const keel_part_spec& spec) {
  at::ScalarType dtype = spec.param_dtype == KEEL_DTYPE_BF16   ? at::kBFloat16
                         : spec.param_dtype == KEEL_DTYPE_FP16 ? at::kHalf
                                                               : at::kFloat;
  at::Device device = spec.device_type == KEEL_DEVICE_CUDA   ? at::Device(at::kCUDA, spec.device_index)
                      : spec.device_type == KEEL_DEVICE_META ? at::Device(at::kMeta)
                                                             : at::Device(at::kCPU);
  return at::TensorOptions().dtype(dtype).device(device);
}

// ------------------------------------------------------------------ model adapters

/// Base of a model part written in C++: declare parameters and buffers in the constructor,
/// each with its init rule, and implement forward().
class Part {
 public:
  /// A part whose declarations live on `options`' device and dtype (see part_options).
  explicit Part(keel_host* host, at::TensorOptions options = {}) : host_(host), options_(options) {}
  virtual ~Part() = default;
  Part(const Part&) = delete;
  Part& operator=(const Part&) = delete;

  /// Initialises every parameter and buffer from (seed, FQN): by default each by the rule it
  /// was declared with.
  virtual void init_weights(uint64_t seed) {
    parameters_.initialise(seed);
    buffers_.initialise(seed);
  }
  /// Runs one microbatch; assigns outputs.activation or outputs.loss_sum.
  virtual void forward(const keel_forward_inputs& inputs, keel_forward_outputs& outputs) = 0;

  /// The host this part reports to.
  keel_host* host() const { return host_; }
  /// Trainable parameters.
  ParamTable& parameters() { return parameters_; }
  /// Buffers.
  ParamTable& buffers() { return buffers_; }
  /// The device and parameter dtype declarations use.
  const at::TensorOptions& options() const { return options_; }

  /// Declares a trainable parameter of `shape` (the local shard's), drawn by `init`; the slot
  /// stays valid while the part lives.
  at::Tensor& param(std::string fqn, std::vector<int64_t> shape, init::Rule init, const ParamOptions& options = {}) {
    at::Tensor t = at::empty(shape, options_).requires_grad_(true);
    return parameters_.add(std::move(fqn), std::move(t), std::move(init), options).tensor();
  }
  /// Declares an fp32 buffer of `shape` set by `init`; persistent buffers are checkpointed.
  at::Tensor& buffer(std::string fqn, std::vector<int64_t> shape, init::Rule init, bool persistent,
                     std::string module_group = "main") {
    ParamOptions options{.flags = persistent ? uint32_t{KEEL_PARAM_PERSISTENT} : 0u,
                         .module_group = std::move(module_group)};
    at::Tensor t = at::zeros(shape, options_.dtype(at::kFloat));
    return buffers_.add(std::move(fqn), std::move(t), std::move(init), options).tensor();
  }

 private:
  keel_host* host_;
  at::TensorOptions options_;
  ParamTable parameters_;
  ParamTable buffers_;
};

}  // namespace keel
