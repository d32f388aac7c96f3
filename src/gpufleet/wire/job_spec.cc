// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/job_spec.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "gpufleet/core/cluster.h"
#include "gpufleet/wire/spec_tree.h"

namespace gpufleet::wire {
namespace {

// -Wpedantic: __int128 is a GNU extension (GCC and clang have it).
__extension__ typedef unsigned __int128 Uint128;
__extension__ typedef __int128 Int128;

using nlohmann::json;
using nlohmann::ordered_json;
using Unit = std::pair<std::string_view, int64_t>;

constexpr size_t kMaxTaskGroups = 1000;
constexpr int kMaxReplicas = 1000000;
constexpr int kMaxGpusPerTask = 1024;
constexpr int kMaxInt = std::numeric_limits<int>::max();
constexpr Uint128 kMaxInt64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kSecond = 1000000000;  // in nanoseconds
constexpr size_t kNpos = std::string_view::npos;

// Largest first; a duration's unit is the longest suffix that matches.
// clang-format off
constexpr std::array<Unit, 6> kDurationUnits = {{
    {"h", 3600 * kSecond}, {"m", 60 * kSecond}, {"s", kSecond}, {"ms", 1000000}, {"us", 1000},
    {"ns", 1}}};
constexpr std::array<Unit, 12> kMemoryUnits = {{
    {"", 1}, {"Ki", int64_t{1} << 10}, {"Mi", int64_t{1} << 20}, {"Gi", int64_t{1} << 30},
    {"Ti", int64_t{1} << 40}, {"Pi", int64_t{1} << 50}, {"k", 1000}, {"K", 1000}, {"M", 1000000},
    {"G", 1000000000}, {"T", 1000000000000}, {"P", 1000000000000000}}};
// clang-format on

}  // namespace

size_t InvalidUtf8Offset(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const size_t length = byte < 0x80   ? 1
                          : byte < 0xC2 ? 0
                          : byte < 0xE0 ? 2
                          : byte < 0xF0 ? 3
                          : byte < 0xF5 ? 4
                                        : 0;
    // The second byte's range; the others are 0x80..0xBF.
    const unsigned low = byte == 0xE0 ? 0xA0 : byte == 0xF0 ? 0x90 : 0x80;
    const unsigned high = byte == 0xED ? 0x9F : byte == 0xF4 ? 0x8F : 0xBF;
    if (length == 0 || i + length > text.size()) {
      return i;
    }
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if (next < (k == 1 ? low : 0x80) || next > (k == 1 ? high : 0xBF)) {
        return i;
      }
    }
    i += length;
  }
  return kNpos;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Scalars and names.

// `"text"`, escaped and cut at 64 characters, for messages.
std::string Quote(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size() && i <= 64; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (i == 64) {
      out += "...";
    } else if (c == '"' || c == '\\') {
      out += {'\\', static_cast<char>(c)};
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string Describe(const SpecNode& node) {
  return node.kind == SpecNode::Kind::kNull       ? "null"
         : node.kind == SpecNode::Kind::kSequence ? "a list"
         : node.kind == SpecNode::Kind::kMap      ? "a map"
         : node.quoted                            ? "string " + Quote(node.text)
                                                  : Quote(node.text);
}

bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}
bool IsLower(char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'z');
}
bool IsAlnum(char c) {
  return IsLower(c) || (c >= 'A' && c <= 'Z');
}

// "[+]<digits>[.<digits>]<suffix>", at least one digit.
struct DecimalText {
  std::string_view integer;
  std::string_view fraction;
  std::string_view suffix;
};

std::optional<DecimalText> SplitDecimal(std::string_view text) {
  size_t i = !text.empty() && text[0] == '+' ? 1 : 0;
  const size_t start = i;
  while (i < text.size() && IsDigit(text[i])) {
    ++i;
  }
  DecimalText out{text.substr(start, i - start), {}, {}};
  if (i < text.size() && text[i] == '.') {
    const size_t fraction = ++i;
    while (i < text.size() && IsDigit(text[i])) {
      ++i;
    }
    out.fraction = text.substr(fraction, i - fraction);
  }
  out.suffix = text.substr(i);
  return out.integer.empty() && out.fraction.empty() ? std::nullopt : std::optional(out);
}

// Digits as a number; nullopt above 2^63.
std::optional<Uint128> DigitsValue(std::string_view digits) {
  Uint128 value = 0;
  for (const char c : digits) {
    value = value * 10 + static_cast<unsigned>(c - '0');
    if (value > (Uint128{1} << 63)) {
      return std::nullopt;
    }
  }
  return value;
}

Uint128 Pow10(size_t exponent) {
  Uint128 value = 1;
  for (size_t i = 0; i < exponent; ++i) {
    value *= 10;
  }
  return value;
}

Status MustBe(std::string_view text, std::string_view what) {
  return InvalidArgumentError(fmt::format("{} must be {}", Quote(text), what));
}
// For text that SplitDecimal refused: "-1" must be positive; anything else is not `what`.
Status NotA(std::string_view text, std::string_view what) {
  return !text.empty() && text[0] == '-'
             ? MustBe(text, "positive")
             : InvalidArgumentError(fmt::format("{} is not {}", Quote(text), what));
}

// `d` times 10^scale, exactly: "1.5" at scale 3 is 1500; "0.0001" at scale 3 is too precise.
Result<int64_t> ScaledDecimal(std::string_view text, const DecimalText& d, size_t scale,
                              std::string_view smallest) {
  const std::string_view kept = d.fraction.substr(0, std::min(scale, d.fraction.size()));
  if (d.fraction.find_first_not_of('0', kept.size()) != kNpos) {
    return InvalidArgumentError(
        fmt::format("{} is too precise (the smallest unit is {})", Quote(text), smallest));
  }
  const std::optional<Uint128> integer = DigitsValue(d.integer);
  const Uint128 value =
      integer.has_value() && *integer <= kMaxInt64
          ? *integer * Pow10(scale) + *DigitsValue(kept) * Pow10(scale - kept.size())
          : kMaxInt64 + 1;
  if (value > kMaxInt64) {
    return InvalidArgumentError(fmt::format("{} is too large", Quote(text)));
  }
  return value == 0 ? Result<int64_t>(MustBe(text, "positive")) : static_cast<int64_t>(value);
}

// A share of one GPU in milli-GPU: "0.25" -> 250.
Result<int64_t> ParseGpuFraction(std::string_view text) {
  const std::optional<DecimalText> d = SplitDecimal(text);
  if (!d.has_value() || !d->suffix.empty()) {
    return NotA(text, "a fraction (e.g. 0.25)");
  }
  GPUFLEET_ASSIGN_OR_RETURN(const int64_t milli, ScaledDecimal(text, *d, 3, "0.001"));
  if (milli >= kMilliPerUnit) {
    return InvalidArgumentError(
        fmt::format("{} (a share is 0.001..0.999; use count for whole GPUs)", text));
  }
  return milli;
}

