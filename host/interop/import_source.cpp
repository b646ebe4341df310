#include "interop/import_source.hpp"

#include <keel/keel.hpp>

#include <limits>
#include <vector>

#include "common/text.hpp"
#include "plugins/host_context.hpp"

namespace keel {

namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts(1);
  for (char c : path) {
    if (c == '.')
      parts.emplace_back();
    else
      parts.back() += c;
  }
  return parts;
}

// The value at `path` ("rope_scaling.factor", "architectures.0"), or nullptr when absent.
const nlohmann::json* find_value(const nlohmann::json& root, const std::string& path) {
  const nlohmann::json* node = &root;
  for (const std::string& part : split_path(path)) {
    if (node->is_object()) {
      auto it = node->find(part);
      if (it == node->end()) return nullptr;
      node = &*it;
    } else if (node->is_array()) {
      if (part.empty() || part.size() > 9 || part.find_first_not_of("0123456789") != std::string::npos) return nullptr;
      const size_t index = std::stoul(part);
      if (index >= node->size()) return nullptr;
      node = &(*node)[index];
    } else {
      return nullptr;
    }
  }
  return node;
}

const char* kind_of(const nlohmann::json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "an object";
}

}  // namespace

ImportSourceAdapter::ImportSourceAdapter(HfCheckpoint& checkpoint, HostContext& context)
    : checkpoint_(checkpoint), context_(&context) {
  raw_ = {sizeof(keel_import_source), this, &config_get, &has_tensor, &read_tensor, &origin};
}

keel_status ImportSourceAdapter::refuse(const std::string& why) {
  host_api().set_error(context_->raw(), KEEL_ERROR_INVALID_ARGUMENT, why.c_str());
  return KEEL_ERROR_INVALID_ARGUMENT;
}

keel_status ImportSourceAdapter::config_get(void* context, const char* path, int32_t type, void* out, int32_t* found) {
  auto& self = *static_cast<ImportSourceAdapter*>(context);
  // No exception crosses back into the plugin's frames.
  try {
    return self.get_config(path, type, out, found);
  } catch (const std::exception& e) {
    return self.refuse(cat("import: config_get: ", e.what()));
  }
}

keel_status ImportSourceAdapter::get_config(const char* path, int32_t type, void* out, int32_t* found) {
  ImportSourceAdapter& self = *this;
  if (path == nullptr || out == nullptr || found == nullptr)
    return self.refuse("import: config_get without a path or output");
  *found = 0;
  const std::string where = cat(self.checkpoint_.dir(), "/config.json: ", path);
  const nlohmann::json* value = find_value(self.checkpoint_.config(), path);
  if (value == nullptr || value->is_null()) return KEEL_OK;
  const char* wanted = nullptr;
  switch (type) {
    case KEEL_CONFIG_INT:
      if (value->is_number_integer() && !value->is_number_unsigned()) {
        *static_cast<int64_t*>(out) = value->get<int64_t>();
      } else if (value->is_number_unsigned() &&
                 value->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        *static_cast<int64_t*>(out) = static_cast<int64_t>(value->get<uint64_t>());
      } else {
        wanted = "an integer";
      }
      break;
    case KEEL_CONFIG_FLOAT:
      if (value->is_number())
        *static_cast<double*>(out) = value->get<double>();
      else
        wanted = "a number";
      break;
    case KEEL_CONFIG_BOOL:
      if (value->is_boolean())
        *static_cast<int32_t*>(out) = value->get<bool>() ? 1 : 0;
      else
        wanted = "a boolean";
      break;
    case KEEL_CONFIG_STRING:
      if (value->is_string()) {
        self.strings_.push_back(value->get<std::string>());
        *static_cast<const char**>(out) = self.strings_.back().c_str();
      } else {
        wanted = "a string";
      }
      break;
    default:
      return self.refuse(cat("import: config_get of unknown type ", type));
  }
  if (wanted != nullptr) return self.refuse(cat(where, ": expected ", wanted, ", got ", kind_of(*value)));
  *found = 1;
  return KEEL_OK;
}

int32_t ImportSourceAdapter::has_tensor(void* context, const char* name) {
  auto& self = *static_cast<ImportSourceAdapter*>(context);
  try {
    return name != nullptr && self.checkpoint_.has(name) ? 1 : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

keel_status ImportSourceAdapter::read_tensor(void* context, const char* name, const keel_tensor** out) {
  auto& self = *static_cast<ImportSourceAdapter*>(context);
  if (name == nullptr || out == nullptr) return self.refuse("import: read_tensor without a name or output");
  *out = nullptr;
  if (!self.checkpoint_.has(name))
    return self.refuse(cat(self.checkpoint_.dir(), ": no tensor '", name, "' (the model needs it)"));
  try {
    self.handed_.push_back(self.checkpoint_.read(name));
  } catch (const std::exception& e) {
    return self.refuse(e.what());
  }
  *out = handle(self.handed_.back());
  return KEEL_OK;
}

const char* ImportSourceAdapter::origin(void* context, const char* name) {
  auto& self = *static_cast<ImportSourceAdapter*>(context);
  try {
    if (name == nullptr || !self.checkpoint_.has(name)) return nullptr;
    self.strings_.push_back(self.checkpoint_.file_of(name));
    return self.strings_.back().c_str();
  } catch (const std::exception&) {
    return nullptr;
  }
}

}  // namespace keel
