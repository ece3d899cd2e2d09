// The CUDA tuning tables (csrc/ops/cuda/tuned_*.cu) as rows of named fields, for Python:
// adaptiveload._C._tuning_table() turns each row into a dict (CUDA builds only).
#pragma once

#include <cstdint>
#include <vector>

namespace adaptiveload {

struct TableField {
  const char* name;
  int64_t number;    // the value, where text is null
  const char* text;  // the value of a text field (static storage)
};

using TableRow = std::vector<TableField>;

// Every row of every table, in table order (dispatch.cu).
std::vector<TableRow> tuning_table_rows();

}  // namespace adaptiveload
