// deepseek_dump: runs one microbatch of the DeepSeek-V3 plugin's part on seeded weights and
// tokens, and writes weights, buffers, logits, losses and gradients to a safetensors file for
// the Python parity tests (Hugging Face transformers and the plain-PyTorch reference).
//   deepseek_dump OUT.safetensors [key=value ...]   (keys of the [model] table, and:)
//     batch=B seq=S       the batch's shape
//     weights=PATH        the weights of a consolidated Keel-named file (keel-ckpt export --keel)
//                         instead of seeded ones
//     export=hf           also the plugin's Hugging Face export of the weights ("hf.<name>") and
//                         of the main loss's gradients ("hf_grad_main.<name>"), and its
//                         config.json (metadata "hf_config")
//     eos=ID              documents: the batch holds EOS id ID at fixed places (adjacent ones,
//                         the first and the last input, the last label) and its labels are
//                         the host's (BatchStream's, ignored after each EOS)
// Losses are divided by the labelled count, as the host divides them; "sequence" holds the
// batch's tokens t_0 .. t_S unmasked.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "args.hpp"
#include "checkpoint/safetensors.hpp"
#include "common/error.hpp"
#include "common/text.hpp"
#include "config/config_tree.hpp"
#include "data/batch_stream.hpp"
#include "dump_support.hpp"
#include "export_hf.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "part.hpp"
#include "plugins/host_context.hpp"

namespace {

// The plugin's Hugging Face export of `state` (weights, or gradients in the weights' places),
// each tensor under `prefix` + its transformers name.
std::string plugin_hf_export(keel::HostContext& context, const deepseek_v3::Args& args, deepseek_v3::Part& part,
                             bool gradients, const std::string& prefix,
                             std::vector<std::pair<std::string, at::Tensor>>& dump) {
  std::map<std::string, at::Tensor> state;
  for (const auto& r : part.parameters().records()) {
    at::Tensor g = r->grad();
    state[r->fqn()] = !gradients ? r->tensor().detach() : g.defined() ? g : at::zeros_like(r->tensor());
  }
  for (const auto& r : part.buffers().records())
    if (r->persistent()) state[r->fqn()] = gradients ? at::zeros_like(r->tensor()) : r->tensor();
  keel::dump::Collected collected;
  keel_export_sink raw = keel::dump::collecting_sink(collected);
  keel::ExportSink sink(&raw);
  deepseek_v3::export_hf(keel::Host(context.raw()), args, state, sink);
  for (auto& [name, tensor] : collected.tensors) dump.push_back({prefix + name, tensor});
  return collected.files.at("config.json");
}

// Hands out the rows of a fixed [batch, seq + 1] sequence as samples 0, 1, ...
class FixedSource final : public keel::TokenSource {
 public:
  FixedSource(at::Tensor rows, int64_t vocab) : rows_(std::move(rows)), vocab_(vocab) {}
  void sample(uint64_t index, int64_t length, int64_t* out) const override {
    const int64_t* row = rows_[static_cast<int64_t>(index)].data_ptr<int64_t>();
    std::copy(row, row + length, out);
  }
  int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override { return "fixed rows"; }

