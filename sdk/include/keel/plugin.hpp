// keel/plugin.hpp — the glue that turns C++ model and clipper classes into the C vtables of
// keel.h, and KEEL_PLUGIN, which defines the plugin's entry symbol.
#pragma once

#include <ATen/ATen.h>
#include <torch/headeronly/version.h>

#include <keel/export.hpp>
#include <keel/host.hpp>
#include <keel/keel.h>
#include <keel/part.hpp>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace keel {

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
  static const keel_component component{sizeof(keel_component), KEEL_COMPONENT_MODEL, name, description, &vtable,
                                        nullptr};
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
  static const keel_component component{sizeof(keel_component), KEEL_COMPONENT_CLIPPER, name, description, &vtable,
                                        nullptr};
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
