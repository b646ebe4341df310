#include "checkpoint/manifest.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <stdexcept>

#include "checkpoint/safetensors.hpp"
#include "checkpoint/strict_json.hpp"
#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "metrics/json_number.hpp"

namespace keel {

namespace {

using nlohmann::json;

constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;
constexpr int kMaxDepth = 16;  // a manifest nests 5 levels deep
constexpr size_t kMaxRank = 16;
constexpr int64_t kMaxStep = int64_t{1} << 53;  // exact as a double, as the learning-rate schedule computes
constexpr int64_t kMaxMeshSize = 1 << 20;
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
// Shards that are not slices along one dimension are proven disjoint pair by pair; Keel never
// writes such shards, so their number is bounded to keep that quadratic check short.
constexpr size_t kMaxGeneralShards = 1024;
constexpr size_t kMaxValidationFigures = 4096;

bool is_name(const std::string& s) {
  static const std::regex pattern("[a-z0-9_]{1,128}");
  return std::regex_match(s, pattern);
}

bool is_shard_file(const std::string& s) {
  static const std::regex pattern("rank-[0-9]{5,9}\\.safetensors");  // CheckpointWriter::file_name
  return std::regex_match(s, pattern);
}

bool is_xxh64(const std::string& s) {
  static const std::regex pattern("[0-9a-f]{16}");
  return std::regex_match(s, pattern);
}

// Printable ASCII without spaces: entry keys and run ids are printed and compared, never parsed.
bool is_printable_token(const std::string& s, size_t max_size) {
  if (s.empty() || s.size() > max_size) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 127; });
}

// The checksum of a manifest: the xxh64 of its JSON without "checksum", keys sorted and no
// whitespace, so it does not depend on how the file was indented.
std::string body_checksum(json body) {
  body.erase("checksum");
  const std::string text = body.dump();
  return xxh64_hex(text.data(), text.size());
}

std::string plugin_name(const json& j, const char* section, const char* key, const std::string& where) {
  const std::string at = cat(where, ": ", section, ".", key);
  std::string name = json_string(json_field(json_field(j, section, where), key, cat(where, ": ", section)), at);
  if (!is_name(name)) throw InputError(cat(at, ": '", name, "' is not a name [a-z0-9_]+"));
  return name;
}

bool overlap(const ShardRecord& a, const ShardRecord& b) {
  for (size_t d = 0; d < a.shape.size(); ++d)
    if (!(a.offsets[d] < b.offsets[d] + b.shape[d] && b.offsets[d] < a.offsets[d] + a.shape[d])) return false;
  return true;
}

// The dimension along which every shard is a slice (full in every other dimension), or -1.
int slab_dim(const EntryRecord& e) {
  const size_t rank = e.shape.size();
  if (rank == 0) return -1;
  size_t dim = 0;  // the first dimension in which some shard is not full
  bool found = false;
  for (const ShardRecord& s : e.shards)
    for (size_t d = 0; d < rank && !found; ++d)
      if (s.shape[d] != e.shape[d]) dim = d, found = true;
  for (const ShardRecord& s : e.shards)
    for (size_t d = 0; d < rank; ++d)
      if (d != dim && (s.offsets[d] != 0 || s.shape[d] != e.shape[d])) return -1;
  return static_cast<int>(dim);
}

// Proves the shards tile the entry: each lies inside it (checked before), their volumes add up
// to its volume and no two overlap — together, every element is held by exactly one shard.
void check_tiling(const EntryRecord& e, int64_t volume, const std::string& where) {
  int64_t covered = 0;
  for (const ShardRecord& s : e.shards) {
    int64_t v = 0;
    checked_volume(s.shape, v);  // inside the entry, so no larger than its volume
    if (__builtin_add_overflow(covered, v, &covered) || covered > volume) break;
  }
  if (covered != volume)
    throw InputError(cat(where, ": its shards hold ", covered > volume ? "more than" : cat(covered, " of"), " the ",
                         volume, " elements of shape ", at::IntArrayRef(e.shape)));
  auto describe = [](const ShardRecord& s) { return cat(s.file, " @ ", at::IntArrayRef(s.offsets)); };
  const int dim = slab_dim(e);
  if (dim >= 0) {
    std::vector<const ShardRecord*> order;
    for (const ShardRecord& s : e.shards) order.push_back(&s);
    const auto d = static_cast<size_t>(dim);
    std::sort(order.begin(), order.end(),
              [d](const ShardRecord* a, const ShardRecord* b) { return a->offsets[d] < b->offsets[d]; });
    const ShardRecord* last = nullptr;  // the non-empty shard reaching furthest so far
    for (const ShardRecord* s : order) {
      if (s->shape[d] == 0) continue;
      if (last != nullptr && s->offsets[d] < last->offsets[d] + last->shape[d])
        throw InputError(cat(where, ": shards ", describe(*last), " and ", describe(*s), " overlap"));
      last = s;
    }
    return;
  }
  if (e.shards.size() > kMaxGeneralShards)
    throw InputError(cat(where, ": ", e.shards.size(), " shards that are not slices along one dimension (at most ",
                         kMaxGeneralShards, ")"));
  for (size_t i = 0; i < e.shards.size(); ++i)
    for (size_t j = i + 1; j < e.shards.size(); ++j)
      if (overlap(e.shards[i], e.shards[j]))
        throw InputError(cat(where, ": shards ", describe(e.shards[i]), " and ", describe(e.shards[j]), " overlap"));
}

