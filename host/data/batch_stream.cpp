#include "data/batch_stream.hpp"

#include <vector>

namespace keel {

BatchStream::BatchStream(const TokenSource& source, int64_t seq_len, int64_t global_batch, int dp, int dp_index)
    : source_(source),
      seq_len_(seq_len),
      global_batch_(global_batch),
      local_batch_(global_batch / dp),
      dp_index_(dp_index) {}

Batch BatchStream::next() {
  Batch batch;
  batch.tokens = at::empty({local_batch_, seq_len_}, at::kLong);
  batch.labels = at::empty({local_batch_, seq_len_}, at::kLong);
  std::vector<int64_t> sample(static_cast<size_t>(seq_len_ + 1));
  int64_t* tokens = batch.tokens.data_ptr<int64_t>();
  int64_t* labels = batch.labels.data_ptr<int64_t>();
  for (int64_t b = 0; b < local_batch_; ++b) {
    uint64_t index = position_ + static_cast<uint64_t>(dp_index_ * local_batch_ + b);
    source_.sample(index, seq_len_ + 1, sample.data());
    for (int64_t t = 0; t < seq_len_; ++t) {
      tokens[b * seq_len_ + t] = sample[static_cast<size_t>(t)];
      labels[b * seq_len_ + t] = sample[static_cast<size_t>(t + 1)];
    }
  }
  batch.labelled_tokens = local_batch_ * seq_len_;
  position_ += static_cast<uint64_t>(global_batch_);
  return batch;
}

}  // namespace keel
