// Fuzz target: a job file (TOML), parsed as keel-train parses --config, then validated.
#include "config/config_tree.hpp"
#include "fuzz_support.hpp"
#include "job_config_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  keel::fuzz::guarded("config", [&] {
    keel::ConfigTree tree = keel::ConfigTree::from_string(text, "fuzz.toml");
    keel::fuzz::validate_job_config(tree);
  });
  return 0;
}
