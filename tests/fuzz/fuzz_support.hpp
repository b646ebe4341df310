// What every fuzz target shares: the input written to a file (the host reads files, not
// buffers), and the rule for what counts as a finding.
//
// The rule: a target calls the host the way a tool does, inside `guarded`. An InputError is the
// host refusing hostile bytes cleanly (the tools print it and exit 2): a normal outcome. Any
// other exception is a finding: keel-train and keel-ckpt would report it as an internal error
// (exit 1; a c10::Error prints LibTorch's stack trace), an unchecked size that reaches an
// allocation surfaces as std::bad_alloc or c10::Error, and an exception no tool catches would
// std::terminate. A finding prints the exception's type and message and aborts, so libFuzzer
// keeps the input and the replay test fails on it; crashes and sanitizer reports are findings
// by themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "common/error.hpp"

namespace keel::fuzz {

/// A private scratch folder for this process (created on first use, removed at exit).
const std::string& scratch_dir();
/// Writes `size` bytes to `name` in the scratch folder (replacing it) and returns its path.
std::string write_file(const std::string& name, const uint8_t* data, size_t size);

/// Prints the finding (target, exception type, message) to stderr and aborts.
[[noreturn]] void report_finding(const char* target, const std::exception* error);

/// Runs `body`; an InputError is a clean refusal, anything else a finding (see above).
template <class Body>
void guarded(const char* target, Body&& body) {
  try {
    body();
  } catch (const InputError&) {
  } catch (const std::exception& error) {
    report_finding(target, &error);
  } catch (...) {
    report_finding(target, nullptr);
  }
}

}  // namespace keel::fuzz
