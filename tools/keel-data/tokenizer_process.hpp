// keel-data's Python step: keel_tokenize.py encodes documents with the `tokenizers` library
// and streams their ids back through a pipe (the record format is in the script's docstring).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace keel::data {

/// What the tokenizer step reports before any document.
struct TokenizerInfo {
  uint64_t vocab_size = 0;
  uint32_t eos_id = 0;
  std::string eos_token;
};

/// The running script, its standard output on a pipe; its standard error is keel-data's.
class TokenizerProcess {
 public:
  /// Starts `python script args...` and reads the header; throws InputError when the
  /// interpreter cannot be run or the script refuses its input.
  TokenizerProcess(const std::string& python, const std::string& script, const std::vector<std::string>& args);
  /// Stops and reaps a script still running (the build failed on this side).
  ~TokenizerProcess();
  TokenizerProcess(const TokenizerProcess&) = delete;
  TokenizerProcess& operator=(const TokenizerProcess&) = delete;

  /// The vocabulary and EOS the script resolved.
  const TokenizerInfo& info() const { return info_; }

  /// Reads every record to the end: `document` gets each document's ids in input order,
  /// `progress` the input bytes consumed so far. Returns the number of documents; throws
  /// InputError when the script stopped on bad input (its message is on standard error).
  uint64_t read_all(const std::function<void(const uint32_t* ids, size_t n)>& document,
                    const std::function<void(uint64_t bytes)>& progress);

 private:
  void read_header();
  bool read_exact(void* out, size_t n);
  // Reads the script's 'E' record (after its kind byte), stops it and throws its refusal as
  // an InputError.
  [[noreturn]] void read_refusal();
  // Closes the pipe, then stops and reaps the script if it is still there.
  void stop();
  // Waits for the script; its wait status.
  int reap();
  // Throws unless `status` is a clean exit: InputError for the script's refusal (status 2).
  static void check(int status);

  pid_t pid_ = -1;
  FILE* pipe_ = nullptr;
  std::vector<char> buffer_;
  TokenizerInfo info_;
};

/// keel_tokenize.py as installed next to this executable (share/keel/ beside bin/, in the build
/// tree as in the install tree); throws InputError when it is missing.
std::string tokenizer_script();

}  // namespace keel::data
