// llama3_dump: the llama3 plugin's logits of a seeded batch on the weights of a consolidated
// Keel-named file (keel-ckpt export --keel), for the Hugging Face export test.
//   llama3_dump OUT.safetensors weights=PATH [batch=B] [seq=S] [key=value ...]
// (other keys are keys of the [model] table; the flavor defaults to tiny)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cstdio>
#include <string>
#include <vector>

#include "checkpoint/safetensors.hpp"
#include "config/config_tree.hpp"
#include "dump_support.hpp"
#include "llama3_args.hpp"
#include "llama3_part.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/host_context.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: llama3_dump OUT.safetensors weights=PATH [batch=B] [seq=S] [model_key=value ...]\n");
    return 2;
  }
  try {
    keel::ConfigTree tree = keel::ConfigTree::from_string("[model]\nflavor = \"tiny\"\n", "dump");
    int64_t batch = 2, seq = 32;
    std::string weights;
    for (int i = 2; i < argc; ++i) {
      std::string kv = argv[i];
      if (kv.rfind("batch=", 0) == 0)
        batch = std::stoll(kv.substr(6));
      else if (kv.rfind("seq=", 0) == 0)
        seq = std::stoll(kv.substr(4));
      else if (kv.rfind("weights=", 0) == 0)
        weights = kv.substr(8);
      else
        tree.set("model." + kv);
    }
    if (weights.empty()) throw std::invalid_argument("weights=PATH is required");
    keel::ConfigSection section = tree.section("model");
    keel::dump::DumpHost host("model llama3 (dump)");
    keel::Config config = host.config(section);
    llama3::Args args = llama3::read_args(config);
    tree.check_all_read();
    llama3::Part part(host.context.raw(), args, keel::dump::whole_model_spec(args.n_layers));
    keel::dump::load_weights(part, weights);
    at::Generator gen = at::detail::createCPUGenerator(7);
    at::Tensor tokens = at::randint(args.vocab_size, {batch, seq}, gen, at::kLong);
    c10::NoGradGuard no_grad;
    std::vector<std::pair<std::string, at::Tensor>> dump = {{"tokens", tokens}, {"logits", part.logits(tokens)}};
    keel::write_safetensors(argv[1], dump);
    std::printf("%s: %zu tensors\n", argv[1], dump.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama3_dump: %s\n", e.what());
    return 1;
  }
}
