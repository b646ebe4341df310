#include "common/durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "common/text.hpp"

namespace keel {

namespace fs = std::filesystem;

namespace {

std::string os_error(const std::string& what, const fs::path& path) {
  return cat(what, " ", path.string(), ": ", std::strerror(errno));
}

}  // namespace

void sync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw std::runtime_error(os_error("cannot open folder", dir) + " (to sync it)");
  if (::fsync(fd) != 0) {
    const std::string error = os_error("cannot sync folder", dir);
    ::close(fd);
    throw std::runtime_error(error);
  }
  ::close(fd);
}

void write_durably(const fs::path& path, const std::string& text) {
  fs::path partial = path;
  partial += ".partial";
  {
    std::ofstream out(partial, std::ios::trunc);
    if (!out) throw std::runtime_error(os_error("cannot create", partial));
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(os_error("cannot write", partial));
  }
  int fd = ::open(partial.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(os_error("cannot open", partial) + " (to sync it)");
  if (::fsync(fd) != 0) {
    const std::string error = os_error("cannot sync", partial);
    ::close(fd);
    throw std::runtime_error(error);
  }
  ::close(fd);
  fs::rename(partial, path);
}

}  // namespace keel
