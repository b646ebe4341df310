// keel-data build: turns text into a token file (docs/data.md).
//   keel-data build --input FILE... --output OUT.tok
//       the byte-level tokenizer (token = byte value, vocabulary 256, no EOS id)
//   keel-data build --tokenizer tokenizer.json --input FILE... --output OUT.tok [--eos TOKEN]
//                   [--format auto|text|jsonl] [--field text] [--text-split file|paragraph|line]
//       a Hugging Face tokenizer (through keel_tokenize.py and the tokenizers library), the EOS
//       id after every document, recorded in the header with the vocabulary and document count
// Exit status: 0 written, 2 bad input (nothing written to OUT), 1 another failure.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/text.hpp"
#include "data/token_file.hpp"
#include "progress.hpp"
#include "tokenizer_process.hpp"
#include "train/stop_signal.hpp"

namespace po = boost::program_options;

namespace {

const char* kUsage =
    "Usage: keel-data build --input FILE... --output OUT.tok [--tokenizer tokenizer.json [options]]\n"
    "  Without --tokenizer: the byte-level tokenizer (one token per byte, vocabulary 256).\n"
    "  With --tokenizer: a Hugging Face tokenizer.json through Python's tokenizers package\n"
    "  ($KEEL_PYTHON, else python3). A .jsonl/.ndjson file holds one document per line (--field);\n"
    "  any other file is plain text, one document per file (or see --text-split). Each document\n"
    "  is encoded without special tokens and followed by the EOS id.\n"
    "Exit status: 0 written, 2 bad input (nothing written to OUT), 1 another failure.\n";

struct Build {
  std::vector<std::string> inputs;
  std::string output, tokenizer, eos, format, field, text_split;
};

// Whether `input` is the file at `path` (the same inode, however it is named).
bool same_file(const std::string& input, const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec) && std::filesystem::equivalent(input, path, ec);
}

// The input files' total size; each must be a readable regular file, and neither --output nor
// the staging file it is written through (OUT.partial, removed on any failure) may be one.
uint64_t input_bytes(const Build& build) {
  if (std::filesystem::is_directory(build.output))
    throw keel::InputError(keel::cat("--output ", build.output, " is a folder; name the token file to write"));
  const std::string staging = build.output + ".partial";
  // The size of the file `key` names, once it is known to be neither output.
  auto checked_size = [&](const std::string& input, const char* key) {
    const uint64_t size = keel::InputFile(input, key).size();
    if (same_file(input, build.output)) throw keel::InputError(keel::cat(key, " ", input, " is also --output"));
    if (same_file(input, staging))
      throw keel::InputError(keel::cat(key, " ", input, " is --output's staging file ", staging,
                                       ", which the build truncates first: rename it, or choose another --output"));
    return size;
  };
  if (!build.tokenizer.empty()) checked_size(build.tokenizer, "--tokenizer");
  uint64_t total = 0;
  for (const std::string& input : build.inputs) total += checked_size(input, "--input");
  return total;
}

int build_byte_level(const Build& build, uint64_t total) {
  keel::TokenFileWriter writer(build.output, 256, std::nullopt);
  keel::data::Progress progress(total);
  std::vector<char> chunk(size_t{1} << 20);
  std::vector<uint32_t> tokens(chunk.size());
  uint64_t done = 0;
  for (const std::string& input : build.inputs) {
    const keel::InputFile in(input, "--input");
    for (uint64_t at = 0; at < in.size();) {
      const auto n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), in.size() - at));
      in.read_at(at, chunk.data(), n);
      for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<unsigned char>(chunk[i]);
      writer.append(tokens.data(), n);
      progress.update(done += n);
      at += n;
      keel::throw_if_stop_requested("the build");
    }
  }
  progress.finish();
  writer.close();
  std::printf("%s: %llu tokens (byte-level, vocab 256)\n", build.output.c_str(),
              static_cast<unsigned long long>(writer.num_tokens()));
  return 0;
}

