// keel-data build --input TEXT --output FILE: turns text into a token file with the
// byte-level tokenizer (token = byte value, vocabulary 256).
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "data/token_file.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string input, output;
  bool build = !args.empty() && args[0] == "build";
  for (size_t i = 1; build && i + 1 < args.size(); i += 2) {
    if (args[i] == "--input")
      input = args[i + 1];
    else if (args[i] == "--output")
      output = args[i + 1];
    else
      build = false;
  }
  if (!build || input.empty() || output.empty()) {
    std::fprintf(stderr,
                 "Usage: keel-data build --input TEXT --output FILE\n"
                 "  Byte-level tokenizer: one token per byte, vocabulary 256.\n");
    return 2;
  }
  std::ifstream in(input, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "keel-data: cannot read %s\n", input.c_str());
    return 2;
  }
  std::vector<uint32_t> tokens;
  for (auto it = std::istreambuf_iterator<char>(in); it != std::istreambuf_iterator<char>(); ++it)
    tokens.push_back(static_cast<unsigned char>(*it));
  try {
    keel::write_token_file(output, tokens, 256);
  } catch (const keel::InputError& e) {
    std::fprintf(stderr, "keel-data: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {  // e.g. the rename into place failing
    std::fprintf(stderr, "keel-data: %s\n", e.what());
    return 1;
  }
  std::printf("%s: %zu tokens (byte-level, vocab 256)\n", output.c_str(), tokens.size());
  return 0;
}
