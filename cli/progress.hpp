// ferry CLI — progress on stderr, the same for every subcommand that runs long:
// a bar redrawn in place on a terminal, a line per tenth otherwise (logs and
// pipes stay readable), or nothing.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

namespace ferry::cli {

class Progress {
 public:
  enum class Lines : std::uint8_t { per_tenth, none };
  // `name` leads every bar or line. Off a terminal, `lines` says whether to print
  // a line per tenth (run) or nothing (replay, snapshot, bench: their output is
  // read by scripts and their stderr kept for errors).
  Progress(std::ostream& err, bool tty, std::string name, Lines lines = Lines::per_tenth);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` of `total` units of `phase` ("layers", "ops", ...). A total of 0 draws nothing.
  void update(std::string_view phase, std::uint64_t done, std::uint64_t total);
  // Erases the bar (on a terminal), so that what follows starts on a clean line.
  void finish();

 private:
  std::ostream& err_;
  bool tty_;
  std::string name_;
  Lines lines_;
  std::string phase_;
  std::uint64_t last_tenth_ = 0;
  std::uint64_t last_percent_ = ~std::uint64_t{0};
  bool drawn_ = false;
};

// Whether `err` is this process's stderr and that is a terminal.
bool is_terminal(const std::ostream& err);

}  // namespace ferry::cli