int build_tokenized(const Build& build, uint64_t total) {
  std::vector<std::string> args = {"--tokenizer", build.tokenizer, "--format",     build.format,
                                   "--field",     build.field,     "--text-split", build.text_split};
  if (!build.eos.empty()) args.insert(args.end(), {"--eos", build.eos});
  args.emplace_back("--refusal-record");  // its refusal comes back as our one-line message
  args.emplace_back("--");
  args.insert(args.end(), build.inputs.begin(), build.inputs.end());
  keel::data::Progress progress(total);  // from here: the summary's rate counts the interpreter's start
  const char* python = std::getenv("KEEL_PYTHON");
  keel::data::TokenizerProcess process(python != nullptr && *python != '\0' ? python : "python3",
                                       keel::data::tokenizer_script(), args);
  const keel::data::TokenizerInfo& info = process.info();
  keel::TokenFileWriter writer(build.output, info.vocab_size, info.eos_id);
  const uint64_t documents = process.read_all(
      [&](const uint32_t* ids, size_t n) {
        keel::throw_if_stop_requested("the build");
        writer.append(ids, n);
        writer.end_document();
      },
      [&](uint64_t bytes) { progress.update(bytes); });
  progress.finish();
  if (documents != writer.num_documents())
    throw std::runtime_error(
        keel::cat("the tokenizer step counted ", documents, " documents but sent ", writer.num_documents()));
  writer.close();
  const double seconds = progress.elapsed();
  std::printf(
      "%s: %llu documents, %llu tokens (vocab %llu, EOS id %u \"%s\"); %.2f MB in %.2f s: %.2f MB/s, %.0f "
      "tokens/s\n",
      build.output.c_str(), static_cast<unsigned long long>(documents),
      static_cast<unsigned long long>(writer.num_tokens()), static_cast<unsigned long long>(info.vocab_size),
      info.eos_id, info.eos_token.c_str(), total / 1e6, seconds, total / 1e6 / seconds, writer.num_tokens() / seconds);
  return 0;
}

int run(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] != "build") throw keel::InputError(keel::cat("unknown command ", args[0], "\n", kUsage));
  Build build;
  po::options_description options("Options");
  options.add_options()("help,h", "show this help")("input", po::value(&build.inputs)->multitoken()->required(),
                                                    "text or JSONL files, in this order")(
      "output", po::value(&build.output)->required(), "the token file to write (replaced only on success)")(
      "tokenizer", po::value(&build.tokenizer), "a Hugging Face tokenizer.json (default: byte-level)")(
      "eos", po::value(&build.eos),
      "the token ending each document (default: tokenizer_config.json's eos_token, "
      "else </s>, <|end_of_text|>, <|endoftext|>, <｜end▁of▁sentence｜> or <eos>)")(
      "format", po::value(&build.format)->default_value("auto"),
      "auto (.jsonl and .ndjson are JSONL, the rest text), text or jsonl")(
      "field", po::value(&build.field)->default_value("text"), "JSONL: the field holding each document's text")(
      "text-split", po::value(&build.text_split)->default_value("file"),
      "plain text: one document per file, per paragraph (blank lines separate) or per line");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(std::vector<std::string>(args.begin() + 1, args.end())).options(options).run(),
              vm);
    if (vm.count("help") != 0) {
      std::cout << kUsage << options;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw keel::InputError(keel::cat("build: ", e.what(), "\n", kUsage, options));
  }
  try {
    if (build.format != "auto" && build.format != "text" && build.format != "jsonl")
      throw keel::InputError(keel::cat("--format: ", build.format, " is not auto, text or jsonl"));
    if (build.text_split != "file" && build.text_split != "paragraph" && build.text_split != "line")
      throw keel::InputError(keel::cat("--text-split: ", build.text_split, " is not file, paragraph or line"));
    if (build.tokenizer.empty())
      for (const char* key : {"eos", "format", "field", "text-split"})
        if (vm.count(key) != 0 && !vm[key].defaulted())
          throw keel::InputError(keel::cat("--", key, " needs --tokenizer (the byte-level build reads bytes)"));
    // Ctrl-C or SIGTERM stops the build between chunks: the staging file is removed on the way
    // out (as on any failure) and keel-data exits 130 or 143.
    keel::install_stop_handlers();
    const uint64_t total = input_bytes(build);
    return build.tokenizer.empty() ? build_byte_level(build, total) : build_tokenized(build, total);
  } catch (const keel::InputError& e) {
    throw keel::InputError(keel::cat(e.what(), " (", build.output, " not written)"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {  // bad input (2), or e.g. the rename into place failing (1)
    // Ctrl-C reaches the tokenizer step too, which may fail first: the stop is what happened.
    if (const int signal = keel::stop_requested(); signal != 0) {
      std::fprintf(stderr, "keel-data: %s; the output was not written\n",
                   keel::StopRequested(signal, "the build").what());
      return 128 + signal;
    }
    std::fprintf(stderr, "keel-data: %s\n", e.what());
    return dynamic_cast<const keel::InputError*>(&e) != nullptr ? 2 : 1;
  }
}
