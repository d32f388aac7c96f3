// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/spec_tree.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

namespace gpufleet::wire {
namespace {

using nlohmann::json;

constexpr size_t kNpos = std::string_view::npos;

SpecNode At(SpecNode::Kind kind, const YAML::Mark& mark, std::string text = "",
            bool quoted = false) {
  return SpecNode{kind, std::move(text), quoted, mark.line + 1, mark.column + 1};
}

// Builds a SpecNode tree from yaml-cpp's events; ignores the events after the first error.
class TreeBuilder final : public YAML::EventHandler {
 public:
  const Status& status() const { return status_; }
  std::optional<SpecNode>& root() { return root_; }

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    Add(At(SpecNode::Kind::kNull, mark), anchor);
  }
  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    const bool quoted = tag == "!" || tag == "tag:yaml.org,2002:str";  // plain scalars have "?"
    Add(At(SpecNode::Kind::kScalar, mark, value, quoted), anchor);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Open(At(SpecNode::Kind::kSequence, mark), anchor);
  }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    Open(At(SpecNode::Kind::kMap, mark), anchor);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapEnd() override { Close(); }
  // A copy of the anchor's node, which must be complete. Copies count towards kMaxSpecNodes.
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    const SpecNode at = At(SpecNode::Kind::kNull, mark);
    const auto found = anchors_.find(anchor);
    if (found == anchors_.end()) {
      Fail(at, "alias of an unknown or unfinished anchor");
    } else if (stack_.size() + found->second.height > kMaxSpecDepth) {
      Fail(at, fmt::format("nesting deeper than {} levels", kMaxSpecDepth));
    } else if (Count(at, found->second.size)) {
      Finish(found->second, 0);
    }
  }

 private:
  struct Frame {
    SpecNode node;
    uint64_t anchor;
    std::optional<SpecNode> key;  // a map's key waiting for its value
  };

  void Fail(const SpecNode& at, const std::string& message) {
    if (status_.ok()) {
      status_ = InvalidArgumentError(message + SpecNodePosition(at));
    }
  }
  bool Count(const SpecNode& at, int64_t nodes) {
    if (status_.ok() && (nodes_ += nodes) > kMaxSpecNodes) {
      Fail(at,
           fmt::format("spec too complex: more than {} values (aliases expanded)", kMaxSpecNodes));
    }
    return status_.ok();
  }
  void Open(SpecNode node, uint64_t anchor) {
    if (Count(node, 1) && stack_.size() >= kMaxSpecDepth) {
      Fail(node, fmt::format("nesting deeper than {} levels", kMaxSpecDepth));
    }
    if (status_.ok()) {
      stack_.push_back({std::move(node), anchor, std::nullopt});
    }
  }
  void Close() {
    if (status_.ok() && !stack_.empty()) {
      Frame frame = std::move(stack_.back());
      stack_.pop_back();
      Finish(std::move(frame.node), frame.anchor);
    }
  }
  void Add(SpecNode node, uint64_t anchor) {
    if (Count(node, 1)) {
      Finish(std::move(node), anchor);
    }
  }
  void Finish(SpecNode node, uint64_t anchor) {
    if (anchor != 0 && Count(node, node.size)) {
      anchors_[anchor] = node;
    }
    if (stack_.empty()) {
      root_ = std::move(node);
      return;
    }
    Frame& top = stack_.back();
    top.node.height = std::max(top.node.height, node.height + 1);
    top.node.size += node.size;
    if (top.node.kind == SpecNode::Kind::kSequence) {
      top.node.items.push_back(std::move(node));
    } else if (!top.key.has_value()) {
      if (node.kind != SpecNode::Kind::kScalar) {
        Fail(node, "a map key must be a string");
      }
      top.key = std::move(node);
    } else {
      top.node.entries.push_back({std::move(*top.key), std::move(node)});
      top.key.reset();
    }
  }

  Status status_;
  std::vector<Frame> stack_;
  std::optional<SpecNode> root_;
  std::map<uint64_t, SpecNode> anchors_;
  int64_t nodes_ = 0;
};

// A JSON value already parsed (a stored job's `spec`) as a tree without positions, under the same
// depth and size limits as TreeBuilder. Numbers keep the text nlohmann writes for them, which is
// what the tree of the dumped value would hold.
Status JsonToTree(const json& value, size_t depth, int64_t& nodes, SpecNode& out) {
  if (depth > kMaxSpecDepth && value.is_structured()) {
    return InvalidArgumentError(fmt::format("nesting deeper than {} levels", kMaxSpecDepth));
  }
  if (++nodes > kMaxSpecNodes) {
    return InvalidArgumentError(
        fmt::format("spec too complex: more than {} values (aliases expanded)", kMaxSpecNodes));
  }
  switch (value.type()) {
    case json::value_t::null:
    case json::value_t::discarded:
      out.kind = SpecNode::Kind::kNull;
      return Status::Ok();
    case json::value_t::string:
      out.kind = SpecNode::Kind::kScalar;
      out.text = value.get_ref<const std::string&>();
      out.quoted = true;
      return Status::Ok();
    case json::value_t::array:
      out.kind = SpecNode::Kind::kSequence;
      out.items.resize(value.size());
      for (size_t i = 0; i < value.size(); ++i) {
        GPUFLEET_RETURN_IF_ERROR(JsonToTree(value[i], depth + 1, nodes, out.items[i]));
      }
      break;
    case json::value_t::object:
      out.kind = SpecNode::Kind::kMap;
      out.entries.reserve(value.size());
      for (const auto& [key, member] : value.items()) {
        SpecNode::Entry& entry = out.entries.emplace_back();
        entry.key = SpecNode{SpecNode::Kind::kScalar, key, true};
        ++nodes;
        GPUFLEET_RETURN_IF_ERROR(JsonToTree(member, depth + 1, nodes, entry.value));
      }
      break;
    default:  // numbers and booleans: plain scalars, as written
      out.kind = SpecNode::Kind::kScalar;
      out.text = value.dump();
      return Status::Ok();
  }
  for (const SpecNode& child : out.items) {
    out.height = std::max(out.height, child.height + 1);
    out.size += child.size;
  }
  for (const SpecNode::Entry& entry : out.entries) {
    out.height = std::max(out.height, entry.value.height + 1);
    out.size += entry.key.size + entry.value.size;
  }
  return Status::Ok();
}

