// SPDX-License-Identifier: Apache-2.0
#ifndef GPUFLEET_WIRE_SPEC_TREE_H_
#define GPUFLEET_WIRE_SPEC_TREE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpufleet/core/status.h"

namespace gpufleet::wire {

// The one safe reader of what users write in YAML or JSON (job and deployment specs): a document
// as a tree of text with positions, bounded in depth and in values after alias expansion, so that
// a few lines of anchors cannot expand into billions of values. Both formats build the same tree,
// so both get the same checks and the same messages.
inline constexpr size_t kMaxSpecDepth = 32;       // a valid job spec nests 6 deep
inline constexpr int64_t kMaxSpecNodes = 100000;  // values after alias expansion

struct SpecNode {
  enum class Kind { kNull, kScalar, kSequence, kMap };
  struct Entry;

  Kind kind = Kind::kNull;
  std::string text;     // kScalar
  bool quoted = false;  // quoted or !!str: text, never a number or a bool
  int line = 0;         // 1-based; 0 when read from an already parsed JSON value
  int column = 0;
  size_t height = 1;            // levels of nesting, this one included
  int64_t size = 1;             // nodes, this one included
  std::vector<SpecNode> items;  // kSequence
  std::vector<Entry> entries;   // kMap, in document order, duplicate keys kept
};
struct SpecNode::Entry {
  SpecNode key;
  SpecNode value;
};

// " (line L, column C)" for a node read from text, "" otherwise.
std::string SpecNodePosition(const SpecNode& node);

// One YAML document (JSON is YAML 1.2; a text starting with '{' is checked as JSON first, so that
// its syntax errors come in JSON's terms). kInvalidArgument naming the line and column.
Result<SpecNode> ParseSpecTree(std::string_view text);

// A JSON value already parsed (a stored spec) as a tree without positions, under the same limits.
// Numbers keep the text nlohmann writes for them.
Result<SpecNode> SpecTreeFromJson(const nlohmann::json& value);

// The tree as JSON: plain scalars read as JSON reads the same text (null, a bool, an integer, a
// number, else a string); quoted ones stay strings, so "2" and 2 differ in both formats. A
// duplicate map key is refused naming the key and its position.
Result<nlohmann::json> SpecTreeToJson(const SpecNode& node);

}  // namespace gpufleet::wire

#endif  // GPUFLEET_WIRE_SPEC_TREE_H_
