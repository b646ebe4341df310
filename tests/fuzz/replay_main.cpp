// Replays a fuzz target on saved inputs without libFuzzer (the normal g++ build, no
// sanitizers): ctest runs it on every seed and every kept crasher.
// Usage: fuzz_replay_<target> FOLDER...
// Each input runs in a child process, so one crash does not hide the others. Passes when every
// input returns normally (an InputError is a normal outcome, see fuzz_support.hpp); otherwise
// names each input that crashed or raised a finding, and exits 1.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

std::string outcome(int status) {
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  return "exit status " + std::to_string(WEXITSTATUS(status));
}

int run_one(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    std::fprintf(stderr, "replay: cannot read %s\n", file.c_str());
    return 1;
  }
  std::fflush(nullptr);
  pid_t child = ::fork();
  if (child < 0) {
    std::perror("replay: fork");
    return 1;
  }
  if (child == 0) {
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    std::fflush(nullptr);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  std::fprintf(stderr, "replay: FAILED %s (%s)\n", file.c_str(), outcome(status).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "Usage: %s FOLDER...\n  Runs the fuzz target on every file of each folder.\n", argv[0]);
    return 2;
  }
  keel::fuzz::scratch_dir();  // created here, so that the children share it and it is removed once
  int inputs = 0, failed = 0;
  for (int i = 1; i < argc; ++i) {
    if (!fs::is_directory(argv[i])) {
      std::fprintf(stderr, "replay: %s is not a folder\n", argv[i]);
      return 2;
    }
    std::vector<fs::path> files;
    for (const auto& item : fs::directory_iterator(argv[i]))
      if (item.is_regular_file() && item.path().filename().string()[0] != '.') files.push_back(item.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      ++inputs;
      failed += run_one(file);
    }
  }
  std::printf("replay: %d input(s), %d failed\n", inputs, failed);
  return failed == 0 ? 0 : 1;
}
