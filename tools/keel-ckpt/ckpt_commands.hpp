// The subcommands of keel-ckpt. Each returns the process's exit status — 0, or 1 when the
// checkpoint is damaged (verify) or the checkpoints differ (diff) — and throws InputError on
// bad input (exit 2): a missing folder, a damaged manifest, an unreadable shard.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_reader.hpp"

namespace keel::ckpt {

/// The checkpoint folder `path` names: `path` itself when it holds a manifest.json, else the
/// latest complete checkpoint under it (a checkpoint root such as <run_dir>/checkpoints).
std::string checkpoint_dir(const std::string& path);

/// Prints the checkpoint's header (step, mesh, model, clipper, data position) and every entry
/// with its dtype, global shape and shards.
int list(const std::string& path);

/// Checks every shard's xxh64; 1 naming the file and key of the first damaged shard.
int verify(const std::string& path);

struct DiffOptions {
  double rtol = 0, atol = 0;          ///< both 0: bitwise
  std::vector<std::string> prefixes;  ///< empty: every entry but rng.*
};

/// Compares two checkpoints entry by entry, consolidated (any two layouts); 1 when an entry
/// differs or is missing from one side.
int diff(const std::string& a, const std::string& b, const DiffOptions& options);

/// Every "model.<fqn>" entry, whole, under its canonical FQN, sorted by FQN.
std::vector<std::pair<std::string, at::Tensor>> model_state(CheckpointReader& reader);

/// Writes the consolidated model under Keel's canonical names to the safetensors file `out`.
int export_keel(const std::string& path, const std::string& out);

/// Writes the model in Hugging Face transformers' format to the folder `out`
/// (model.safetensors and the model's files, config.json), through its plugin's export_state.
int export_hf(const std::string& path, const std::string& out, const std::vector<std::string>& plugin_dirs);

}  // namespace keel::ckpt
