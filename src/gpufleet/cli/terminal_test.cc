// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/terminal.h"

#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace gpufleet::cli {
namespace {

std::string Escaped(const std::string& text) {
  std::ostringstream out;
  {
    EscapeControlCharacters escaping(out);
    out << text;
  }
  return out.str();
}

TEST(ControlEscapingBuffer, EscapesEveryControlCharacterButNewlineAndTab) {
  // Clear the screen, set the window title, a carriage return that rewrites the line, a bell.
  EXPECT_EQ(Escaped("a\x1b[2Jb\x1b]0;title\x07 c\rd\n\te"),
            "a\\x1b[2Jb\\x1b]0;title\\x07 c\\x0dd\n\te");
  EXPECT_EQ(Escaped(std::string("nul\0del\x7f", 8)), "nul\\x00del\\x7f");
  // C1 controls (CSI is U+009B) in UTF-8; other UTF-8 passes as it is.
  EXPECT_EQ(Escaped("x\xc2\x9b"
                    "31my \xc2\xa0 \xc3\xa9 \xe2\x82\xac"),
            "x\\u009b31my \xc2\xa0 \xc3\xa9 \xe2\x82\xac");
  EXPECT_EQ(Escaped("ends with a lead \xc2"), "ends with a lead \xc2");
}

TEST(ControlEscapingBuffer, AC1ControlSplitAcrossWritesAndFlushesIsStillEscaped) {
  std::ostringstream out;
  {
    EscapeControlCharacters escaping(out);
    out << "a\xc2" << std::flush;
    out.put('\x85');
    out << "b" << std::endl;
  }
  EXPECT_EQ(out.str(), "a\\u0085b\n");
}

TEST(EscapeControlCharacters, RestoresTheStreamsBuffer) {
  std::ostringstream out;
  // The stream's buffer as std::ostream sees it (std::ostringstream::rdbuf() is always its own).
  std::ostream& stream = out;
  std::streambuf* original = stream.rdbuf();
  {
    EscapeControlCharacters escaping(stream);
    EXPECT_NE(stream.rdbuf(), original);
  }
  EXPECT_EQ(stream.rdbuf(), original);
  out << "\x1b";
  EXPECT_EQ(out.str(), "\x1b");
}

}  // namespace
}  // namespace gpufleet::cli
