#include "checkpoint/manifest.hpp"

#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/text.hpp"

namespace keel {

std::string xxh64_hex(const void* data, size_t size) {
  return format("%016llx", static_cast<unsigned long long>(XXH64(data, size, 0)));
}

std::string manifest_json(const Manifest& m) {
  nlohmann::ordered_json j;
  j["format"] = "keel-checkpoint";
  j["version"] = Manifest::kVersion;
  j["step"] = m.step;
  j["run_id"] = m.run_id;
  j["data_position"] = m.data_position;
  j["tokens_seen"] = m.tokens_seen;
  j["lr"] = m.lr;
  j["mesh"] = {{"pp", m.pp}, {"dp", m.dp}, {"ep", m.ep}};
  j["model"] = {{"plugin", m.model_plugin}, {"component", m.model_component}};
  j["clipper"] = {{"plugin", m.clipper_plugin}, {"component", m.clipper_component}};
  j["config"] = m.config;
  nlohmann::ordered_json entries = nlohmann::ordered_json::object();
  for (const auto& [key, e] : m.entries) {
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    for (const ShardRecord& s : e.shards)
      shards.push_back({{"file", s.file}, {"offsets", s.offsets}, {"shape", s.shape}, {"xxh64", s.xxh64}});
    entries[key] = {{"dtype", e.dtype}, {"shape", e.shape}, {"shards", shards}};
  }
  j["entries"] = entries;
  return j.dump(1);
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "manifest.json").string();
  std::ifstream in(path);
  if (!in) throw InputError(cat(path, ": no such file (not a complete Keel checkpoint)"));
  Manifest m;
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    if (j.value("format", "") != "keel-checkpoint")
      throw InputError(cat(path, ": not a Keel checkpoint manifest (format '", j.value("format", ""), "')"));
    if (j.at("version").get<int>() != Manifest::kVersion)
      throw InputError(cat(path, ": manifest version ", j.at("version").get<int>(), ", this Keel reads version ",
                           Manifest::kVersion));
    m.step = j.at("step").get<int64_t>();
    m.run_id = j.value("run_id", std::string());  // absent in checkpoints of older versions
    m.data_position = j.at("data_position").get<uint64_t>();
    m.tokens_seen = j.at("tokens_seen").get<int64_t>();
    m.lr = j.at("lr").get<double>();
    m.pp = j.at("mesh").at("pp").get<int>();
    m.dp = j.at("mesh").at("dp").get<int>();
    m.ep = j.at("mesh").at("ep").get<int>();
    m.model_plugin = j.at("model").at("plugin").get<std::string>();
    m.model_component = j.at("model").at("component").get<std::string>();
    m.clipper_plugin = j.at("clipper").at("plugin").get<std::string>();
    m.clipper_component = j.at("clipper").at("component").get<std::string>();
    m.config = j.at("config").get<std::string>();
    for (const auto& [key, e] : j.at("entries").items()) {
      EntryRecord entry;
      entry.dtype = e.at("dtype").get<std::string>();
      entry.shape = e.at("shape").get<std::vector<int64_t>>();
      for (const auto& s : e.at("shards"))
        entry.shards.push_back({s.at("file").get<std::string>(), s.at("offsets").get<std::vector<int64_t>>(),
                                s.at("shape").get<std::vector<int64_t>>(), s.at("xxh64").get<std::string>()});
      m.entries[key] = std::move(entry);
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(cat(path, ": damaged manifest: ", e.what()));
  }
  return m;
}

}  // namespace keel
