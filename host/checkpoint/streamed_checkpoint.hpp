// A one-rank checkpoint whose tensors arrive one at a time and are written at once, so that
// writing it never holds more than one tensor in memory (keel-ckpt import). The layout (every
// key, dtype and shape) is fixed up front, which fixes the safetensors header and each
// tensor's place in the file. The folder appears under its name only when complete: until
// commit() it is `step-<N>.partial/`, removed if the writer is destroyed uncommitted.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"

namespace keel {

class StreamedCheckpoint {
 public:
  /// Starts checkpoint `step` under `root` (created if missing) holding `layout`; refuses when
  /// `root`/step-<step> already exists (nothing is replaced).
  StreamedCheckpoint(const std::string& root, int64_t step, std::vector<SafetensorsLayout> layout);
  /// Removes the partial folder unless committed.
  ~StreamedCheckpoint();
  StreamedCheckpoint(const StreamedCheckpoint&) = delete;
  StreamedCheckpoint& operator=(const StreamedCheckpoint&) = delete;

  /// Writes `value` (converted to the layout's dtype) as `key`; throws InputError when `key` is
  /// not in the layout, was written already or has another shape.
  void write(const std::string& key, const at::Tensor& value);
  /// The layout's keys not written yet, sorted.
  std::vector<std::string> missing() const;
  /// Bytes written so far.
  uint64_t bytes_written() const { return bytes_written_; }
  /// Completes the checkpoint: every key written (else InputError naming them), data synced,
  /// `header` (its entries filled here) as the manifest, the folder renamed into place and
  /// `root`/latest pointed at it. Returns the checkpoint folder.
  std::string commit(Manifest header);

 private:
  struct Slot {
    SafetensorsLayout layout;
    uint64_t offset = 0;  // of its data in the file
    std::string xxh64;    // set once written
  };

  std::string root_, partial_, final_, file_;
  int fd_ = -1;
  uint64_t data_start_ = 0, bytes_written_ = 0;
  std::map<std::string, Slot> slots_;
  bool committed_ = false;
};

}  // namespace keel
