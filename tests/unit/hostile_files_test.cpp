// Files that are not what their name promises: a FIFO, a folder, a device or a socket in place
// of every kind of file Keel reads, and files that change under a reader. Each is refused at
// once with an InputError naming the file and the key that pointed at it; nothing waits on a
// FIFO (a hang shows as this suite's timeout) and nothing faults.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_reader.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "common/error.hpp"
#include "common/input_file.hpp"
#include "config/config_tree.hpp"
#include "data/token_file.hpp"
#include "interop/hf_checkpoint.hpp"
#include "metrics/metrics_log.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;

// What can stand where a file is expected, and the word the refusal must use for it.
struct Impostor {
  const char* name;
  const char* kind;
};
const Impostor kImpostors[] = {
    {"fifo", "a FIFO"}, {"folder", "a folder"}, {"socket", "a socket"}, {"device", "a character device"}};

// Puts `impostor` at `path`: a device is a link to /dev/null (making a device node needs
// privileges), which the readers follow as they follow any link.
void make(const Impostor& impostor, const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
  const std::string name = impostor.name;
  if (name == "fifo") {
    ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << path;
  } else if (name == "folder") {
    fs::create_directory(path);
  } else if (name == "socket") {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    ASSERT_LT(path.size(), sizeof(address.sun_path)) << path;
    std::copy(path.begin(), path.end(), address.sun_path);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << path;
    ::close(fd);
  } else {
    fs::create_symlink("/dev/null", path);
  }
}

// The InputError `read` throws, or "" when it throws none.
std::string refusal(const std::function<void()>& read) {
  try {
    read();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

void expect_refused(const std::string& what, const std::function<void()>& read, const std::vector<std::string>& named) {
  const std::string error = refusal(read);
  ASSERT_FALSE(error.empty()) << what << ": accepted";
  for (const std::string& word : named) EXPECT_NE(error.find(word), std::string::npos) << what << ": " << error;
}

// Short paths: a socket's path must fit sun_path (108 bytes).
class HostileFiles : public testing::TestWithParam<Impostor> {
 protected:
  test::TempDir dir;
  std::string at(const std::string& name) const { return dir / name; }
};

TEST_P(HostileFiles, InputFileRefusesItNamingTheKeyTheFileAndWhatItIs) {
  make(GetParam(), at("x"));
  expect_refused("InputFile", [&] { InputFile file(at("x"), "some.key"); }, {"some.key", at("x"), GetParam().kind});
  expect_refused("read_input_file", [&] { read_input_file(at("x"), "some.key", 100); }, {"some.key", at("x")});
}

TEST_P(HostileFiles, AConfigIsRefusedNamingTheOption) {
  make(GetParam(), at("job.toml"));
  expect_refused("config", [&] { ConfigTree::from_file(at("job.toml")); },
                 {"--config", at("job.toml"), GetParam().kind});
}

TEST_P(HostileFiles, ATokenFileIsRefusedNamingItsKey) {
  make(GetParam(), at("t.tok"));
  expect_refused("data.path", [&] { TokenFileSource source(at("t.tok"), 1); }, {"data.path", at("t.tok")});
  expect_refused("validation.data", [&] { TokenFileSource source(at("t.tok"), 1, "validation.data"); },
                 {"validation.data", at("t.tok"), GetParam().kind});
}

TEST_P(HostileFiles, ASafetensorsFileIsRefusedWholeOrByTensor) {
  make(GetParam(), at("s.safetensors"));
  expect_refused("read", [&] { read_safetensors(at("s.safetensors")); }, {at("s.safetensors"), GetParam().kind});
  expect_refused("by tensor", [&] { SafetensorsReader file(at("s.safetensors")); },
                 {"checkpoint shard", at("s.safetensors"), GetParam().kind});
}

TEST_P(HostileFiles, ACheckpointManifestIsRefused) {
  make(GetParam(), at("step-1/manifest.json"));
  expect_refused("manifest", [&] { read_manifest(at("step-1")); }, {"manifest.json", GetParam().kind});
}

TEST_P(HostileFiles, ALatestPointerIsRefusedAsNotAPointer) {
  fs::create_directories(at("step-1"));
  test::write_file(at("step-1/manifest.json"), "{}");
  make(GetParam(), at("latest"));
  expect_refused("latest", [&] { resolve_checkpoint(dir.path(), "latest"); },
                 {at("latest"), "not a checkpoint pointer"});
}

TEST_P(HostileFiles, AnHfFolderFileIsRefusedNamingTheFile) {
  for (const char* name : {"config.json", "model.safetensors.index.json", "model.safetensors"}) {
    const std::string folder = at(std::string("hf-") + name);
    fs::create_directories(folder);
    if (std::string(name) != "config.json") test::write_file(folder + "/config.json", "{}");
    make(GetParam(), folder + "/" + name);
    expect_refused(name, [&] { HfCheckpoint hf(folder); }, {folder + "/" + name, GetParam().kind});
  }
}

TEST_P(HostileFiles, ARunsMetricsLogIsRefusedBeforeItIsReadOrWritten) {
  make(GetParam(), at("metrics.jsonl"));
  expect_refused("metrics.jsonl", [&] { MetricsLog log(at("metrics.jsonl"), 3); },
                 {"job.run_dir", at("metrics.jsonl"), GetParam().kind});
}

INSTANTIATE_TEST_SUITE_P(Impostors, HostileFiles, testing::ValuesIn(kImpostors),
                         [](const testing::TestParamInfo<Impostor>& info) { return std::string(info.param.name); });

std::string token_file(const test::TempDir& dir, size_t tokens) {
  std::vector<uint32_t> ids(tokens);
  for (size_t i = 0; i < tokens; ++i) ids[i] = static_cast<uint32_t>(i % 50);
  write_token_file(dir / "t.tok", ids, 64);
  return dir / "t.tok";
}

// The refusal of sampling a token file of `tokens` tokens, opened and sampled once, after
// `change` was made to it; "" when every later sample is read.
std::string refusal_after_change(size_t tokens, const std::function<void(const std::string&)>& change,
                                 std::string* path_out) {
  test::TempDir dir;
  const std::string path = token_file(dir, tokens);
  *path_out = path;
  TokenFileSource source(path, 7);
  std::vector<int64_t> sample(16);
  source.sample(0, 16, sample.data());
  change(path);
  return refusal([&] {
    for (uint64_t i = 1; i < 100; ++i) source.sample(i, 16, sample.data());
  });
}

TEST(ChangedFiles, ATokenFileTruncatedUnderItsReaderIsANamedErrorNotASignal) {
  std::string path;
  const std::string error = refusal_after_change(
      100000, [](const std::string& file) { fs::resize_file(file, 1000); }, &path);
  EXPECT_NE(error.find("data.path"), std::string::npos) << error;
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("changed while the job read it"), std::string::npos) << error;
}

TEST(ChangedFiles, ATokenFileRewrittenInPlaceIsRefusedRatherThanReadAsOtherData) {
  std::string path;
  const std::string error = refusal_after_change(
      10000,
      [](const std::string& file) {
        {
          std::fstream out(file, std::ios::in | std::ios::out | std::ios::binary);
          out.seekp(100);
          out.write("\x01\x00", 2);
        }
        // The rewrite's time, set apart from the open's even on a coarse clock.
        const timespec times[2] = {{0, UTIME_OMIT}, {1, 0}};
        ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
      },
      &path);
  EXPECT_NE(error.find("modified in place"), std::string::npos) << error;
}

// A shard of two tensors, its reader opened on it, and the refusal of reading both after
// `change` was made to the file; "" when both are read.
std::string shard_refusal_after_change(const std::function<void(const std::string&)>& change, std::string* path_out) {
  test::TempDir dir;
  const std::string path = dir / "s.safetensors";
  *path_out = path;
  write_safetensors(path, {{"a", at::arange(4096, at::kFloat)}, {"b", at::arange(4096, at::kFloat)}});
  SafetensorsReader reader(path);
  change(path);
  return refusal([&] {
    reader.read("a");
    reader.read("b");
  });
}

TEST(ChangedFiles, AShardTruncatedUnderItsReaderIsANamedErrorNotASignal) {
  std::string path;
  const std::string error =
      shard_refusal_after_change([](const std::string& file) { fs::resize_file(file, 100); }, &path);
  EXPECT_NE(error.find("checkpoint shard"), std::string::npos) << error;
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("changed while it was read"), std::string::npos) << error;
}

