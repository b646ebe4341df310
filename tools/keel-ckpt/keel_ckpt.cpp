// keel-ckpt: lists, verifies, compares and exports Keel checkpoints.
//   keel-ckpt ls DIR | verify DIR | diff A B [--rtol R --atol T --prefix P] |
//             export (--hf OUT | --keel OUT.safetensors) DIR [--plugin NAME] [--plugin-path P] |
//             import --hf HF_DIR OUT [--plugin NAME] [--flavor F] [--set model.KEY=VALUE]
// Exit status: 0 done (equal), 1 damaged (verify) or different (diff) or a failure, 2 bad input.
#include <c10/util/Exception.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "ckpt_commands.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "train/stop_signal.hpp"

namespace po = boost::program_options;

namespace {

const char* kUsage =
    "Usage: keel-ckpt COMMAND [options]\n"
    "  ls DIR                             the checkpoint's step, mesh, model, data position and every entry\n"
    "  verify DIR                         checks every shard (exit 1 on a checksum mismatch, 2 on a malformed\n"
    "                                     checkpoint; each problem named by file and key)\n"
    "  diff A B                           compares two checkpoints entry by entry (exit 1 if they differ)\n"
    "  export --hf OUT DIR                the model in Hugging Face transformers' format (folder OUT)\n"
    "  export --keel OUT.safetensors DIR  the consolidated model under Keel's canonical names\n"
    "  import --hf HF_DIR OUT             a Hugging Face checkpoint folder as the Keel checkpoint OUT/step-0\n"
    "DIR is a checkpoint folder (step-<N>/) or a folder of them (its latest is used).\n"
    "keel-ckpt COMMAND --help shows a command's options.\n"
    "Exit status: 0 ok, 1 damaged (verify), different (diff) or failed, 2 bad input.\n";

struct Command {
  po::options_description options;
  po::positional_options_description positional;
  po::options_description hidden;
  po::variables_map vm;

