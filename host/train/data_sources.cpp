#include "train/data_sources.hpp"

#include "common/text.hpp"
#include "data/mixture_source.hpp"
#include "data/synthetic_source.hpp"
#include "data/token_file.hpp"

namespace keel {

namespace {

void check_vocabulary(Job& job, const TokenSource& source, const std::string& section, const std::string& key) {
  const int64_t vocab = job.model().info().vocab_size;
  if (source.vocab_size() > vocab)
    ConfigSection(job.tree(), section)
        .invalid(key, cat("the token file's vocabulary (", source.vocab_size(), ") exceeds the model's (", vocab, ")"));
}

TokenFileShare share(const JobConfig& c, bool validation) {
  TokenFileShare s;
  s.held_out = c.validation.split;
  s.block_tokens = c.validation.split_block;
  s.split_seed = c.data.seed;
  s.validation = validation;
  return s;
}

std::string eos_text(const std::optional<int64_t>& eos) {
  return eos ? cat("EOS id ", *eos) : std::string("no EOS id");
}

// [[data.sources]] as one mixture, each file one side of the split (`validation`) or all of it;
// `only` keeps one source (validation.source). Every file's vocabulary must fit the model and
// every file must record the first one's EOS id: they come from one tokenizer.
std::unique_ptr<TokenSource> open_mixture(Job& job, bool validation, const std::string& only = "") {
  const JobConfig& c = job.config();
  std::vector<MixturePart> parts;
  for (size_t i = 0; i < c.data.sources.size(); ++i) {
    const DataSourceSpec& spec = c.data.sources[i];
    const std::string section = cat("data.sources[", i, "]");
    auto source = std::make_unique<TokenFileSource>(spec.path, c.data.seed, share(c, validation), section + ".path");
    check_vocabulary(job, *source, section, "path");
    if (!parts.empty() && source->eos_id() != parts.front().source->eos_id())
      ConfigSection(job.tree(), section)
          .invalid("path", cat(spec.path, " records ", eos_text(source->eos_id()), ", source '", parts.front().name,
                               "' (", c.data.sources.front().path, ") ", eos_text(parts.front().source->eos_id()),
                               ": every source must come from one tokenizer"));
    parts.push_back({spec.name, spec.weight, std::move(source)});
  }
  if (!only.empty()) {
    std::erase_if(parts, [&](const MixturePart& p) { return p.name != only; });
    return std::move(parts.front().source);
  }
  return std::make_unique<MixtureSource>(std::move(parts), c.data.seed);
}

}  // namespace

std::unique_ptr<TokenSource> open_training_source(Job& job) {
  const JobConfig& c = job.config();
  const int64_t vocab = job.model().info().vocab_size;
  if (!c.data.sources.empty()) return open_mixture(job, /*validation=*/false);
  if (c.data.source == "tokens") {
    auto source = std::make_unique<TokenFileSource>(c.data.path, c.data.seed, share(c, /*validation=*/false));
    check_vocabulary(job, *source, "data", "path");
    return source;
  }
  if (c.data.branching > vocab)
    ConfigSection(job.tree(), "data")
        .invalid("branching", cat("must not exceed the model's vocabulary (", vocab, "), got ", c.data.branching));
  return std::make_unique<SyntheticSource>(vocab, c.data.branching, c.data.seed);
}

std::unique_ptr<TokenSource> open_validation_source(Job& job, const TokenSource& training) {
  const JobConfig& c = job.config();
  std::unique_ptr<TokenSource> source;
  if (!c.validation.data.empty()) {
    source = std::make_unique<TokenFileSource>(c.validation.data, c.data.seed, "validation.data");
    check_vocabulary(job, *source, "validation", "data");
    if (source->eos_id() != training.eos_id())
      ConfigSection(job.tree(), "validation")
          .invalid("data",
                   cat("records EOS id ", source->eos_id() ? std::to_string(*source->eos_id()) : std::string("(none)"),
                       ", the training data ", data_origin(c, /*validation=*/false), " records ",
                       training.eos_id() ? std::to_string(*training.eos_id()) : std::string("(none)"),
                       ": both must come from one tokenizer"));
    return source;
  }
  if (!c.data.sources.empty()) return open_mixture(job, /*validation=*/true, c.validation.source);
  if (c.data.source == "tokens")
    return std::make_unique<TokenFileSource>(c.data.path, c.data.seed, share(c, /*validation=*/true));
  return std::make_unique<SyntheticSource>(job.model().info().vocab_size, c.data.branching, c.data.seed,
                                           /*validation=*/true);
}

std::optional<int64_t> document_end(Job& job, const TokenSource& source) {
  const DataSection& data = job.config().data;
  if (data.documents == "none") return std::nullopt;
  const std::optional<int64_t> eos = source.eos_id();
  if (data.documents == "eos" && !eos)
    ConfigSection(job.tree(), "data")
        .invalid("documents", cat("\"eos\" needs an EOS id, and ", data_origin(job.config(), false),
                                  " has none (rebuild it with keel-data build --tokenizer, or set data.documents = "
                                  "\"none\")"));
  if (data.attention == "block_causal" && !eos)
    ConfigSection(job.tree(), "data")
        .invalid("attention",
                 cat("\"block_causal\" needs documents, and ", data_origin(job.config(), false),
                     " records no EOS id (rebuild it with keel-data build --tokenizer, or use \"causal\")"));
  return eos;
}

std::string data_origin(const JobConfig& c, bool validation) {
  if (validation && !c.validation.data.empty()) return cat("validation.data (", c.validation.data, ")");
  if (validation && !c.validation.source.empty())
    return cat("validation.source (", c.validation.source, ", held out of data.sources)");
  if (!c.data.sources.empty()) return cat("data.sources (", c.data.sources.size(), " token files)");
  if (c.data.source == "tokens") return cat("data.path (", c.data.path, ")");
  return "synthetic data";
}

}  // namespace keel
