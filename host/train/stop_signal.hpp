// SIGINT / SIGTERM ask the loop to finish the current step, save and exit cleanly (the tools:
// to stop their work and remove what they staged); a second signal of the same kind
// terminates at once.
#pragma once

#include <stdexcept>
#include <string>

namespace keel {

/// A tool's long work stopped by SIGINT or SIGTERM: thrown between units of work, so that what
/// the work staged is removed on the way out; the tool then exits 128 + signal.
class StopRequested : public std::runtime_error {
 public:
  StopRequested(int signal, const std::string& what);
  /// The signal that asked for the stop.
  int signal() const { return signal_; }
  /// The exit status a shell gives a process that signal killed (130 for SIGINT, 143 for SIGTERM).
  int exit_status() const { return 128 + signal_; }

 private:
  int signal_;
};

/// Installs the handlers (idempotent).
void install_stop_handlers();
/// Whether a stop was requested; 0 or the signal number.
int stop_requested();
/// Throws StopRequested naming `what` (the work left unfinished) when a stop was requested.
void throw_if_stop_requested(const std::string& what);

}  // namespace keel
