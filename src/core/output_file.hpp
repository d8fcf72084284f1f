// Opening a file ferry writes (a trace, a report, a page): the one place where
// ferry opens for writing what a user names.
//
// The path is opened without blocking (a FIFO with no reader would hang in
// open()) and must be a regular file once open (a FIFO, socket, directory or
// device is refused: /dev/full would only fail later). It is created or
// truncated. Writes go through an std::ostream over the descriptor; a write
// error sets its badbit, as for an std::ofstream.
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include "ferry/result.hpp"

namespace ferry {

// Errors: invalid_argument "PATH: cannot open for writing: REASON" or
// "PATH: is a FIFO (a named pipe), not a regular file" / ... Never blocks on a
// FIFO or device.
Result<std::unique_ptr<std::ostream>> open_output_file(const std::string& path);

}  // namespace ferry
