// keel/plugin.hpp — the glue that turns C++ model and clipper classes into the C vtables of
// keel.h, and KEEL_PLUGIN, which defines the plugin's entry symbol.
#pragma once

#include <ATen/ATen.h>
#include <torch/headeronly/version.h>

#include <keel/keel.h>
#include <keel/export.hpp>
#include <keel/host.hpp>
#include <keel/import.hpp>
#include <keel/param_view.hpp>
#include <keel/part.hpp>
#include <keel/recompute_mode.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace keel {

/// What a clipper's optional state() returns: each state tensor under its name. The tensors
/// must stay where they are (the host copies a checkpoint into them).
using StateList = std::vector<std::pair<std::string, at::Tensor*>>;

/// The reduced rows of one parameter's gradient that this rank's optimizer steps, when the
/// host reduce-scatters gradients (keel_clipper_shards_extension): `rows` is a flat view into
/// the gradient, `param` the parameter it belongs to.
struct GradientShard {
  ParamView param;
  at::Tensor* rows;
};

namespace detail {

// Builds a component object: through T::create(host, config) when T has one, else T(host, config).
template <class T>
std::unique_ptr<T> make_component(Host host, Config& config) {
  if constexpr (requires { T::create(host, config); })
    return T::create(host, config);
  else
    return std::make_unique<T>(host, config);
}

// What the ABI's keel_model* / keel_clipper* point to: the C++ object and its host together.
template <class T>
struct Holder {
  Host host{nullptr};
  std::unique_ptr<T> object;
};

template <class M>
struct ModelAdapter {
  using H = Holder<M>;
  static H& holder(keel_model* m) { return *reinterpret_cast<H*>(m); }
  static Part& part(keel_part* p) { return *reinterpret_cast<Part*>(p); }