EntryRecord parse_entry(const json& e, const std::string& where) {
  json_only_keys(e, {"dtype", "shape", "shards"}, where);
  EntryRecord entry;
  entry.dtype = json_string(json_field(e, "dtype", where), cat(where, ": dtype"));
  scalar_type_of(entry.dtype, where);  // refuses an unknown dtype
  entry.shape = json_dims(json_field(e, "shape", where), cat(where, ": shape"), kMaxRank);
  int64_t volume = 0;
  if (!checked_volume(entry.shape, volume))
    throw InputError(cat(where, ": shape ", at::IntArrayRef(entry.shape), " overflows the element count"));
  const json& shards = json_field(e, "shards", where);
  if (!shards.is_array() || shards.empty()) throw InputError(cat(where, ": 'shards' must be a non-empty array"));
  std::set<std::string> files;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string at = cat(where, ", shard ", i);
    const json& s = shards[i];
    json_only_keys(s, {"file", "offsets", "shape", "xxh64"}, at);
    ShardRecord shard;
    shard.file = json_string(json_field(s, "file", at), cat(at, ": file"));
    if (!is_shard_file(shard.file))
      throw InputError(cat(at, ": file '", shard.file, "' is not a shard file name (rank-NNNNN.safetensors)"));
    // A file holds one tensor per key, so one shard of an entry: a repeat is a duplicated shard.
    if (!files.insert(shard.file).second)
      throw InputError(cat(at, ": a second shard in file ", shard.file, " (a duplicated shard)"));
    shard.offsets = json_dims(json_field(s, "offsets", at), cat(at, ": offsets"), kMaxRank);
    shard.shape = json_dims(json_field(s, "shape", at), cat(at, ": shape"), kMaxRank);
    if (shard.offsets.size() != entry.shape.size() || shard.shape.size() != entry.shape.size())
      throw InputError(cat(at, ": offsets ", at::IntArrayRef(shard.offsets), " and shape ",
                           at::IntArrayRef(shard.shape), " must have the entry's rank ", entry.shape.size()));
    for (size_t d = 0; d < entry.shape.size(); ++d)
      // offset + size <= global, without computing a sum that could overflow.
      if (shard.offsets[d] > entry.shape[d] || shard.shape[d] > entry.shape[d] - shard.offsets[d])
        throw InputError(cat(at, ": offsets ", at::IntArrayRef(shard.offsets), " + shape ",
                             at::IntArrayRef(shard.shape), " lie outside the entry's shape ",
                             at::IntArrayRef(entry.shape)));
    shard.xxh64 = json_string(json_field(s, "xxh64", at), cat(at, ": xxh64"));
    if (!is_xxh64(shard.xxh64)) throw InputError(cat(at, ": xxh64 '", shard.xxh64, "' is not 16 hex digits"));
    entry.shards.push_back(std::move(shard));
  }
  check_tiling(entry, volume, where);
  return entry;
}

ValidationRecord parse_validation(const json& v, int64_t checkpoint_step, const std::string& where) {
  if (!v.is_object()) throw InputError(cat(where, ": must be an object"));
  json_only_keys(v, {"step", "metrics"}, where);
  ValidationRecord record;
  // An evaluation after a later step than the checkpoint's cannot describe its weights.
  record.step = json_int(json_field(v, "step", where), cat(where, ".step"), 0, checkpoint_step);
  const json& metrics = json_field(v, "metrics", where);
  if (!metrics.is_object() || metrics.size() > kMaxValidationFigures)
    throw InputError(cat(where, ".metrics: must be an object of at most ", kMaxValidationFigures, " figures"));
  for (const auto& [name, value] : metrics.items()) {
    if (!is_printable_token(name, 128))
      throw InputError(cat(where, ".metrics: name '", name, "' is not printable text of at most 128 characters"));
    try {
      record.metrics[name] = number_from_json(value);
    } catch (const std::invalid_argument& e) {
      throw InputError(cat(where, ".metrics.", name, ": ", e.what()));
    }
  }
  if (!record.metrics.count("val_loss")) throw InputError(cat(where, ".metrics: no val_loss"));
  return record;
}

}  // namespace

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
  if (m.validation) {
    nlohmann::ordered_json figures = nlohmann::ordered_json::object();
    for (const auto& [name, value] : m.validation->metrics) figures[name] = json_number(value);
    j["validation"] = {{"step", m.validation->step}, {"metrics", figures}};
  }
  // Computed on the text as the reader sees it: parsed back, then put in canonical form.
  j["checksum"] = body_checksum(json::parse(j.dump()));
  return j.dump(1);
}

