// One trainable model and one clipper on the raw ABI, built once per ABI minor to prove that
// plugins of every minor load and train in this host (KEEL_TEST_MINOR = 0 to 10):
//   1.0: component and model vtable end where 1.0 ended; what lies beyond them (an export
//        function, an extension chain) are traps a host reading past struct_size would use.
//   1.1: the model vtable carries export_state.
//   1.2: export is an extension; the vtable's export_state is NULL.
//   1.3: the clipper declares the one config key it reads (bound), as an extension.
//   1.4: as 1.3 (its model offers no import: a host must say so, not fail).
//   1.5: as 1.4, and the model reports its loss per token as a ratio (report_metric_ratio,
//        after checking the host's api is that large).
//   1.6: as 1.5 (its model does not recompute: a host must not ask it to).
//   1.7: as 1.6, and the model's pre_clip (a no-op in every minor) declares
//        KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY; the clipper offers no shards extension (a host must
//        keep gradients whole for it).
//   1.8: as 1.7 (1.8 changed only the SDK's helpers and what the host allows).
//   1.9: as 1.8 (its model offers no document masking: a host must refuse block_causal).
//   1.10: a newer plugin: a larger component struct and an extension this host cannot know,
//        listed before the export extension.
// The model is a bigram language model (an embedding and an output head, one stage).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/headeronly/version.h>

#include <keel/keel.h>

#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>

#ifndef KEEL_TEST_MINOR
#error "define KEEL_TEST_MINOR"
#endif

#define KEEL_TEXT_OF(x) #x
#define KEEL_TEXT(x) KEEL_TEXT_OF(x)

