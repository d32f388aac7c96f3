// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/csv.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

namespace gpufleet::sim {
namespace {

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
int64_t DaysFromCivil(int64_t year, int64_t month, int64_t day) {
  year -= month <= 2 ? 1 : 0;
  const int64_t era = (year >= 0 ? year : year - 399) / 400;
  const int64_t year_of_era = year - era * 400;
  const int64_t day_of_year = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1;
  const int64_t day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
  return era * 146097 + day_of_era - 719468;
}

int DaysInMonth(int64_t year, int64_t month) {
  static constexpr std::array<int, 12> kDays = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return month == 2 && leap ? 29 : kDays[month - 1];
}

}  // namespace

std::optional<int64_t> ToInt64(std::string_view text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

std::optional<double> ToFiniteDouble(std::string_view text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() ||
      !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

std::optional<int64_t> ParseIsoDateTime(std::string_view text, char separator) {
  if (text.size() != 19 || text[4] != '-' || text[7] != '-' || text[10] != separator ||
      text[13] != ':' || text[16] != ':') {
    return std::nullopt;
  }
  auto number = [&text](size_t begin, size_t length) -> int64_t {
    int64_t value = 0;
    for (size_t i = begin; i < begin + length; ++i) {
      if (text[i] < '0' || text[i] > '9') {
        return -1;
      }
      value = value * 10 + (text[i] - '0');
    }
    return value;
  };
  const int64_t year = number(0, 4);
  const int64_t month = number(5, 2);
  const int64_t day = number(8, 2);
  const int64_t hour = number(11, 2);
  const int64_t minute = number(14, 2);
  const int64_t second = number(17, 2);
  if (year < 0 || month < 1 || month > 12 || day < 1 || day > DaysInMonth(year, month) ||
      hour < 0 || hour > 23 || minute < 0 || minute > 59 || second < 0 || second > 59) {
    return std::nullopt;
  }
  return DaysFromCivil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second;
}

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

DelimitedReader::DelimitedReader(std::istream& in, std::string source, char delimiter,
                                 std::vector<std::string> header)
    : in_(in), source_(std::move(source)), delimiter_(delimiter), header_(std::move(header)) {}

Status DelimitedReader::Open() {
  if (!header_.empty()) {
    return Status::Ok();
  }
  std::string text;
  if (!std::getline(in_, text)) {
    return InvalidArgumentError(fmt::format("{}:1: empty file, expected a header row", source_));
  }
  ++line_;
  Split(text, header_);
  if (header_.size() > 1 && header_.back().empty()) {
    header_.pop_back();
    trailing_delimiter_ = true;
  }
  return Status::Ok();
}

Result<bool> DelimitedReader::Next() {
  std::string text;
  while (std::getline(in_, text)) {
    ++line_;
    if (text.empty() || text == "\r") {
      continue;
    }
    Split(text, fields_);
    if (trailing_delimiter_ && fields_.size() == header_.size() + 1 && fields_.back().empty()) {
      fields_.pop_back();
    }
    if (fields_.size() != header_.size()) {
      return InvalidArgumentError(fmt::format("{}:{}: {} fields, expected {} ({})", source_, line_,
                                              fields_.size(), header_.size(),
                                              fmt::join(header_, ",")));
    }
    return true;
  }
  return false;
}

Result<int> DelimitedReader::Column(std::string_view name) const {
  for (size_t i = 0; i < header_.size(); ++i) {
    if (header_[i] == name) {
      return static_cast<int>(i);
    }
  }
  return InvalidArgumentError(fmt::format("{}:{}: missing column \"{}\" (columns: {})", source_,
                                          line_, name, fmt::join(header_, ",")));
}

bool DelimitedReader::HasColumn(std::string_view name) const {
  return std::find(header_.begin(), header_.end(), name) != header_.end();
}

std::string DelimitedReader::Where(int column) const {
  return fmt::format("{}:{}: column \"{}\"", source_, line_, header_[column]);
}

void DelimitedReader::Split(const std::string& text, std::vector<std::string>& out) const {
  out.clear();
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(delimiter_, begin);
    std::string field = text.substr(begin, end == std::string::npos ? end : end - begin);
    if (end == std::string::npos) {
      if (!field.empty() && field.back() == '\r') {
        field.pop_back();
      }
      out.push_back(std::move(field));
      return;
    }
    out.push_back(std::move(field));
    begin = end + 1;
  }
}

}  // namespace gpufleet::sim