Manifest parse_manifest(const std::string& text, const std::string& where) {
  const json j = parse_untrusted_json(text, where, kMaxDepth);
  if (!j.is_object()) throw InputError(cat(where, ": not a Keel checkpoint manifest (not a JSON object)"));
  const auto format_it = j.find("format");
  if (format_it == j.end() || !format_it->is_string() || format_it->get<std::string>() != "keel-checkpoint")
    throw InputError(cat(where, ": not a Keel checkpoint manifest (no \"format\": \"keel-checkpoint\")"));
  const int64_t version = json_int(json_field(j, "version", where), cat(where, ": version"), 0, kMaxInt64);
  if (version != 1 && version != Manifest::kVersion)
    throw InputError(
        cat(where, ": manifest version ", version, ", this Keel reads versions 1 and ", Manifest::kVersion));
  json_only_keys(j,
                 {"format", "version", "checksum", "step", "run_id", "data_position", "tokens_seen", "lr", "mesh",
                  "model", "clipper", "config", "entries", "validation"},
                 where);
  if (j.contains("checksum")) {
    const std::string recorded = json_string(j.at("checksum"), cat(where, ": checksum"));
    const std::string found = body_checksum(j);
    if (recorded != found)
      throw InputError(cat(where, ": damaged manifest (its checksum is ", found, ", it records ", recorded, ")"));
  } else if (version != 1) {
    throw InputError(cat(where, ": manifest version ", version, " without its checksum"));
  } else {
    // Checkpoints of the release before manifest version 2 carry no checksum: still loadable,
    // with every field below checked, but a changed byte in them may go unnoticed.
    log_warn(cat(where,
                 ": a version-1 manifest without a checksum (saved by an older Keel): its structure is "
                 "checked, its content cannot be"));
  }
  Manifest m;
  m.step = json_int(json_field(j, "step", where), cat(where, ": step"), 0, kMaxStep);
  if (j.contains("run_id")) {  // absent in checkpoints of older versions
    m.run_id = json_string(j.at("run_id"), cat(where, ": run_id"));
    if (!m.run_id.empty() && !is_printable_token(m.run_id, 128))
      throw InputError(cat(where, ": run_id is not printable text of at most 128 characters"));
  }
  m.data_position = json_uint(json_field(j, "data_position", where), cat(where, ": data_position"), kMaxInt64);
  m.tokens_seen = json_int(json_field(j, "tokens_seen", where), cat(where, ": tokens_seen"), 0, kMaxInt64);
  const json& lr = json_field(j, "lr", where);
  if (!lr.is_number() || !std::isfinite(lr.get<double>()) || lr.get<double>() < 0)
    throw InputError(cat(where, ": lr must be a finite number >= 0, found ", lr.dump()));
  m.lr = lr.get<double>();
  const json& mesh = json_field(j, "mesh", where);
  const std::string mesh_where = cat(where, ": mesh");
  json_only_keys(mesh, {"pp", "dp", "ep"}, mesh_where);
  m.pp = static_cast<int>(json_int(json_field(mesh, "pp", mesh_where), cat(mesh_where, ".pp"), 1, kMaxMeshSize));
  m.dp = static_cast<int>(json_int(json_field(mesh, "dp", mesh_where), cat(mesh_where, ".dp"), 1, kMaxMeshSize));
  m.ep = static_cast<int>(json_int(json_field(mesh, "ep", mesh_where), cat(mesh_where, ".ep"), 1, kMaxMeshSize));
  for (const char* section : {"model", "clipper"})
    json_only_keys(json_field(j, section, where), {"plugin", "component"}, cat(where, ": ", section));
  m.model_plugin = plugin_name(j, "model", "plugin", where);
  m.model_component = plugin_name(j, "model", "component", where);
  m.clipper_plugin = plugin_name(j, "clipper", "plugin", where);
  m.clipper_component = plugin_name(j, "clipper", "component", where);
  m.config = json_string(json_field(j, "config", where), cat(where, ": config"));
  const json& entries = json_field(j, "entries", where);
  if (!entries.is_object()) throw InputError(cat(where, ": 'entries' must be an object"));
  for (const auto& [key, e] : entries.items()) {
    if (!is_printable_token(key, 1024))
      throw InputError(cat(where, ": entry key '", key, "' is not printable text of at most 1024 characters"));
    m.entries[key] = parse_entry(e, cat(where, ": entry '", key, "'"));
  }
  if (j.contains("validation")) m.validation = parse_validation(j.at("validation"), m.step, cat(where, ": validation"));
  return m;
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "manifest.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw InputError(cat(path, ": no such file (not a complete Keel checkpoint)"));
  const std::string text = read_input_file(path, "checkpoint manifest", kMaxManifestBytes);
  return parse_manifest(text, path);
}

}  // namespace keel
