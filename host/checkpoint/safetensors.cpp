#include "checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "checkpoint/strict_json.hpp"
#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/text.hpp"

namespace keel {

namespace {

const char* dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "F32";
    case at::kDouble:
      return "F64";
    case at::kBFloat16:
      return "BF16";
    case at::kHalf:
      return "F16";
    case at::kLong:
      return "I64";
    case at::kInt:
      return "I32";
    case at::kShort:
      return "I16";
    case at::kChar:
      return "I8";
    case at::kByte:
      return "U8";
    case at::kBool:
      return "BOOL";
    case at::kFloat8_e4m3fn:
      return "F8_E4M3";
    case at::kFloat8_e5m2:
      return "F8_E5M2";
    default:
      throw std::invalid_argument(cat("safetensors: unsupported dtype ", t));
  }
}

at::ScalarType dtype_from(const std::string& code, const std::string& where);

void sync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(cat("cannot sync ", path, ": ", std::strerror(errno)));
  }
  ::close(fd);
}

at::ScalarType dtype_from(const std::string& code, const std::string& where) {
  static const std::map<std::string, at::ScalarType> table = {{"F32", at::kFloat},
                                                              {"F64", at::kDouble},
                                                              {"BF16", at::kBFloat16},
                                                              {"F16", at::kHalf},
                                                              {"I64", at::kLong},
                                                              {"I32", at::kInt},
                                                              {"I16", at::kShort},
                                                              {"I8", at::kChar},
                                                              {"U8", at::kByte},
                                                              {"BOOL", at::kBool},
                                                              {"F8_E4M3", at::kFloat8_e4m3fn},
                                                              {"F8_E5M2", at::kFloat8_e5m2}};
  auto it = table.find(code);
  if (it == table.end()) throw InputError(cat(where, ": unsupported dtype '", code, "'"));
  return it->second;
}

}  // namespace

std::string safetensors_dtype(at::ScalarType type) { return dtype_code(type); }

at::ScalarType scalar_type_of(const std::string& code, const std::string& where) { return dtype_from(code, where); }

std::string safetensors_header(const std::vector<SafetensorsLayout>& layout,
                               const std::map<std::string, std::string>& metadata, std::vector<uint64_t>& offsets) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  offsets.clear();
  uint64_t offset = 0;
  for (const SafetensorsLayout& entry : layout) {
    uint64_t bytes = c10::elementSize(entry.dtype);
    for (int64_t d : entry.shape) bytes *= static_cast<uint64_t>(d);
    header[entry.name] = {
        {"dtype", dtype_code(entry.dtype)}, {"shape", entry.shape}, {"data_offsets", {offset, offset + bytes}}};
    offsets.push_back(offset);
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  uint64_t header_size = text.size();
  std::string out(reinterpret_cast<const char*>(&header_size), sizeof(header_size));  // little-endian hosts only
  return out + text;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata, bool durable) {
  std::vector<SafetensorsLayout> layout;
  std::vector<at::Tensor> cpu;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    layout.push_back({name, c.scalar_type(), c.sizes().vec()});
    cpu.push_back(c);
  }
  std::vector<uint64_t> offsets;
  const std::string header = safetensors_header(layout, metadata, offsets);
  std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(cat("cannot write ", partial));
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const at::Tensor& c : cpu)
      out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
    out.flush();
    if (!out) throw std::runtime_error(cat("cannot write ", partial, " (disk full?)"));
  }
  if (durable) sync_file(partial);
  std::filesystem::rename(partial, path);
}

namespace {

// Hugging Face's reader refuses larger headers too; ours are a few KiB per tensor.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr size_t kMaxRank = 16;

struct HeaderEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the start of the data section
};

struct Header {
  std::vector<HeaderEntry> entries;
  std::map<std::string, std::string> metadata;
};

// The header's length from the file's first 8 bytes, checked against the file's size.
uint64_t header_size_of(const std::string& path, const unsigned char* first8, uint64_t file_size) {
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | first8[i];  // little-endian
  if (header_size > file_size - 8)
    throw InputError(cat(path, ": truncated safetensors header (", header_size, " bytes claimed, the file has ",
                         file_size - 8, " after the length)"));
  if (header_size > kMaxHeaderBytes)
    throw InputError(cat(path, ": safetensors header of ", header_size, " bytes (at most ", kMaxHeaderBytes, ")"));
  return header_size;
}

