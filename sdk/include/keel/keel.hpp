// keel.hpp — header-only C++ helpers for plugin authors, on top of the C ABI in keel.h.
//
// A plugin written with these helpers implements plain C++ classes; the helpers produce the
// C vtables, turn every exception into a keel_status with its message, and give typed access
// to the host (config, mesh, collectives, metrics). Nothing here is part of the ABI: a plugin
// may ignore this header and implement keel.h directly.
#pragma once

#include <ATen/ATen.h>
#include <torch/headeronly/version.h>

#include <keel/keel.h>

#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace keel {

// ------------------------------------------------------------------ handles <-> tensors

/// The at::Tensor behind a handle (handles are borrowed at::Tensor pointers).
inline at::Tensor& tensor(keel_tensor* handle) { return *reinterpret_cast<at::Tensor*>(handle); }
/// The at::Tensor behind a const handle.
inline const at::Tensor& tensor(const keel_tensor* handle) { return *reinterpret_cast<const at::Tensor*>(handle); }
/// A borrowed handle on `t`; valid while `t` lives.
inline keel_tensor* handle(at::Tensor& t) { return reinterpret_cast<keel_tensor*>(&t); }
/// A borrowed const handle on `t`; valid while `t` lives.
inline const keel_tensor* handle(const at::Tensor& t) { return reinterpret_cast<const keel_tensor*>(&t); }

// ------------------------------------------------------------------ errors

/// An error with a status code; the message goes to the host's set_error.
class Error : public std::exception {
 public:
  Error(keel_status code, std::string message) : code_(code), message_(std::move(message)) {}
  /// The status the failing entry point returns.
  keel_status code() const noexcept { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  keel_status code_;
  std::string message_;
};

/// Thrown when a host call already reported its error: the guard must not overwrite it.
class HostReported : public std::exception {
 public:
  explicit HostReported(keel_status code) : code_(code) {}
  /// The status the host returned.
  keel_status code() const noexcept { return code_; }
  const char* what() const noexcept override { return "error reported by the host"; }

