// SIGINT / SIGTERM ask the loop to finish the current step, save and exit cleanly; a second
// signal of the same kind terminates at once.
#pragma once

namespace keel {

/// Installs the handlers (idempotent).
void install_stop_handlers();
/// Whether a stop was requested; 0 or the signal number.
int stop_requested();

}  // namespace keel
