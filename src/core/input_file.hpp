// Reading an input file (a trace, a weights file) whole, or refusing it with a
// plain reason: the one place where ferry opens what a user names as input.
//
// Every input is opened without blocking (a FIFO with no writer would hang in
// open()), must be a regular file (a directory, FIFO, socket or device is
// refused at once: /dev/zero would never end), and is read with read(2) to its
// end: a read error part-way (EIO, a file truncated while read) is an error,
// never a shorter input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ferry/result.hpp"

namespace ferry {

class InputFile {
 public:
  // Opens `path` read-only and non-blocking and checks that it is a regular
  // file. Errors: invalid_argument "PATH: cannot open: REASON" or
  // "PATH: is a directory" / "is a FIFO" / "is a character device" / ...
  static Result<InputFile> open(const std::string& path);

  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  const std::string& path() const noexcept { return path_; }
  // The size fstat gave at open (0 for files such as /proc's that have none).
  std::uint64_t size() const noexcept { return size_; }

  // Fills `into` from the current position. Errors: invalid_argument naming the
  // path, the offset reached and the reason (a read error, or the file ending
  // before `into` is full: it shrank since open).
  Result<void> read_exactly(std::span<std::byte> into);

  // Reads from the current position to the end. Errors: invalid_argument on a
  // read error, or when the file holds more than `max_bytes` ("PATH: is larger
  // than the LIMIT limit on a WHAT"); out_of_memory when the text cannot be held.
  Result<std::string> read_rest(std::uint64_t max_bytes, std::string_view what);

 private:
  InputFile(int fd, std::string path, std::uint64_t size) : fd_(fd), path_(std::move(path)), size_(size) {}

  int fd_ = -1;
  std::string path_;
  std::uint64_t size_ = 0;
  std::uint64_t offset_ = 0;  // bytes read so far
};

// Why a file of this st_mode, not a regular one, is refused: "is a FIFO (a named
// pipe), not a regular file", "is a character device, ...".
const char* not_regular_reason(unsigned mode) noexcept;

// InputFile::open(path) then read_rest(max_bytes, what).
Result<std::string> read_input_file(const std::string& path, std::uint64_t max_bytes, std::string_view what);

}  // namespace ferry