// A plain (unquoted) scalar as JSON reads the same text.
json PlainScalar(const std::string& text) {
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") {
    return nullptr;
  }
  if (text == "true" || text == "True" || text == "TRUE") {
    return true;
  }
  if (text == "false" || text == "False" || text == "FALSE") {
    return false;
  }
  const char* begin = text.data() + (text.front() == '+' ? 1 : 0);
  const char* end = text.data() + text.size();
  int64_t integer = 0;
  if (const auto [at, error] = std::from_chars(begin, end, integer);
      error == std::errc() && at == end) {
    return integer;
  }
  double number = 0;
  if (const auto [at, error] = std::from_chars(begin, end, number);
      error == std::errc() && at == end) {
    return number;
  }
  return text;
}

}  // namespace

// JSON is YAML 1.2, and yaml-cpp reads it keeping duplicate keys, positions and numbers as
// written; nlohmann checks JSON first so that JSON syntax errors come in JSON's terms.
Result<SpecNode> ParseSpecTree(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != kNpos && text[first] == '{') {
    try {
      [[maybe_unused]] const json checked =
          json::parse(text.begin(), text.end(), [](int, json::parse_event_t, json&) {
            return false;  // keep nothing: a syntax check
          });
    } catch (const json::exception& e) {
      std::string_view what = e.what();  // "[json.exception.parse_error.101] parse error at ..."
      what.remove_prefix(what.find("] ") == kNpos ? 0 : what.find("] ") + 2);
      return InvalidArgumentError(fmt::format("invalid JSON: {}", what));
    }
  }
  std::istringstream in{std::string(text)};
  try {
    YAML::Parser parser(in);
    TreeBuilder tree;
    const bool any = parser.HandleNextDocument(tree);
    GPUFLEET_RETURN_IF_ERROR(tree.status());
    std::optional<SpecNode> root = std::move(tree.root());
    if (!any || !root.has_value() || root->kind == SpecNode::Kind::kNull) {
      return InvalidArgumentError("spec is empty" +
                                  (root.has_value() ? SpecNodePosition(*root) : ""));
    }
    // At most one empty document may follow (a trailing "---"). Look at two at most: on some bad
    // input yaml-cpp 0.7 returns empty documents forever (jbeder/yaml-cpp#1040).
    TreeBuilder extra;
    for (int i = 0; i < 2 && parser.HandleNextDocument(extra); ++i) {
      if (i == 1 || (extra.root().has_value() && extra.root()->kind != SpecNode::Kind::kNull)) {
        return InvalidArgumentError("more than one YAML document: a spec is one document");
      }
    }
    return std::move(*root);
  } catch (const YAML::DeepRecursion& e) {  // its message is "bad file"
    return InvalidArgumentError(fmt::format("nesting deeper than {} levels", kMaxSpecDepth));
  } catch (const YAML::Exception& e) {
    const std::string at = e.mark.is_null() ? ""
                                            : fmt::format(" at line {}, column {}", e.mark.line + 1,
                                                          e.mark.column + 1);
    return InvalidArgumentError(fmt::format("invalid YAML{}: {}", at, e.msg));
  }
}

std::string SpecNodePosition(const SpecNode& node) {
  return node.line > 0 ? fmt::format(" (line {}, column {})", node.line, node.column) : "";
}

Result<SpecNode> SpecTreeFromJson(const nlohmann::json& value) {
  SpecNode root;
  int64_t nodes = 0;
  GPUFLEET_RETURN_IF_ERROR(JsonToTree(value, 1, nodes, root));
  return root;
}

Result<nlohmann::json> SpecTreeToJson(const SpecNode& node) {
  switch (node.kind) {
    case SpecNode::Kind::kNull:
      return json(nullptr);
    case SpecNode::Kind::kScalar:
      return node.quoted ? json(node.text) : PlainScalar(node.text);
    case SpecNode::Kind::kSequence: {
      json out = json::array();
      for (const SpecNode& item : node.items) {
        GPUFLEET_ASSIGN_OR_RETURN(json value, SpecTreeToJson(item));
        out.push_back(std::move(value));
      }
      return out;
    }
    case SpecNode::Kind::kMap: {
      json out = json::object();
      for (const SpecNode::Entry& entry : node.entries) {
        if (out.contains(entry.key.text)) {
          return InvalidArgumentError(
              fmt::format("{}: duplicate key{}", entry.key.text, SpecNodePosition(entry.key)));
        }
        GPUFLEET_ASSIGN_OR_RETURN(out[entry.key.text], SpecTreeToJson(entry.value));
      }
      return out;
    }
  }
  return InvalidArgumentError("unreadable spec node");
}

}  // namespace gpufleet::wire
