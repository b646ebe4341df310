// keel/part.hpp — a model part's parameters and buffers as a plugin declares them, and the
// base class of a C++ model part.
#pragma once

#include <ATen/ATen.h>

#include <keel/host.hpp>
#include <keel/keel.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace keel {

// ------------------------------------------------------------------ parameters

/// A parameter or buffer as a plugin declares it; the SDK keeps the C view in sync.
struct ParamDecl {
  std::string fqn;
  at::Tensor tensor;
  uint32_t flags = 0;
  int32_t shard_dim = -1;
  int64_t shard_offset = 0;
  int64_t global_dim_size = 0;
  double active_fraction = 1.0;
  std::string module_group = "main";
};

/// Stable C views (keel_param_info) of a list of ParamDecl.
class ParamTable {
 public:
  /// Adds a declaration; returns the tensor slot that stays valid while the table lives.
  at::Tensor& add(ParamDecl decl) {
    decls_.push_back(std::make_unique<ParamDecl>(std::move(decl)));
    dirty_ = true;
    return decls_.back()->tensor;
  }
  /// The declarations, in insertion order.
  const std::vector<std::unique_ptr<ParamDecl>>& decls() const { return decls_; }
  /// The C views, rebuilt after additions.
  std::pair<const keel_param_info* const*, size_t> view() {
    if (dirty_) rebuild();
    return {pointers_.data(), pointers_.size()};
  }

 private:
  void rebuild() {
    infos_.assign(decls_.size(), keel_param_info{});
    pointers_.clear();
    for (size_t i = 0; i < decls_.size(); ++i) {
      ParamDecl& d = *decls_[i];
      keel_param_info& info = infos_[i];
      info.struct_size = sizeof(keel_param_info);
      info.fqn = d.fqn.c_str();
      info.tensor = handle(d.tensor);
      info.flags = d.flags;
      info.shard_dim = d.shard_dim;
      info.shard_offset = d.shard_offset;
      info.global_dim_size = d.global_dim_size;
      info.active_fraction = d.active_fraction;
      info.module_group = d.module_group.c_str();
      pointers_.push_back(&info);
    }
    dirty_ = false;
  }

  std::vector<std::unique_ptr<ParamDecl>> decls_;
  std::vector<keel_param_info> infos_;
  std::vector<const keel_param_info*> pointers_;
  bool dirty_ = true;
};

/// Reads one C parameter entry, checking its struct_size once.
inline const keel_param_info& param(const keel_param_info* info) {
  if (info == nullptr || info->struct_size < offsetof(keel_param_info, active_fraction))
    throw Error(KEEL_ERROR_INVALID_ARGUMENT, "keel_param_info is NULL or older than SDK 1.0");
  return *info;
}

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

/// Base of a model part written in C++: declare parameters and buffers in the constructor.
class Part {
 public:
  explicit Part(keel_host* host) : host_(host) {}
  virtual ~Part() = default;
  Part(const Part&) = delete;
  Part& operator=(const Part&) = delete;

  /// Initialises every parameter and buffer from (seed, FQN).
  virtual void init_weights(uint64_t seed) = 0;
  /// Runs one microbatch; assigns outputs.activation or outputs.loss_sum.
  virtual void forward(const keel_forward_inputs& inputs, keel_forward_outputs& outputs) = 0;

  /// The host this part reports to.
  keel_host* host() const { return host_; }
  /// Trainable parameters.
  ParamTable& parameters() { return parameters_; }
  /// Buffers.
  ParamTable& buffers() { return buffers_; }

 private:
  keel_host* host_;
  ParamTable parameters_;
  ParamTable buffers_;
};

/// Checks that an export's `state` holds exactly the parameters and persistent buffers that
/// `whole` declares (a part holding the whole model, e.g. built on the meta device), each with
}  // namespace keel
