#include "plugins/extensions.hpp"

#include <set>

#include "common/error.hpp"
#include "common/text.hpp"
#include "plugins/versioned.hpp"

namespace keel {

ComponentExtensions read_extensions(const std::string& path, const keel_component& component) {
  ComponentExtensions out;
  if (component.struct_size < KEEL_COMPONENT_SIZE_1_2) return out;  // before 1.2: no chain
  auto where = [&](size_t index) {
    return cat("plugin ", path, ": component '", component.name, "' extension #", index);
  };
  std::set<int32_t> seen;
  size_t index = 0;
  for (const keel_extension* e = component.extensions; e != nullptr; e = e->next, ++index) {
    // A chain that loops back on itself must not hang the loader.
    if (index >= KEEL_MAX_EXTENSIONS)
      throw InputError(cat("plugin ", path, ": component '", component.name, "' lists more than ", KEEL_MAX_EXTENSIONS,
                           " extensions (a loop in its chain?)"));
    if (e->struct_size < KEEL_EXTENSION_SIZE_1_2)
      throw InputError(cat(where(index), " is ", e->struct_size, " bytes, smaller than keel_extension (",
                           KEEL_EXTENSION_SIZE_1_2, ")"));
    if (!seen.insert(e->type).second) throw InputError(cat(where(index), ": type ", e->type, " is listed twice"));
    if (e->type != KEEL_EXTENSION_MODEL_EXPORT) {
      out.unknown.push_back(e->type);
      continue;
    }
    if (component.kind != KEEL_COMPONENT_MODEL)
      throw InputError(cat(where(index), ": the model export extension on a ",
                           component.kind == KEEL_COMPONENT_CLIPPER ? "clipper" : "component of unknown kind"));
    if (e->struct_size < KEEL_MODEL_EXPORT_EXTENSION_SIZE_1_2)
      throw InputError(cat(where(index), ": the model export extension is ", e->struct_size,
                           " bytes, this host needs at least ", KEEL_MODEL_EXPORT_EXTENSION_SIZE_1_2, " (ABI 1.2)"));
    out.model_export = copy_versioned<keel_model_export_extension>(e);
    out.model_export.base.next = nullptr;
    if (out.model_export.export_state == nullptr)
      throw InputError(cat(where(index), ": the model export extension has no export_state function"));
  }
  return out;
}

}  // namespace keel