// Every check made before a byte of tensor data is touched or a tensor allocated: the entry's
// byte count is computed without overflow from its shape and dtype and must equal its offsets'
// span, which must lie inside the data section; the tensors must tile the data section exactly
// (no overlap, no hole), as the format requires.
Header parse_header(const std::string& path, std::string_view text, uint64_t data_size) {
  nlohmann::json j = parse_untrusted_json(text, cat(path, ": safetensors header"), 8);
  if (!j.is_object()) throw InputError(cat(path, ": safetensors header is not a JSON object"));
  Header header;
  for (const auto& [name, e] : j.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) throw InputError(cat(path, ": __metadata__ is not an object of strings"));
      for (const auto& [k, v] : e.items()) header.metadata[k] = json_string(v, cat(path, ": __metadata__.", k));
      continue;
    }
    const std::string where = cat(path, ": ", name);
    json_only_keys(e, {"dtype", "shape", "data_offsets"}, where);
    HeaderEntry entry;
    entry.name = name;
    entry.dtype = dtype_from(json_string(json_field(e, "dtype", where), cat(where, ": dtype")), where);
    entry.shape = json_dims(json_field(e, "shape", where), cat(where, ": shape"), kMaxRank);
    const nlohmann::json& offsets = json_field(e, "data_offsets", where);
    if (!offsets.is_array() || offsets.size() != 2) throw InputError(cat(where, ": data_offsets must be [begin, end]"));
    entry.begin = json_uint(offsets[0], cat(where, ": data_offsets[0]"), UINT64_MAX);
    entry.end = json_uint(offsets[1], cat(where, ": data_offsets[1]"), UINT64_MAX);
    int64_t numel = 0;
    uint64_t bytes = 0;
    if (!checked_volume(entry.shape, numel) ||
        __builtin_mul_overflow(static_cast<uint64_t>(numel), c10::elementSize(entry.dtype), &bytes) ||
        bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw InputError(cat(where, ": shape ", at::IntArrayRef(entry.shape), " of ", dtype_code(entry.dtype),
                           " overflows the element count"));
    if (entry.begin > entry.end || entry.end > data_size)
      throw InputError(cat(where, ": data_offsets [", entry.begin, ", ", entry.end, "] are not inside the data (",
                           data_size, " bytes)"));
    if (entry.end - entry.begin != bytes)
      throw InputError(cat(where, ": data_offsets span ", entry.end - entry.begin, " bytes, its shape ",
                           at::IntArrayRef(entry.shape), " of ", dtype_code(entry.dtype), " needs ", bytes));
    header.entries.push_back(std::move(entry));
  }
  std::vector<const HeaderEntry*> order;
  for (const HeaderEntry& e : header.entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const HeaderEntry* a, const HeaderEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t next = 0;
  for (const HeaderEntry* e : order) {
    if (e->begin != next)
      throw InputError(cat(path, ": tensor '", e->name, "' starts at byte ", e->begin, " of the data, ",
                           e->begin < next ? "inside the tensor before it" : "after a hole", " (expected ", next, ")"));
    next = e->end;
  }
  if (next != data_size)
    throw InputError(cat(path, ": the tensors cover ", next, " of the ", data_size, " data bytes"));
  return header;
}

// A failure of LibTorch on a shape already validated (out of memory, mostly) as a clean message.
[[noreturn]] void rethrow_as_input_error(const std::string& where) {
  try {
    throw;
  } catch (const c10::Error& e) {
    throw InputError(cat(where, ": ", e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    throw InputError(cat(where, ": out of memory"));
  }
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path, const std::string& source) {
  const SafetensorsReader reader(path, source);
  SafetensorsFile file;
  file.metadata = reader.metadata();
  for (const std::string& key : reader.keys()) file.tensors[key] = reader.read(key);
  return file;
}

SafetensorsReader::SafetensorsReader(const std::string& path, const std::string& source)
    : path_(path), source_(source) {
  const InputFile file(path, source);
  identity_ = file.identity();
  const uint64_t size = file.size();
  if (size < 8) throw InputError(cat(path, ": truncated safetensors file (", size, " bytes)"));
  unsigned char first8[8];
  file.read_at(0, first8, 8);
  const uint64_t header_size = header_size_of(path, first8, size);
  std::string text(header_size, '\0');
  file.read_at(8, text.data(), text.size());
  const uint64_t data_start = 8 + header_size;
  Header header = parse_header(path, text, size - data_start);
  metadata_ = std::move(header.metadata);
  for (HeaderEntry& e : header.entries)
    entries_[e.name] = Entry{e.dtype, std::move(e.shape), data_start + e.begin, data_start + e.end};
}

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) throw InputError(cat(path_, ": no tensor '", key, "'"));
  return it->second;
}

at::Tensor SafetensorsReader::read(const std::string& key) const {
  const Entry& e = entry(key);
  const std::string where = cat(path_, ": ", key);
  at::Tensor t;
  try {
    t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));  // at most the file's size
  } catch (...) {
    rethrow_as_input_error(where);
  }
  const InputFile file(path_, source_);
  file.require_identity(identity_);
  file.read_at(e.begin, t.data_ptr(), static_cast<size_t>(e.end - e.begin));
  return t;
}

uint64_t SafetensorsReader::byte_size(const std::string& key) const {
  const Entry& e = entry(key);
  return e.end - e.begin;
}

std::vector<std::string> SafetensorsReader::keys() const {
  std::vector<std::string> out;
  for (const auto& [key, e] : entries_) out.push_back(key);
  return out;
}

}  // namespace keel
