/* Claims another LibTorch: the host must name both versions. */
#include "c_plugin_common.h"
static const keel_model_vtable vtable = TEST_MODEL_VTABLE(fail_forward);
static const keel_component component = {sizeof(keel_component), KEEL_COMPONENT_MODEL, "torch_mismatch", "", &vtable, NULL};
TEST_ENTRY(KEEL_ABI_MAJOR, "1.13.1", sizeof(keel_plugin_descriptor))