 private:
  at::Tensor rows_;
  int64_t vocab_;
};

// Puts EOS id `eos` at fixed places of `sequence` ([batch, seq + 1]; elsewhere there is none):
// two adjacent ones (an empty document), one early, one as the first and as the last input,
// and one as the last label (its prediction counts; nothing of its next document is in the batch).
void place_documents(at::Tensor& sequence, int64_t eos, int64_t vocab) {
  const int64_t batch = sequence.size(0), seq = sequence.size(1) - 1;
  sequence.masked_fill_(sequence.eq(eos), (eos + 1) % vocab);
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int64_t> places =
        b % 2 == 0 ? std::vector<int64_t>{3, seq / 2, seq / 2 + 1, seq} : std::vector<int64_t>{0, 5, seq - 1};
    for (int64_t t : places) sequence[b][t] = eos;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: deepseek_dump OUT.safetensors [cpu_gemm=onednn|blas] [model_key=value ...]\n");
    return 2;
  }
  try {
    keel::ConfigTree tree = keel::ConfigTree::from_string("[model]\nflavor = \"tiny\"\n", "dump");
    int64_t batch = 2, seq = 32;
    std::string weights, export_format;
    int64_t eos = -1;
    for (int i = 2; i < argc; ++i) {
      std::string kv = argv[i];
      if (kv.rfind("batch=", 0) == 0)
        batch = std::stoll(kv.substr(6));
      else if (kv.rfind("seq=", 0) == 0)
        seq = std::stoll(kv.substr(4));
      else if (kv.rfind("weights=", 0) == 0)
        weights = kv.substr(8);
      else if (kv.rfind("export=", 0) == 0)
        export_format = kv.substr(7);
      else if (kv.rfind("eos=", 0) == 0)
        eos = std::stoll(kv.substr(4));
      else if (kv == "cpu_gemm=onednn" || kv == "cpu_gemm=blas")
        at::globalContext().setUserEnabledMkldnn(kv == "cpu_gemm=onednn");  // as keel-train's training.cpu_gemm
      else
        tree.set("model." + kv);
    }
    if (!export_format.empty() && export_format != "hf")
      throw std::invalid_argument("export=" + export_format + ": only export=hf exists");
    keel::ConfigSection section = tree.section("model");
    keel::dump::DumpHost host("model deepseek_v3_mtp (dump)");
    keel::Config config = host.config(section);
    deepseek_v3::Args args = deepseek_v3::read_args(config);
    tree.check_all_read();
    deepseek_v3::ExpertPlacement placement;
    placement.local = args.n_routed_experts;
    deepseek_v3::Part part(host.context.raw(), args, keel::dump::whole_model_spec(args.n_layers), placement);
    at::Generator gen = at::detail::createCPUGenerator(7);
    if (!weights.empty()) {
      keel::dump::load_weights(part, weights);
    } else {
      part.init_weights(42);
      // A non-zero routing bias, so the parity tests cover biased expert choice.
      c10::NoGradGuard no_grad;
      for (deepseek_v3::Moe* moe : part.moes())
        moe->expert_bias().copy_(at::randn({args.n_routed_experts}, gen) * 0.05);
    }
    at::Tensor sequence = at::randint(args.vocab_size, {batch, seq + 1}, gen, at::kLong);
    if (eos >= 0) place_documents(sequence, eos, args.vocab_size);
    FixedSource source(sequence, args.vocab_size);
    keel::Batch from_stream =
        keel::BatchStream(source, seq, batch, 1, 0, eos >= 0 ? std::optional(eos) : std::nullopt).next();
    const at::Tensor &tokens = from_stream.tokens, &labels = from_stream.labels;

    deepseek_v3::Part::Outputs out = part.compute(tokens, labels, nullptr);
    const double n = static_cast<double>(from_stream.labelled_tokens);
    if (out.main_tokens.item<int64_t>() != from_stream.labelled_tokens)
      throw std::runtime_error("the part's labelled count differs from the batch's");
    std::vector<std::pair<std::string, at::Tensor>> dump = {{"sequence", sequence},
                                                            {"tokens", tokens},
                                                            {"labels", labels},
                                                            {"main_tokens", out.main_tokens},
                                                            {"logits", out.logits.detach()},
                                                            {"main_loss", out.main_loss_sum.detach() / n},
                                                            {"loss", out.loss_sum.detach() / n}};
    for (size_t k = 0; k < out.mtp_logits.size(); ++k) {
      dump.push_back({"mtp_logits." + std::to_string(k), out.mtp_logits[k].detach()});
      dump.push_back({"mtp_loss." + std::to_string(k), out.mtp_loss_sums[k].detach() / n});
      dump.push_back({"mtp_tokens." + std::to_string(k), out.mtp_tokens[k]});
    }
    for (const auto& r : part.parameters().records())
      dump.push_back({"param." + std::string(r->fqn()), r->tensor().detach().clone()});
    for (const auto& r : part.buffers().records())
      if (r->persistent()) dump.push_back({"buffer." + std::string(r->fqn()), r->tensor().clone()});
    std::string hf_config;
    if (export_format == "hf") hf_config = plugin_hf_export(host.context, args, part, /*gradients=*/false, "hf.", dump);
    (out.main_loss_sum / n).backward({}, /*retain_graph=*/true);
    if (export_format == "hf") plugin_hf_export(host.context, args, part, /*gradients=*/true, "hf_grad_main.", dump);
    for (const auto& r : part.parameters().records()) {
      at::Tensor g = r->grad();
      dump.push_back({"grad_main." + std::string(r->fqn()), g.defined() ? g.clone() : at::zeros_like(r->tensor())});
      if (g.defined()) r->tensor().mutable_grad().zero_();
    }
    (out.loss_sum / n).backward();
    for (const auto& r : part.parameters().records())
      dump.push_back({"grad_total." + std::string(r->fqn()), r->grad().clone()});
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
    if (!hf_config.empty()) meta["hf_config"] = hf_config;
    if (eos >= 0) meta["eos"] = std::to_string(eos);
    keel::write_safetensors(argv[1], dump, meta);
    std::printf("%s: %zu tensors\n", argv[1], dump.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepseek_dump: %s\n", e.what());
    return 1;
  }
}
