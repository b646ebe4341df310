#include "train/stop_signal.hpp"

#include <atomic>
#include <csignal>

namespace keel {

namespace {
std::atomic<int> requested{0};

extern "C" void on_stop_signal(int signal) {
  if (requested.exchange(signal) != 0) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
}
}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int stop_requested() { return requested.load(); }

StopRequested::StopRequested(int signal, const std::string& what)
    : std::runtime_error(what + " stopped by " + (signal == SIGINT ? "SIGINT" : "SIGTERM")), signal_(signal) {}

void throw_if_stop_requested(const std::string& what) {
  if (const int signal = stop_requested(); signal != 0) throw StopRequested(signal, what);
}

}  // namespace keel