  static keel_status create(keel_host* host, const keel_config* config, keel_model** out) {
    return guard(host, [&] {
      Config cfg(host, config);
      auto h = std::make_unique<H>(H{Host(host), make_component<M>(Host(host), cfg)});
      *out = reinterpret_cast<keel_model*>(h.release());
    });
  }
  static void destroy(keel_model* m) { delete reinterpret_cast<H*>(m); }
  static keel_status info(keel_model* m, keel_model_info* out) {
    return guard(holder(m).host.raw(), [&] {
      if (out == nullptr || out->struct_size < KEEL_MODEL_INFO_SIZE_1_0)
        throw Error(KEEL_ERROR_INVALID_ARGUMENT, "keel_model_info is NULL or older than SDK 1.0");
      keel_model_info info = holder(m).object->info();
      info.struct_size = out->struct_size;  // the caller's struct: fill what both know
      std::memcpy(out, &info, std::min(out->struct_size, sizeof(info)));
    });
  }
  static keel_status build_part(keel_model* m, const keel_part_spec* spec, keel_part** out) {
    return guard(holder(m).host.raw(), [&] {
      if (spec == nullptr || spec->struct_size < KEEL_PART_SPEC_SIZE_1_0)
        throw Error(KEEL_ERROR_INVALID_ARGUMENT, "keel_part_spec is NULL or older than SDK 1.0");
      *out = reinterpret_cast<keel_part*>(&holder(m).object->build_part(*spec));
    });
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
    return guard(part(p).host(), [&] {
      if (in == nullptr || in->struct_size < KEEL_FORWARD_INPUTS_SIZE_1_0 || out == nullptr ||
          out->struct_size < KEEL_FORWARD_OUTPUTS_SIZE_1_0)
        throw Error(KEEL_ERROR_INVALID_ARGUMENT, "forward: inputs or outputs NULL or older than SDK 1.0");
      part(p).forward(*in, *out);
    });
  }
  static keel_status post_init(keel_model* m) {
    return guard(holder(m).host.raw(), [&] { holder(m).object->post_init(); });
  }
  static keel_status pre_clip(keel_model* m) {
    return guard(holder(m).host.raw(), [&] { holder(m).object->pre_clip(); });
  }
  static keel_status post_step(keel_model* m) {
    return guard(holder(m).host.raw(), [&] { holder(m).object->post_step(); });
  }
  static keel_status export_state(keel_model* m, const char* format, const keel_named_tensor* const* state,
                                  size_t count, const keel_export_sink* sink) {
    return guard(holder(m).host.raw(), [&] {
      std::map<std::string, at::Tensor> tensors;
      for (size_t i = 0; i < count; ++i) {
        const keel_named_tensor* entry = state[i];
        if (entry == nullptr || entry->struct_size < KEEL_NAMED_TENSOR_SIZE_1_0 || entry->name == nullptr ||
            entry->tensor == nullptr)
          throw Error(KEEL_ERROR_INVALID_ARGUMENT,
                      "export_state: state entry #" + std::to_string(i) + " is incomplete");
        tensors.emplace(entry->name, tensor(entry->tensor));
      }
      ExportSink out(sink, holder(m).host.raw());
      holder(m).object->export_state(format != nullptr ? format : "", tensors, out);
    });
  }
  static keel_status set_recompute(keel_model* m, int32_t mode) {
    return guard(holder(m).host.raw(), [&] { holder(m).object->set_recompute(static_cast<Recompute>(mode)); });
  }
  static keel_status set_attention(keel_model* m, uint32_t flags) {
    return guard(holder(m).host.raw(), [&] { holder(m).object->set_attention(flags); });
  }
  static keel_status activation_bytes(keel_model* m, const keel_part_spec* spec, int64_t batch, int64_t seq,
                                      int32_t mode, int64_t* bytes) {
    return guard(holder(m).host.raw(), [&] {
      if (spec == nullptr || bytes == nullptr || batch < 0 || seq < 0)
        throw Error(KEEL_ERROR_INVALID_ARGUMENT, "activation_bytes: no spec or result, or a negative batch or seq");
      *bytes = holder(m).object->activation_bytes(*spec, batch, seq, static_cast<Recompute>(mode));
    });
  }
  static keel_status import_config(keel_host* host, const char* format, const keel_import_source* source,
                                   const keel_config_sink* sink) {
    return guard(host, [&] {
      ImportedConfig out(sink, host);
      M::import_config(Host(host), format != nullptr ? format : "", ImportSource(source, host), out);
    });
  }
  static keel_status import_state(keel_model* m, const char* format, const keel_import_source* source,
                                  const keel_export_sink* sink) {
    keel_host* host = holder(m).host.raw();
    return guard(host, [&] {
      ExportSink out(sink, host);
      holder(m).object->import_state(format != nullptr ? format : "", ImportSource(source, host), out);
    });
  }
};

// A clipper and what the adapter keeps for it: the views of the host's records (built once,
// in bind_model_parts) and the C arrays of its state.
template <class C>
struct ClipperHolder : Holder<C> {
  bool bound = false;
  std::vector<const keel_param_info*> records;  // the records the views were built from
  std::vector<ParamView> views;
  StateList state;
  std::vector<keel_named_tensor> named;
  std::vector<const keel_named_tensor*> named_pointers;
  std::vector<GradientShard> shards;
};

template <class C>
struct ClipperAdapter {
  using H = ClipperHolder<C>;
  static H& holder(keel_clipper* c) { return *reinterpret_cast<H*>(c); }

