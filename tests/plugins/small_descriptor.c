/* A descriptor whose struct_size is smaller than ABI 1.0's: refused before anything is read. */
#include "c_plugin_common.h"
static const keel_model_vtable vtable = TEST_MODEL_VTABLE(fail_forward);
static const keel_component component = {sizeof(keel_component), KEEL_COMPONENT_MODEL, "small", "", &vtable, NULL};
TEST_ENTRY(KEEL_ABI_MAJOR, KEEL_TEST_TORCH_VERSION, sizeof(size_t))
