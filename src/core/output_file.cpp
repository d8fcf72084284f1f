#include "core/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <streambuf>
#include <utility>

#include "core/input_file.hpp"

namespace ferry {
namespace {

// An std::streambuf writing to a descriptor it owns, in 64 KiB pieces.
class FdBuffer final : public std::streambuf {
 public:
  explicit FdBuffer(int fd) : fd_(fd) { setp(buf_.data(), buf_.data() + buf_.size()); }
  ~FdBuffer() override {
    (void)drain();
    ::close(fd_);
  }
  FdBuffer(const FdBuffer&) = delete;
  FdBuffer& operator=(const FdBuffer&) = delete;

 protected:
  int_type overflow(int_type ch) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  bool drain() {
    const char* p = pbase();
    while (p < pptr()) {
      const ssize_t n = ::write(fd_, p, static_cast<std::size_t>(pptr() - p));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      p += n;
    }
    setp(buf_.data(), buf_.data() + buf_.size());
    return true;
  }

  int fd_;
  std::array<char, 64 * 1024> buf_{};
};

class OutputStream final : public std::ostream {
 public:
  explicit OutputStream(int fd) : std::ostream(nullptr), buf_(fd) { rdbuf(&buf_); }

 private:
  FdBuffer buf_;
};

Error output_error(const std::string& path, const std::string& what) {
  return make_error(ErrorCode::invalid_argument, path + ": " + what);
}

}  // namespace

Result<std::unique_ptr<std::ostream>> open_output_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO with no reader fails at once (ENXIO) instead of
  // hanging; a regular file ignores the flag.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0666);
  if (fd < 0) return output_error(path, std::string("cannot open for writing: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;  // read before close() can change it
    ::close(fd);
    return output_error(path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return output_error(path, not_regular_reason(st.st_mode));
  }
  std::unique_ptr<std::ostream> out;
  try {
    out = std::make_unique<OutputStream>(fd);
  } catch (...) {
    ::close(fd);
    throw;
  }
  return out;
}

}  // namespace ferry
