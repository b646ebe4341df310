#include "fuzz_support.hpp"

#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <typeinfo>
#include <vector>

namespace keel::fuzz {

namespace {

std::string demangled(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> text(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && text ? text.get() : name;
}

// The folder lives as long as the process; a replay's child processes share their parent's.
struct Scratch {
  std::string path;
  pid_t owner = 0;
  Scratch() {
    std::string pattern = (std::filesystem::temp_directory_path() / "keel-fuzz-XXXXXX").string();
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (::mkdtemp(buffer.data()) == nullptr) throw std::runtime_error("cannot create a scratch folder in " + pattern);
    path = buffer.data();
    owner = ::getpid();
  }
  ~Scratch() {
    std::error_code ignored;
    if (::getpid() == owner) std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

const std::string& scratch_dir() {
  static const Scratch scratch;
  return scratch.path;
}

std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  std::string path = scratch_dir() + "/" + name;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  bool ok = fd >= 0;
  for (size_t done = 0; ok && done < size;) {
    ssize_t n = ::write(fd, data + done, size - done);
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  if (fd >= 0) ::close(fd);
  if (!ok) {
    // The harness failing is not a finding of the host: stop loudly without a crash report.
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::_Exit(3);
  }
  return path;
}

void report_finding(const char* target, const std::exception* error) {
  if (error != nullptr)
    std::fprintf(stderr, "\nFINDING in %s: uncaught %s (not keel::InputError): %s\n", target,
                 demangled(typeid(*error).name()).c_str(), error->what());
  else
    std::fprintf(stderr, "\nFINDING in %s: an exception not derived from std::exception\n", target);
  std::fflush(stderr);
  std::abort();
}

}  // namespace keel::fuzz
