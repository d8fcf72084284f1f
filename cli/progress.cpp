#include "progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <ostream>
#include <utility>

namespace ferry::cli {

Progress::Progress(std::ostream& err, bool tty, std::string name, Lines lines)
    : err_(err), tty_(tty), name_(std::move(name)), lines_(lines) {}

Progress::~Progress() { finish(); }

void Progress::update(std::string_view phase, std::uint64_t done, std::uint64_t total) {
  if (total == 0) return;
  const bool new_phase = phase != phase_;
  if (new_phase) phase_ = std::string(phase);
  if (tty_) {
    constexpr std::uint64_t kWidth = 30;
    done = std::min(done, total);
    // Redrawn once per percent, per phase and at the end: a million ops must not
    // mean a million writes to the terminal.
    const std::uint64_t percent = done * 100 / total;
    if (!new_phase && percent == last_percent_ && done != total) return;
    last_percent_ = percent;
    const std::uint64_t filled = done * kWidth / total;
    err_ << "\r" << name_ << " [" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
         << phase_ << " " << done << "/" << total << "   " << std::flush;
    drawn_ = true;
    return;
  }
  if (lines_ == Lines::none) return;
  const std::uint64_t tenth = done * 10 / total;
  if (new_phase || tenth != last_tenth_) {
    err_ << name_ << ": " << phase_ << " " << done << "/" << total << "\n";
    last_tenth_ = tenth;
  }
}

void Progress::finish() {
  if (tty_ && drawn_) err_ << "\r\033[K" << std::flush;
  drawn_ = false;
}

bool is_terminal(const std::ostream& err) { return &err == &std::cerr && ::isatty(STDERR_FILENO) == 1; }

}  // namespace ferry::cli