  static keel_status create(keel_host* host, const keel_config* config, keel_clipper** out) {
    return guard(host, [&] {
      Config cfg(host, config);
      auto h = std::make_unique<H>();
      h->host = Host(host);
      h->object = make_component<C>(Host(host), cfg);
      *out = reinterpret_cast<keel_clipper*>(h.release());
    });
  }
  static void destroy(keel_clipper* c) { delete reinterpret_cast<H*>(c); }
  // Builds the views and hands them to C::bind, when C has one.
  static void bind(H& h, const keel_param_info* const* params, size_t count) {
    h.views = param_views(params, count);
    h.records.assign(params, params + count);
    h.bound = true;
    if constexpr (requires(C & c, std::span<const ParamView> v) { c.bind(v); })
      h.object->bind(std::span<const ParamView>(h.views));
  }
  static keel_status bind_model_parts(keel_clipper* c, const keel_param_info* const* params, size_t count) {
    return guard(holder(c).host.raw(), [&] { bind(holder(c), params, count); });
  }
  static keel_status bind_gradient_shards(keel_clipper* c, const keel_param_info* const* owners,
                                          keel_tensor* const* owned, size_t count) {
    H& h = holder(c);
    return guard(h.host.raw(), [&] {
      h.shards.clear();
      for (size_t i = 0; i < count; ++i) h.shards.push_back({ParamView(owners[i]), &tensor(owned[i])});
      h.object->bind_gradient_shards(std::span<const GradientShard>(h.shards));
    });
  }
  static keel_status clip(keel_clipper* c, const keel_param_info* const* params, size_t count,
                          keel_tensor* total_norm) {
    H& h = holder(c);
    return guard(h.host.raw(), [&] {
      // The host passes the bound array every step; a caller that passes other records (or
      // never bound) gets them bound first, so C always sees views of what it clips.
      if (!h.bound || count != h.records.size() || !std::equal(params, params + count, h.records.begin()))
        bind(h, params, count);
      tensor(total_norm) = h.object->clip(std::span<const ParamView>(h.views));
    });
  }
  static keel_status state(keel_clipper* c, const keel_named_tensor* const** out, size_t* count) {
    H& h = holder(c);
    return guard(h.host.raw(), [&] {
      h.state = h.object->state();
      h.named.clear();
      h.named_pointers.clear();
      for (auto& [name, t] : h.state) h.named.push_back({sizeof(keel_named_tensor), name.c_str(), handle(*t)});
      for (const keel_named_tensor& n : h.named) h.named_pointers.push_back(&n);
      *out = h.named_pointers.data();
      *count = h.named_pointers.size();
    });
  }
};

/// The KEEL_EXTENSION_CONFIG_KEYS extension of T::config_keys(), chained before `next`; built
/// once and kept for the process, like the descriptor it hangs from.
template <class T>
const keel_extension* config_keys_extension(const keel_extension* next) {
  struct Table {
    std::vector<ConfigKey> keys;
    std::vector<keel_config_key> entries;
    std::vector<const keel_config_key*> pointers;
    keel_config_keys_extension extension{};
  };
  static const Table* table = [next] {
    auto* t = new Table{T::config_keys(), {}, {}, {}};  // never freed: plugins are never unloaded
    for (ConfigKey& k : t->keys) {                      // the host refuses a longer doc: cut it at a character boundary
      if (k.doc.size() <= KEEL_MAX_CONFIG_DOC) continue;
      size_t end = KEEL_MAX_CONFIG_DOC - 3;
      while (end > 0 && (static_cast<unsigned char>(k.doc[end]) & 0xC0) == 0x80) --end;
      k.doc = k.doc.substr(0, end) + "...";
    }
    t->entries.reserve(t->keys.size());
    for (const ConfigKey& k : t->keys)
      t->entries.push_back({sizeof(keel_config_key), k.name.c_str(), k.type,
                            k.default_value ? k.default_value->c_str() : nullptr, k.doc.c_str()});
    for (const keel_config_key& entry : t->entries) t->pointers.push_back(&entry);
    t->extension.base = {sizeof(keel_config_keys_extension), KEEL_EXTENSION_CONFIG_KEYS, next};
    t->extension.keys = t->pointers.data();
    t->extension.count = t->pointers.size();
    return t;
  }();
  return &table->extension.base;
}

/// `next` with T's config keys chained in front when T declares them.
template <class T>
const keel_extension* with_config_keys(const keel_extension* next) {
  if constexpr (requires { T::config_keys(); })
    return config_keys_extension<T>(next);
  else
    return next;
}

template <class M>
constexpr bool has_export = requires(M& m, const std::string& format, const std::map<std::string, at::Tensor>& state,
                                     ExportSink& sink) {
  m.export_state(format, state, sink);
};

template <class M>
constexpr bool has_import = requires(M& m, Host host, const std::string& format, const ImportSource& source,
                                     ImportedConfig& config, ExportSink& sink) {
  M::import_config(host, format, source, config);
  m.import_state(format, source, sink);
};

// The import extension of M chained in front of `next` when M imports.
template <class M>
const keel_extension* with_import(const keel_extension* next) {
  if constexpr (has_import<M>) {
    using A = ModelAdapter<M>;
    static const keel_model_import_extension import_extension = [next] {
      keel_model_import_extension e{};
      e.base = {sizeof(keel_model_import_extension), KEEL_EXTENSION_MODEL_IMPORT, next};
      if constexpr (requires { M::import_formats; })
        e.formats = M::import_formats;
      else
        e.formats = "";
      e.import_config = &A::import_config;
      e.import_state = &A::import_state;
      return e;
    }();
    return &import_extension.base;
  } else {
    return next;
  }
}

template <class M>
constexpr bool has_recompute = requires(M& m) {
  { M::recompute_modes } -> std::convertible_to<uint32_t>;
  m.set_recompute(Recompute::full);
};

// The recompute extension of M chained in front of `next` when M recomputes.
template <class M>
const keel_extension* with_recompute(const keel_extension* next) {
  if constexpr (has_recompute<M>) {
    static const keel_model_recompute_extension recompute_extension = [next] {
      keel_model_recompute_extension e{};
      e.base = {sizeof(keel_model_recompute_extension), KEEL_EXTENSION_MODEL_RECOMPUTE, next};
      e.modes = M::recompute_modes;
      e.set_recompute = &ModelAdapter<M>::set_recompute;
      return e;
    }();
    return &recompute_extension.base;
  } else {
    return next;
  }
}

template <class M>
constexpr bool has_attention = requires(M& m) {
  { M::attention_flags } -> std::convertible_to<uint32_t>;
  m.set_attention(uint32_t{});
};

// The attention extension of M chained in front of `next` when M masks attention by document.
template <class M>
const keel_extension* with_attention(const keel_extension* next) {
  if constexpr (has_attention<M>) {
    static const keel_model_attention_extension attention_extension = [next] {
      keel_model_attention_extension e{};
      e.base = {sizeof(keel_model_attention_extension), KEEL_EXTENSION_MODEL_ATTENTION, next};
      e.supported = M::attention_flags;
      e.set_attention = &ModelAdapter<M>::set_attention;
      return e;
    }();
    return &attention_extension.base;
  } else {
    return next;
  }
}

template <class M>
constexpr bool has_activation_bytes = requires(const M& m, const keel_part_spec& spec) {
  { m.activation_bytes(spec, int64_t{}, int64_t{}, Recompute::none) } -> std::convertible_to<int64_t>;
};

// The memory extension of M chained in front of `next` when M estimates its activations.
template <class M>
const keel_extension* with_memory(const keel_extension* next) {
  if constexpr (has_activation_bytes<M>) {
    static const keel_model_memory_extension memory_extension = [next] {
      keel_model_memory_extension e{};
      e.base = {sizeof(keel_model_memory_extension), KEEL_EXTENSION_MODEL_MEMORY, next};
      e.activation_bytes = &ModelAdapter<M>::activation_bytes;
      return e;
    }();
    return &memory_extension.base;
  } else {
    return next;
  }
}

template <class C>
constexpr bool has_gradient_shards = requires(C& c, std::span<const GradientShard> shards) {
  c.bind_gradient_shards(shards);
};

// The shards extension of C chained in front of `next` when C clips reduce-scattered gradients.
template <class C>
const keel_extension* with_gradient_shards(const keel_extension* next) {
  if constexpr (has_gradient_shards<C>) {
    static const keel_clipper_shards_extension shards_extension = [next] {
      keel_clipper_shards_extension e{};
      e.base = {sizeof(keel_clipper_shards_extension), KEEL_EXTENSION_CLIPPER_SHARDS, next};
      e.bind_gradient_shards = &ClipperAdapter<C>::bind_gradient_shards;
      return e;
    }();
    return &shards_extension.base;
  } else {
    return next;
  }
}

}  // namespace detail

