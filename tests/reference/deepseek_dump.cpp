// deepseek_dump: runs one microbatch of the DeepSeek-V3 plugin's part on seeded weights and
// tokens, and writes weights, buffers, logits, losses and gradients to a safetensors file for
// the Python parity tests (Hugging Face transformers and the plain-PyTorch reference).
//   deepseek_dump OUT.safetensors [key=value ...]   (keys of the [model] table)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "args.hpp"
#include "checkpoint/safetensors.hpp"
#include "common/error.hpp"
#include "common/text.hpp"
#include "config/config_tree.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "part.hpp"
#include "plugins/host_context.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: deepseek_dump OUT.safetensors [model_key=value ...]\n");
    return 2;
  }
  try {
    keel::ConfigTree tree = keel::ConfigTree::from_string("[model]\nflavor = \"tiny\"\n", "dump");
    int64_t batch = 2, seq = 32;
    for (int i = 2; i < argc; ++i) {
      std::string kv = argv[i];
      if (kv.rfind("batch=", 0) == 0)
        batch = std::stoll(kv.substr(6));
      else if (kv.rfind("seq=", 0) == 0)
        seq = std::stoll(kv.substr(4));
      else
        tree.set("model." + kv);
    }
    keel::ConfigSection section = tree.section("model");
    keel::Mesh mesh(keel::MeshLayout::compute(1, 1, 1, 0));
    keel::StepMetrics metrics;
    keel::HostContext context("model deepseek_v3_mtp (dump)", {&mesh, &metrics});
    keel::Config config(context.raw(), keel::HostContext::config_handle(section));
    deepseek_v3::Args args = deepseek_v3::read_args(config);
    tree.check_all_read();

    keel_part_spec spec{};
    spec.struct_size = sizeof(spec);
    spec.num_stages = 1;
    spec.num_layers = static_cast<int32_t>(args.n_layers);
    deepseek_v3::ExpertPlacement placement;
    placement.local = args.n_routed_experts;
    deepseek_v3::Part part(context.raw(), args, spec, placement);
    part.init_weights(42);
    at::Generator gen = at::detail::createCPUGenerator(7);
    {
      // A non-zero routing bias, so the parity tests cover biased expert choice.
      c10::NoGradGuard no_grad;
      for (deepseek_v3::Moe* moe : part.moes())
        moe->expert_bias().copy_(at::randn({args.n_routed_experts}, gen) * 0.05);
    }
    at::Tensor sequence = at::randint(args.vocab_size, {batch, seq + 1}, gen, at::kLong);
    at::Tensor tokens = sequence.slice(1, 0, seq).contiguous(), labels = sequence.slice(1, 1, seq + 1).contiguous();

    deepseek_v3::Part::Outputs out = part.compute(tokens, labels, nullptr);
    const double n = static_cast<double>(labels.numel());
    std::vector<std::pair<std::string, at::Tensor>> dump = {{"tokens", tokens},
                                                            {"labels", labels},
                                                            {"logits", out.logits.detach()},
                                                            {"main_loss", out.main_loss_sum.detach() / n},
                                                            {"loss", out.loss_sum.detach() / n}};
    for (size_t k = 0; k < out.mtp_logits.size(); ++k) {
      dump.push_back({"mtp_logits." + std::to_string(k), out.mtp_logits[k].detach()});
      dump.push_back({"mtp_loss." + std::to_string(k), out.mtp_loss_sums[k].detach() / n});
    }
    for (const auto& d : part.parameters().decls()) dump.push_back({"param." + d->fqn, d->tensor.detach().clone()});
    for (const auto& d : part.buffers().decls())
      if (d->flags & KEEL_PARAM_PERSISTENT) dump.push_back({"buffer." + d->fqn, d->tensor.clone()});
    (out.main_loss_sum / n).backward({}, /*retain_graph=*/true);
    for (const auto& d : part.parameters().decls()) {
      at::Tensor g = d->tensor.grad();
      dump.push_back({"grad_main." + d->fqn, g.defined() ? g.clone() : at::zeros_like(d->tensor)});
      if (g.defined()) d->tensor.mutable_grad().zero_();
    }
    (out.loss_sum / n).backward();
    for (const auto& d : part.parameters().decls()) dump.push_back({"grad_total." + d->fqn, d->tensor.grad().clone()});
    std::map<std::string, std::string> meta = {{"vocab_size", std::to_string(args.vocab_size)},
                                               {"dim", std::to_string(args.dim)},
                                               {"n_layers", std::to_string(args.n_layers)},
                                               {"n_dense_layers", std::to_string(args.n_dense_layers)},
                                               {"n_heads", std::to_string(args.n_heads)},
                                               {"q_lora_rank", std::to_string(args.q_lora_rank)},
                                               {"kv_lora_rank", std::to_string(args.kv_lora_rank)},
                                               {"qk_nope_head_dim", std::to_string(args.qk_nope_head_dim)},
                                               {"qk_rope_head_dim", std::to_string(args.qk_rope_head_dim)},
                                               {"v_head_dim", std::to_string(args.v_head_dim)},
                                               {"dense_hidden", std::to_string(args.dense_hidden)},
                                               {"moe_hidden", std::to_string(args.moe_hidden)},
                                               {"n_routed_experts", std::to_string(args.n_routed_experts)},
                                               {"n_shared_experts", std::to_string(args.n_shared_experts)},
                                               {"top_k", std::to_string(args.top_k)},
                                               {"score_func", args.score_func},
                                               {"n_expert_groups", std::to_string(args.n_expert_groups)},
                                               {"n_limited_groups", std::to_string(args.n_limited_groups)},
                                               {"route_norm", args.route_norm ? "1" : "0"},
                                               {"route_scale", keel::format("%.17g", args.route_scale)},
                                               {"rope_theta", keel::format("%.17g", args.rope_theta)},
                                               {"rope_factor", keel::format("%.17g", args.rope_factor)},
                                               {"original_seq_len", std::to_string(args.original_seq_len)},
                                               {"beta_fast", keel::format("%.17g", args.beta_fast)},
                                               {"beta_slow", keel::format("%.17g", args.beta_slow)},
                                               {"mscale", keel::format("%.17g", args.mscale)},
                                               {"mscale_all_dim", keel::format("%.17g", args.mscale_all_dim)},
                                               {"norm_eps", keel::format("%.17g", args.norm_eps)},
                                               {"num_mtp_layers", std::to_string(args.num_mtp_layers)},
                                               {"mtp_loss_scale", keel::format("%.17g", args.mtp_loss_scale)}};
    keel::write_safetensors(argv[1], dump, meta);
    std::printf("%s: %zu tensors\n", argv[1], dump.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepseek_dump: %s\n", e.what());
    return 1;
  }
}
