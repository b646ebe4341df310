// Helpers shared by Keel's test suites: temporary folders, files, subprocesses, and the
// locations of the build tree (compiled in by CMake).
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace keel::test {

/// The build tree's plugin folder (llama3.so, norm_clipper.so).
inline std::string plugin_dir() { return KEEL_TEST_BUILD_PLUGIN_DIR; }
/// The folder of the deliberately broken test plugins.
inline std::string test_plugin_dir() { return KEEL_TEST_PLUGIN_DIR; }
/// The build tree's bin folder (keel-train, keel-plugin).
inline std::string bin_dir() { return KEEL_TEST_BIN_DIR; }
/// The source tree.
inline std::string source_dir() { return KEEL_TEST_SOURCE_DIR; }

/// A fresh temporary folder, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "keel-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// The folder.
  const std::string& path() const { return path_; }
  /// A path inside it.
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Writes `text` to `path`, creating folders.
inline void write_file(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

/// Reads a whole file.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// The exit status and combined output of a shell command.
struct CommandResult {
  int status = -1;
  std::string output;
};

/// Runs `command` through the shell, capturing stdout and stderr.
inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  int raw = ::pclose(pipe);
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return result;
}

/// A loopback TCP port that was free a moment ago (for a test job's MASTER_PORT).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace keel::test
