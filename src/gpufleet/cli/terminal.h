// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <ostream>
#include <streambuf>

// What the CLI prints comes from the server and so, in part, from other users: a job's command,
// its provenance values, an error message quoting a field. Control characters in them would be
// read by the terminal (clear the screen, rewrite a line, set the window title, in some terminals
// worse), so every verb's output goes through ControlEscapingBuffer.
namespace gpufleet::cli {

// A stream buffer that forwards to `target`, writing each control character but newline and tab
// as an escape: C0 controls and DEL as "\x1b", C1 controls (U+0080 to U+009F, in UTF-8) as
// "\u009b". Everything else passes byte for byte. Not thread-safe (as the stream it serves).
class ControlEscapingBuffer final : public std::streambuf {
 public:
  explicit ControlEscapingBuffer(std::streambuf& target) : target_(target) {}
  ~ControlEscapingBuffer() override;
  ControlEscapingBuffer(const ControlEscapingBuffer&) = delete;
  ControlEscapingBuffer& operator=(const ControlEscapingBuffer&) = delete;

 protected:
  int_type overflow(int_type ch) override;
  std::streamsize xsputn(const char* text, std::streamsize count) override;
  int sync() override;

 private:
  bool Put(unsigned char byte);
  bool FlushPending();

  std::streambuf& target_;
  bool pending_lead_ = false;  // a 0xC2 byte held back: it may start a C1 control
};

// While it lives, `stream` writes through a ControlEscapingBuffer over its own buffer.
// Thread-compatible.
class EscapeControlCharacters {
 public:
  explicit EscapeControlCharacters(std::ostream& stream);
  ~EscapeControlCharacters();
  EscapeControlCharacters(const EscapeControlCharacters&) = delete;
  EscapeControlCharacters& operator=(const EscapeControlCharacters&) = delete;

 private:
  std::ostream& stream_;
  std::streambuf* const original_;
  ControlEscapingBuffer buffer_;
};

}  // namespace gpufleet::cli