 private:
  keel_status code_;
};

/// Throws HostReported when a host call failed.
inline void check(keel_status status) {
  if (status != KEEL_OK) throw HostReported(status);
}

/// Runs `body`, turning keel::Error, c10::Error and std::exception into a status and a message.
template <class Body>
keel_status guard(keel_host* host, Body&& body) noexcept {
  auto report = [host](keel_status code, const char* message) {
    if (host != nullptr && host->api != nullptr) host->api->set_error(host, code, message);
    return code;
  };
  try {
    body();
    return KEEL_OK;
  } catch (const HostReported& e) {
    return e.code();
  } catch (const Error& e) {
    return report(e.code(), e.what());
  } catch (const c10::Error& e) {
    return report(KEEL_ERROR_RUNTIME, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return report(KEEL_ERROR_INTERNAL, e.what());
  } catch (...) {
    return report(KEEL_ERROR_INTERNAL, "unknown exception");
  }
}

// ------------------------------------------------------------------ the host

/// Typed access to one component's config table; every getter marks its key as read.
class Config {
 public:
  Config(keel_host* host, const keel_config* config) : host_(host), config_(config) {}

  /// The integer at `key`, or `fallback` when absent.
  int64_t integer(const char* key, int64_t fallback) const {
    int64_t out = 0;
    check(host_->api->config_int(host_, config_, key, fallback, &out, nullptr));
    return out;
  }
  /// The number at `key` (integers are accepted), or `fallback` when absent.
  double real(const char* key, double fallback) const {
    double out = 0;
    check(host_->api->config_float(host_, config_, key, fallback, &out, nullptr));
    return out;
  }
  /// The boolean at `key`, or `fallback` when absent.
  bool boolean(const char* key, bool fallback) const {
    int32_t out = 0;
    check(host_->api->config_bool(host_, config_, key, fallback ? 1 : 0, &out, nullptr));
    return out != 0;
  }
  /// The string at `key`, or `fallback` when absent.
  std::string string(const char* key, const char* fallback) const {
    const char* out = nullptr;
    check(host_->api->config_string(host_, config_, key, fallback, &out, nullptr));
    return out != nullptr ? std::string(out) : std::string();
  }
  /// Overwrites `value` with the key's value when present (the current value is the default).
  void update(const char* key, int64_t& value) const { value = integer(key, value); }
  /// Overwrites `value` with the key's number when present.
  void update(const char* key, double& value) const { value = real(key, value); }
  /// Overwrites `value` with the key's boolean when present.
  void update(const char* key, bool& value) const { value = boolean(key, value); }
  /// Overwrites `value` with the key's string when present.
  void update(const char* key, std::string& value) const { value = string(key, value.c_str()); }
  /// Reports that `key` holds an impossible value and throws; the host adds file and line.
  [[noreturn]] void invalid(const char* key, const std::string& why) const {
    keel_status status = host_->api->config_invalid(host_, config_, key, why.c_str());
    throw HostReported(status == KEEL_OK ? KEEL_ERROR_CONFIG : status);
  }

 private:
  keel_host* host_;
  const keel_config* config_;
};

/// The host as seen from a component: logging, mesh, groups, collectives, metrics.
class Host {
 public:
  explicit Host(keel_host* host) : host_(host) {}

  /// The raw host pointer, for guard() and direct ABI calls.
  keel_host* raw() const { return host_; }
  /// Writes an info line to the host's log.
  void info(const std::string& message) const { host_->api->log(host_, KEEL_LOG_INFO, message.c_str()); }
  /// Writes a warning line to the host's log.
  void warn(const std::string& message) const { host_->api->log(host_, KEEL_LOG_WARN, message.c_str()); }

  /// This rank's mesh coordinates.
  keel_mesh_info mesh() const {
    keel_mesh_info info{};
    info.struct_size = sizeof(info);
    check(host_->api->mesh_info(host_, &info));
    return info;
  }
  /// The mesh group of that kind.
  keel_group* group(keel_group_kind kind) const { return host_->api->group(host_, kind); }
  /// Creates a sub-group; every rank calls it with the same lists. [setup][collective: world]
  keel_group* new_group(const std::vector<int32_t>& world_ranks) const {
    keel_group* out = nullptr;
    check(host_->api->new_group(host_, world_ranks.data(), world_ranks.size(), &out));
    return out;
  }
  /// Number of ranks in `group`.
  int32_t size(const keel_group* group) const { return host_->api->group_size(host_, group); }
  /// This rank's index in `group` (-1 when not a member).
  int32_t rank(const keel_group* group) const { return host_->api->group_rank(host_, group); }

  /// In-place all-reduce, returning once done. [collective: group]
  void all_reduce(keel_group* group, at::Tensor& t, keel_reduce_op op = KEEL_REDUCE_SUM) const {
    check(host_->api->all_reduce(host_, group, handle(t), op, nullptr));
  }
  /// In-place broadcast from group rank `root`. [collective: group]
  void broadcast(keel_group* group, at::Tensor& t, int32_t root) const {
    check(host_->api->broadcast(host_, group, handle(t), root, nullptr));
  }
  /// All-to-all of dim-0 slices with split sizes. [collective: group]
  void all_to_all(keel_group* group, at::Tensor& output, const at::Tensor& input,
                  const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits) const {
    check(host_->api->all_to_all(host_, group, handle(output), handle(input), output_splits.data(), input_splits.data(),
                                 nullptr));
  }
  /// Reports a named scalar for this step (read lazily by the host).
  void metric(const char* name, const at::Tensor& value, keel_metric_reduce reduce = KEEL_METRIC_MEAN) const {
    check(host_->api->report_metric(host_, name, handle(value), reduce));
  }

 private:
  keel_host* host_;
};

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

// ------------------------------------------------------------------ model export

/// The host's receiver of a model export (keel_export_sink): each call hands over one tensor
/// or file, which the host takes before returning.
class ExportSink {
 public:
  explicit ExportSink(const keel_export_sink* sink) : sink_(sink) {
    if (sink == nullptr || sink->struct_size < offsetof(keel_export_sink, file) + sizeof(sink->file))
      throw Error(KEEL_ERROR_INVALID_ARGUMENT, "keel_export_sink is NULL or older than SDK 1.1");
  }
  /// Hands over `value` under `name` (a name of the target format).
  void tensor(const std::string& name, const at::Tensor& value) const {
    check(sink_->tensor(sink_->context, name.c_str(), handle(value)));
  }
  /// Hands over the text file `name` (a plain file name, e.g. "config.json").
  void file(const std::string& name, const std::string& text) const {
    check(sink_->file(sink_->context, name.c_str(), text.c_str()));
  }

 private:
  const keel_export_sink* sink_;
};

/// The name transformers' config.json uses for a dtype ("float32", "bfloat16", "float16").
inline std::string transformers_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    default:
      throw Error(KEEL_ERROR_UNSUPPORTED, std::string("export: no transformers dtype for ") + c10::toString(dtype));
  }
}

