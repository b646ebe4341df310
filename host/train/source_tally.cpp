#include "train/source_tally.hpp"

#include "data/mixture_source.hpp"

namespace keel {

SourceTally::SourceTally(const TokenSource& source, int64_t seq_len)
    : mixture_(dynamic_cast<const MixtureSource*>(&source)), seq_len_(seq_len) {
  if (mixture_ == nullptr) return;
  names_ = mixture_->part_names();
  samples_.assign(names_.size(), 0);
}

std::map<std::string, double> SourceTally::tokens_until(uint64_t position) {
  std::map<std::string, double> out;
  if (mixture_ == nullptr) return out;
  // A draw is a few integer operations: a resumed run recounts 10^8 samples in well under a second.
  for (; counted_ < position; ++counted_) ++samples_[mixture_->part_of(counted_)];
  for (size_t k = 0; k < names_.size(); ++k)
    out[names_[k]] = static_cast<double>(samples_[k]) * static_cast<double>(seq_len_);
  return out;
}

}  // namespace keel