  explicit Command(const std::string& caption) : options(caption) { options.add_options()("help,h", "show this help"); }
  // Parses `args`; false (after printing why) when they are not this command's.
  bool parse(const std::vector<std::string>& args, const char* name) {
    po::options_description all;
    all.add(options).add(hidden);
    try {
      po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
      po::notify(vm);
      return true;
    } catch (const po::error& e) {
      std::fprintf(stderr, "keel-ckpt %s: %s\n%s", name, e.what(), keel::cat(options).c_str());
      return false;
    }
  }
  bool help() const { return vm.count("help") != 0; }
  void print() const { std::cout << options; }
};

namespace ck = keel::ckpt;

int ls_or_verify(const std::string& name, const std::vector<std::string>& args) {
  Command c(name == "ls"
                ? "Usage: keel-ckpt ls DIR\n  Prints the checkpoint's header and every entry: key, "
                  "dtype, global shape, shards (file @ offsets).\nOptions"
                : "Usage: keel-ckpt verify DIR\n  Validates the manifest, then every shard of every entry: its "
                  "file's header,\n  its dtype and shape, its xxh64. Prints every problem naming the file and "
                  "key;\n  exit 1 when all are checksum mismatches, 2 when any is malformed.\nOptions");
  c.hidden.add_options()("dir", po::value<std::string>());
  c.positional.add("dir", 1);
  if (!c.parse(args, name.c_str())) return 2;
  if (c.help()) return c.print(), 0;
  if (c.vm.count("dir") == 0) throw keel::InputError(keel::cat(name, " needs a checkpoint: keel-ckpt ", name, " DIR"));
  const std::string dir = c.vm["dir"].as<std::string>();
  return name == "ls" ? ck::list(dir) : ck::verify(dir);
}

int diff(const std::vector<std::string>& args) {
  Command c(
      "Usage: keel-ckpt diff A B [options]\n"
      "  Compares checkpoints A and B entry by entry, each entry consolidated, so any two layouts compare.\n"
      "  Every entry is compared except rng.* (per-rank generator states, which depend on the layout);\n"
      "  --prefix restricts the comparison to keys starting with the prefix (repeatable; rng. to include\n"
      "  them). Bitwise unless --rtol or --atol is given: then |a - b| <= atol + rtol * |b|.\n"
      "  Prints one line per differing or missing entry, then \"identical: N entries\" or\n"
      "  \"differ: K of N entries\"; exit 0 equal, 1 different, 2 bad input.\nOptions");
  c.options.add_options()("rtol", po::value<double>()->default_value(0.0), "relative tolerance")(
      "atol", po::value<double>()->default_value(0.0), "absolute tolerance")(
      "prefix", po::value<std::vector<std::string>>()->composing(), "compare only keys with this prefix");
  c.hidden.add_options()("checkpoints", po::value<std::vector<std::string>>());
  c.positional.add("checkpoints", 2);
  if (!c.parse(args, "diff")) return 2;
  if (c.help()) return c.print(), 0;
  std::vector<std::string> dirs;
  if (c.vm.count("checkpoints") != 0) dirs = c.vm["checkpoints"].as<std::vector<std::string>>();
  if (dirs.size() != 2) throw keel::InputError("diff needs two checkpoints: keel-ckpt diff A B");
  ck::DiffOptions options;
  options.rtol = c.vm["rtol"].as<double>();
  options.atol = c.vm["atol"].as<double>();
  if (!(options.rtol >= 0) || !(options.atol >= 0)) throw keel::InputError("--rtol and --atol must be >= 0");
  if (c.vm.count("prefix") != 0) options.prefixes = c.vm["prefix"].as<std::vector<std::string>>();
  return ck::diff(dirs[0], dirs[1], options);
}

int export_model(const std::vector<std::string>& args) {
  Command c(
      "Usage: keel-ckpt export (--hf OUT | --keel OUT.safetensors) DIR [--plugin NAME] [--plugin-path P]...\n"
      "  Consolidates the checkpoint's model (every model.* entry, under its canonical FQN).\n"
      "  --hf: the model plugin converts it to Hugging Face transformers' format: the plugin the manifest\n"
      "  names, looked up by name on the plugin search path, or the one --plugin gives (a name or a path)\n"
      "  (OUT/model.safetensors, OUT/config.json); what it cannot express is left out and logged\n"
      "  (deepseek_v3_mtp: the MTP modules). Optimizer, clipper and RNG state are never exported.\nOptions");
  c.options.add_options()("hf", po::value<std::string>(), "write a Hugging Face folder OUT")(
      "keel", po::value<std::string>(), "write one safetensors file with Keel's names")(
      "plugin", po::value<std::string>(), "the model plugin for --hf (a name or a path), instead of the manifest's")(
      "plugin-path", po::value<std::vector<std::string>>()->composing(),
      "a folder searched first for plugins (repeatable)");
  c.hidden.add_options()("dir", po::value<std::string>());
  c.positional.add("dir", 1);
  if (!c.parse(args, "export")) return 2;
  if (c.help()) return c.print(), 0;
  const bool hf = c.vm.count("hf") != 0, native = c.vm.count("keel") != 0;
  if (hf == native) throw keel::InputError("export needs exactly one of --hf OUT and --keel OUT.safetensors");
  if (c.vm.count("dir") == 0) throw keel::InputError("export needs a checkpoint: keel-ckpt export ... DIR");
  const std::string dir = c.vm["dir"].as<std::string>();
  if (native) return ck::export_keel(dir, c.vm["keel"].as<std::string>());
  std::vector<std::string> plugin_dirs;
  if (c.vm.count("plugin-path") != 0) plugin_dirs = c.vm["plugin-path"].as<std::vector<std::string>>();
  const std::string plugin = c.vm.count("plugin") != 0 ? c.vm["plugin"].as<std::string>() : std::string();
  return ck::export_hf(dir, c.vm["hf"].as<std::string>(), plugin_dirs, plugin);
}

int import_model(const std::vector<std::string>& args) {
  Command c(
      "Usage: keel-ckpt import --hf HF_DIR OUT [--plugin NAME] [--component C] [--flavor F]\n"
      "                        [--set model.KEY=VALUE]... [--plugin-path P]...\n"
      "  Turns a Hugging Face checkpoint folder (config.json with model.safetensors, or the shards\n"
      "  model.safetensors.index.json names) into the Keel checkpoint OUT/step-0, which any layout loads\n"
      "  (--set checkpoint.load=OUT/step-0 --set checkpoint.load_model_only=true), and writes the\n"
      "  matching [model] table to OUT/model.toml. The model plugin reads config.json and maps every\n"
      "  tensor: the one --plugin names, or else the one model on the plugin search path that accepts the\n"
      "  folder. --flavor and --set give the keys config.json does not (training settings such as\n"
      "  mtp_loss_scale); its shapes cannot be overridden. Tensors are read and written one at a time;\n"
      "  a shard that changes while it is read is refused. On failure nothing is left in OUT; OUT must be new or "
      "empty.\nOptions");
  c.options.add_options()("hf", po::value<std::string>(), "the Hugging Face folder to import")(
      "plugin", po::value<std::string>(), "the model plugin (a name or a path)")(
      "component", po::value<std::string>(), "the model component, when the plugin has several")(
      "flavor", po::value<std::string>(), "the model flavor the imported keys apply on top of")(
      "set", po::value<std::vector<std::string>>()->composing(), "model.KEY=VALUE (repeatable)")(
      "plugin-path", po::value<std::vector<std::string>>()->composing(),
      "a folder searched first for plugins (repeatable)");
  c.hidden.add_options()("out", po::value<std::string>());
  c.positional.add("out", 1);
  if (!c.parse(args, "import")) return 2;
  if (c.help()) return c.print(), 0;
  if (c.vm.count("hf") == 0 || c.vm.count("out") == 0)
    throw keel::InputError("import needs a folder and a destination: keel-ckpt import --hf HF_DIR OUT");
  ck::ImportOptions options;
  options.hf_dir = c.vm["hf"].as<std::string>();
  options.out_dir = c.vm["out"].as<std::string>();
  auto text = [&](const char* key) { return c.vm.count(key) != 0 ? c.vm[key].as<std::string>() : std::string(); };
  options.plugin = text("plugin");
  options.component = text("component");
  options.flavor = text("flavor");
  if (c.vm.count("plugin-path") != 0) options.plugin_dirs = c.vm["plugin-path"].as<std::vector<std::string>>();
  if (c.vm.count("set") != 0) options.sets = c.vm["set"].as<std::vector<std::string>>();
  return ck::import_hf(options);
}

int run(const std::string& name, const std::vector<std::string>& args) {
  if (name == "ls" || name == "verify") return ls_or_verify(name, args);
  if (name == "diff") return diff(args);
  if (name == "export") return export_model(args);
  if (name == "import") return import_model(args);
  std::fprintf(stderr, "keel-ckpt: unknown command '%s'\n%s", name.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return std::fputs(kUsage, stderr), 2;
  if (args[0] == "--help" || args[0] == "-h") return std::fputs(kUsage, stdout), 0;
  try {
    return run(args[0], std::vector<std::string>(args.begin() + 1, args.end()));
  } catch (const keel::StopRequested& e) {
    keel::log_line(keel::LogLevel::error, e.what());
    return e.exit_status();
  } catch (const keel::InputError& e) {
    keel::log_line(keel::LogLevel::error, e.what());
    return 2;
  } catch (const c10::Error& e) {
    // LibTorch's message without its stack trace.
    keel::log_line(keel::LogLevel::error, e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    keel::log_line(keel::LogLevel::error, e.what());
    return 1;
  } catch (...) {
    keel::log_line(keel::LogLevel::error, "keel-ckpt: unknown exception");
    return 1;
  }
}
