// keel-train on hostile job files, overrides and token files: a clean refusal with exit status
// 2 naming the file or key, never a crash (a stack overflow in the TOML parser was SIGSEGV).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/token_file.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text).substr(0, 2000)

const char* kJob = R"([model]
plugin = "llama3"
flavor = "tiny"
[training]
steps = 2
seq_len = 16
global_batch = 4
threads = 1
)";

test::CommandResult train(const test::TempDir& dir, const std::string& job, const std::string& sets = "") {
  test::write_file(dir / "job.toml", job);
  return test::run_command(test::bin_dir() + "/keel-train --plugin-path " + test::plugin_dir() + " --config " +
                           (dir / "job.toml") + " --set job.run_dir=\\\"" + (dir / "run") + "\\\"" + sets);
}

TEST(HostileConfig, AJobFileNested100000DeepExits2NamingFileAndLine) {
  test::TempDir dir;
  auto r = train(dir, std::string(kJob) + "[optimizer]\nno_decay = " + std::string(100000, '[') + "\n");
  EXPECT_EQ(r.status, 2) << r.output.substr(0, 2000);
  EXPECT_HAS(r.output, "job.toml:10: nesting deeper than 64 levels");
}

TEST(HostileConfig, AnOverrideNested100000DeepExits2NamingTheOverride) {
  test::TempDir dir;
  test::write_file(dir / "deep.txt", std::string(100000, '['));
  auto r = train(dir, kJob, " --set \"optimizer.no_decay=$(cat " + (dir / "deep.txt") + ")\"");
  EXPECT_EQ(r.status, 2) << r.output.substr(0, 2000);
  EXPECT_HAS(r.output, "--set optimizer.no_decay=[[[");
  EXPECT_HAS(r.output, "nesting deeper than 64 levels");
}

TEST(HostileConfig, IntegersBeyondTheirRangeAndNonFiniteFloatsExit2NamingTheKey) {
  test::TempDir dir;
  auto threads = train(dir, kJob, " --set training.threads=4294967298");
  EXPECT_EQ(threads.status, 2) << threads.output;
  EXPECT_HAS(threads.output, "training.threads: must be in [0, 4096], got 4294967298");
  auto pp = train(dir, kJob, " --set parallelism.pp=4294967297");
  EXPECT_EQ(pp.status, 2) << pp.output;
  EXPECT_HAS(pp.output, "parallelism.pp: must be in [1, 65536], got 4294967297");
  auto lr = train(dir, std::string(kJob) + "[optimizer]\nlr = 1e309\n");
  EXPECT_EQ(lr.status, 2) << lr.output;
  EXPECT_HAS(lr.output, "job.toml:10: optimizer.lr: must be a finite number");
}

TEST(HostileConfig, ATokenFileWhoseHeaderSizeWrapsExits2) {
  // num_tokens = 2^63 + 100 of 2 bytes: the header's size, 32 + 2 x num_tokens, wraps to the
  // file's real 232 bytes.
  test::TempDir dir;
  std::string bytes = "KEELTOK1";
  auto put = [&](const auto& v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint32_t{2});
  put(uint32_t{0});
  put((uint64_t{1} << 63) + 100);
  put(uint64_t{256});
  bytes += std::string(200, '\0');
  test::write_file(dir / "tokens.bin", bytes);
  auto r = train(dir, std::string(kJob) + "[data]\nsource = \"tokens\"\npath = \"" + (dir / "tokens.bin") + "\"\n");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_HAS(r.output, "header promises 9223372036854775908 tokens");
}

TEST(HostileConfig, DocumentsAtEosOfATokenFileWithoutAnEosIdExits2) {
  test::TempDir dir;
  write_token_file(dir / "tokens.bin", std::vector<uint32_t>(4000, 5), 256);
  const std::string data = "[data]\nsource = \"tokens\"\npath = \"" + (dir / "tokens.bin") + "\"\n";
  auto r = train(dir, std::string(kJob) + data + "documents = \"eos\"\n");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_HAS(r.output, "job.toml:12: data.documents: \"eos\" needs an EOS id, and data.path (");
  EXPECT_HAS(r.output, "rebuild it with keel-data build --tokenizer");
  // Unset, the documents follow the file: none here, and the run trains.
  auto unset = train(dir, std::string(kJob) + data);
  EXPECT_EQ(unset.status, 0) << unset.output;
  EXPECT_HAS(unset.output, "documents: not separated (the source records no EOS id)");
}

}  // namespace
}  // namespace keel