/// The error a model raises for an export format it does not know.
inline Error unsupported_format(const std::string& model, const std::string& format, const std::string& known) {
  return Error(KEEL_ERROR_UNSUPPORTED, model + " cannot export format '" + format + "'; it exports: " + known);
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
/// its global shape; throws naming the first FQN that is missing, unknown or misshapen.
inline void check_export_state(Part& whole, const std::map<std::string, at::Tensor>& state) {
  std::map<std::string, std::vector<int64_t>> expected;
  auto collect = [&](ParamTable& table, bool persistent_only) {
    for (const auto& d : table.decls()) {
      if (persistent_only && (d->flags & KEEL_PARAM_PERSISTENT) == 0) continue;
      std::vector<int64_t> shape = d->tensor.sizes().vec();
      if (d->shard_dim >= 0) shape[static_cast<size_t>(d->shard_dim)] = d->global_dim_size;
      expected.emplace(d->fqn, std::move(shape));
    }
  };
  collect(whole.parameters(), false);
  collect(whole.buffers(), true);
  auto text = [](const std::vector<int64_t>& shape) {
    std::string out = "[";
    for (size_t i = 0; i < shape.size(); ++i) out += (i > 0 ? ", " : "") + std::to_string(shape[i]);
    return out + "]";
  };
  for (const auto& [fqn, shape] : expected) {
    auto it = state.find(fqn);
    if (it == state.end()) throw Error(KEEL_ERROR_INVALID_ARGUMENT, "export: the state lacks '" + fqn + "'");
    if (it->second.sizes().vec() != shape)
      throw Error(KEEL_ERROR_INVALID_ARGUMENT, "export: '" + fqn + "' has shape " + text(it->second.sizes().vec()) +
                                                   ", the model's config gives " + text(shape));
  }
  for (const auto& [fqn, value] : state)
    if (expected.count(fqn) == 0)
      throw Error(KEEL_ERROR_INVALID_ARGUMENT, "export: '" + fqn + "' is not a tensor of this model's config");
}

namespace detail {

template <class M>
struct ModelAdapter {
  static M& self(keel_model* m) { return *reinterpret_cast<M*>(m); }
  static Part& part(keel_part* p) { return *reinterpret_cast<Part*>(p); }

  static keel_status create(keel_host* host, const keel_config* config, keel_model** out) {
    return guard(host, [&] {
      Config cfg(host, config);
      std::unique_ptr<M> model = M::create(Host(host), cfg);
      *out = reinterpret_cast<keel_model*>(model.release());
    });
  }
  static void destroy(keel_model* m) { delete reinterpret_cast<M*>(m); }
  static keel_status info(keel_model* m, keel_model_info* out) {
    return guard(self(m).host().raw(), [&] {
      keel_model_info info = self(m).info();
      info.struct_size = sizeof(info);
      std::memcpy(out, &info, out->struct_size < sizeof(info) ? out->struct_size : sizeof(info));
    });
  }
  static keel_status build_part(keel_model* m, const keel_part_spec* spec, keel_part** out) {
    return guard(self(m).host().raw(), [&] { *out = reinterpret_cast<keel_part*>(&self(m).build_part(*spec)); });
  }
  static keel_status parameters(keel_part* p, const keel_param_info* const** out, size_t* count) {
    return guard(part(p).host(), [&] { std::tie(*out, *count) = part(p).parameters().view(); });
  }
  static keel_status buffers(keel_part* p, const keel_param_info* const** out, size_t* count) {
    return guard(part(p).host(), [&] { std::tie(*out, *count) = part(p).buffers().view(); });
  }
  static keel_status init_weights(keel_part* p, uint64_t seed) {
    return guard(part(p).host(), [&] { part(p).init_weights(seed); });
  }
  static keel_status forward(keel_part* p, const keel_forward_inputs* in, keel_forward_outputs* out) {
    return guard(part(p).host(), [&] { part(p).forward(*in, *out); });
  }
  static keel_status post_init(keel_model* m) {
    return guard(self(m).host().raw(), [&] { self(m).post_init(); });
  }
  static keel_status pre_clip(keel_model* m) {
    return guard(self(m).host().raw(), [&] { self(m).pre_clip(); });
  }
  static keel_status post_step(keel_model* m) {
    return guard(self(m).host().raw(), [&] { self(m).post_step(); });
  }
  static keel_status export_state(keel_model* m, const char* format, const keel_named_tensor* const* state,
                                  size_t count, const keel_export_sink* sink) {
    return guard(self(m).host().raw(), [&] {
      std::map<std::string, at::Tensor> tensors;
      for (size_t i = 0; i < count; ++i) {
        const keel_named_tensor* entry = state[i];
        if (entry == nullptr || entry->name == nullptr || entry->tensor == nullptr)
          throw Error(KEEL_ERROR_INVALID_ARGUMENT,
                      "export_state: state entry #" + std::to_string(i) + " is incomplete");
        tensors.emplace(entry->name, tensor(entry->tensor));
      }
      ExportSink out(sink);
      self(m).export_state(format != nullptr ? format : "", tensors, out);
    });
  }
};

template <class C>
struct ClipperAdapter {
  static C& self(keel_clipper* c) { return *reinterpret_cast<C*>(c); }

  static keel_status create(keel_host* host, const keel_config* config, keel_clipper** out) {
    return guard(host, [&] {
      Config cfg(host, config);
      std::unique_ptr<C> clipper = C::create(Host(host), cfg);
      *out = reinterpret_cast<keel_clipper*>(clipper.release());
    });
  }
  static void destroy(keel_clipper* c) { delete reinterpret_cast<C*>(c); }
  static keel_status bind_model_parts(keel_clipper* c, const keel_param_info* const* params, size_t count) {
    return guard(self(c).host().raw(), [&] { self(c).bind_model_parts(params, count); });
  }
  static keel_status clip(keel_clipper* c, const keel_param_info* const* params, size_t count,
                          keel_tensor* total_norm) {
    return guard(self(c).host().raw(), [&] { tensor(total_norm) = self(c).clip(params, count); });
  }
  static keel_status state(keel_clipper* c, const keel_named_tensor* const** out, size_t* count) {
    return guard(self(c).host().raw(), [&] { std::tie(*out, *count) = self(c).state(); });
  }
};

}  // namespace detail

/// The MODEL component of class M. M provides:
///   static std::unique_ptr<M> create(keel::Host, keel::Config&);
///   keel::Host host() const;  keel_model_info info();  keel::Part& build_part(const keel_part_spec&);
/// and optionally post_init(), pre_clip(), post_step() and
///   void export_state(const std::string& format, const std::map<std::string, at::Tensor>& state,
///                     keel::ExportSink& sink);
/// a hook M lacks is NULL in the vtable. `hook_flags` declares capture-safe hooks
/// (KEEL_HOOK_*_CAPTURE_SAFE).
template <class M>
const keel_component* model_component(const char* name, const char* description, uint32_t hook_flags = 0) {
  using A = detail::ModelAdapter<M>;
  static const keel_model_vtable vtable = [&] {
    keel_model_vtable v{};
    v.struct_size = sizeof(v);
    v.create = &A::create;
    v.destroy = &A::destroy;
    v.info = &A::info;
    v.build_part = &A::build_part;
    v.parameters = &A::parameters;
    v.buffers = &A::buffers;
    v.init_weights = &A::init_weights;
    v.forward = &A::forward;
    if constexpr (requires(M & m) { m.post_init(); }) v.post_init = &A::post_init;
    if constexpr (requires(M & m) { m.pre_clip(); }) v.pre_clip = &A::pre_clip;
    if constexpr (requires(M & m) { m.post_step(); }) v.post_step = &A::post_step;
    v.hook_flags = hook_flags;
    if constexpr (requires(M & m, const std::string& format, const std::map<std::string, at::Tensor>& state,
                           ExportSink& sink) { m.export_state(format, state, sink); })
      v.export_state = &A::export_state;
    return v;
  }();
  static const keel_component component{sizeof(keel_component), KEEL_COMPONENT_MODEL, name, description, &vtable};
  return &component;
}

/// The CLIPPER component of class C. C provides:
///   static std::unique_ptr<C> create(keel::Host, keel::Config&);  keel::Host host() const;
///   at::Tensor clip(const keel_param_info* const*, size_t);
/// and optionally bind_model_parts(const keel_param_info* const*, size_t) and
/// std::pair<const keel_named_tensor* const*, size_t> state().
template <class C>
const keel_component* clipper_component(const char* name, const char* description, uint32_t hook_flags = 0) {
  using A = detail::ClipperAdapter<C>;
  static const keel_clipper_vtable vtable = [&] {
    keel_clipper_vtable v{};
    v.struct_size = sizeof(v);
    v.create = &A::create;
    v.destroy = &A::destroy;
    v.clip = &A::clip;
    if constexpr (requires(C & c, const keel_param_info* const* p, size_t n) { c.bind_model_parts(p, n); })
      v.bind_model_parts = &A::bind_model_parts;
    if constexpr (requires(C & c) { c.state(); }) v.state = &A::state;
    v.hook_flags = hook_flags;
    return v;
  }();
  static const keel_component component{sizeof(keel_component), KEEL_COMPONENT_CLIPPER, name, description, &vtable};
  return &component;
}

}  // namespace keel

/// The LibTorch version this translation unit is compiled against.
#define KEEL_TORCH_VERSION_STRING TORCH_VERSION

/// Defines keel_plugin_entry() for a plugin holding the given components, e.g.
///   KEEL_PLUGIN("llama3", "1.0.0", keel::model_component<Llama3>("llama3", "Llama 3"))
#define KEEL_PLUGIN(NAME, VERSION, ...)                                                         \
  extern "C" KEEL_EXPORT const keel_plugin_descriptor* keel_plugin_entry(void) {                \
    static const keel_component* const components[] = {__VA_ARGS__};                            \
    static const keel_plugin_descriptor descriptor{sizeof(keel_plugin_descriptor),              \
                                                   KEEL_ABI_MAJOR,                              \
                                                   KEEL_ABI_MINOR,                              \
                                                   NAME,                                        \
                                                   VERSION,                                     \
                                                   KEEL_TORCH_VERSION_STRING,                   \
                                                   _GLIBCXX_USE_CXX11_ABI,                      \
                                                   components,                                  \
                                                   sizeof(components) / sizeof(components[0])}; \
    return &descriptor;                                                                         \
  }
