// keel-ckpt diff: two checkpoints compared entry by entry, each entry consolidated (read whole
// from whichever shards hold it), so checkpoints of different layouts compare directly.
#include <c10/core/GradMode.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/safetensors.hpp"
#include "ckpt_commands.hpp"
#include "common/text.hpp"

namespace keel::ckpt {

namespace {

// The per-rank generator states depend on the layout, not on the training: left out unless a
// prefix asks for them.
bool compared(const std::string& key, const DiffOptions& options) {
  if (options.prefixes.empty()) return !key.starts_with("rng.");
  for (const std::string& prefix : options.prefixes)
    if (key.starts_with(prefix)) return true;
  return false;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

std::string header(const char* label, const CheckpointReader& r) {
  const Manifest& m = r.manifest();
  return format("%s: %s (step %ld, pp %d x dp %d, ep %d)", label, r.dir().c_str(), static_cast<long>(m.step), m.pp,
                m.dp, m.ep);
}

}  // namespace

int diff(const std::string& path_a, const std::string& path_b, const DiffOptions& options) {
  CheckpointReader a(checkpoint_dir(path_a)), b(checkpoint_dir(path_b));
  std::printf("%s\n%s\n", header("a", a).c_str(), header("b", b).c_str());
  std::set<std::string> keys;
  for (const CheckpointReader* r : {&a, &b})
    for (const auto& [key, entry] : r->manifest().entries)
      if (compared(key, options)) keys.insert(key);
  // Every shard of both sides is read and its checksum verified before any finding is printed:
  // a malformed or damaged checkpoint is refused (exit 2), whether or not its entries differ.
  // Findings are therefore kept until the end; each shard is read once.
  const bool bitwise = options.rtol == 0 && options.atol == 0;
  c10::NoGradGuard no_grad;
  std::vector<std::string> findings;
  for (const std::string& key : keys) {
    if (!a.has(key) || !b.has(key)) {
      (a.has(key) ? a : b).check_entry(key);
      findings.push_back(format("only in %s  %s", a.has(key) ? "a" : "b", key.c_str()));
      continue;
    }
    const EntryRecord &ea = a.manifest().entries.at(key), &eb = b.manifest().entries.at(key);
    if (ea.dtype != eb.dtype || ea.shape != eb.shape) {
      a.check_entry(key);
      b.check_entry(key);
      findings.push_back(format("differs    %s  %s %s vs %s %s", key.c_str(), ea.dtype.c_str(),
                                cat(at::IntArrayRef(ea.shape)).c_str(), eb.dtype.c_str(),
                                cat(at::IntArrayRef(eb.shape)).c_str()));
      continue;
    }
    at::Tensor x = a.read_whole(key), y = b.read_whole(key);
    at::Tensor xd = x.to(at::kDouble), yd = y.to(at::kDouble);
    const bool same = bitwise ? bitwise_equal(x, y)
                              : at::isclose(xd, yd, options.rtol, options.atol, /*equal_nan=*/true).all().item<bool>();
    if (same) continue;
    at::Tensor gap = (xd - yd).abs();
    const double max_diff = gap.numel() == 0 ? 0.0 : gap.max().item<double>();
    findings.push_back(format("differs    %s  max |diff| %.6g", key.c_str(), max_diff));
  }
  for (const std::string& line : findings) std::printf("%s\n", line.c_str());
  const size_t differ = findings.size();
  const std::string within =
      bitwise ? std::string("bitwise") : format("within rtol %g, atol %g", options.rtol, options.atol);
  if (differ == 0)
    std::printf("identical: %zu entries (%s)\n", keys.size(), within.c_str());
  else
    std::printf("differ: %zu of %zu entries (%s)\n", differ, keys.size(), within.c_str());
  return differ == 0 ? 0 : 1;
}

}  // namespace keel::ckpt
