// TensorBoard event files byte for byte: CRC-32C against published vectors, records and events
// against what TensorBoard's own protobuf classes and RecordWriter produce for the same values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "metrics/tensorboard_writer.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

std::string hex(std::string_view bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) out += {digits[b >> 4], digits[b & 15]};
  return out;
}

// The events of an event file, each record's length and CRCs checked.
std::vector<std::string> read_events(const std::string& path) {
  const std::string file = test::read_file(path);
  std::vector<std::string> events;
  for (size_t at = 0; at < file.size();) {
    uint64_t length = 0;
    EXPECT_LE(at + 12, file.size());
    std::memcpy(&length, file.data() + at, 8);
    EXPECT_LE(at + 16 + length, file.size());
    std::string record = file.substr(at, 16 + length);
    events.push_back(record.substr(12, length));
    EXPECT_EQ(record, tfrecord(events.back())) << "record " << events.size() << " of " << path;
    at += 16 + length;
  }
  return events;
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// An event with its wall time (field 1, the first 9 bytes) cut off: the part a test can predict.
std::string without_wall_time(const std::string& event) { return event.substr(9); }

TEST(TensorBoard, Crc32cMatchesPublishedVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720, B.4
  std::string ascending;
  for (char c = 0; c < 32; ++c) ascending += c;
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
}

TEST(TensorBoard, ScalarRecordHasTensorBoardsExactBytes) {
  // event_pb2.Event(wall_time=1.5, step=3, summary=Summary(value=[Value(tag="loss",
  // simple_value=2.0)])), framed by tensorboard.summary.writer.record_writer.RecordWriter.
  EXPECT_EQ(hex(scalar_event(1.5, 3, "loss", 2.0f)), "09000000000000f83f10032a0d0a0b0a046c6f73731500000040");
  EXPECT_EQ(hex(tfrecord(scalar_event(1.5, 3, "loss", 2.0f))),
            "1a00000000000000129bd82d09000000000000f83f10032a0d0a0b0a046c6f7373150000004096100c33");
}

TEST(TensorBoard, FileVersionAndSessionStartHaveTensorBoardsExactBytes) {
  EXPECT_EQ(hex(file_version_event(1.5)), "09000000000000f83f1a0d627261696e2e4576656e743a32");
  EXPECT_EQ(hex(session_start_event(1.5, 7)), "09000000000000f83f10073a020801");
}

TEST(TensorBoard, LargeStepsAndLongTagsTakeMultiByteVarints) {
  // Event(wall_time=0.25, step=1 << 40, summary of a 200-character tag): 230 bytes.
  const std::string event = scalar_event(0.25, int64_t{1} << 40, std::string(200, 't'), 1.0f);
  EXPECT_EQ(hex(event.substr(0, 20)), "09000000000000d03f108080808080202ad3010a");
  EXPECT_EQ(event.size(), 230u);
}

TEST(TensorBoard, WriterStartsWithVersionAndSessionThenOneEventPerScalar) {
  test::TempDir dir;
  std::string path;
  {
    TensorBoardWriter writer(dir / "tb", 5);
    path = writer.path();
    writer.write_step(5, {{"loss", 2.0}, {"lr", 1e-3}});
    writer.write_step(6, {{"loss", std::numeric_limits<double>::quiet_NaN()}, {"tokens", -1e300}});
  }
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u) << path;
  std::vector<std::string> events = read_events(path);
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(without_wall_time(events[0]), without_wall_time(file_version_event(0)));
  EXPECT_EQ(without_wall_time(events[1]), without_wall_time(session_start_event(0, 5)));
  EXPECT_EQ(without_wall_time(events[2]), without_wall_time(scalar_event(0, 5, "loss", 2.0f)));
  EXPECT_EQ(without_wall_time(events[3]), without_wall_time(scalar_event(0, 5, "lr", 1e-3f)));
  float written = 0;
  std::memcpy(&written, events[4].data() + events[4].size() - 4, 4);
  EXPECT_TRUE(std::isnan(written));  // non-finite values are written as they are
  EXPECT_EQ(without_wall_time(events[5]),
            without_wall_time(scalar_event(0, 6, "tokens", -std::numeric_limits<float>::infinity())));
}

TEST(TensorBoard, ASecondWriterAddsAFileThatSortsAfterAndKeepsTheFirst) {
  test::TempDir dir;
  TensorBoardWriter first(dir / "tb", 1);
  first.write_step(1, {{"loss", 3.0}});
  const std::string first_bytes = test::read_file(first.path());
  TensorBoardWriter second(dir / "tb", 2);
  second.write_step(2, {{"loss", 2.0}});
  EXPECT_EQ(event_files(dir / "tb"), (std::vector<std::string>{first.path(), second.path()}));
  EXPECT_EQ(test::read_file(first.path()), first_bytes);
}

TEST(TensorBoard, AFolderThatCannotBeMadeIsNamed) {
  test::TempDir dir;
  test::write_file(dir / "file", "not a folder");
  try {
    TensorBoardWriter writer(dir / "file/tb", 1);
    FAIL() << "opened " << writer.path();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir / "file/tb"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace keel
