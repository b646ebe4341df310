// Fuzz target: --set overrides. The input is up to 8 assignments separated by NUL bytes (as
// they arrive in argv), applied to a small valid job, which is then validated.
#include "config/config_tree.hpp"
#include "fuzz_support.hpp"
#include "job_config_check.hpp"

namespace {

constexpr const char* kJob = R"([job]
name = "fuzz"
[model]
plugin = "llama3"
flavor = "debug"
[training]
steps = 2
seq_len = 16
global_batch = 4
[parallelism]
dp = 2
)";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  keel::fuzz::guarded("config_set", [&] {
    keel::ConfigTree tree = keel::ConfigTree::from_string(kJob, "job.toml");
    size_t begin = 0;
    for (int n = 0; n < 8 && begin <= input.size(); ++n) {
      size_t end = input.find('\0', begin);
      if (end == std::string::npos) end = input.size();
      tree.set(input.substr(begin, end - begin));
      begin = end + 1;
    }
    keel::fuzz::validate_job_config(tree);
  });
  return 0;
}
