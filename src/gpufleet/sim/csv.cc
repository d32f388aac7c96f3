// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/csv.h"

#include <charconv>

#include <fmt/format.h>

namespace gpufleet::sim {

Result<std::ifstream> OpenInputFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return NotFoundError(fmt::format("{}: cannot open file", path));
  }
  return in;
}

CsvReader::CsvReader(std::istream& in, std::string source, std::vector<std::string> header)
    : in_(in), source_(std::move(source)), header_(std::move(header)) {}

bool CsvReader::SplitLine(const std::string& text, std::vector<std::string>& out) const {
  out.clear();
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(std::move(field));
      field.clear();
    } else if (c != '\r') {
      field += c;
    }
  }
  out.push_back(std::move(field));
  return !quoted;
}

Status CsvReader::Open() {
  if (!header_.empty()) {
    return Status::Ok();
  }
  std::string text;
  if (!std::getline(in_, text)) {
    return InvalidArgumentError(fmt::format("{}: empty file, expected a header row", source_));
  }
  ++line_;
  if (!SplitLine(text, header_)) {
    return InvalidArgumentError(fmt::format("{}:{}: unterminated quote in header", source_, line_));
  }
  return Status::Ok();
}

Result<bool> CsvReader::Next() {
  std::string text;
  while (std::getline(in_, text)) {
    ++line_;
    if (text.empty() || text == "\r") {
      continue;
    }
    if (!SplitLine(text, fields_)) {
      return InvalidArgumentError(fmt::format("{}:{}: unterminated quote", source_, line_));
    }
    if (fields_.size() != header_.size()) {
      return InvalidArgumentError(fmt::format("{}:{}: {} fields, the header has {} ({})", source_,
                                              line_, fields_.size(), header_.size(),
                                              fmt::join(header_, ",")));
    }
    return true;
  }
  return false;
}

bool CsvReader::HasColumn(std::string_view name) const {
  for (const std::string& column : header_) {
    if (column == name) {
      return true;
    }
  }
  return false;
}

Result<int> CsvReader::Column(std::string_view name) const {
  for (size_t i = 0; i < header_.size(); ++i) {
    if (header_[i] == name) {
      return static_cast<int>(i);
    }
  }
  return InvalidArgumentError(fmt::format("{}:{}: missing column \"{}\" (columns: {})", source_,
                                          line_, name, fmt::join(header_, ",")));
}

std::string CsvReader::Where(int column) const {
  return fmt::format("{}:{}: column \"{}\"", source_, line_, header_[column]);
}

Result<int64_t> CsvReader::Int(int column) const {
  const std::string& text = fields_[column];
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < 0) {
    return InvalidArgumentError(
        fmt::format("{}: \"{}\" is not a non-negative integer", Where(column), text));
  }
  return value;
}

}  // namespace gpufleet::sim
