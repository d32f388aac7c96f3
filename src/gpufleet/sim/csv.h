// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <fstream>
#include <istream>
#include <map>
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

}  // namespace gpufleet::sim
