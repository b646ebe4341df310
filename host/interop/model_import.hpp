// The first half of a model import: the model component translates a foreign checkpoint's
// config into its own config table (keel_model_import_extension.import_config), before any
// model exists. The second half is Model::import_state.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <keel/keel.h>

#include "interop/hf_checkpoint.hpp"
#include "plugins/host_context.hpp"

namespace keel {

/// The config table (key, TOML value; in the order the model set them) that model `component`
/// of plugin `plugin_name` derives from `checkpoint` in `format`. Every key must be one the
/// component declares, of its declared type, and set once. InputError naming the plugin when
/// the component cannot import or refuses the checkpoint (its message names the field).
std::vector<std::pair<std::string, std::string>> import_model_config(const keel_component& component,
                                                                     const std::string& plugin_name,
                                                                     const std::string& format,
                                                                     HfCheckpoint& checkpoint, HostServices services);

}  // namespace keel