// RFC 1123 label: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters.
bool IsDnsLabel(std::string_view s) {
  return !s.empty() && s.size() <= 63 && IsLower(s.front()) && IsLower(s.back()) &&
         std::all_of(s.begin(), s.end(), [](char c) { return IsLower(c) || c == '-'; });
}
// DNS labels joined by `separator`, at most 253 characters.
bool IsDnsLabelPath(std::string_view s, char separator) {
  for (size_t start = 0; s.size() <= 253;) {
    const size_t end = s.find(separator, start);
    if (!IsDnsLabel(s.substr(start, end - start))) {
      return false;
    }
    if (end == kNpos) {
      return true;
    }
    start = end + 1;
  }
  return false;
}
bool IsQueuePath(std::string_view s) {
  return IsDnsLabelPath(s, '/');
}
// Kubernetes label name: [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, at most 63 characters.
bool IsLabelName(std::string_view s) {
  return !s.empty() && s.size() <= 63 && IsAlnum(s.front()) && IsAlnum(s.back()) &&
         std::all_of(s.begin(), s.end(),
                     [](char c) { return IsAlnum(c) || c == '-' || c == '_' || c == '.'; });
}
bool IsLabelValue(std::string_view s) {
  return s.empty() || IsLabelName(s);
}
// [dns-subdomain/]label-name, e.g. "gpufleet.io/driver-version" or "zone".
bool IsLabelKey(std::string_view s) {
  const size_t slash = s.find('/');
  return slash == kNpos
             ? IsLabelName(s)
             : IsDnsLabelPath(s.substr(0, slash), '.') && IsLabelName(s.substr(slash + 1));
}

// What a string field accepts, and how a message says it.
struct Rule {
  bool (*valid)(std::string_view);
  std::string_view text;
};
constexpr Rule kAnyString{nullptr, ""};
constexpr Rule kDnsLabelRule{&IsDnsLabel,
                             "lower-case letters, digits and '-', starting and ending with a "
                             "letter or digit, at most 63 characters"};
constexpr Rule kQueueRule{&IsQueuePath, "DNS labels joined by '/', e.g. \"research/nlp\""};
constexpr Rule kLabelKeyRule{&IsLabelKey,
                             "an optional DNS prefix and '/', then letters, digits, '-', '_' and "
                             "'.', starting and ending with a letter or digit, at most 63 "
                             "characters"};
