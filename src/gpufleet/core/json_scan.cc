// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/json_scan.h"

#include <cstring>

namespace gpufleet {
namespace {

// A cursor over JSON text; every step reports failure instead of reading past the end.
class Scanner {
 public:
  explicit Scanner(std::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Take(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  bool Peek(char c) {
    SkipSpace();
    return pos_ < text_.size() && text_[pos_] == c;
  }

  // A string at the cursor, without its quotes; `escaped` tells whether it held a backslash.
  // Quotes are found with memchr: most bytes of a stored document are inside strings.
  std::optional<std::string_view> String(bool& escaped) {
    if (!Take('"')) {
      return std::nullopt;
    }
    const size_t start = pos_;
    while (pos_ < text_.size()) {
      const void* found = std::memchr(text_.data() + pos_, '"', text_.size() - pos_);
      if (found == nullptr) {
        return std::nullopt;
      }
      const size_t quote = static_cast<size_t>(static_cast<const char*>(found) - text_.data());
      // The quote ends the string unless an odd number of backslashes precedes it.
      size_t backslashes = 0;
      while (quote - backslashes > start && text_[quote - backslashes - 1] == '\\') {
        ++backslashes;
      }
      pos_ = quote + 1;
      if (backslashes % 2 == 0) {
        escaped = std::memchr(text_.data() + start, '\\', quote - start) != nullptr;
        return text_.substr(start, quote - start);
      }
    }
    return std::nullopt;
  }

  // Skips one value of any type.
  bool SkipValue() {
    SkipSpace();
    if (pos_ >= text_.size()) {
      return false;
    }
    bool escaped = false;
    const char first = text_[pos_];
    if (first == '"') {
      return String(escaped).has_value();
    }
    if (first == '{' || first == '[') {
      int depth = 0;
      while (pos_ < text_.size()) {
        const char c = text_[pos_];
        if (c == '"') {
          if (!String(escaped)) {
            return false;
          }
          continue;
        }
        depth += (c == '{' || c == '[') ? 1 : (c == '}' || c == ']') ? -1 : 0;
        ++pos_;
        if (depth == 0) {
          return true;
        }
      }
      return false;
    }
    // A number, true, false or null: up to the next delimiter.
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != '}' && text_[pos_] != ']' &&
           text_[pos_] != ' ' && text_[pos_] != '\n') {
      ++pos_;
    }
    return pos_ > start;
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

std::optional<std::string> TopLevelString(std::string_view text, std::string_view key) {
  Scanner scanner(text);
  if (!scanner.Take('{') || scanner.Take('}')) {
    return std::nullopt;
  }
  do {
    bool escaped = false;
    const std::optional<std::string_view> name = scanner.String(escaped);
    if (!name || escaped || !scanner.Take(':')) {
      return std::nullopt;
    }
    if (*name == key) {
      if (!scanner.Peek('"')) {
        return std::nullopt;
      }
      const std::optional<std::string_view> value = scanner.String(escaped);
      if (!value || escaped) {
        return std::nullopt;
      }
      return std::string(*value);
    }
    if (!scanner.SkipValue()) {
      return std::nullopt;
    }
  } while (scanner.Take(','));
  return std::nullopt;
}

}  // namespace gpufleet
