/* Built for a future ABI major: the host must refuse it and say "rebuild it against SDK 1". */
#include "c_plugin_common.h"
static const keel_model_vtable vtable = TEST_MODEL_VTABLE(fail_forward);
static const keel_component component = {sizeof(keel_component), KEEL_COMPONENT_MODEL, "abi_major", "", &vtable, NULL};
TEST_ENTRY(99, KEEL_TEST_TORCH_VERSION, sizeof(keel_plugin_descriptor))
