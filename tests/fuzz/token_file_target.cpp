// Fuzz target: a token file (its KEELTOK1 or KEELTOK2 header and the tokens it promises),
// opened as training opens data.path and sampled as the batch stream samples it.
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <vector>

#include "data/token_file.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = keel::fuzz::write_file("tokens.bin", data, size);
  keel::fuzz::guarded("token_file", [&] {
    keel::TokenFileSource source(path, /*seed=*/7);
    source.describe();
    // What training relies on once the file opened: an EOS id is a token of the vocabulary,
    // and there are no more documents than tokens.
    const std::optional<int64_t> eos = source.eos_id();
    if ((eos && (*eos < 0 || *eos >= source.vocab_size())) || source.num_documents() > source.num_tokens())
      throw std::logic_error("an accepted header breaks its own invariants");
    // A window of 1 token and one of up to 64 (the whole file when it is shorter), at a few
    // indices: every offset a sample may start at is drawn from (seed, index).
    const int64_t longest = static_cast<int64_t>(std::min<uint64_t>(source.num_tokens(), 64));
    std::vector<int64_t> out(64);
    for (int64_t length : {int64_t{1}, longest})
      for (uint64_t index = 0; index < 4 && length > 0; ++index) source.sample(index, length, out.data());
    // The held-out split (validation.split) of the same file: each side's windows stay in its
    // own blocks. A file too small to split is refused (InputError), never sampled across.
    for (bool validation : {false, true}) {
      keel::TokenFileShare share;
      share.held_out = 0.25;
      share.block_tokens = 8;
      share.split_seed = 3;
      share.validation = validation;
      keel::TokenFileSource side(path, /*seed=*/7, share);
      for (uint64_t index = 0; index < 4; ++index) {
        const uint64_t start = side.sample_start(index, 4);
        for (uint64_t block = start / 8; block <= (start + 3) / 8; ++block)
          if (side.held_out(block) != validation) throw std::logic_error("a window crossed the held-out split");
        side.sample(index, 4, out.data());
      }
    }
  });
  return 0;
}
