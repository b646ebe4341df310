// The subcommands of keel-ckpt. Each returns the process's exit status — 0, or 1 when a
// shard's bytes fail their checksum (verify) or the checkpoints differ (diff) — and throws
// InputError on bad input (exit 2): a missing folder, a damaged or invalid manifest, a
// malformed shard file.
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

/// Checks every shard: its file's header, its dtype and shape against the manifest, its xxh64.
/// Prints every problem (file and key); 2 when any is structural, 1 when all are checksum
/// mismatches.
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
/// The plugin is `plugin` when given (a name or a path, the user's choice), else the one the
/// manifest names, loaded by name only (never a path read from the checkpoint).
int export_hf(const std::string& path, const std::string& out, const std::vector<std::string>& plugin_dirs,
              const std::string& plugin = "");

struct ImportOptions {
  std::string hf_dir, out_dir;
  std::vector<std::string> plugin_dirs;
  std::string plugin, component;  ///< "" = the one model on the search path that imports the folder
  std::string flavor;             ///< "" = none: the keys config.json gives and the model's defaults
  std::vector<std::string> sets;  ///< "model.KEY=VALUE" for keys config.json does not give
};

/// Turns the Hugging Face folder `hf_dir` into the Keel checkpoint `out_dir`/step-0 (and the
/// model's table in `out_dir`/model.toml) through the model plugin's import extension. Nothing
/// is left in `out_dir` on failure; `out_dir` must be new or empty.
int import_hf(const ImportOptions& options);

}  // namespace keel::ckpt
