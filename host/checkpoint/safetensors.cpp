#include "checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
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
  static const std::map<std::string, at::ScalarType> table = {
      {"F32", at::kFloat}, {"F64", at::kDouble}, {"BF16", at::kBFloat16}, {"F16", at::kHalf}, {"I64", at::kLong},
      {"I32", at::kInt},   {"I16", at::kShort},  {"I8", at::kChar},       {"U8", at::kByte},  {"BOOL", at::kBool}};
  auto it = table.find(code);
  if (it == table.end()) throw InputError(cat(where, ": unsupported dtype '", code, "'"));
  return it->second;
}

}  // namespace

std::string safetensors_dtype(at::ScalarType type) { return dtype_code(type); }

at::ScalarType scalar_type_of(const std::string& code, const std::string& where) { return dtype_from(code, where); }

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata, bool durable) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    auto bytes = static_cast<uint64_t>(c.nbytes());
    header[name] = {
        {"dtype", dtype_code(c.scalar_type())}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    cpu.push_back(c);
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  uint64_t header_size = text.size();
  std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(cat("cannot write ", partial));
    out.write(reinterpret_cast<const char*>(&header_size), sizeof(header_size));  // little-endian hosts only
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const at::Tensor& c : cpu)
      out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
    out.flush();
    if (!out) throw std::runtime_error(cat("cannot write ", partial, " (disk full?)"));
  }
  if (durable) sync_file(partial);
  std::filesystem::rename(partial, path);
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(cat("cannot open ", path));
  in.seekg(0, std::ios::end);
  auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t header_size = 0;
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(&header_size), 8) || header_size > file_size - 8)
    throw InputError(cat(path, ": truncated safetensors header"));
  std::string text(header_size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_size));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(cat(path, ": bad safetensors header: ", e.what()));
  }
  SafetensorsFile file;
  uint64_t data_start = 8 + header_size;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : entry.items()) file.metadata[k] = v.get<std::string>();
      continue;
    }
    std::string where = cat(path, ": ", name);
    try {
      at::ScalarType dtype = dtype_from(entry.at("dtype").get<std::string>(), where);
      std::vector<int64_t> shape = entry.at("shape").get<std::vector<int64_t>>();
      auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
      if (offsets.size() != 2 || offsets[1] - offsets[0] != static_cast<uint64_t>(t.nbytes()) ||
          data_start + offsets[1] > file_size)
        throw InputError(cat(where, ": data offsets do not match its shape or the file is truncated"));
      in.seekg(static_cast<std::streamoff>(data_start + offsets[0]));
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
      file.tensors[name] = t;
    } catch (const nlohmann::json::exception& e) {
      throw InputError(cat(where, ": bad entry: ", e.what()));
    }
  }
  return file;
}

MappedSafetensors::MappedSafetensors(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw InputError(cat("cannot open ", path, ": ", std::strerror(errno)));
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw InputError(cat("cannot map ", path, ": ", std::strerror(errno)));
  }
  const auto* base = static_cast<const char*>(map_);
  uint64_t header_size = 0;
  if (size_ < 8) throw InputError(cat(path, ": truncated safetensors file (", size_, " bytes)"));
  std::memcpy(&header_size, base, 8);
  if (header_size > size_ - 8) throw InputError(cat(path, ": truncated safetensors header"));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base + 8, base + 8 + header_size);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(cat(path, ": bad safetensors header: ", e.what()));
  }
  const uint64_t data_start = 8 + header_size;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    std::string where = cat(path, ": ", name);
    try {
      Entry entry;
      entry.dtype = dtype_from(e.at("dtype").get<std::string>(), where);
      entry.shape = e.at("shape").get<std::vector<int64_t>>();
      auto offsets = e.at("data_offsets").get<std::vector<uint64_t>>();
      uint64_t numel = 1;
      for (int64_t d : entry.shape) numel *= static_cast<uint64_t>(d);
      if (offsets.size() != 2 || offsets[1] < offsets[0] ||
          offsets[1] - offsets[0] != numel * c10::elementSize(entry.dtype))
        throw InputError(cat(where, ": data offsets do not match its shape"));
      entry.begin = data_start + offsets[0];
      entry.end = data_start + offsets[1];
      if (entry.end > size_)
        throw InputError(cat(where, ": the file is truncated (", size_, " bytes, the tensor ends at ", entry.end, ")"));
      entries_[name] = std::move(entry);
    } catch (const nlohmann::json::exception& ex) {
      throw InputError(cat(where, ": bad entry: ", ex.what()));
    }
  }
}

MappedSafetensors::~MappedSafetensors() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

const MappedSafetensors::Entry& MappedSafetensors::entry(const std::string& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) throw InputError(cat(path_, ": no tensor '", key, "'"));
  return it->second;
}

at::Tensor MappedSafetensors::view(const std::string& key) const {
  const Entry& e = entry(key);
  // The mapping is read-only; views are only ever copied from.
  void* data = static_cast<char*>(map_) + e.begin;
  return at::from_blob(data, e.shape, at::TensorOptions().dtype(e.dtype));
}

std::pair<const void*, size_t> MappedSafetensors::bytes(const std::string& key) const {
  const Entry& e = entry(key);
  return {static_cast<const char*>(map_) + e.begin, static_cast<size_t>(e.end - e.begin)};
}

}  // namespace keel
