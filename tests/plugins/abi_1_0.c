/* A model built against SDK 1.0: its vtable ends at hook_flags and its component at vtable, so
 * a host of a later minor must load it, treat every later function as absent and read nothing
 * beyond struct_size. The export_state slot and the extension chain beyond the component's
 * size hold traps that a host reading past struct_size would call. */
#include <stddef.h>

#include "c_plugin_common.h"

static int instance;

static keel_status ok_create(keel_host* host, const keel_config* config, keel_model** out) {
  (void)host;
  (void)config;
  *out = (keel_model*)&instance;
  return KEEL_OK;
}
static void ok_destroy(keel_model* model) { (void)model; }
static keel_status ok_info(keel_model* m, keel_model_info* out) {
  (void)m;
  out->vocab_size = 8;
  out->num_layers = 1;
  out->hidden_size = 4;
  return KEEL_OK;
}
static keel_status trap_export(keel_model* m, const char* format, const keel_named_tensor* const* state, size_t count,
                               const keel_export_sink* sink) {
  (void)m;
  (void)format;
  (void)state;
  (void)count;
  (void)sink;
  return KEEL_ERROR_INTERNAL;
}

static const keel_model_export_extension trap_extension = {
    {sizeof(keel_model_export_extension), KEEL_EXTENSION_MODEL_EXPORT, NULL}, "hf", trap_export};

static const keel_model_vtable vtable = {KEEL_MODEL_VTABLE_SIZE_1_0,
                                         ok_create,
                                         ok_destroy,
                                         ok_info,
                                         fail_build,
                                         fail_list,
                                         fail_list,
                                         fail_init,
                                         fail_forward,
                                         NULL,
                                         NULL,
                                         NULL,
                                         0,
                                         trap_export};
static const keel_component component = {
    KEEL_COMPONENT_SIZE_1_0, KEEL_COMPONENT_MODEL, "abi_1_0", "", &vtable, &trap_extension.base};
static const keel_component* const components[] = {&component};
KEEL_EXPORT const keel_plugin_descriptor* keel_plugin_entry(void) {
  static const keel_plugin_descriptor d = {
      sizeof(keel_plugin_descriptor), KEEL_ABI_MAJOR, 0, "abi_1_0", "0.0.1", KEEL_TEST_TORCH_VERSION, 1, components, 1};
  return &d;
}
