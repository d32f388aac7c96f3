// SPDX-License-Identifier: Apache-2.0
#include "config_file.h"

#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <yaml-cpp/yaml.h>

namespace gpufleet::app {
namespace {

// The key of `option` in a file: its first long name ("listen" for --listen); empty for options
// without one.
std::string KeyOf(const CLI::Option& option) {
  const std::vector<std::string>& names = option.get_lnames();
  return names.empty() ? std::string() : names.front();
}

bool IsConfigOption(const CLI::Option& option) {
  const std::string key = KeyOf(option);
  return key.empty() || key == "help" || key == std::string(kConfigFlag).substr(2) ||
         key == std::string(kPrintConfigFlag).substr(2);
}

// A flag takes no value on the command line (--no-quarantine).
bool IsFlag(const CLI::Option& option) {
  return option.get_expected_max() == 0;
}

// The text of a YAML node for error messages: a scalar as written, anything else as flow YAML.
std::string Shown(const YAML::Node& node) {
  if (node.IsScalar()) {
    return node.Scalar();
  }
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

// `line` is 0-based, as yaml-cpp counts.
Status BadValue(const std::string& path, int line, const YAML::Node& node, const std::string& key,
                const std::string& why) {
  const std::string shown = node.IsDefined() && !node.IsNull() ? Shown(node) : std::string();
  return InvalidArgumentError(
      fmt::format("{}:{}: {}: bad value \"{}\": {}", path, line + 1, key, shown, why));
}

bool IsList(const CLI::Option& option) {
  return option.get_expected_max() > 1 || option.get_items_expected_max() > 1;
}

// The values an unset option stands at: its captured default, which CLI11 writes as "[a,b]" for
// a list option.
std::vector<std::string> DefaultValues(const CLI::Option& option) {
  std::string text = option.get_default_str();
  if (!IsList(option)) {
    return {text};
  }
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  std::vector<std::string> values;
  if (text.empty()) {
    return values;
  }
  size_t start = 0;
  for (size_t comma = text.find(','); comma != std::string::npos; comma = text.find(',', start)) {
    values.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  values.push_back(text.substr(start));
  return values;
}

// The command-line strings `value` stands for, for the option `option` named `key`.
Result<std::vector<std::string>> Strings(const std::string& path, int line, const std::string& key,
                                         const CLI::Option& option, const YAML::Node& value) {
  if (!value.IsDefined() || value.IsNull()) {
    return BadValue(path, line, value, key, "no value");
  }
  if (IsFlag(option)) {
    bool on = false;
    if (!value.IsScalar() || !YAML::convert<bool>::decode(value, on)) {
      return BadValue(path, line, value, key, "expected true or false");
    }
    return on ? std::vector<std::string>{"true"} : std::vector<std::string>{};
  }
  if (value.IsScalar()) {
    return std::vector<std::string>{value.Scalar()};
  }
  if (value.IsSequence()) {
    if (!IsList(option)) {
      return BadValue(path, line, value, key, "expected one value, not a list");
    }
    std::vector<std::string> strings;
    for (const YAML::Node& item : value) {
      if (!item.IsScalar()) {
        return BadValue(path, item.Mark().line, item, key, "expected a list of plain values");
      }
      strings.push_back(item.Scalar());
    }
    return strings;
  }
  return BadValue(path, line, value, key, "expected a plain value, not a mapping");
}

std::string RedactPasswords(const std::string& text) {
  static const std::regex kUserInfo("(://[^:/@\\s]+:)[^@/\\s]+@");
  return std::regex_replace(text, kUserInfo, "$1***@");
}

}  // namespace

void AddConfigFlags(CLI::App& command) {
  command.option_defaults()->always_capture_default();
  command.add_option(kConfigFlag,
                     "YAML file of settings: each key a flag without its dashes "
                     "(docs/operations.md); flags given here override it");
  const std::string description =
      "print the effective configuration (flags, file, defaults) as YAML and exit";
  command.add_flag(kPrintConfigFlag, description);
}

Status ApplyConfigFile(CLI::App& command, const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return NotFoundError(fmt::format("{}: cannot read the configuration file", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(
        fmt::format("{}:{}: malformed YAML: {}", path, e.mark.line + 1, e.msg));
  }
  if (root.IsNull()) {
    return Status();  // an empty file sets nothing
  }
  if (!root.IsMap()) {
    return InvalidArgumentError(
        fmt::format("{}:{}: expected a mapping of settings (key: value), not \"{}\"", path,
                    root.Mark().line + 1, Shown(root)));
  }
  std::set<const CLI::Option*> from_file;
  for (const auto& entry : root) {
    const YAML::Node& key_node = entry.first;
    const YAML::Node& value = entry.second;
    const std::string key = key_node.IsScalar() ? key_node.Scalar() : Shown(key_node);
    const int line = key_node.Mark().line;
    CLI::Option* option = key.empty() ? nullptr : command.get_option_no_throw("--" + key);
    if (option == nullptr || IsConfigOption(*option) || KeyOf(*option) != key) {
      return InvalidArgumentError(fmt::format(
          "{}:{}: unknown key \"{}\" (value \"{}\"); the keys are the flags of `gpufleet {}` "
          "without their dashes (gpufleet {} --help)",
          path, key_node.Mark().line + 1, key, Shown(value), command.get_name(),
          command.get_name()));
    }
    GPUFLEET_ASSIGN_OR_RETURN(std::vector<std::string> strings,
                              Strings(path, line, key, *option, value));
    if (option->count() > 0 && from_file.count(option) == 0) {
      continue;  // given on the command line, which wins
    }
    if (from_file.count(option) > 0) {
      return InvalidArgumentError(
          fmt::format("{}:{}: key \"{}\" given twice", path, key_node.Mark().line + 1, key));
    }
    if (strings.empty() || (!IsFlag(*option) && strings == DefaultValues(*option))) {
      // A flag set to false, or an option set to its default (as --print-config writes every
      // option), changes nothing and leaves the option unset, so its `needs` do not apply.
      from_file.insert(option);
      continue;
    }
    // Each value goes through the option's checks and conversion as if typed after the flag.
    try {
      option->add_result(strings);
      option->run_callback();
    } catch (const CLI::Error& e) {
      return BadValue(path, line, value, key, e.what());
    }
    from_file.insert(option);
  }
  for (const CLI::Option* option : from_file) {
    if (option->count() == 0) {
      continue;
    }
    for (const CLI::Option* needed : option->get_needs()) {
      if (needed->count() == 0) {
        return InvalidArgumentError(fmt::format("{}: {} needs {} (key \"{}\")", path,
                                                KeyOf(*option), needed->get_name(),
                                                KeyOf(*needed)));
      }
    }
    for (const CLI::Option* excluded : option->get_excludes()) {
      if (excluded->count() > 0) {
        return InvalidArgumentError(fmt::format("{}: {} excludes {} (key \"{}\")", path,
                                                KeyOf(*option), excluded->get_name(),
                                                KeyOf(*excluded)));
      }
    }
  }
  return Status();
}

std::string RenderEffectiveConfig(const CLI::App& command) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const CLI::Option* option : command.get_options()) {
    if (IsConfigOption(*option)) {
      continue;
    }
    out << YAML::Key << KeyOf(*option) << YAML::Value;
    if (IsFlag(*option)) {
      out << (option->count() > 0);
      continue;
    }
    const std::vector<std::string> values =
        option->count() > 0 ? option->results() : DefaultValues(*option);
    if (IsList(*option)) {
      out << YAML::Flow << YAML::BeginSeq;
      for (const std::string& value : values) {
        out << YAML::DoubleQuoted << RedactPasswords(value);
      }
      out << YAML::EndSeq;
    } else {
      out << YAML::DoubleQuoted << RedactPasswords(values.empty() ? "" : values.back());
    }
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::optional<int> HandleConfigFlags(CLI::App& command) {
  const CLI::Option* config = command.get_option(kConfigFlag);
  if (config->count() > 0) {
    Status status = ApplyConfigFile(command, config->as<std::string>());
    if (!status.ok()) {
      fmt::print(stderr, "gpufleet {}: {}\n", command.get_name(), status.message());
      return 1;
    }
  }
  if (command.get_option(kPrintConfigFlag)->count() > 0) {
    fmt::print("{}", RenderEffectiveConfig(command));
    return 0;
  }
  return std::nullopt;
}

}  // namespace gpufleet::app