/// The MODEL component of class M. M provides:
///   M(keel::Host, keel::Config&)  (or static std::unique_ptr<M> create(keel::Host, keel::Config&));
///   keel_model_info info();  keel::Part& build_part(const keel_part_spec&);
/// and optionally post_init(), pre_clip(), post_step() and
///   void export_state(const std::string& format, const std::map<std::string, at::Tensor>& state,
///                     keel::ExportSink& sink);
/// with `static constexpr const char* export_formats = "hf";` naming the formats, its inverse
///   static void import_config(keel::Host, const std::string& format, const keel::ImportSource&,
///                             keel::ImportedConfig&);
///   void import_state(const std::string& format, const keel::ImportSource&, keel::ExportSink&);
/// with `static constexpr const char* import_formats = "hf";`, and
///   static std::vector<keel::ConfigKey> config_keys();
/// declaring every key it reads (keel/config_keys.hpp), and
///   void set_recompute(keel::Recompute);  with  static constexpr uint32_t recompute_modes = ...;
/// (keel::recompute_bit(mode) | ...; the helper is keel/recompute.hpp), and
///   int64_t activation_bytes(const keel_part_spec&, int64_t batch, int64_t seq, keel::Recompute) const;
/// estimating what a part's forward keeps for backward (the dry run's memory plan), and
///   void set_attention(uint32_t flags);  with  static constexpr uint32_t attention_flags = ...;
/// (KEEL_ATTENTION_* bits: document masking, data.attention = "block_causal"). A hook M
/// lacks is NULL in the vtable; export, import, recomputation, the activation estimate,
/// document masking and config keys are offered as extensions.
/// `hook_flags` declares capture-safe hooks (KEEL_HOOK_*_CAPTURE_SAFE). Every member function
/// is called on the train thread.
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
    return v;  // export_state stays NULL: 1.2 offers it as an extension
  }();
  const keel_extension* extensions = nullptr;
  if constexpr (detail::has_export<M>) {
    static const keel_model_export_extension export_extension = [] {
      keel_model_export_extension e{};
      e.base = {sizeof(keel_model_export_extension), KEEL_EXTENSION_MODEL_EXPORT, nullptr};
      if constexpr (requires { M::export_formats; })
        e.formats = M::export_formats;
      else
        e.formats = "";
      e.export_state = &A::export_state;
      return e;
    }();
    extensions = &export_extension.base;
  }
  static const keel_component component{sizeof(keel_component),
                                        KEEL_COMPONENT_MODEL,
                                        name,
                                        description,
                                        &vtable,
                                        detail::with_config_keys<M>(detail::with_attention<M>(detail::with_memory<M>(
                                            detail::with_recompute<M>(detail::with_import<M>(extensions)))))};
  return &component;
}

