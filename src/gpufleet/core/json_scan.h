// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <optional>
#include <string>
#include <string_view>

// Reading one field of a stored JSON document without parsing all of it. The scheduling loop
// lists every job each cycle; most are finished, and building their whole documents (specs
// included) is what made a restart with 100,000 jobs slow (bench/RESULTS.md). The store indexes
// objects by their top-level "state" with it (store::IndexedState). In core because the store
// depends on core alone. Thread-safe, never throws.
namespace gpufleet {

// The value of the string member `key` at the top level of the JSON object `text`; nested
// objects and arrays are skipped, not parsed. nullopt when it cannot tell for sure: `text` is not
// a well-formed object as far as it reads, `key` is absent, the member is not a string, or a key
// or the value holds an escape sequence (the caller then parses the document).
std::optional<std::string> TopLevelString(std::string_view text, std::string_view key);

}  // namespace gpufleet
