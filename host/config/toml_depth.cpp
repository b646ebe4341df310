#include "config/toml_depth.hpp"

#include <vector>

#include "common/error.hpp"
#include "common/text.hpp"

namespace keel {

namespace {

// Hand-written because no TOML library offers a depth limit: a lexer just good enough to tell
// keys, values, strings and comments apart. Where it and toml11 could disagree on a malformed
// line, it errs towards counting more.
class DepthScanner {
 public:
  DepthScanner(const std::string& text, const std::string& name) : text_(text), name_(name) {}

  void run() {
    start_line();
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '\n') {
        ++line_;
        ++pos_;
        if (open_.empty()) start_line();
      } else if (c == '#') {
        skip_comment();
      } else if (c == '"' || c == '\'') {
        skip_string(c);
      } else {
        structure(c);
        ++pos_;
      }
    }
  }

 private:
  enum class Open { array, inline_table };
  struct Frame {
    Open kind;
    size_t depth;  // the depth outside this bracket
  };

  void start_line() {
    depth_ = header_depth_;
    in_key_ = true;
    line_start_ = true;
    in_header_ = false;
  }

  void deeper() {
    if (++depth_ > kMaxTomlDepth)
      throw InputError(cat(name_, ":", line_, ": nesting deeper than ", kMaxTomlDepth,
                           " levels (arrays, inline tables, table headers and dotted keys together)"));
  }

  void structure(char c) {
    const bool first = line_start_ && c != ' ' && c != '\t' && c != '\r';
    if (first) line_start_ = false;
    if (first && open_.empty() && c == '[') {  // a table header: [a.b] or [[a.b]]
      in_header_ = true;
      depth_ = 0;
      deeper();
      return;
    }
    if (in_header_) {
      if (c == '[' || c == '.') deeper();
      if (c == ']') {
        header_depth_ = depth_;
        in_header_ = false;
        in_key_ = false;
      }
      return;
    }
    if (in_key_) {
      if (c == '.') deeper();
      if (c == '=') in_key_ = false;
      if (c == '}' && !open_.empty() && open_.back().kind == Open::inline_table) close();  // {}
      return;
    }
    switch (c) {
      case '[':
        open_.push_back({Open::array, depth_});
        deeper();
        break;
      case '{':
        open_.push_back({Open::inline_table, depth_});
        deeper();
        in_key_ = true;
        break;
      case ']':
      case '}':
        if (!open_.empty()) close();
        break;
      case ',':
        if (!open_.empty() && open_.back().kind == Open::inline_table) {
          depth_ = open_.back().depth + 1;
          in_key_ = true;
        }
        break;
      default:
        break;
    }
  }

  void close() {
    depth_ = open_.back().depth;
    open_.pop_back();
    in_key_ = false;
  }

  void skip_comment() {
    while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
  }

  size_t quote_run(char quote) const {
    size_t n = 0;
    while (pos_ + n < text_.size() && text_[pos_ + n] == quote) ++n;
    return n;
  }

  // Basic ("...", """...""") and literal ('...', '''...''') strings. A one-line string ends
  // at the line's end at the latest; a multi-line one at a run of three or more quotes (up
  // to two more are content, as TOML says).
  void skip_string(char quote) {
    line_start_ = false;
    const bool basic = quote == '"';
    if (quote_run(quote) >= 3) {
      pos_ += 3;
      while (pos_ < text_.size()) {
        const char c = text_[pos_];
        if (basic && c == '\\') {
          if (pos_ + 1 < text_.size() && text_[pos_ + 1] == '\n') ++line_;
          pos_ += 2;
        } else if (c == quote) {
          const size_t run = quote_run(quote);
          pos_ += run;
          if (run >= 3) return;
        } else {
          if (c == '\n') ++line_;
          ++pos_;
        }
      }
      return;
    }
    ++pos_;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '\n') return;  // unterminated: toml11 refuses the line; the newline is scanned
      if (basic && c == '\\') {
        pos_ += text_[pos_ + 1 < text_.size() ? pos_ + 1 : pos_] == '\n' ? 1 : 2;
      } else {
        ++pos_;
        if (c == quote) return;
      }
    }
  }

  const std::string& text_;
  const std::string& name_;
  size_t pos_ = 0, line_ = 1;
  size_t depth_ = 0, header_depth_ = 0;
  bool in_key_ = true, line_start_ = true, in_header_ = false;
  std::vector<Frame> open_;
};

}  // namespace

void check_toml_depth(const std::string& text, const std::string& name) { DepthScanner(text, name).run(); }

}  // namespace keel
