// The token sources of a run, opened from [data] and [validation]: the training stream, the
// held-out stream evaluations draw from, and the document end both mask labels at.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "data/token_source.hpp"
#include "train/job.hpp"

namespace keel {

/// The training source: data.path (without the share validation.split holds out) or the
/// synthetic process. Refuses a vocabulary larger than the model's, naming the key.
std::unique_ptr<TokenSource> open_training_source(Job& job);
/// The source evaluations draw from: validation.data, the held-out share of data.path, or the
/// synthetic samples training never draws. Refuses a vocabulary larger than the model's and an
/// EOS id that differs from the training source's, naming the keys.
std::unique_ptr<TokenSource> open_validation_source(Job& job, const TokenSource& training);
/// The EOS id after which labels are ignored, from data.documents and what `source` records;
/// refuses data.attention = "block_causal" when there is none.
std::optional<int64_t> document_end(Job& job, const TokenSource& source);
/// Where the training (or the validation) batches come from, for messages: "data.path (FILE)",
/// "validation.data (FILE)" or "synthetic data".
std::string data_origin(const JobConfig& c, bool validation);

}  // namespace keel