namespace {

constexpr int64_t kVocab = 64, kHidden = 16;

at::Tensor& tensor(keel_tensor* t) { return *reinterpret_cast<at::Tensor*>(t); }
const at::Tensor& tensor(const keel_tensor* t) { return *reinterpret_cast<const at::Tensor*>(t); }
keel_tensor* handle(at::Tensor& t) { return reinterpret_cast<keel_tensor*>(&t); }

struct Model {
  keel_host* host;
  at::Tensor embedding, head;
  keel_param_info infos[2];
  const keel_param_info* pointers[2];
};

template <class Body>
keel_status guarded(keel_host* host, Body&& body) {
  try {
    body();
    return KEEL_OK;
  } catch (const std::exception& e) {
    host->api->set_error(host, KEEL_ERROR_RUNTIME, e.what());
    return KEEL_ERROR_RUNTIME;
  }
}

keel_status create(keel_host* host, const keel_config*, keel_model** out) {
  *out = reinterpret_cast<keel_model*>(new Model{host, {}, {}, {}, {}});
  return KEEL_OK;
}
void destroy(keel_model* m) { delete reinterpret_cast<Model*>(m); }
keel_status info(keel_model*, keel_model_info* out) {
  out->vocab_size = kVocab;
  out->num_layers = 1;
  out->hidden_size = kHidden;
  return KEEL_OK;
}
keel_status build_part(keel_model* model, const keel_part_spec* spec, keel_part** out) {
  Model& m = *reinterpret_cast<Model*>(model);
  if (spec->num_stages != 1) {
    m.host->api->set_error(m.host, KEEL_ERROR_UNSUPPORTED, "versioned test model: one stage only");
    return KEEL_ERROR_UNSUPPORTED;
  }
  m.embedding = at::zeros({kVocab, kHidden}).requires_grad_(true);
  m.head = at::zeros({kVocab, kHidden}).requires_grad_(true);
  const char* names[2] = {"embedding.weight", "head.weight"};
  at::Tensor* tensors[2] = {&m.embedding, &m.head};
  for (int i = 0; i < 2; ++i) {
    m.infos[i] = keel_param_info{sizeof(keel_param_info), names[i], handle(*tensors[i]), 0, -1, 0, 0, 1.0, nullptr};
    m.pointers[i] = &m.infos[i];
  }
  *out = reinterpret_cast<keel_part*>(&m);
  return KEEL_OK;
}
keel_status parameters(keel_part* part, const keel_param_info* const** out, size_t* count) {
  *out = reinterpret_cast<Model*>(part)->pointers;
  *count = 2;
  return KEEL_OK;
}
keel_status buffers(keel_part*, const keel_param_info* const** out, size_t* count) {
  *out = nullptr;
  *count = 0;
  return KEEL_OK;
}
keel_status init_weights(keel_part* part, uint64_t seed) {
  Model& m = *reinterpret_cast<Model*>(part);
  return guarded(m.host, [&] {
    c10::NoGradGuard no_grad;
    at::Generator gen = at::detail::createCPUGenerator(seed);
    m.embedding.normal_(0.0, 1.0, gen);
    m.head.normal_(0.0, 0.25, gen);
  });
}
keel_status forward(keel_part* part, const keel_forward_inputs* in, keel_forward_outputs* out) {
  Model& m = *reinterpret_cast<Model*>(part);
  return guarded(m.host, [&] {
    at::Tensor logits = at::linear(at::embedding(m.embedding, tensor(in->tokens)), m.head);
    tensor(out->loss_sum) = at::cross_entropy_loss(logits.reshape({-1, kVocab}), tensor(in->labels).reshape({-1}),
                                                   std::nullopt, at::Reduction::Sum, KEEL_IGNORE_INDEX);
#if KEEL_TEST_MINOR >= 5
    if (m.host->api->struct_size >= KEEL_HOST_API_SIZE_1_5) {
      at::Tensor sum = tensor(out->loss_sum).detach(), tokens = tensor(in->labels).ne(KEEL_IGNORE_INDEX).sum();
      const keel_status status = m.host->api->report_metric_ratio(m.host, "token_loss", handle(sum), handle(tokens));
      if (status != KEEL_OK) throw std::runtime_error("report_metric_ratio failed");
    }
#endif
  });
}
[[maybe_unused]] keel_status export_state(keel_model* model, const char* format, const keel_named_tensor* const* state,
                                          size_t count, const keel_export_sink* sink) {
  Model& m = *reinterpret_cast<Model*>(model);
  if (std::string(format) != "hf") {
    m.host->api->set_error(m.host, KEEL_ERROR_UNSUPPORTED, "versioned test model exports only 'hf'");
    return KEEL_ERROR_UNSUPPORTED;
  }
  for (size_t i = 0; i < count; ++i)
    if (keel_status s = sink->tensor(sink->context, state[i]->name, state[i]->tensor)) return s;
  return sink->file(sink->context, "config.json", "{\"versioned_minor\": " KEEL_TEXT(KEEL_TEST_MINOR) "}\n");
}
[[maybe_unused]] keel_status trap_export(keel_model* model, const char*, const keel_named_tensor* const*, size_t,
                                         const keel_export_sink*) {
  Model& m = *reinterpret_cast<Model*>(model);
  m.host->api->set_error(m.host, KEEL_ERROR_INTERNAL, "the host read beyond a struct_size");
  return KEEL_ERROR_INTERNAL;
}

// The clipper: clamps every gradient to [-bound, bound] (from 1.3 `bound` is a declared config
// key, default 1.0) and reports the L2 norm before clamping.
keel_host* clipper_host = nullptr;
double bound = 1.0;
keel_status clipper_create(keel_host* host, [[maybe_unused]] const keel_config* config, keel_clipper** out) {
  clipper_host = host;
#if KEEL_TEST_MINOR >= 3
  if (keel_status s = host->api->config_float(host, config, "bound", 1.0, &bound, nullptr)) return s;
#endif
  *out = reinterpret_cast<keel_clipper*>(&clipper_host);
  return KEEL_OK;
}
void clipper_destroy(keel_clipper*) {}
keel_status clip(keel_clipper*, const keel_param_info* const* params, size_t count, keel_tensor* total_norm) {
  return guarded(clipper_host, [&] {
    at::Tensor sq = at::zeros({}, at::kFloat);
    for (size_t i = 0; i < count; ++i) {
      at::Tensor grad = tensor(params[i]->tensor).grad();
      if (!grad.defined()) continue;
      sq = sq + grad.to(at::kFloat).square().sum();
      grad.clamp_(-bound, bound);
    }
    tensor(total_norm) = sq.sqrt();
  });
}

#if KEEL_TEST_MINOR == 0
constexpr size_t kModelVtableSize = KEEL_MODEL_VTABLE_SIZE_1_0;
constexpr auto kVtableExport = &trap_export;
#elif KEEL_TEST_MINOR == 1
constexpr size_t kModelVtableSize = KEEL_MODEL_VTABLE_SIZE_1_1;
constexpr auto kVtableExport = &export_state;
#else
constexpr size_t kModelVtableSize = sizeof(keel_model_vtable);
constexpr keel_status (*kVtableExport)(keel_model*, const char*, const keel_named_tensor* const*, size_t,
                                       const keel_export_sink*) = nullptr;
#endif

// Touches no gradient: a model hook a host must still treat as reading every gradient unless
// it declares otherwise (1.7).
keel_status pre_clip(keel_model*) { return KEEL_OK; }
#if KEEL_TEST_MINOR >= 7
constexpr uint32_t kHookFlags = KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY;
#else
constexpr uint32_t kHookFlags = 0;
#endif

const keel_model_vtable model_vtable = {kModelVtableSize, create,  destroy,      info,         build_part,
                                        parameters,       buffers, init_weights, forward,      nullptr,
                                        pre_clip,         nullptr, kHookFlags,   kVtableExport};
const keel_clipper_vtable clipper_vtable = {
    sizeof(keel_clipper_vtable), clipper_create, clipper_destroy, nullptr, clip, nullptr, 0};

#if KEEL_TEST_MINOR == 0
const keel_model_export_extension export_extension = {
    {sizeof(keel_model_export_extension), KEEL_EXTENSION_MODEL_EXPORT, nullptr}, "hf", trap_export};
#else
const keel_model_export_extension export_extension = {
    {sizeof(keel_model_export_extension), KEEL_EXTENSION_MODEL_EXPORT, nullptr}, "hf", export_state};
#endif

// An extension of a later minor: a type this host has never heard of, larger than any it knows.
struct FutureExtension {
  keel_extension base;
  void* payload[4];
};
const FutureExtension future_extension = {{sizeof(FutureExtension), 0x7e57, &export_extension.base}, {}};

// A component as a later minor may lay it out: a field appended after `extensions`.
struct FutureComponent {
  keel_component component;
  const void* appended;
};

#if KEEL_TEST_MINOR >= 3
const keel_config_key bound_key = {sizeof(keel_config_key), "bound", KEEL_CONFIG_FLOAT, "1.0",
                                   "gradients are clamped to [-bound, bound]"};
const keel_config_key* const clipper_keys[] = {&bound_key};
const keel_config_keys_extension clipper_config_keys = {
    {sizeof(keel_config_keys_extension), KEEL_EXTENSION_CONFIG_KEYS, nullptr}, clipper_keys, 1};
const keel_extension* const kClipperExtensions = &clipper_config_keys.base;
#else
const keel_extension* const kClipperExtensions = nullptr;
#endif

#if KEEL_TEST_MINOR == 0 || KEEL_TEST_MINOR == 1
constexpr size_t kComponentSize = KEEL_COMPONENT_SIZE_1_0;
const keel_extension* const kExtensions = &export_extension.base;  // beyond struct_size: a trap
#elif KEEL_TEST_MINOR >= 2 && KEEL_TEST_MINOR <= 9
constexpr size_t kComponentSize = KEEL_COMPONENT_SIZE_1_2;
const keel_extension* const kExtensions = &export_extension.base;
#else
constexpr size_t kComponentSize = sizeof(FutureComponent);
const keel_extension* const kExtensions = &future_extension.base;
#endif

const FutureComponent model_component = {
    {kComponentSize, KEEL_COMPONENT_MODEL, "model", "bigram model", &model_vtable, kExtensions}, nullptr};
const FutureComponent clipper_component = {
    {kComponentSize, KEEL_COMPONENT_CLIPPER, "clipper", "clamps gradients", &clipper_vtable, kClipperExtensions},
    nullptr};
const keel_component* const components[] = {&model_component.component, &clipper_component.component};

}  // namespace

extern "C" KEEL_EXPORT const keel_plugin_descriptor* keel_plugin_entry(void) {
  static const keel_plugin_descriptor d = {sizeof(keel_plugin_descriptor), KEEL_ABI_MAJOR, KEEL_TEST_MINOR,
                                           KEEL_TEST_PLUGIN_NAME,          "0.0.1",        TORCH_VERSION,
                                           _GLIBCXX_USE_CXX11_ABI,         components,     2};
  return &d;
}
