// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/terminal.h"

#include <fmt/format.h>

namespace gpufleet::cli {
namespace {

constexpr unsigned char kC1Lead = 0xC2;  // UTF-8 of U+0080 to U+00BF starts with it

}  // namespace

ControlEscapingBuffer::~ControlEscapingBuffer() {
  FlushPending();
  target_.pubsync();
}

bool ControlEscapingBuffer::FlushPending() {
  if (!pending_lead_) {
    return true;
  }
  pending_lead_ = false;
  return target_.sputc(static_cast<char>(kC1Lead)) != traits_type::eof();
}

bool ControlEscapingBuffer::Put(unsigned char byte) {
  if (pending_lead_ && byte >= 0x80 && byte <= 0x9F) {
    pending_lead_ = false;
    const std::string escape = fmt::format("\\u{:04x}", byte);
    return target_.sputn(escape.data(), static_cast<std::streamsize>(escape.size())) ==
           static_cast<std::streamsize>(escape.size());
  }
  if (!FlushPending()) {
    return false;
  }
  if (byte == kC1Lead) {
    pending_lead_ = true;
    return true;
  }
  if ((byte < 0x20 && byte != '\n' && byte != '\t') || byte == 0x7F) {
    const std::string escape = fmt::format("\\x{:02x}", byte);
    return target_.sputn(escape.data(), static_cast<std::streamsize>(escape.size())) ==
           static_cast<std::streamsize>(escape.size());
  }
  return target_.sputc(static_cast<char>(byte)) != traits_type::eof();
}

ControlEscapingBuffer::int_type ControlEscapingBuffer::overflow(int_type ch) {
  if (traits_type::eq_int_type(ch, traits_type::eof())) {
    return sync() == 0 ? traits_type::not_eof(ch) : traits_type::eof();
  }
  return Put(static_cast<unsigned char>(traits_type::to_char_type(ch))) ? ch : traits_type::eof();
}

std::streamsize ControlEscapingBuffer::xsputn(const char* text, std::streamsize count) {
  for (std::streamsize i = 0; i < count; ++i) {
    if (!Put(static_cast<unsigned char>(text[i]))) {
      return i;
    }
  }
  return count;
}

int ControlEscapingBuffer::sync() {
  // A lead byte held back stays so across a flush (std::cerr flushes after every write): the
  // byte after it decides, or the end of the output.
  return target_.pubsync();
}

EscapeControlCharacters::EscapeControlCharacters(std::ostream& stream)
    : stream_(stream), original_(stream.rdbuf()), buffer_(*original_) {
  stream_.rdbuf(&buffer_);
}

EscapeControlCharacters::~EscapeControlCharacters() {
  stream_.rdbuf(original_);
}

}  // namespace gpufleet::cli
