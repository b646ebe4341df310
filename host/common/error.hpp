// Errors the host raises. InputError is a refusal of the user's input (config, plugin,
// checkpoint, data): keel-train prints it and exits with status 2, nothing else is written.
#pragma once

#include <stdexcept>
#include <string>

namespace keel {

/// Bad input from the user: the message names what is wrong and where.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A plugin broke a promise it made through the ABI (a bug in the plugin, not bad input): a
/// component reading a config key it did not declare, for instance.
class PluginContractError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace keel
