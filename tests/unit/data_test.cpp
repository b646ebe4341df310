// The synthetic source, token files, the global sample stream and safetensors files.
#include <gtest/gtest.h>
#include <keel/keel.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "checkpoint/safetensors.hpp"
#include "common/error.hpp"
#include "data/batch_stream.hpp"
#include "data/synthetic_source.hpp"
#include "data/token_file.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

TEST(SyntheticSource, SameSeedAndIndexGiveTheSameSample) {
  SyntheticSource a(512, 4, 9), b(512, 4, 9), c(512, 4, 10);
  std::vector<int64_t> x(64), y(64), z(64), w(64);
  a.sample(3, 64, x.data());
  b.sample(3, 64, y.data());
  c.sample(3, 64, z.data());
  a.sample(4, 64, w.data());
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  EXPECT_NE(x, w);
}

TEST(SyntheticSource, NextTokenHasExactlyBranchingChoicesGivenThePrevious) {
  const int64_t vocab = 64, branching = 4;
  SyntheticSource source(vocab, branching, 1);
  std::map<int64_t, std::map<int64_t, int64_t>> transitions;
  std::vector<int64_t> s(256);
  for (uint64_t i = 0; i < 400; ++i) {
    source.sample(i, 256, s.data());
    for (size_t t = 1; t < s.size(); ++t) transitions[s[t - 1]][s[t]]++;
  }
  // Every previous token has exactly `branching` successors, uniformly used: the conditional
  // entropy, and so the loss floor, is ln(branching).
  double entropy = 0, total = 0;
  for (const auto& [prev, next] : transitions) {
    EXPECT_EQ(next.size(), static_cast<size_t>(branching)) << "token " << prev;
    double n = 0;
    for (const auto& [tok, count] : next) n += static_cast<double>(count);
    for (const auto& [tok, count] : next)
      entropy -= static_cast<double>(count) * std::log(static_cast<double>(count) / n);
    total += n;
  }
  EXPECT_NEAR(entropy / total, std::log(4.0), 0.01);
  EXPECT_DOUBLE_EQ(*source.loss_floor(), std::log(4.0));
}

TEST(SyntheticSource, RefusesBranchingAboveVocab) { EXPECT_THROW(SyntheticSource(8, 9, 0), std::invalid_argument); }

TEST(BatchStream, DataParallelRanksSplitTheGlobalStream) {
  SyntheticSource source(128, 3, 5);
  BatchStream whole(source, 16, 8, 1, 0), rank0(source, 16, 8, 2, 0), rank1(source, 16, 8, 2, 1);
  for (int step = 0; step < 3; ++step) {
    Batch all = whole.next(), a = rank0.next(), b = rank1.next();
    EXPECT_TRUE(at::equal(at::cat({a.tokens, b.tokens}), all.tokens)) << "step " << step;
    EXPECT_TRUE(at::equal(at::cat({a.labels, b.labels}), all.labels));
    EXPECT_TRUE(at::equal(all.labels.slice(1, 0, 15), all.tokens.slice(1, 1, 16)));  // labels are next tokens
  }
  EXPECT_EQ(whole.position(), 24u);
}

// Documents of varying length: token t of sample i is (i * 7 + t) % 10, and 3 ends a document.
class CountingDocuments final : public TokenSource {
 public:
  static constexpr int64_t kEos = 3;
  void sample(uint64_t index, int64_t length, int64_t* out) const override {
    for (int64_t t = 0; t < length; ++t) out[t] = (static_cast<int64_t>(index) * 7 + t) % 10;
  }
  int64_t vocab_size() const override { return 10; }
  std::string describe() const override { return "counting documents"; }
  std::optional<int64_t> eos_id() const override { return kEos; }
};

TEST(BatchStream, NoLabelCrossesADocumentEnd) {
  CountingDocuments source;
  BatchStream stream(source, 12, 4, 2, 1, CountingDocuments::kEos);
  for (int step = 0; step < 2; ++step) {
    Batch batch = stream.next();
    std::vector<int64_t> sample(13);
    int64_t labelled = 0, eos_predicted = 0;
    for (int64_t b = 0; b < 2; ++b) {
      source.sample(static_cast<uint64_t>(step * 4 + 2 + b), 13, sample.data());
      for (int64_t t = 0; t < 12; ++t) {
        EXPECT_EQ(batch.tokens[b][t].item<int64_t>(), sample[t]);
        // Ignored exactly where the token is an EOS: its next token starts another document.
        const int64_t expected = sample[t] == CountingDocuments::kEos ? KEEL_IGNORE_INDEX : sample[t + 1];
        EXPECT_EQ(batch.labels[b][t].item<int64_t>(), expected) << "step " << step << " row " << b << " t " << t;
        labelled += expected != KEEL_IGNORE_INDEX ? 1 : 0;
        eos_predicted += expected == CountingDocuments::kEos ? 1 : 0;
      }
    }
    EXPECT_EQ(batch.labelled_tokens, labelled);
    EXPECT_EQ(batch.labelled_tokens, batch.labels.ne(KEEL_IGNORE_INDEX).sum().item<int64_t>());
    EXPECT_LT(labelled, 24);      // some document ends in the batch
    EXPECT_GT(eos_predicted, 0);  // the EOS itself stays a target
  }
}

