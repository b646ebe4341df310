#include "data/batch_stream.hpp"

#include <keel/keel.h>

#include <vector>

namespace keel {

BatchStream::BatchStream(const TokenSource& source, int64_t seq_len, int64_t global_batch, int dp, int dp_index,
                         std::optional<int64_t> document_end)
    : source_(source),
      seq_len_(seq_len),
      global_batch_(global_batch),
      local_batch_(global_batch / dp),
      dp_index_(dp_index),
      document_end_(document_end) {}

Batch BatchStream::next() {
  Batch batch;
  batch.tokens = at::empty({local_batch_, seq_len_}, at::kLong);
  batch.labels = at::empty({local_batch_, seq_len_}, at::kLong);
  std::vector<int64_t> sample(static_cast<size_t>(seq_len_ + 1));
  int64_t* tokens = batch.tokens.data_ptr<int64_t>();
  int64_t* labels = batch.labels.data_ptr<int64_t>();
  int64_t labelled = 0;
  for (int64_t b = 0; b < local_batch_; ++b) {
    uint64_t index = position_ + static_cast<uint64_t>(dp_index_ * local_batch_ + b);
    source_.sample(index, seq_len_ + 1, sample.data());
    for (int64_t t = 0; t < seq_len_; ++t) {
      const int64_t token = sample[static_cast<size_t>(t)];
      // The EOS itself is predicted (it ends its document); what follows it is not.
      const bool document_ends = document_end_ && token == *document_end_;
      tokens[b * seq_len_ + t] = token;
      labels[b * seq_len_ + t] = document_ends ? KEEL_IGNORE_INDEX : sample[static_cast<size_t>(t + 1)];
      labelled += document_ends ? 0 : 1;
    }
  }
  batch.labelled_tokens = labelled;
  position_ += static_cast<uint64_t>(global_batch_);
  return batch;
}

}  // namespace keel