constexpr Rule kLabelValueRule{&IsLabelValue,
                               "empty, or letters, digits, '-', '_' and '.', starting and ending "
                               "with a letter or digit, at most 63 characters"};

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) {
    row[j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const bool same = (a[i - 1] | 0x20) == (b[j - 1] | 0x20);  // ASCII, ignoring case
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// ---------------------------------------------------------------------------------------------
// Reading fields. A reader is `Result<T>(const SpecNode&, const std::string& path)`; every error
// names the field path and the value.

std::string Child(const std::string& path, std::string_view key) {
  const bool plain =
      !key.empty() && key.size() <= 64 && std::all_of(key.begin(), key.end(), [](char c) {
        return IsAlnum(c) || c == '-' || c == '_' || c == '.' || c == '/';
      });
  const std::string shown = plain ? std::string(key) : Quote(key);
  return path.empty() ? shown : fmt::format("{}.{}", path, shown);
}
std::string Index(const std::string& path, size_t i) {
  return fmt::format("{}[{}]", path, i);
}
Status FieldError(const std::string& path, const SpecNode& node, std::string_view message) {
  return InvalidArgumentError(fmt::format("{}: {}{}", path, message, SpecNodePosition(node)));
}

Result<std::string> ReadString(const SpecNode& node, const std::string& path) {
  if (node.kind != SpecNode::Kind::kScalar) {
    return FieldError(path, node, "expected a string, got " + Describe(node));
  }
  // The document is checked for UTF-8 as a whole, but YAML escapes ("\x85", "\N") can still
  // decode to bytes that are not UTF-8.
  if (const size_t bad = InvalidUtf8Offset(node.text); bad != kNpos) {
    return FieldError(path, node,
                      fmt::format("not valid UTF-8 at byte {} (after YAML escapes)", bad));
  }
  return node.text;
}

auto Named(Rule rule) {
  return [rule](const SpecNode& node, const std::string& path) -> Result<std::string> {
    GPUFLEET_ASSIGN_OR_RETURN(std::string value, ReadString(node, path));
    if (rule.valid != nullptr && !rule.valid(value)) {
      return FieldError(path, node, fmt::format("{} is not valid ({})", Quote(value), rule.text));
    }
    return value;
  };
}

// The one accepted value, e.g. for `kind: Job`.
auto Exactly(std::string_view expected) {
  return [expected](const SpecNode& node, const std::string& path) -> Result<std::string> {
    GPUFLEET_ASSIGN_OR_RETURN(std::string value, ReadString(node, path));
    if (value != expected) {
      return FieldError(
          path, node,
          fmt::format("{} is not supported (expected {})", Quote(value), Quote(expected)));
    }
    return value;
  };
}

// An unquoted integer in [min, max].
auto Int(int64_t min, int64_t max) {
  return [min, max](const SpecNode& node, const std::string& path) -> Result<int64_t> {
    const std::string_view text = node.text;
    const bool negative = !text.empty() && text[0] == '-';
    const std::string_view digits = text.substr(!text.empty() && (negative || text[0] == '+'));
    if (node.kind != SpecNode::Kind::kScalar || node.quoted || digits.empty() ||
        !std::all_of(digits.begin(), digits.end(), IsDigit)) {
      return FieldError(path, node, "expected an integer, got " + Describe(node));
    }
    const std::optional<Uint128> magnitude = DigitsValue(digits);  // nullopt above 2^63
    const Int128 value = static_cast<Int128>(magnitude.value_or(Uint128{1} << 64));
    if ((negative ? -value : value) < min) {
      return FieldError(path, node, fmt::format("{} (must be at least {})", text, min));
    }
    if ((negative ? -value : value) > max) {
      return FieldError(path, node, fmt::format("{} is too large (at most {})", text, max));
    }
    return static_cast<int64_t>(negative ? -value : value);
  };
}

Result<bool> ReadBool(const SpecNode& node, const std::string& path) {
  static constexpr std::array<std::string_view, 6> kWords = {"true",  "True",  "TRUE",
                                                             "false", "False", "FALSE"};
  const auto word = std::find(kWords.begin(), kWords.end(), node.text);
  if (node.kind != SpecNode::Kind::kScalar || node.quoted || word == kWords.end()) {
    return FieldError(path, node, "expected true or false, got " + Describe(node));
  }
  return word < kWords.begin() + 3;
}

// A string or a number in one of the schema's formats, e.g. ParseMemoryQuantity.
template <typename T>
auto Formatted(Result<T> (*parse)(std::string_view)) {
  return [parse](const SpecNode& node, const std::string& path) -> Result<T> {
    if (node.kind != SpecNode::Kind::kScalar) {
      return FieldError(path, node, "expected a string or a number, got " + Describe(node));
    }
    Result<T> value = parse(node.text);
    return value.ok() ? value : FieldError(path, node, value.status().message());
  };
}

// A list of distinct strings.
auto StringList(Rule rule) {
  return [rule](const SpecNode& node, const std::string& path) -> Result<std::vector<std::string>> {
    if (node.kind != SpecNode::Kind::kSequence) {
      return FieldError(path, node, "expected a list, got " + Describe(node));
    }
    std::vector<std::string> out;
    std::set<std::string, std::less<>> seen;
    for (size_t i = 0; i < node.items.size(); ++i) {
      GPUFLEET_ASSIGN_OR_RETURN(std::string value, Named(rule)(node.items[i], Index(path, i)));
      if (!seen.insert(value).second) {
        return FieldError(Index(path, i), node.items[i], "duplicate " + Quote(value));
      }
      out.push_back(std::move(value));
    }
    return out;
  };
}

// A map of label keys to label values (labels, nodeSelector).
Result<std::map<std::string, std::string>> ReadLabels(const SpecNode& node,
                                                      const std::string& path) {
  if (node.kind != SpecNode::Kind::kMap) {
    return FieldError(path, node, "expected a map, got " + Describe(node));
  }
  std::map<std::string, std::string> out;
  for (const SpecNode::Entry& entry : node.entries) {
    const std::string key_path = Child(path, entry.key.text);
    if (!IsLabelKey(entry.key.text)) {
      return FieldError(key_path, entry.key, fmt::format("invalid key ({})", kLabelKeyRule.text));
    }
    if (out.count(entry.key.text) > 0) {
      return FieldError(key_path, entry.key, "duplicate key");
    }
    GPUFLEET_ASSIGN_OR_RETURN(out[entry.key.text], Named(kLabelValueRule)(entry.value, key_path));
  }
  return out;
}

// A map whose keys are known fields, each present at most once.
class Fields {
 public:
  static Result<Fields> Read(const SpecNode& node, std::string path,
                             std::initializer_list<std::string_view> known) {
    if (node.kind != SpecNode::Kind::kMap) {
      return FieldError(path.empty() ? "document" : path, node,
                        "expected a map, got " + Describe(node));
    }
    for (size_t i = 0; i < node.entries.size(); ++i) {
      const SpecNode& key = node.entries[i].key;
      for (size_t j = 0; j < i; ++j) {  // ends within |known| + 1 entries
        if (node.entries[j].key.text == key.text) {
          return FieldError(Child(path, key.text), key, "duplicate key");
        }
      }
      if (std::find(known.begin(), known.end(), key.text) != known.end()) {
        continue;
      }
      // Suggest a field at edit distance 1 or 2; on a tie, one with the same first letter.
      std::string_view best;
      std::string all;
      size_t best_score = 6;
      for (const std::string_view candidate : known) {
        const size_t distance = EditDistance(key.text, candidate);
        const size_t score = 2 * distance + ((key.text[0] | 0x20) != (candidate[0] | 0x20));
        if (distance <= 2 && distance < key.text.size() && score < best_score) {
          best = candidate;
          best_score = score;
        }
        all += fmt::format("{}{}", all.empty() ? "" : ", ", candidate);
      }
      return FieldError(Child(path, key.text), key,
                        best.empty() ? fmt::format("unknown field (known: {})", all)
                                     : fmt::format("unknown field (did you mean \"{}\"?)", best));
    }
    return Fields(node, std::move(path));
  }

  // nullptr when the field is absent or null.
  const SpecNode* Find(std::string_view key) const {
    for (const SpecNode::Entry& entry : node_->entries) {
      if (entry.key.text == key) {
        return entry.value.kind == SpecNode::Kind::kNull ? nullptr : &entry.value;
      }
    }
    return nullptr;
  }
  std::string Path(std::string_view key) const { return Child(path_, key); }

  // Reads field `key` with `read` into `*out`, which keeps its value when the field is absent.
  template <typename T, typename Reader>
  Status Get(std::string_view key, T* out, const Reader& read) const {
    if (const SpecNode* node = Find(key)) {
      auto value = read(*node, Path(key));
      if (!value.ok()) {
        return value.status();
      }
      *out = static_cast<T>(std::move(value).value());  // integer readers check the range
    }
    return Status::Ok();
  }
  template <typename T, typename Reader>
  Status Need(std::string_view key, T* out, const Reader& read) const {
    if (Find(key) == nullptr) {
      return FieldError(Path(key), *node_, "required field missing");
    }
    return Get(key, out, read);
  }

 private:
  Fields(const SpecNode& node, std::string path) : node_(&node), path_(std::move(path)) {}

  const SpecNode* node_;
  std::string path_;
};

// ---------------------------------------------------------------------------------------------
// The schema.

Result<GpuRequest> ReadGpus(const SpecNode& node, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(
      const Fields f,
      Fields::Read(node, path, {"count", "fraction", "milli", "memory", "migProfile", "sharing"}));
  const SpecNode* count = f.Find("count");
  const SpecNode* memory = f.Find("memory");
  const bool share = f.Find("fraction") != nullptr || f.Find("milli") != nullptr;
  if (memory != nullptr && !share) {
    return FieldError(f.Path("memory"), *memory,
                      "only a fractional GPU (fraction or milli) takes memory; whole GPUs and MIG "
                      "instances come with theirs (see spec.minGpuMemory)");
  }
  if (const SpecNode* sharing = f.Find("sharing"); sharing != nullptr && !share) {
    return FieldError(f.Path("sharing"), *sharing,
                      "only a fractional GPU (fraction or milli) is shared; whole GPUs and MIG "
                      "instances are the task's alone");
  }
  if (f.Find("migProfile") != nullptr) {
    if (share) {
      return FieldError(path, node, "migProfile cannot be combined with fraction or milli");
    }
    MigGpus mig;
    GPUFLEET_RETURN_IF_ERROR(f.Get("migProfile", &mig.profile, ReadString));
    GPUFLEET_RETURN_IF_ERROR(f.Get("count", &mig.count, Int(1, kMaxGpusPerTask)));
    return GpuRequest(std::move(mig));
  }
  if (share) {
    if (f.Find("fraction") != nullptr && f.Find("milli") != nullptr) {
      return FieldError(path, node, "give fraction or milli, not both");
    }
    if (count != nullptr) {
      return FieldError(f.Path("count"), *count,
                        "a fractional GPU is a share of one GPU; count asks for whole GPUs");
    }
    FractionalGpu gpu;
    GPUFLEET_RETURN_IF_ERROR(f.Get("fraction", &gpu.gpu_milli, Formatted(&ParseGpuFraction)));
    GPUFLEET_RETURN_IF_ERROR(f.Get("milli", &gpu.gpu_milli, Int(1, kMilliPerUnit - 1)));
    GPUFLEET_RETURN_IF_ERROR(f.Get("memory", &gpu.gpu_memory_mib, Formatted(&ParseMemoryQuantity)));
    GPUFLEET_RETURN_IF_ERROR(f.Get("sharing", &gpu.sharing, Formatted(&ParseGpuSharing)));
    return GpuRequest(gpu);
  }
  if (count == nullptr) {
    return FieldError(path, node, "one of count, fraction, milli or migProfile is required");
  }
  WholeGpus whole;
  GPUFLEET_RETURN_IF_ERROR(f.Get("count", &whole.count, Int(1, kMaxGpusPerTask)));
  return GpuRequest(whole);
}

// A command line: a list of strings, repeats allowed, the first one not empty.
Result<std::vector<std::string>> ReadCommand(const SpecNode& node, const std::string& path) {
  if (node.kind != SpecNode::Kind::kSequence) {
    return FieldError(path, node, "expected a list of strings, got " + Describe(node));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < node.items.size(); ++i) {
    GPUFLEET_ASSIGN_OR_RETURN(std::string arg, ReadString(node.items[i], Index(path, i)));
    if (arg.find('\0') != std::string::npos) {
      return FieldError(Index(path, i), node.items[i], "contains a NUL character");
    }
    out.push_back(std::move(arg));
  }
  if (!out.empty() && out.front().empty()) {
    return FieldError(Index(path, 0), node.items[0], "the program name is empty");
  }
  return out;
}

// POSIX portable environment variable name: [A-Za-z_][A-Za-z0-9_]*.
bool IsEnvName(std::string_view s) {
  return !s.empty() && !(s.front() >= '0' && s.front() <= '9') &&
         std::all_of(s.begin(), s.end(), [](char c) { return IsAlnum(c) || c == '_'; });
}

// Variables the agent sets for a task: a spec that set them could read another task's GPUs or
// pose as another task. GPUFLEET_SIM_* script the simulated runner and reach no real task.
bool IsReservedEnvName(std::string_view name) {
  return name == "CUDA_VISIBLE_DEVICES" || name == "NVIDIA_VISIBLE_DEVICES" ||
         (name.starts_with("GPUFLEET_") && !name.starts_with("GPUFLEET_SIM_"));
}

// Environment variables of a task: names as POSIX shells accept, any string values.
Result<std::map<std::string, std::string>> ReadEnv(const SpecNode& node, const std::string& path) {
  if (node.kind != SpecNode::Kind::kMap) {
    return FieldError(path, node, "expected a map, got " + Describe(node));
  }
  std::map<std::string, std::string> out;
  for (const SpecNode::Entry& entry : node.entries) {
    const std::string key_path = Child(path, entry.key.text);
    if (!IsEnvName(entry.key.text)) {
      return FieldError(key_path, entry.key,
                        "invalid name (letters, digits and '_', not starting with a digit)");
    }
    if (out.count(entry.key.text) > 0) {
      return FieldError(key_path, entry.key, "duplicate key");
    }
    if (IsReservedEnvName(entry.key.text)) {
      return FieldError(key_path, entry.key,
                        "is set by the agent (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES and "
                        "GPUFLEET_* are reserved)");
    }
    GPUFLEET_ASSIGN_OR_RETURN(std::string value, ReadString(entry.value, key_path));
    if (value.find('\0') != std::string::npos) {
      return FieldError(key_path, entry.value, "contains a NUL character");
    }
    out[entry.key.text] = std::move(value);
  }
  return out;
}

// An OCI image reference (core/image_reference.h).
Result<std::string> ReadImage(const SpecNode& node, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(std::string reference, ReadString(node, path));
  if (const Status valid = ValidateImageReference(reference); !valid.ok()) {
    return FieldError(path, node, fmt::format("{}: {}", Quote(reference), valid.message()));
  }
  return reference;
}

Result<ImagePullPolicy> ReadImagePullPolicy(const SpecNode& node, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(const std::string name, ReadString(node, path));
  const std::optional<ImagePullPolicy> policy = ImagePullPolicyFromName(name);
  if (!policy.has_value()) {
    return FieldError(path, node, Quote(name) + " is not one of IfNotPresent, Always, Never");
  }
  return *policy;
}

// The user's free-form record of a run: named keys, string values, bounded in number and size.
Result<std::map<std::string, std::string>> ReadProvenance(const SpecNode& node,
                                                          const std::string& path) {
  if (node.kind != SpecNode::Kind::kMap) {
    return FieldError(path, node, "expected a map, got " + Describe(node));
  }
  if (node.entries.size() > kMaxProvenanceEntries) {
    return FieldError(path, node,
                      fmt::format("{} entries, more than the limit of {}", node.entries.size(),
                                  kMaxProvenanceEntries));
  }
  std::map<std::string, std::string> out;
  size_t bytes = 0;
  for (const SpecNode::Entry& entry : node.entries) {
    const std::string key_path = Child(path, entry.key.text);
    // Keys follow the label key rule, as Kubernetes annotation keys do, so a key stays a short
    // printable name in every format the spec is written to.
    if (!IsLabelKey(entry.key.text)) {
      return FieldError(key_path, entry.key, fmt::format("invalid key ({})", kLabelKeyRule.text));
    }
    if (out.count(entry.key.text) > 0) {
      return FieldError(key_path, entry.key, "duplicate key");
    }
    GPUFLEET_ASSIGN_OR_RETURN(std::string value, ReadString(entry.value, key_path));
    bytes += entry.key.text.size() + value.size();
    if (bytes > kMaxProvenanceBytes) {
      return FieldError(
          key_path, entry.value,
          fmt::format("keys and values exceed the limit of {} bytes in all", kMaxProvenanceBytes));
    }
    out[entry.key.text] = std::move(value);
  }
  return out;
}

// `replicas: 4`, or an elastic group's range `replicas: {min: 2, max: 8}` (docs/job-spec.md,
// "Elastic jobs"); min 0 for a fixed count.
struct ReplicaRange {
  int64_t min = 0;
  int64_t max = 1;
};

Result<ReplicaRange> ReadReplicas(const SpecNode& node, const std::string& path) {
  if (node.kind != SpecNode::Kind::kMap) {
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t count, Int(1, kMaxReplicas)(node, path));
    return ReplicaRange{.min = 0, .max = count};
  }
  GPUFLEET_ASSIGN_OR_RETURN(const Fields f, Fields::Read(node, path, {"min", "max"}));
  ReplicaRange range;
  GPUFLEET_RETURN_IF_ERROR(f.Need("min", &range.min, Int(1, kMaxReplicas)));
  GPUFLEET_RETURN_IF_ERROR(f.Need("max", &range.max, Int(1, kMaxReplicas)));
  if (range.min > range.max) {
    return FieldError(f.Path("min"), *f.Find("min"),
                      fmt::format("{} is above max {}", range.min, range.max));
  }
  return range;
}

Result<TaskGroup> ReadTask(const SpecNode& node, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(
      const Fields f, Fields::Read(node, path,
                                   {"name", "replicas", "resources", "command", "env", "image",
                                    "imagePullPolicy", "hostNetwork"}));
  TaskGroup group;
  GPUFLEET_RETURN_IF_ERROR(f.Need("name", &group.name, Named(kDnsLabelRule)));
  ReplicaRange replicas{.min = 0, .max = group.replicas};
  GPUFLEET_RETURN_IF_ERROR(f.Get("replicas", &replicas, ReadReplicas));
  group.min_replicas = static_cast<int>(replicas.min);
  group.replicas = static_cast<int>(replicas.max);
  GPUFLEET_RETURN_IF_ERROR(f.Get("command", &group.command, ReadCommand));
  GPUFLEET_RETURN_IF_ERROR(f.Get("env", &group.env, ReadEnv));
  GPUFLEET_RETURN_IF_ERROR(f.Get("image", &group.image, ReadImage));
  GPUFLEET_RETURN_IF_ERROR(f.Get("imagePullPolicy", &group.image_pull_policy, ReadImagePullPolicy));
  GPUFLEET_RETURN_IF_ERROR(f.Get("hostNetwork", &group.host_network, ReadBool));
  if (group.image.empty()) {
    for (const char* container_only : {"imagePullPolicy", "hostNetwork"}) {
      if (const SpecNode* field = f.Find(container_only); field != nullptr) {
        return FieldError(f.Path(container_only), *field,
                          "applies to container tasks only; set spec.tasks[].image too");
      }
    }
  }
  const SpecNode* resources = f.Find("resources");
  if (resources == nullptr) {
    return group;
  }
  GPUFLEET_ASSIGN_OR_RETURN(
      const Fields r, Fields::Read(*resources, f.Path("resources"), {"cpu", "memory", "gpus"}));
  HostResources& host = group.request.host;
  GPUFLEET_RETURN_IF_ERROR(r.Get("cpu", &host.cpu_milli, Formatted(&ParseCpuQuantity)));
  GPUFLEET_RETURN_IF_ERROR(r.Get("memory", &host.memory_mib, Formatted(&ParseMemoryQuantity)));
  GPUFLEET_RETURN_IF_ERROR(r.Get("gpus", &group.request.gpus, ReadGpus));
  return group;
}

Result<std::vector<TaskGroup>> ReadTasks(const SpecNode& node, const std::string& path) {
  if (node.kind != SpecNode::Kind::kSequence) {
    return FieldError(path, node, "expected a list, got " + Describe(node));
  }
  if (node.items.empty() || node.items.size() > kMaxTaskGroups) {
    return FieldError(
        path, node,
        fmt::format("at least one task group is required, at most {} allowed", kMaxTaskGroups));
  }
  std::vector<TaskGroup> groups;
  std::set<std::string, std::less<>> names;
  for (size_t i = 0; i < node.items.size(); ++i) {
    GPUFLEET_ASSIGN_OR_RETURN(TaskGroup group, ReadTask(node.items[i], Index(path, i)));
    if (group.min_replicas > 0 && node.items.size() > 1) {
      return FieldError(Index(path, i) + ".replicas", node.items[i],
                        "a range {min, max} needs a job of one task group (an elastic job has "
                        "one)");
    }
    if (!names.insert(group.name).second) {
      return FieldError(Index(path, i) + ".name", node.items[i],
                        "duplicate task group name " + Quote(group.name));
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

Result<JobKind> ReadJobKind(const SpecNode& node, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(const std::string name, ReadString(node, path));
  for (const JobKind kind : {JobKind::kBatch, JobKind::kInteractive, JobKind::kInference}) {
    if (name == JobKindName(kind)) {
      return kind;
    }
  }
  return FieldError(path, node, Quote(name) + " is not one of batch, interactive, inference");
}

Result<NodeFailurePolicy> ReadNodeFailurePolicy(const SpecNode& node, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(const std::string name, ReadString(node, path));
  for (const NodeFailurePolicy policy : {NodeFailurePolicy::kRequeue, NodeFailurePolicy::kFail}) {
    if (name == NodeFailurePolicyName(policy)) {
      return policy;
    }
  }
  return FieldError(path, node, Quote(name) + " is not one of requeue, fail");
}

Result<TopologyConstraint> ReadTopology(const SpecNode& node, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(const Fields f, Fields::Read(node, path, {"required", "preferred"}));
  TopologyConstraint topology;
  GPUFLEET_RETURN_IF_ERROR(f.Get("required", &topology.required_level, Named(kLabelKeyRule)));
  GPUFLEET_RETURN_IF_ERROR(f.Get("preferred", &topology.preferred_level, Named(kLabelKeyRule)));
  return topology;
}

// `preemption: {minRuntime: 10m, checkpointGraceSeconds: 120, noticeSignal: SIGUSR2}`.
struct PreemptionFields {
  std::optional<Duration> min_runtime;
  int64_t checkpoint_grace_seconds = 0;
  std::string notice_signal = std::string(kDefaultNoticeSignal);
};

Result<PreemptionFields> ReadPreemption(const SpecNode& node, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(
      const Fields f,
      Fields::Read(node, path, {"minRuntime", "checkpointGraceSeconds", "noticeSignal"}));
  PreemptionFields out;
  if (f.Find("minRuntime") != nullptr) {
    Duration min_runtime{0};
    GPUFLEET_RETURN_IF_ERROR(f.Get("minRuntime", &min_runtime, Formatted(&ParseSpecDuration)));
    out.min_runtime = min_runtime;
  }
  GPUFLEET_RETURN_IF_ERROR(f.Get("checkpointGraceSeconds", &out.checkpoint_grace_seconds,
                                 Int(0, kMaxCheckpointGraceSeconds)));
  if (const SpecNode* signal = f.Find("noticeSignal")) {
    const std::string signal_path = path + ".noticeSignal";
    GPUFLEET_ASSIGN_OR_RETURN(const std::string name, ReadString(*signal, signal_path));
    if (!NoticeSignalNumber(name)) {
      return FieldError(signal_path, *signal,
                        fmt::format("{} is not a signal a task can take as its notice (one of {})",
                                    Quote(name), NoticeSignalNames()));
    }
    out.notice_signal = name.starts_with("SIG") ? name : "SIG" + name;
  }
  return out;
}

Result<SpreadConstraint> ReadSpread(const SpecNode& node, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(const Fields f, Fields::Read(node, path, {"faultDomain", "maxSkew"}));
  SpreadConstraint spread;
  GPUFLEET_RETURN_IF_ERROR(f.Need("faultDomain", &spread.fault_domain, Named(kLabelKeyRule)));
  GPUFLEET_RETURN_IF_ERROR(f.Get("maxSkew", &spread.max_skew, Int(1, kMaxInt)));
  return spread;
}

// `identicalStack`: a list of label keys; `true` (the driver and CUDA versions and the images'
// digests); or `{labels: [...], imageDigest: "sha256:..."}`, labels defaulting to those of `true`.
struct IdenticalStack {
  std::vector<std::string> labels;
  std::string image_digest;
};
Result<IdenticalStack> ReadIdenticalStack(const SpecNode& node, const std::string& path) {
  const std::vector<std::string> defaults = {std::string(kDriverVersionLabel),
                                             std::string(kCudaVersionLabel),
                                             std::string(kImageDigestStackKey)};
  IdenticalStack out;
  if (node.kind == SpecNode::Kind::kSequence) {
    GPUFLEET_ASSIGN_OR_RETURN(out.labels, StringList(kLabelKeyRule)(node, path));
    return out;
  }
  if (node.kind == SpecNode::Kind::kScalar) {
    GPUFLEET_ASSIGN_OR_RETURN(const bool on, ReadBool(node, path));
    if (on) {
      out.labels = defaults;
    }
    return out;
  }
  GPUFLEET_ASSIGN_OR_RETURN(const Fields f, Fields::Read(node, path, {"labels", "imageDigest"}));
  out.labels = defaults;
  GPUFLEET_RETURN_IF_ERROR(f.Get("labels", &out.labels, StringList(kLabelKeyRule)));
  GPUFLEET_RETURN_IF_ERROR(f.Get("imageDigest", &out.image_digest, Named(kAnyString)));
  if (!out.image_digest.empty()) {
    if (const Status digest = ValidateImageDigest(out.image_digest); !digest.ok()) {
      return InvalidArgumentError(fmt::format("{}.imageDigest: {}", path, digest.message()));
    }
    if (std::find(out.labels.begin(), out.labels.end(), kImageDigestStackKey) == out.labels.end()) {
      out.labels.emplace_back(kImageDigestStackKey);
    }
  }
  return out;
}

Result<Job> ReadSpec(const SpecNode& node) {
  GPUFLEET_ASSIGN_OR_RETURN(
      const Fields f,
      Fields::Read(node, "spec",
                   {"kind", "priority", "preemptible", "runtimeEstimate", "tasks", "gpuModels",
                    "minGpuMemory", "nodeSelector", "topology", "spread", "identicalStack",
                    "onNodeFailure", "provenance", "preemption"}));
  Job job;
  GPUFLEET_RETURN_IF_ERROR(f.Get("kind", &job.kind, ReadJobKind));
  GPUFLEET_RETURN_IF_ERROR(f.Get("priority", &job.priority, Int(-kMaxInt - 1, kMaxInt)));
  GPUFLEET_RETURN_IF_ERROR(f.Get("preemptible", &job.preemptible, ReadBool));
  GPUFLEET_RETURN_IF_ERROR(
      f.Get("runtimeEstimate", &job.runtime_estimate, Formatted(&ParseSpecDuration)));
  GPUFLEET_RETURN_IF_ERROR(f.Need("tasks", &job.groups, ReadTasks));
  GPUFLEET_RETURN_IF_ERROR(f.Get("onNodeFailure", &job.on_node_failure, ReadNodeFailurePolicy));
  GPUFLEET_RETURN_IF_ERROR(f.Get("gpuModels", &job.allowed_gpu_models, StringList(kAnyString)));
  GPUFLEET_RETURN_IF_ERROR(
      f.Get("minGpuMemory", &job.min_gpu_memory_mib, Formatted(&ParseMemoryQuantity)));
  GPUFLEET_RETURN_IF_ERROR(f.Get("nodeSelector", &job.node_selector, ReadLabels));
  GPUFLEET_RETURN_IF_ERROR(f.Get("topology", &job.topology, ReadTopology));
  GPUFLEET_RETURN_IF_ERROR(f.Get("spread", &job.spread, ReadSpread));
  IdenticalStack stack;
  GPUFLEET_RETURN_IF_ERROR(f.Get("identicalStack", &stack, ReadIdenticalStack));
  job.identical_stack_labels = std::move(stack.labels);
  job.identical_image_digest = std::move(stack.image_digest);
  GPUFLEET_RETURN_IF_ERROR(f.Get("provenance", &job.provenance, ReadProvenance));
  PreemptionFields preemption;
  GPUFLEET_RETURN_IF_ERROR(f.Get("preemption", &preemption, ReadPreemption));
  job.min_runtime = preemption.min_runtime;
  job.checkpoint_grace_seconds = preemption.checkpoint_grace_seconds;
  job.notice_signal = std::move(preemption.notice_signal);
  return job;
}

Result<Job> ReadJob(const SpecNode& root) {
  GPUFLEET_ASSIGN_OR_RETURN(const Fields f,
                            Fields::Read(root, "", {"apiVersion", "kind", "metadata", "spec"}));
  std::string text;
  GPUFLEET_RETURN_IF_ERROR(f.Need("apiVersion", &text, Exactly(kJobSpecApiVersion)));
  GPUFLEET_RETURN_IF_ERROR(f.Need("kind", &text, Exactly("Job")));
  const SpecNode* metadata = f.Find("metadata");
  if (metadata == nullptr) {
    return FieldError("metadata", root, "required field missing");
  }
  GPUFLEET_ASSIGN_OR_RETURN(const Fields m,
                            Fields::Read(*metadata, "metadata", {"name", "queue", "labels"}));
  std::string name;
  std::string queue = "default";
  std::map<std::string, std::string> labels;
  GPUFLEET_RETURN_IF_ERROR(m.Need("name", &name, Named(kDnsLabelRule)));
  GPUFLEET_RETURN_IF_ERROR(m.Get("queue", &queue, Named(kQueueRule)));
  GPUFLEET_RETURN_IF_ERROR(m.Get("labels", &labels, ReadLabels));
  const SpecNode* spec = f.Find("spec");
  if (spec == nullptr) {
    return FieldError("spec", root, "required field missing");
  }
  GPUFLEET_ASSIGN_OR_RETURN(Job job, ReadSpec(*spec));
  job.id = JobId(name);
  job.queue = QueueId(queue);
  job.labels = std::move(labels);
  return job;
}

// Job::Validate names Job's fields ("groups[1].request.gpus.mig_profile: ..."); users wrote the
// spec's ("spec.tasks[1].resources.gpus.migProfile: ...").
Status ToSpecPaths(const Status& status) {
  // clang-format off
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 6> kWholePaths = {{
      {"id", "metadata.name"}, {"groups", "spec.tasks"}, {"min_gpu_memory_mib", "spec.minGpuMemory"},
      {"spread.max_skew", "spec.spread.maxSkew"}, {"runtime_estimate", "spec.runtimeEstimate"},
      {"provenance", "spec.provenance"}}};
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 8> kParts = {{
      {"groups[", "spec.tasks["}, {"allowed_gpu_models[", "spec.gpuModels["},
      {".request.gpus.mig_profile", ".resources.gpus.migProfile"},
      {".request.gpus.gpu_milli", ".resources.gpus.milli"},
      {".request.gpus.gpu_memory_mib", ".resources.gpus.memory"},
      {".request.gpus", ".resources.gpus"}, {".request.cpu_milli", ".resources.cpu"},
      {".request.memory_mib", ".resources.memory"}}};
  // clang-format on
  const size_t colon = status.message().find(": ");
  if (status.ok() || colon == std::string::npos) {
    return status;
  }
  std::string path = status.message().substr(0, colon);
  for (const auto& [from, to] : kWholePaths) {
    path = path == from ? std::string(to) : path;
  }
  for (const auto& [from, to] : kParts) {
    if (const size_t at = path.find(from); at != std::string::npos) {
      path.replace(at, from.size(), to);
    }
  }
  return Status(status.code(), path + status.message().substr(colon));
}

// ---------------------------------------------------------------------------------------------
// Writing.

template <typename Json>
Json SpecToJson(const Job& job) {
  // Sets json[key] when `when`: fields at their default value are left out.
  const auto put = [](Json& parent, const char* key, const auto& value, bool when) {
    if (when) {
      parent[key] = value;
    }
  };
  Json out = Json::object();
  out["apiVersion"] = std::string(kJobSpecApiVersion);
  out["kind"] = "Job";
  out["metadata"]["name"] = job.id.value();
  put(out["metadata"], "queue", job.queue.value(), !job.queue.empty());
  put(out["metadata"], "labels", job.labels, !job.labels.empty());
  Json& spec = out["spec"];
  spec["kind"] = JobKindName(job.kind);
  spec["priority"] = job.priority;
  spec["preemptible"] = job.preemptible;
  put(spec, "runtimeEstimate", FormatSpecDuration(job.runtime_estimate),
      job.runtime_estimate.count() != 0);
  if (job.min_runtime) {
    spec["preemption"]["minRuntime"] = FormatSpecDuration(*job.min_runtime);
  }
  if (job.checkpoint_grace_seconds != 0) {
    spec["preemption"]["checkpointGraceSeconds"] = job.checkpoint_grace_seconds;
  }
  if (job.notice_signal != kDefaultNoticeSignal) {
    spec["preemption"]["noticeSignal"] = job.notice_signal;
  }
  put(spec, "onNodeFailure", std::string(NodeFailurePolicyName(job.on_node_failure)),
      job.on_node_failure != NodeFailurePolicy::kRequeue);
  spec["tasks"] = Json::array();
  for (const TaskGroup& group : job.groups) {
    const HostResources& host = group.request.host;
    Json resources = Json::object();
    put(resources, "cpu", FormatCpuQuantity(host.cpu_milli), host.cpu_milli != 0);
    put(resources, "memory", FormatMemoryQuantity(host.memory_mib), host.memory_mib != 0);
    if (const auto* whole = std::get_if<WholeGpus>(&group.request.gpus)) {
      resources["gpus"]["count"] = whole->count;
    } else if (const auto* share = std::get_if<FractionalGpu>(&group.request.gpus)) {
      resources["gpus"]["milli"] = share->gpu_milli;
      put(resources["gpus"], "memory", FormatMemoryQuantity(share->gpu_memory_mib),
          share->gpu_memory_mib != 0);
      put(resources["gpus"], "sharing", std::string(GpuSharingName(share->sharing)),
          share->sharing != GpuSharing::kNodeDefault);
    } else if (const auto* mig = std::get_if<MigGpus>(&group.request.gpus)) {
      resources["gpus"]["migProfile"] = mig->profile;
      resources["gpus"]["count"] = mig->count;
    }
    Json task = Json::object();
    task["name"] = group.name;
    if (group.min_replicas > 0) {
      task["replicas"] = {{"min", group.min_replicas}, {"max", group.replicas}};
    } else {
      task["replicas"] = group.replicas;
    }
    put(task, "resources", resources, !resources.empty());
    put(task, "command", group.command, !group.command.empty());
    put(task, "env", group.env, !group.env.empty());
    put(task, "image", group.image, !group.image.empty());
    put(task, "imagePullPolicy", std::string(ImagePullPolicyName(group.image_pull_policy)),
        group.image_pull_policy != ImagePullPolicy::kIfNotPresent);
    put(task, "hostNetwork", group.host_network, group.host_network);
    spec["tasks"].push_back(std::move(task));
  }
  put(spec, "gpuModels", job.allowed_gpu_models, !job.allowed_gpu_models.empty());
  put(spec, "minGpuMemory", FormatMemoryQuantity(job.min_gpu_memory_mib),
      job.min_gpu_memory_mib != 0);
  put(spec, "nodeSelector", job.node_selector, !job.node_selector.empty());
  Json topology = Json::object();
  put(topology, "required", job.topology.required_level, !job.topology.required_level.empty());
  put(topology, "preferred", job.topology.preferred_level, !job.topology.preferred_level.empty());
  put(spec, "topology", topology, !topology.empty());
  if (!job.spread.fault_domain.empty()) {
    spec["spread"]["faultDomain"] = job.spread.fault_domain;
    spec["spread"]["maxSkew"] = job.spread.max_skew;
  }
  if (job.identical_image_digest.empty()) {
    put(spec, "identicalStack", job.identical_stack_labels, !job.identical_stack_labels.empty());
  } else {
    spec["identicalStack"] = {{"labels", job.identical_stack_labels},
                              {"imageDigest", job.identical_image_digest}};
  }
  put(spec, "provenance", job.provenance, !job.provenance.empty());
  return out;
}

// True unless `s` can be a YAML plain scalar that every YAML 1.1 or 1.2 reader takes for a
// string: "32", "1.10", "true", "no", "0x1F" and "" are quoted, "500m" and "H100-80GB" are not.
bool NeedsQuotes(std::string_view s) {
  static constexpr std::array<std::string_view, 9> kWords = {"null", "true", "false", "yes", "no",
                                                             "on",   "off",  "y",     "n"};
  std::string lower;
  bool number_like = true;
  for (const char c : s) {
    if (!IsAlnum(c) && c != '-' && c != '_' && c != '.' && c != '/') {
      return true;
    }
    lower += static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
    number_like = number_like && (IsDigit(c) || std::string_view("._eE+-").find(c) != kNpos);
  }
  const bool radix =  // 0x1F, 0o17, 0b101
      lower.size() > 1 && lower[0] == '0' && std::string_view("xob").find(lower[1]) != kNpos;
  return s.empty() || s[0] == '-' || s[0] == '.' || number_like || radix ||
         std::find(kWords.begin(), kWords.end(), lower) != kWords.end();
}

void EmitYaml(YAML::Emitter& out, const ordered_json& value, std::string_view key) {
  if (value.is_object()) {
    if (key == "labels" || key == "nodeSelector" || key == "topology" || key == "spread" ||
        key == "gpus") {
      out << YAML::Flow;
    }
    out << YAML::BeginMap;
    for (const auto& [name, item] : value.items()) {
      out << YAML::Key;
      EmitYaml(out, name, "");
      out << YAML::Value;
      EmitYaml(out, item, name);
    }
    out << YAML::EndMap;
  } else if (value.is_array()) {
    if (std::all_of(value.begin(), value.end(),
                    [](const auto& item) { return item.is_primitive(); })) {
      out << YAML::Flow;
    }
    out << YAML::BeginSeq;
    for (const ordered_json& item : value) {
      EmitYaml(out, item, "");
    }
    out << YAML::EndSeq;
  } else if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    if (NeedsQuotes(text)) {
      out << YAML::DoubleQuoted;
    }
    out << text;
  } else if (value.is_boolean()) {
    out << value.get<bool>();
  } else if (value.is_number_integer()) {
    out << value.get<int64_t>();
  } else {
    out << YAML::Null;
  }
}

}  // namespace

namespace {

Status ValidateName(std::string_view field, std::string_view text, const Rule& rule) {
  if (!rule.valid(text)) {
    return InvalidArgumentError(
        fmt::format("{}: {} is not valid ({})", field, Quote(text), rule.text));
  }
  return Status::Ok();
}

}  // namespace

Status ValidateTeamName(std::string_view field, std::string_view text) {
  return ValidateName(field, text, kDnsLabelRule);
}

Status ValidateNodeName(std::string_view field, std::string_view text) {
  return ValidateName(field, text, kDnsLabelRule);
}

Status ValidateQueueName(std::string_view field, std::string_view text) {
  return ValidateName(field, text, kQueueRule);
}

Result<int64_t> ParseCpuQuantity(std::string_view text) {
  const std::optional<DecimalText> d = SplitDecimal(text);
  if (!d.has_value() || (d->suffix != "" && d->suffix != "m")) {
    return NotA(text,
                "a CPU quantity (use cores such as \"2\" or \"0.5\", or milli-cores such "
                "as \"500m\")");
  }
  return ScaledDecimal(text, *d, d->suffix == "m" ? 0 : 3, "1m");
}

Result<int64_t> ParseMemoryQuantity(std::string_view text) {
  const std::optional<DecimalText> d = SplitDecimal(text);
  const auto unit = std::find_if(kMemoryUnits.begin(), kMemoryUnits.end(), [&](const Unit& u) {
    return d.has_value() && u.first == d->suffix;
  });
  if (unit == kMemoryUnits.end()) {
    return NotA(text, "a memory quantity (use e.g. \"512Mi\", \"256Gi\", \"1G\" or bytes)");
  }
  if (d->fraction.size() > 9) {
    return InvalidArgumentError(
        fmt::format("{} is too precise (at most 9 decimal places)", Quote(text)));
  }
  // MiB = ceil((integer + fraction / 10^k) * multiplier / 2^20), all terms below 2^115.
  constexpr Uint128 kMib = Uint128{1} << 20;
  const auto multiplier = static_cast<Uint128>(unit->second);
  const std::optional<Uint128> integer = DigitsValue(d->integer);
  if (!integer.has_value() || *integer * multiplier / kMib > kMaxInt64) {
    return InvalidArgumentError(fmt::format("{} is too large", Quote(text)));
  }
  const Uint128 scale = Pow10(d->fraction.size());
  const Uint128 bytes_scaled = (*integer * scale + *DigitsValue(d->fraction)) * multiplier;
  const Uint128 mib = (bytes_scaled + scale * kMib - 1) / (scale * kMib);
  if (bytes_scaled == 0) {
    return MustBe(text, "positive");
  }
  if (mib > kMaxInt64) {
    return InvalidArgumentError(fmt::format("{} is too large", Quote(text)));
  }
  return static_cast<int64_t>(mib);
}

Result<Duration> ParseSpecDuration(std::string_view text) {
  if (!text.empty() && text[0] == '-') {
    return MustBe(text, "zero or positive");
  }
  const bool bare = !text.empty() && std::all_of(text.begin(), text.end(), IsDigit);  // seconds
  int64_t total = 0;
  for (size_t i = 0; i < text.size() || text.empty();) {
    const size_t start = i;
    while (i < text.size() && IsDigit(text[i])) {
      ++i;
    }
    const std::optional<Uint128> amount = DigitsValue(text.substr(start, i - start));
    const Unit* unit = bare ? &kDurationUnits[2] : nullptr;
    for (const Unit& candidate : kDurationUnits) {
      if (!bare && text.substr(i, candidate.first.size()) == candidate.first &&
          (unit == nullptr || candidate.first.size() > unit->first.size())) {
        unit = &candidate;
      }
    }
    if (i == start || unit == nullptr) {
      return InvalidArgumentError(fmt::format(
          "{} is not a duration (use e.g. \"90s\", \"30m\", \"2h\", \"1h30m\" or integer seconds)",
          Quote(text)));
    }
    i += bare ? 0 : unit->first.size();
    int64_t nanos = 0;
    if (!amount.has_value() || *amount > kMaxInt64 ||
        __builtin_mul_overflow(static_cast<int64_t>(*amount), unit->second, &nanos) ||
        __builtin_add_overflow(total, nanos, &total)) {
      return InvalidArgumentError(fmt::format("{} is too long", Quote(text)));
    }
  }
  return Duration(total);
}

std::string FormatCpuQuantity(int64_t cpu_milli) {
  return cpu_milli % kMilliPerUnit == 0 ? std::to_string(cpu_milli / kMilliPerUnit)
                                        : std::to_string(cpu_milli) + "m";
}

std::string FormatMemoryQuantity(int64_t memory_mib) {
  for (const auto& [suffix, shift] : {std::pair<const char*, int>{"Ti", 20}, {"Gi", 10}}) {
    if (memory_mib != 0 && memory_mib % (int64_t{1} << shift) == 0) {
      return fmt::format("{}{}", memory_mib / (int64_t{1} << shift), suffix);
    }
  }
  return fmt::format("{}Mi", memory_mib);
}

std::string FormatSpecDuration(Duration duration) {
  if (duration.count() == 0) {
    return "0s";
  }
  // A negative duration is not valid in a spec; it is written as such rather than hidden.
  std::string out = duration.count() < 0 ? "-" : "";
  auto rest = static_cast<uint64_t>(duration.count());
  rest = duration.count() < 0 ? 0 - rest : rest;
  for (const auto& [suffix, nanos] : kDurationUnits) {
    if (rest >= static_cast<uint64_t>(nanos)) {
      out += fmt::format("{}{}", rest / nanos, suffix);
      rest %= nanos;
    }
  }
  return out;
}

int64_t PlacementBytesBound(const TaskGroup& group) {
  // Measured on PlacementsToJson's output with a 63-character node name, plus the phase, exit
  // code and end reason a task's report adds (docs/api.md), rounded up; each GPU's UUID
  // (scheduler::kMaxGpuUuidBytes, quoted) on top.
  constexpr int64_t kPerTask = 640;
  constexpr int64_t kPerGpu = 140 + 98;
  // A container task's image_pull_ms and image_digest (at most kMaxImageDigestLength).
  constexpr int64_t kPerImage = 64 + static_cast<int64_t>(kMaxImageDigestLength);
  const int64_t gpus = std::visit(
      [](const auto& request) -> int64_t {
        using T = std::decay_t<decltype(request)>;
        if constexpr (std::is_same_v<T, WholeGpus> || std::is_same_v<T, MigGpus>) {
          return request.count;
        } else if constexpr (std::is_same_v<T, FractionalGpu>) {
          return 1;
        } else {
          return 0;
        }
      },
      group.request.gpus);
  return kPerTask + 2 * static_cast<int64_t>(group.name.size()) + kPerGpu * gpus +
         (group.image.empty() ? 0 : kPerImage);
}

Status CheckSubmissionLimits(const Job& job, size_t document_bytes, size_t max_document_bytes) {
  int64_t tasks = 0;
  int64_t placements = 0;
  for (const TaskGroup& group : job.groups) {
    tasks += group.replicas;
    placements += group.replicas * PlacementBytesBound(group);
  }
  if (tasks > kMaxTasksPerJob) {
    return InvalidArgumentError(fmt::format(
        "spec.tasks: {} tasks in all, more than the limit of {}", tasks, kMaxTasksPerJob));
  }
  // Reasons, events quoted in the document and the stop record.
  constexpr int64_t kLifeBytes = 16 * 1024;
  const int64_t bound = static_cast<int64_t>(document_bytes) + placements + kLifeBytes;
  if (bound > static_cast<int64_t>(max_document_bytes)) {
    return InvalidArgumentError(fmt::format(
        "spec: the job's stored document with its {} placements could reach {} bytes, more than "
        "the store's limit of {}; submit fewer tasks (spec.tasks[].replicas) or a smaller spec",
        tasks, bound, max_document_bytes));
  }
  return Status::Ok();
}

Status CheckTasksRunnable(const Job& job) {
  for (size_t i = 0; i < job.groups.size(); ++i) {
    const TaskGroup& group = job.groups[i];
    if (group.command.empty() && group.image.empty()) {
      return InvalidArgumentError(
          fmt::format("spec.tasks[{}].command: task {} has neither a command nor an image; give "
                      "it one or both",
                      i, Quote(group.name)));
    }
  }
  return Status::Ok();
}

Result<Job> ParseJobSpec(std::string_view text, const GpuCatalog& catalog) {
  if (text.size() > kMaxJobSpecBytes) {
    return InvalidArgumentError(
        fmt::format("spec too large: {} bytes, limit {}", text.size(), kMaxJobSpecBytes));
  }
  if (const size_t bad = InvalidUtf8Offset(text); bad != kNpos) {
    return InvalidArgumentError(fmt::format("spec is not valid UTF-8 at byte offset {}", bad));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const SpecNode root, ParseSpecTree(text));
  GPUFLEET_ASSIGN_OR_RETURN(Job job, ReadJob(root));
  GPUFLEET_RETURN_IF_ERROR(ToSpecPaths(job.Validate(catalog)));
  return job;
}

Result<Job> JobSpecFromJson(const nlohmann::json& spec, const GpuCatalog& catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(const SpecNode root, SpecTreeFromJson(spec));
  if (root.kind == SpecNode::Kind::kNull) {
    return InvalidArgumentError("spec is empty");
  }
  GPUFLEET_ASSIGN_OR_RETURN(Job job, ReadJob(root));
  GPUFLEET_RETURN_IF_ERROR(ToSpecPaths(job.Validate(catalog)));
  return job;
}

std::string JobSpecToYaml(const Job& job) {
  YAML::Emitter out;
  EmitYaml(out, SpecToJson<ordered_json>(job), "");
  return std::string(out.c_str()) + "\n";
}

nlohmann::json JobSpecToJson(const Job& job) {
  return SpecToJson<json>(job);
}

}  // namespace gpufleet::wire
