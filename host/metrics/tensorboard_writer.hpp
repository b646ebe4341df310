// TensorBoard event files: a run's logged scalars as
// <dir>/events.out.tfevents.<unix seconds>.<hostname>, which the `tensorboard` viewer reads.
//
// The format is written by hand: a file is a sequence of TFRecords, each holding one
// serialized `Event` protobuf, and Keel needs five of its fields. Debian packages no C++
// TensorBoard writer (nor TensorFlow, whose SummaryFileWriter is the reference one), and
// protobuf for five fields would add a build dependency for every user. The layout is TensorBoard's
// (tensorboard/compat/proto/event.proto, summary.proto; the TFRecord framing of
// tensorflow/core/lib/io/record_writer.cc); tests read what this writes with TensorBoard's own
// reader.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace keel {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `bytes`, as TFRecords use it.
uint32_t crc32c(std::string_view bytes);

/// One TFRecord: `data`'s length (uint64, little endian), the masked CRC-32C of those 8 bytes,
/// `data`, and the masked CRC-32C of `data`.
std::string tfrecord(std::string_view data);

/// A serialized Event{wall_time, step, summary{value{tag, simple_value}}}.
std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

/// A serialized Event{wall_time, file_version = "brain.Event:2"}: the first record of a file.
std::string file_version_event(double wall_time);

/// A serialized Event{wall_time, step, session_log{status = START}}. TensorBoard drops the
/// events it has read with a step at or after `step` when it meets one: a resumed run's file
/// supersedes what an earlier run logged past the checkpoint it resumed from.
std::string session_start_event(double wall_time, int64_t step);

/// Writes one run's scalars to a new event file.
class TensorBoardWriter {
 public:
  /// Opens a new event file in `dir` (created if missing; files already there are kept, since
  /// TensorBoard merges the files of one folder) for a run whose first step is `first_step`.
  /// Throws std::runtime_error naming the folder or file when it cannot.
  TensorBoardWriter(const std::string& dir, int64_t first_step);
  /// Writes one event per scalar of step `step` and flushes, so a run that crashes keeps what it
  /// logged. Values are stored as float32, non-finite ones as they are. Throws
  /// std::runtime_error naming the file when writing fails.
  void write_step(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  /// The event file.
  const std::string& path() const { return path_; }

 private:
  void write_records(const std::string& records);

  std::string path_;
  std::ofstream out_;
};

}  // namespace keel