TEST(BatchStream, WithoutADocumentEndEveryLabelCounts) {
  CountingDocuments source;
  BatchStream stream(source, 12, 4, 2, 1);
  Batch batch = stream.next();
  EXPECT_EQ(batch.labelled_tokens, 24);
  EXPECT_TRUE(at::equal(batch.labels.slice(1, 0, 11), batch.tokens.slice(1, 1, 12)));
  EXPECT_EQ(batch.labels.eq(KEEL_IGNORE_INDEX).sum().item<int64_t>(), 0);
}

TEST(TokenFile, RoundTripsAndSamplesWindows) {
  test::TempDir dir;
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 1000; ++i) tokens.push_back(i % 300);
  write_token_file(dir / "t.bin", tokens, 300);
  TokenFileSource source(dir / "t.bin", 1);
  EXPECT_EQ(source.num_tokens(), 1000u);
  EXPECT_EQ(source.vocab_size(), 300);
  std::vector<int64_t> s(50);
  source.sample(7, 50, s.data());
  for (size_t t = 1; t < s.size(); ++t) EXPECT_EQ(s[t], (s[t - 1] + 1) % 300);  // a contiguous window
}

std::string open_error(const std::string& path) {
  try {
    TokenFileSource source(path, 0);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(TokenFile, BadMagicTruncationAndMissingFileAreRefusedNamingTheFile) {
  test::TempDir dir;
  test::write_file(dir / "text.bin", std::string(64, 'x'));
  EXPECT_NE(open_error(dir / "text.bin").find("bad magic"), std::string::npos);
  EXPECT_NE(open_error(dir / "text.bin").find(dir / "text.bin"), std::string::npos);
  write_token_file(dir / "t.bin", std::vector<uint32_t>(100, 1), 10);
  std::filesystem::resize_file(dir / "t.bin", 100);
  EXPECT_NE(open_error(dir / "t.bin").find("header promises 100 tokens"), std::string::npos)
      << open_error(dir / "t.bin");
  EXPECT_NE(open_error(dir / "none.bin").find("data.path: " + (dir / "none.bin") + ": cannot open"), std::string::npos)
      << open_error(dir / "none.bin");
}

// A 32-byte token-file header followed by `payload` bytes.
std::string token_header(uint32_t width, uint32_t reserved, uint64_t num_tokens, uint64_t vocab) {
  std::string bytes = "KEELTOK1";
  auto put = [&](const auto& v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(width);
  put(reserved);
  put(num_tokens);
  put(vocab);
  return bytes;
}

TEST(TokenFile, AHeaderWhoseSizeWrapsIsRefusedBeforeAnyTokenIsRead) {
  // 2 x (2^63 + 100) + 32 wraps to 232: the file's real size. It must not pass as 100 tokens.
  test::TempDir dir;
  const uint64_t huge = (uint64_t{1} << 63) + 100;
  test::write_file(dir / "wrap.bin", token_header(2, 0, huge, 300) + std::string(200, '\0'));
  const std::string error = open_error(dir / "wrap.bin");
  EXPECT_NE(error.find("header promises 9223372036854775908 tokens"), std::string::npos) << error;
  EXPECT_NE(error.find(dir / "wrap.bin"), std::string::npos) << error;
}

TEST(TokenFile, ReservedFieldAndAVocabularyBeyondTheTokenWidthAreRefused) {
  test::TempDir dir;
  test::write_file(dir / "reserved.bin", token_header(2, 7, 4, 300) + std::string(8, '\0'));
  EXPECT_NE(open_error(dir / "reserved.bin").find("reserved header field is 7"), std::string::npos);
  test::write_file(dir / "vocab.bin", token_header(2, 0, 4, 70000) + std::string(8, '\0'));
  EXPECT_NE(open_error(dir / "vocab.bin").find("does not fit 2-byte tokens"), std::string::npos)
      << open_error(dir / "vocab.bin");
  test::write_file(dir / "vocab4.bin", token_header(4, 0, 2, uint64_t{1} << 40) + std::string(8, '\0'));
  EXPECT_NE(open_error(dir / "vocab4.bin").find("does not fit 4-byte tokens"), std::string::npos);
}

// A 48-byte version-2 token-file header.
std::string token_header_v2(uint32_t width, uint32_t flags, uint64_t num_tokens, uint64_t vocab, uint64_t eos,
                            uint64_t documents) {
  std::string bytes = "KEELTOK2";
  auto put = [&](const auto& v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(width);
  put(flags);
  put(num_tokens);
  put(vocab);
  put(eos);
  put(documents);
  return bytes;
}

TEST(TokenFile, Version2RecordsTheEosIdAndTheDocumentCount) {
  test::TempDir dir;
  TokenFileWriter writer(dir / "t.bin", 70000, 69999);
  for (uint32_t doc = 0; doc < 3; ++doc) {
    const std::vector<uint32_t> body = {doc, 65536 + doc};
    writer.append(body.data(), body.size());
    writer.end_document();
  }
  writer.close();
  TokenFileSource source(dir / "t.bin", 1);
  EXPECT_EQ(source.num_tokens(), 9u);
  EXPECT_EQ(source.vocab_size(), 70000);
  EXPECT_EQ(source.eos_id(), std::optional<int64_t>(69999));
  EXPECT_EQ(source.num_documents(), 3u);
  EXPECT_EQ(std::filesystem::file_size(dir / "t.bin"), 48u + 9u * 4u);  // uint32 tokens: the vocabulary needs them
  std::vector<int64_t> all(9);
  source.sample(0, 9, all.data());
  EXPECT_EQ(all, (std::vector<int64_t>{0, 65536, 69999, 1, 65537, 69999, 2, 65538, 69999}));
  EXPECT_NE(source.describe().find("EOS id 69999, 3 documents"), std::string::npos) << source.describe();

  write_token_file(dir / "plain.bin", {1, 2, 3}, 10);
  TokenFileSource plain(dir / "plain.bin", 1);
  EXPECT_EQ(plain.eos_id(), std::nullopt);
  EXPECT_EQ(plain.num_documents(), 0u);
  EXPECT_EQ(std::filesystem::file_size(dir / "plain.bin"), 48u + 3u * 2u);
  EXPECT_EQ(plain.describe().find("EOS"), std::string::npos) << plain.describe();
}

TEST(TokenFile, Version1FilesAreStillRead) {
  test::TempDir dir;
  std::string payload;
  for (uint16_t t : {5, 6, 7, 8}) payload.append(reinterpret_cast<const char*>(&t), sizeof(t));
  test::write_file(dir / "v1.bin", token_header(2, 0, 4, 300) + payload);
  TokenFileSource source(dir / "v1.bin", 1);
  EXPECT_EQ(source.num_tokens(), 4u);
  EXPECT_EQ(source.eos_id(), std::nullopt);
  EXPECT_EQ(source.num_documents(), 0u);
  std::vector<int64_t> all(4);
  source.sample(3, 4, all.data());
  EXPECT_EQ(all, (std::vector<int64_t>{5, 6, 7, 8}));
}

TEST(TokenFile, EachBadVersion2HeaderFieldIsRefusedNamingTheFieldAndTheFile) {
  test::TempDir dir;
  const std::string four_tokens(8, '\0');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {token_header_v2(3, 1, 4, 300, 2, 1) + std::string(12, '\0'), "width: bytes per token is 3"},
      {token_header_v2(2, 2, 4, 300, 0, 0) + four_tokens, "flags: unknown bits"},
      {token_header_v2(2, 1, 4, 300, 300, 1) + four_tokens, "eos_id: EOS id 300 is not below the vocabulary size 300"},
      {token_header_v2(2, 0, 4, 300, 7, 0) + four_tokens, "eos_id: is 7 but the flags record no EOS id"},
      {token_header_v2(2, 1, 4, 300, 2, 5) + four_tokens, "num_documents: 5 documents in 4 tokens"},
      {token_header_v2(2, 1, 4, 0, 0, 1) + four_tokens, "vocab_size: vocabulary size is 0"},
      {token_header_v2(2, 1, 4, 70000, 2, 1) + four_tokens, "vocab_size: vocabulary size 70000 does not fit"},
      {token_header_v2(2, 1, 5, 300, 2, 1) + four_tokens, "num_tokens: header promises 5 tokens"},
      {token_header_v2(2, 1, (uint64_t{1} << 63) + 4, 300, 2, 1) + four_tokens, "num_tokens: header promises"},
      {token_header_v2(2, 1, 0, 300, 2, 0).substr(0, 40), "smaller than its 48-byte KEELTOK2 header"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir / ("bad" + std::to_string(i) + ".bin");
    test::write_file(path, cases[i].first);
    const std::string error = open_error(path);
    EXPECT_NE(error.find(cases[i].second), std::string::npos) << "case " << i << ": " << error;
    EXPECT_NE(error.find(path), std::string::npos) << "case " << i << ": " << error;
  }
  // The same fields, valid, open.
  test::write_file(dir / "good.bin", token_header_v2(2, 1, 4, 300, 2, 4) + four_tokens);
  EXPECT_EQ(open_error(dir / "good.bin"), "");
}

TEST(TokenFileWriter, AFailedOrAbandonedWriteLeavesTheOutputPathAlone) {
  test::TempDir dir;
  const std::string path = dir / "t.bin";
  test::write_file(path, "previous contents");
  try {
    write_token_file(path, {1, 2, 300}, 300);
    FAIL() << "accepted a token beyond the vocabulary";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("token 300 is not below the vocabulary size 300"), std::string::npos);
  }
  {
    TokenFileWriter abandoned(path, 300, 2);
    const uint32_t t = 1;
    abandoned.append(&t, 1);
    abandoned.end_document();
  }
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "previous contents");
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
  EXPECT_THROW(TokenFileWriter(path, 300, 300), InputError);  // an EOS id the vocabulary cannot hold
  EXPECT_THROW(TokenFileWriter(dir / "no/such/dir/t.bin", 300, std::nullopt), InputError);
  TokenFileWriter no_eos(dir / "u.bin", 300, std::nullopt);
  EXPECT_THROW(no_eos.end_document(), InputError);
}

// close() fsyncs the file before the rename and the folder after it; a sync cannot be observed
// here, so this checks what close() leaves: the whole file in place of the old, no partial file.
TEST(TokenFileWriter, CloseReplacesTheOutputWithTheWholeFileAndLeavesNoPartial) {
  test::TempDir dir;
  const std::string path = dir / "t.bin";
  test::write_file(path, "previous contents");
  TokenFileWriter writer(path, 300, 2);
  const std::vector<uint32_t> document = {5, 299, 7};
  for (int i = 0; i < 4; ++i) {
    writer.append(document.data(), document.size());
    writer.end_document();
  }
  writer.close();
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
  EXPECT_EQ(std::filesystem::file_size(path), 48u + 16u * 2u);  // the header, then 16 two-byte tokens
  TokenFileSource source(path, 1);
  EXPECT_EQ(source.num_tokens(), 16u);
  EXPECT_EQ(source.num_documents(), 4u);
  std::vector<int64_t> all(16);
  source.sample(0, 16, all.data());
  EXPECT_EQ(all, (std::vector<int64_t>{5, 299, 7, 2, 5, 299, 7, 2, 5, 299, 7, 2, 5, 299, 7, 2}));
  EXPECT_THROW(writer.close(), std::logic_error);
}

TEST(TokenFileWriter, StreamsMoreTokensThanItsBufferHoldsInOrder) {
  // 700,000 uint32 tokens are 2.8 MB, past the writer's 1 MiB block, appended in odd-sized runs.
  test::TempDir dir;
  const uint32_t vocab = 70000, n = 700000;
  std::vector<uint32_t> tokens(n);
  for (uint32_t i = 0; i < n; ++i) tokens[i] = (i * 7919u) % vocab;
  TokenFileWriter writer(dir / "t.bin", vocab, std::nullopt);
  for (uint32_t at = 0; at < n; at += 9973) writer.append(tokens.data() + at, std::min<uint32_t>(9973, n - at));
  writer.close();
  TokenFileSource source(dir / "t.bin", 3);
  ASSERT_EQ(source.num_tokens(), n);
  std::vector<int64_t> all(n);
  source.sample(0, n, all.data());
  EXPECT_TRUE(std::equal(all.begin(), all.end(), tokens.begin()));
}

TEST(Safetensors, RoundTripsDtypesShapesAndMetadata) {
  test::TempDir dir;
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"a.weight", at::randn({3, 4})}, {"b", at::arange(10, at::kLong)}, {"c", at::randn({2, 2}).to(at::kBFloat16)}};
  write_safetensors(dir / "w.safetensors", tensors, {{"step", "7"}});
  SafetensorsFile file = read_safetensors(dir / "w.safetensors");
  ASSERT_EQ(file.tensors.size(), 3u);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(at::equal(file.tensors.at(name), t)) << name;
  EXPECT_EQ(file.metadata.at("step"), "7");
}

TEST(Safetensors, TruncatedFileIsRefusedNamingFileAndKey) {
  test::TempDir dir;
  write_safetensors(dir / "w.safetensors", {{"big", at::randn({64, 64})}});
  std::filesystem::resize_file(dir / "w.safetensors", 1000);
  try {
    read_safetensors(dir / "w.safetensors");
    FAIL() << "accepted a truncated file";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("w.safetensors: big"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace keel
