/* Shared pieces of the C test plugins: a model vtable whose functions all fail. Inline, so a
 * plugin that uses only some of them compiles without unused-function warnings. */
#ifndef KEEL_TEST_C_PLUGIN_COMMON_H
#define KEEL_TEST_C_PLUGIN_COMMON_H
#include <keel/keel.h>

static inline keel_status fail_create(keel_host* host, const keel_config* config, keel_model** out) {
  (void)config;
  (void)out;
  host->api->set_error(host, KEEL_ERROR_UNSUPPORTED, "test plugin");
  return KEEL_ERROR_UNSUPPORTED;
}
static inline void noop_destroy(keel_model* model) { (void)model; }
static inline keel_status fail_info(keel_model* m, keel_model_info* out) {
  (void)m;
  (void)out;
  return KEEL_ERROR_UNSUPPORTED;
}
static inline keel_status fail_build(keel_model* m, const keel_part_spec* s, keel_part** out) {
  (void)m;
  (void)s;
  (void)out;
  return KEEL_ERROR_UNSUPPORTED;
}
static inline keel_status fail_list(keel_part* p, const keel_param_info* const** out, size_t* n) {
  (void)p;
  (void)out;
  (void)n;
  return KEEL_ERROR_UNSUPPORTED;
}
static inline keel_status fail_init(keel_part* p, uint64_t seed) {
  (void)p;
  (void)seed;
  return KEEL_ERROR_UNSUPPORTED;
}
static inline keel_status fail_forward(keel_part* p, const keel_forward_inputs* i, keel_forward_outputs* o) {
  (void)p;
  (void)i;
  (void)o;
  return KEEL_ERROR_UNSUPPORTED;
}

#define TEST_MODEL_VTABLE(FORWARD)                                                                                \
  {                                                                                                               \
    sizeof(keel_model_vtable), fail_create, noop_destroy, fail_info, fail_build, fail_list, fail_list, fail_init, \
        FORWARD, NULL, NULL, NULL, 0                                                                              \
  }

#define TEST_ENTRY(ABI_MAJOR, TORCH, DESCRIPTOR_SIZE)                                                         \
  static const keel_component* const components[] = {&component};                                             \
  KEEL_EXPORT const keel_plugin_descriptor* keel_plugin_entry(void) {                                         \
    static const keel_plugin_descriptor d = {DESCRIPTOR_SIZE, ABI_MAJOR, 0, "test_plugin", "0.0.1", TORCH, 1, \
                                             components,      1};                                             \
    return &d;                                                                                                \
  }
#endif
