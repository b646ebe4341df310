/* A model without forward: the host must name the missing function. */
#include "c_plugin_common.h"
static const keel_model_vtable vtable = TEST_MODEL_VTABLE(NULL);
static const keel_component component = {sizeof(keel_component), KEEL_COMPONENT_MODEL, "missing_function", "", &vtable, NULL};
TEST_ENTRY(KEEL_ABI_MAJOR, KEEL_TEST_TORCH_VERSION, sizeof(keel_plugin_descriptor))