/// The CLIPPER component of class C. C provides:
///   C(keel::Host, keel::Config&)  (or static std::unique_ptr<C> create(keel::Host, keel::Config&));
///   at::Tensor clip(std::span<const keel::ParamView>);
/// and optionally void bind(std::span<const keel::ParamView>) (once, before the first clip,
/// with the views clip() then receives every step: sort them into static lists there) and
/// keel::StateList state(), static std::vector<keel::ConfigKey> config_keys() declaring
/// every key it reads, and void bind_gradient_shards(std::span<const keel::GradientShard>)
/// (once, after bind: from then on clip() counts and scales only those rows, summing its norm
/// over the world; offered as KEEL_EXTENSION_CLIPPER_SHARDS, which lets the host
/// reduce-scatter gradients under a sharded optimizer). Every member function is called on the
/// train thread.
template <class C>
const keel_component* clipper_component(const char* name, const char* description, uint32_t hook_flags = 0) {
  using A = detail::ClipperAdapter<C>;
  static const keel_clipper_vtable vtable = [&] {
    keel_clipper_vtable v{};
    v.struct_size = sizeof(v);
    v.create = &A::create;
    v.destroy = &A::destroy;
    v.bind_model_parts = &A::bind_model_parts;  // the adapter builds the views there
    v.clip = &A::clip;
    if constexpr (requires(C & c) { c.state(); }) v.state = &A::state;
    v.hook_flags = hook_flags;
    return v;
  }();
  static const keel_component component{sizeof(keel_component),
                                        KEEL_COMPONENT_CLIPPER,
                                        name,
                                        description,
                                        &vtable,
                                        detail::with_config_keys<C>(detail::with_gradient_shards<C>(nullptr))};
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
