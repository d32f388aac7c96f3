// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <fstream>
#include <istream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"

namespace gpufleet::sim {

// Opens a trace file for reading; kNotFound naming the path when it cannot.
Result<std::ifstream> OpenInputFile(const std::string& path);

// Reads a CSV file with a header row, one record at a time (streaming). Fields may be quoted with
// '"' ("" inside quotes is a quote). Errors name the file, the line and the column.
// Not thread-safe.
class CsvReader {
 public:
  // `source` names the file in error messages. A header is required unless `header` is given.
  CsvReader(std::istream& in, std::string source, std::vector<std::string> header = {});

  // Reads the header (when not given); kInvalidArgument when the file is empty.
  Status Open();
  // Next record; false at the end of the input. A record with the wrong number of fields is an
  // error naming the line.
  Result<bool> Next();

  // kInvalidArgument "file:line: missing column \"name\"" when the header lacks the column.
  Result<int> Column(std::string_view name) const;
  bool HasColumn(std::string_view name) const;
  const std::string& Field(int column) const { return fields_[column]; }

  // The field parsed as a non-negative integer; the error names file, line, column and value.
  Result<int64_t> Int(int column) const;
  int line() const { return line_; }
  const std::string& source() const { return source_; }
  // "file:line: column \"name\": " for error messages about the current record.
  std::string Where(int column) const;

 private:
  bool SplitLine(const std::string& text, std::vector<std::string>& out) const;

  std::istream& in_;
  std::string source_;
  std::vector<std::string> header_;
  std::vector<std::string> fields_;
  int line_ = 0;
};

// Lines of fields split at one character, without quoting: Gavel's tab-separated traces and
// sacct's '|'-separated output. One trailing delimiter on every line (`sacct --parsable`) is
// dropped when the header has it. Streams: holds one line at a time. Errors name file and line
// as CsvReader's do. Not thread-safe.
class DelimitedReader {
 public:
  // A header row is read by Open() unless `header` is given.
  DelimitedReader(std::istream& in, std::string source, char delimiter,
                  std::vector<std::string> header = {});

  // kInvalidArgument "file:1: empty file, expected a header row".
  Status Open();
  // Next non-empty line; false at the end of the input. A line with another number of fields
  // than the header is kInvalidArgument "file:line: N fields, expected M (columns)".
  Result<bool> Next();

  // kInvalidArgument "file:line: missing column \"name\" (columns: ...)".
  Result<int> Column(std::string_view name) const;
  bool HasColumn(std::string_view name) const;
  const std::string& Field(int column) const { return fields_[column]; }
  int line() const { return line_; }
  const std::string& source() const { return source_; }
  // "file:line: column \"name\"" for error messages about the current line.
  std::string Where(int column) const;

 private:
  void Split(const std::string& text, std::vector<std::string>& out) const;

  std::istream& in_;
  std::string source_;
  char delimiter_;
  std::vector<std::string> header_;
  std::vector<std::string> fields_;
  bool trailing_delimiter_ = false;
  int line_ = 0;
};

// The whole of `text` as a decimal integer, or nullopt.
std::optional<int64_t> ToInt64(std::string_view text);
// The whole of `text` as a finite decimal number, or nullopt.
std::optional<double> ToFiniteDouble(std::string_view text);

// "YYYY-MM-DD<separator>HH:MM:SS" as seconds since 1970-01-01 00:00:00, read as UTC; nullopt
// when malformed.
std::optional<int64_t> ParseIsoDateTime(std::string_view text, char separator);

}  // namespace gpufleet::sim
