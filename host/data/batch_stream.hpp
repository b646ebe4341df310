// Cuts a source's global stream into steps: step k consumes samples
// [k * global_batch, (k + 1) * global_batch); data-parallel rank r takes its contiguous share.
// The position is a count of global samples, so a resume at another dp continues the stream.
// With documents marked by an EOS id, no label crosses a document end: the label of a position
// holding the EOS (its next token starts another document) is the ignore index.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "data/token_source.hpp"

namespace keel {

/// One rank's batch of a step: tokens and next-token labels, [local_batch, seq_len] int64 on CPU.
struct Batch {
  at::Tensor tokens;
  at::Tensor labels;
  int64_t labelled_tokens = 0;  ///< labels != ignore index, this rank
};

/// The per-rank view of the global sample stream.
class BatchStream {
 public:
  /// `document_end`: the EOS id whose next-token labels are ignored (none: every label counts).
  BatchStream(const TokenSource& source, int64_t seq_len, int64_t global_batch, int dp, int dp_index,
              std::optional<int64_t> document_end = std::nullopt);
  /// The batch of the next step, advancing the position by one global batch.
  Batch next();
  /// Global samples consumed so far.
  uint64_t position() const { return position_; }
  /// Moves to a global sample position (a multiple of the global batch).
  void seek(uint64_t position) { position_ = position; }

 private:
  const TokenSource& source_;
  int64_t seq_len_, global_batch_, local_batch_;
  int dp_index_;
  std::optional<int64_t> document_end_;
  uint64_t position_ = 0;
};

}  // namespace keel