TEST(ChangedFiles, AShardReplacedOrRewrittenUnderItsReaderIsRefusedRatherThanMixed) {
  std::string path;
  const std::string replaced = shard_refusal_after_change(
      [](const std::string& file) {
        write_safetensors(file + ".new", {{"a", at::zeros(4096, at::kFloat)}, {"b", at::zeros(4096, at::kFloat)}});
        fs::rename(file + ".new", file);
      },
      &path);
  EXPECT_NE(replaced.find("another file is in its place"), std::string::npos) << replaced;
  const std::string rewritten = shard_refusal_after_change(
      [](const std::string& file) {
        const timespec times[2] = {{0, UTIME_OMIT}, {1, 0}};
        ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
      },
      &path);
  EXPECT_NE(rewritten.find("modified in place"), std::string::npos) << rewritten;
  EXPECT_EQ(shard_refusal_after_change([](const std::string&) {}, &path), "");
}

TEST(ChangedFiles, AnHfShardTruncatedDuringAnImportNamesTheShard) {
  test::TempDir dir;
  test::write_file(dir / "config.json", "{}");
  write_safetensors(dir / "model.safetensors", {{"w", at::ones({64, 64})}});
  HfCheckpoint hf(dir.path());
  fs::resize_file(dir / "model.safetensors", 200);
  const std::string error = refusal([&] { hf.read("w"); });
  EXPECT_NE(error.find("--hf shard"), std::string::npos) << error;
  EXPECT_NE(error.find("model.safetensors"), std::string::npos) << error;
}

TEST(ChangedFiles, AReadPastTheEndOfAShrunkFileNamesTheFileAndTheSizes) {
  test::TempDir dir;
  test::write_file(dir / "f", std::string(4096, 'x'));
  InputFile file(dir / "f", "some.key");
  fs::resize_file(dir / "f", 100);
  char buffer[64];
  file.read_at(0, buffer, sizeof(buffer));  // still there
  const std::string error = refusal([&] { file.read_at(1000, buffer, sizeof(buffer)); });
  EXPECT_NE(error.find(dir / "f"), std::string::npos) << error;
  EXPECT_NE(error.find("4096 bytes when opened"), std::string::npos) << error;
  EXPECT_NE(refusal([&] { file.check_unchanged(); }).find("4096 bytes when opened, 100 now"), std::string::npos);
}

TEST(ChangedFiles, AFileLargerThanItsReaderAllowsIsRefusedBeforeItIsRead) {
  test::TempDir dir;
  test::write_file(dir / "f", std::string(1000, 'x'));
  const std::string error = refusal([&] { read_input_file(dir / "f", "some.key", 999); });
  EXPECT_NE(error.find("1000 bytes, more than it may hold (999)"), std::string::npos) << error;
  EXPECT_EQ(read_input_file(dir / "f", "some.key", 1000).size(), 1000u);
}

}  // namespace
}  // namespace keel
