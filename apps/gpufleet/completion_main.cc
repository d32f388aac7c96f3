// SPDX-License-Identifier: Apache-2.0
// `gpufleet completion bash`: a bash completion script drawn from the command tree itself, so
// that it names every subcommand and flag this binary has (installed by the Debian package as
// /usr/share/bash-completion/completions/gpufleet).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>

#include "subcommands.h"

namespace gpufleet::app {
namespace {

// What may follow each command path ("gpufleet sim chaos"): its subcommands and its flags.
void CollectWords(const CLI::App& command, const std::string& path,
                  std::map<std::string, std::vector<std::string>>& words) {
  std::vector<std::string>& here = words[path];
  for (const CLI::App* sub : command.get_subcommands([](const CLI::App* app) {
         return !app->get_name().empty() && !app->get_group().empty();
       })) {
    here.push_back(sub->get_name());
    CollectWords(*sub, path + " " + sub->get_name(), words);
  }
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) {
      here.push_back("--" + name);
    }
    for (const std::string& name : option->get_snames()) {
      here.push_back("-" + name);
    }
  }
}

std::string BashScript(const CLI::App& root) {
  std::map<std::string, std::vector<std::string>> words;
  CollectWords(root, "gpufleet", words);
  std::string table;
  for (const auto& [path, list] : words) {
    table += fmt::format("  [\"{}\"]=\"{}\"\n", path, fmt::join(list, " "));
  }
  return fmt::format(R"(# bash completion for gpufleet, made by `gpufleet completion bash` ({} {})
declare -gA _gpufleet_words=(
{})
_gpufleet() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" path=gpufleet word i
  for ((i = 1; i < COMP_CWORD; i++)); do
    word="${{COMP_WORDS[i]}}"
    if [[ "$word" != -* && -n "${{_gpufleet_words["$path $word"]+set}}" ]]; then
      path="$path $word"
    fi
  done
  COMPREPLY=($(compgen -W "${{_gpufleet_words["$path"]}}" -- "$cur"))
}}
complete -o default -F _gpufleet gpufleet
)",
                     BuildVersion(), BuildCommit(), table);
}

}  // namespace

Action AddCompletionCommand(CLI::App& app) {
  CLI::App* completion = app.add_subcommand("completion", "print a shell completion script (bash)");
  auto shell = std::make_shared<std::string>("bash");
  completion->add_option("shell", *shell, "the shell (bash)")->check(CLI::IsMember({"bash"}));
  const CLI::App* root = &app;
  return [completion, root, shell] {
    if (!completion->parsed()) {
      return 0;
    }
    fmt::print("{}", BashScript(*root));
    return 0;
  };
}

}  // namespace gpufleet::app
