#include "core/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include "core/text.hpp"

namespace ferry {
namespace {

Error input_error(const std::string& path, const std::string& what) {
  return make_error(ErrorCode::invalid_argument, path + ": " + what);
}

}  // namespace

const char* not_regular_reason(unsigned mode) noexcept {
  if (S_ISDIR(mode)) return "is a directory, not a regular file";
  if (S_ISFIFO(mode)) return "is a FIFO (a named pipe), not a regular file";
  if (S_ISSOCK(mode)) return "is a socket, not a regular file";
  if (S_ISCHR(mode)) return "is a character device, not a regular file";
  if (S_ISBLK(mode)) return "is a block device, not a regular file";
  return "is not a regular file";
}

Result<InputFile> InputFile::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of hanging;
  // a regular file ignores the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return input_error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;  // read before close() can change it
    ::close(fd);
    return input_error(path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return input_error(path, not_regular_reason(st.st_mode));
  }
  return InputFile(fd, path, static_cast<std::uint64_t>(st.st_size));
}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), size_(other.size_), offset_(other.offset_) {}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    size_ = other.size_;
    offset_ = other.offset_;
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<void> InputFile::read_exactly(std::span<std::byte> into) {
  std::size_t got = 0;
  while (got < into.size()) {
    const ssize_t n = ::read(fd_, into.data() + got, into.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return input_error(path_, "read failed at offset " + std::to_string(offset_) + ": " + std::strerror(errno));
    }
    if (n == 0) {
      return input_error(path_, "ended at offset " + std::to_string(offset_) + ", before the " +
                                    std::to_string(offset_ + (into.size() - got)) +
                                    " bytes it had when opened (was it truncated?)");
    }
    got += static_cast<std::size_t>(n);
    offset_ += static_cast<std::uint64_t>(n);
  }
  return {};
}

Result<std::string> InputFile::read_rest(std::uint64_t max_bytes, std::string_view what) {
  const auto too_large = [&] {
    return input_error(path_, "is larger than the " + text::human_bytes(max_bytes, 0) + " limit on " +
                                  std::string(what));
  };
  if (size_ > max_bytes) return too_large();
  std::string text;
  try {
    // One byte past the size fstat gave, so that reaching the end costs no second
    // pass; /proc-like files (size 0) grow the buffer as they go.
    text.resize(static_cast<std::size_t>(std::max<std::uint64_t>(size_ + 1, 64 * 1024)));
    std::size_t used = 0;
    for (;;) {
      if (used == text.size()) {
        if (used > max_bytes) return too_large();
        text.resize(std::min<std::uint64_t>(2 * text.size(), max_bytes + 1));
      }
      const ssize_t n = ::read(fd_, text.data() + used, text.size() - used);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return input_error(path_, "read failed at offset " + std::to_string(offset_) + ": " + std::strerror(errno));
      }
      if (n == 0) break;
      used += static_cast<std::size_t>(n);
      offset_ += static_cast<std::uint64_t>(n);
    }
    if (used > max_bytes) return too_large();
    text.resize(used);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::out_of_memory,
                      path_ + ": host memory ran out after reading " + std::to_string(offset_) + " bytes");
  }
  return text;
}

Result<std::string> read_input_file(const std::string& path, std::uint64_t max_bytes, std::string_view what) {
  Result<InputFile> file = InputFile::open(path);
  if (!file.ok()) return std::move(file).error();
  return file->read_rest(max_bytes, what);
}

}  // namespace ferry
