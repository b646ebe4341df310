#include "tokenizer_process.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "common/error.hpp"
#include "common/text.hpp"
#include "train/stop_signal.hpp"

extern char** environ;

namespace keel::data {

namespace {
constexpr char kMagic[8] = {'K', 'E', 'E', 'L', 'T', 'K', 'Z', '1'};
// A batch larger than this is not something the script writes: the stream is corrupt.
constexpr uint64_t kMaxBatchTokens = uint64_t{1} << 32;
}  // namespace

std::string tokenizer_script() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw InputError(cat("cannot locate keel-data's own executable: ", ec.message()));
  const std::filesystem::path script = (exe.parent_path() / KEEL_DATA_FROM_BIN / "keel_tokenize.py").lexically_normal();
  if (!std::filesystem::is_regular_file(script))
    throw InputError(cat("the tokenizer step ", script.string(), " is missing (keel-data is installed without it)"));
  return script.string();
}

TokenizerProcess::TokenizerProcess(const std::string& python, const std::string& script,
                                   const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error(cat("pipe: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  std::vector<std::string> argv_strings = {python, script};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int err = ::posix_spawnp(&pid_, python.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (err != 0) {
    pid_ = -1;
    ::close(fds[0]);
    throw InputError(cat("cannot run ", python, ": ", std::strerror(err),
                         " (KEEL_PYTHON names the Python 3 with the tokenizers package)"));
  }
  pipe_ = ::fdopen(fds[0], "rb");
  if (pipe_ == nullptr) {
    ::close(fds[0]);
    throw std::runtime_error(cat("fdopen: ", std::strerror(errno)));
  }
  buffer_.resize(size_t{1} << 20);
  std::setvbuf(pipe_, buffer_.data(), _IOFBF, buffer_.size());
  try {
    read_header();
  } catch (...) {
    stop();  // no destructor runs for a constructor that throws
    throw;
  }
}

void TokenizerProcess::read_header() {
  char magic[8];
  uint64_t vocab = 0, eos = 0;
  uint32_t eos_length = 0;
  if (read_exact(magic, 1) && magic[0] == 'E') read_refusal();  // refused before its header
  if (!read_exact(magic + 1, sizeof(magic) - 1) || !read_exact(&vocab, sizeof(vocab)) ||
      !read_exact(&eos, sizeof(eos)) || !read_exact(&eos_length, sizeof(eos_length))) {
    check(reap());  // throws: the script refused its arguments or could not start
    throw std::runtime_error("the tokenizer step exited 0 without writing its header");
  }
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0 || eos >= vocab || eos_length > 4096)
    throw std::runtime_error("the tokenizer step wrote a malformed header");
  info_.vocab_size = vocab;
  info_.eos_id = static_cast<uint32_t>(eos);
  info_.eos_token.resize(eos_length);
  if (!read_exact(info_.eos_token.data(), eos_length))
    throw std::runtime_error("the tokenizer step's header is cut short");
}

TokenizerProcess::~TokenizerProcess() { stop(); }

void TokenizerProcess::stop() {
  if (pipe_ != nullptr) std::fclose(pipe_);
  pipe_ = nullptr;
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    reap();
  }
}

bool TokenizerProcess::read_exact(void* out, size_t n) {
  auto* bytes = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    done += std::fread(bytes + done, 1, n - done, pipe_);
    if (done == n) break;
    if (!std::ferror(pipe_) || errno != EINTR) return false;
    // A signal: SIGINT or SIGTERM stops the build here (the script is stopped, not waited on),
    // any other read goes on.
    std::clearerr(pipe_);
    if (stop_requested() != 0) {
      stop();
      throw_if_stop_requested("the build");
    }
  }
  return true;
}

void TokenizerProcess::read_refusal() {
  constexpr uint32_t kMaxRefusalBytes = 4096;
  uint32_t length = 0;
  std::string message;
  if (read_exact(&length, sizeof(length)) && length <= kMaxRefusalBytes) {
    message.resize(length);
    if (!read_exact(message.data(), length)) message.clear();
  }
  stop();
  if (message.empty()) throw std::runtime_error("the tokenizer step's refusal record is malformed");
  throw InputError(message);
}

int TokenizerProcess::reap() {
  int status = 0;
  pid_t reaped;
  while ((reaped = ::waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  if (reaped < 0) throw std::runtime_error(cat("waitpid: ", std::strerror(errno)));
  return status;
}

void TokenizerProcess::check(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 2) throw InputError("the tokenizer step refused the input");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    throw InputError("the tokenizer step could not start (is KEEL_PYTHON or python3 a Python 3?)");
  throw std::runtime_error(WIFEXITED(status) ? cat("the tokenizer step exited with status ", WEXITSTATUS(status))
                                             : cat("the tokenizer step was killed by signal ", WTERMSIG(status)));
}

uint64_t TokenizerProcess::read_all(const std::function<void(const uint32_t*, size_t)>& document,
                                    const std::function<void(uint64_t)>& progress) {
  std::vector<uint32_t> lengths, ids;
  for (;;) {
    char kind = 0;
    if (!read_exact(&kind, 1)) {
      check(reap());  // throws: the script stopped on bad input, its message already printed
      throw std::runtime_error("the tokenizer step ended without its end record");
    }
    if (kind == 'B') {
      uint32_t n = 0;
      if (!read_exact(&n, sizeof(n))) break;
      lengths.resize(n);
      if (!read_exact(lengths.data(), n * sizeof(uint32_t))) break;
      uint64_t total = 0;
      for (uint32_t length : lengths) total += length;
      if (total > kMaxBatchTokens) break;
      ids.resize(total);
      if (!read_exact(ids.data(), total * sizeof(uint32_t))) break;
      const uint32_t* at = ids.data();
      for (uint32_t length : lengths) {
        document(at, length);
        at += length;
      }
    } else if (kind == 'P') {
      uint64_t bytes = 0;
      if (!read_exact(&bytes, sizeof(bytes))) break;
      progress(bytes);
    } else if (kind == 'E') {
      read_refusal();
    } else if (kind == 'Z') {
      uint64_t documents = 0;
      if (!read_exact(&documents, sizeof(documents))) break;
      check(reap());
      return documents;
    } else {
      break;
    }
  }
  // A record cut short or unknown: the script died mid-write, or something else wrote to its
  // standard output.
  stop();
  throw std::runtime_error("the tokenizer step's output is malformed");
}

}  // namespace keel::data
