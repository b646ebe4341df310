#include "metrics/tensorboard_writer.hpp"

#include <unistd.h>

#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "common/text.hpp"

namespace keel {

namespace {

static_assert(std::endian::native == std::endian::little, "event files are little endian; add byte swaps");

constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}

// TFRecord stores CRCs rotated and offset, so that a CRC of data that holds CRCs stays strong.
uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

template <class T>
void append_raw(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

// Protobuf wire format: a key is (field number << 3 | wire type); varints are base 128, low
// group first.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void append_varint(std::string& out, uint64_t value) {
  for (; value >= 0x80; value >>= 7) out.push_back(static_cast<char>((value & 0x7f) | 0x80));
  out.push_back(static_cast<char>(value));
}

void append_key(std::string& out, uint32_t field, WireType type) { append_varint(out, field << 3 | type); }

void append_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  append_key(out, field, kLengthDelimited);
  append_varint(out, bytes.size());
  out.append(bytes);
}

// Event's fields (tensorboard/compat/proto/event.proto).
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7;
// Summary.value, Summary.Value.tag and .simple_value (summary.proto); SessionLog.status.
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2, kSessionLogStatus = 1;
constexpr uint64_t kSessionLogStart = 1;

std::string event_header(double wall_time, int64_t step) {
  std::string event;
  append_key(event, kWallTime, kFixed64);
  append_raw(event, wall_time);
  if (step != 0) {  // proto3 leaves default values out
    append_key(event, kStep, kVarint);
    append_varint(event, static_cast<uint64_t>(step));
  }
  return event;
}

// A finite double beyond float's range is undefined to convert: it becomes an infinity of its sign.
float to_float(double value) {
  constexpr float infinity = std::numeric_limits<float>::infinity();
  if (std::isfinite(value) && std::abs(value) > std::numeric_limits<float>::max())
    return value > 0 ? infinity : -infinity;
  return static_cast<float>(value);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// events.out.tfevents.<unix seconds>.<hostname>, with ".1", ".2", ... when taken (a resumed
// run started within the same second): the suffix sorts after, and TensorBoard reads a folder's
// files in name order, so a resumed run's session start comes after what it supersedes.
std::filesystem::path new_event_file(const std::filesystem::path& dir) {
  char host[256] = {};
  std::string hostname = ::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0' ? host : "keel";
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string base = cat("events.out.tfevents.", seconds, ".", hostname);
  std::filesystem::path path = dir / base;
  for (int n = 1; std::filesystem::exists(path); ++n) path = dir / cat(base, ".", n);
  return path;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  static constexpr std::array<uint32_t, 256> table = crc32c_table();
  uint32_t crc = 0xffffffffu;
  for (unsigned char byte : bytes) crc = table[(crc ^ byte) & 0xffu] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

std::string tfrecord(std::string_view data) {
  std::string record;
  append_raw(record, static_cast<uint64_t>(data.size()));
  append_raw(record, masked_crc32c(record));
  record.append(data);
  append_raw(record, masked_crc32c(data));
  return record;
}

std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  append_bytes(summary_value, kValueTag, tag);
  append_key(summary_value, kValueSimpleValue, kFixed32);
  append_raw(summary_value, value);
  std::string summary;
  append_bytes(summary, kSummaryValue, summary_value);
  std::string event = event_header(wall_time, step);
  append_bytes(event, kSummary, summary);
  return event;
}

std::string file_version_event(double wall_time) {
  std::string event = event_header(wall_time, 0);
  append_bytes(event, kFileVersion, "brain.Event:2");
  return event;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string session_log;
  append_key(session_log, kSessionLogStatus, kVarint);
  append_varint(session_log, kSessionLogStart);
  std::string event = event_header(wall_time, step);
  append_bytes(event, kSessionLog, session_log);
  return event;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error(cat("cannot create the TensorBoard folder ", dir, ": ", ec.message()));
  path_ = new_event_file(dir).string();
  out_.open(path_, std::ios::binary);
  if (!out_) throw std::runtime_error(cat("cannot open ", path_, " for writing TensorBoard events"));
  const double now = now_seconds();
  write_records(tfrecord(file_version_event(now)) + tfrecord(session_start_event(now, first_step)));
}

void TensorBoardWriter::write_step(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  const double now = now_seconds();
  std::string records;
  for (const auto& [tag, value] : scalars) records += tfrecord(scalar_event(now, step, tag, to_float(value)));
  write_records(records);
}

void TensorBoardWriter::write_records(const std::string& records) {
  out_.write(records.data(), static_cast<std::streamsize>(records.size()));
  out_.flush();
  if (!out_) throw std::runtime_error(cat("cannot write TensorBoard events to ", path_));
}

}  // namespace keel
