#include "ferry/fault_spec.hpp"

#include <charconv>
#include <string>

#include "core/text.hpp"

namespace ferry {
namespace {

constexpr std::string_view kGrammar =
    "expected pinned-noop[:P] (0<=P<=1), peer-noop[:P] (0<=P<=1), batch-broken, batch-missing, fail-map:N (N>=1), "
    "delay:NS or none, comma-separated";

// Faults are quoted as on the command line: 'pinned-noop'.
std::string quoted(std::string_view text) { return text::quoted(text, std::string_view::npos, '\''); }

Error bad(std::string_view item, std::string_view why) {
  return make_error(ErrorCode::invalid_argument, "--inject item " + quoted(item) + ": " +
                                                     std::string(why) + "; " +
                                                     std::string(kGrammar));
}

Result<std::uint64_t> parse_u64(std::string_view item, std::string_view digits) {
  const std::optional<std::uint64_t> v = text::parse_u64(digits);
  if (!v) return bad(item, quoted(digits) + " is not a non-negative integer (max 2^64-1)");
  return *v;
}

Result<double> parse_probability(std::string_view item, std::string_view text) {
  double p = 0;
  const char* end = text.data() + text.size();
  // Fixed notation only: no exponents, no hex floats, no locale.
  auto [ptr, ec] = std::from_chars(text.data(), end, p, std::chars_format::fixed);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return bad(item, "probability " + quoted(text) + " is not a decimal number");
  }
  if (!(p >= 0.0 && p <= 1.0)) {
    return bad(item, "probability " + std::string(text) + " is outside [0, 1]");
  }
  return p;
}

Result<void> apply_item(std::string_view item, SimFaults& faults) {
  const auto colon = item.find(':');
  const std::string_view name = colon == std::string_view::npos ? item : item.substr(0, colon);
  const bool has_arg = colon != std::string_view::npos;
  const std::string_view arg = has_arg ? item.substr(colon + 1) : std::string_view{};

  if (name == "pinned-noop" || name == "peer-noop") {
    double p = 1.0;
    if (has_arg) {
      auto parsed = parse_probability(item, arg);
      if (!parsed.ok()) return std::move(parsed).error();
      p = *parsed;
    }
    (name == "pinned-noop" ? faults.pinned_noop : faults.peer_noop) = p;
    return {};
  }
  if (name == "batch-broken" || name == "batch-missing" || name == "none") {
    if (has_arg) return bad(item, quoted(name) + " takes no argument");
    if (name == "batch-broken") {
      faults.batch_broken = true;
    } else if (name == "batch-missing") {
      faults.batch_missing = true;
    } else {
      faults = SimFaults{};
    }
    return {};
  }
  if (name == "fail-map" || name == "delay") {
    if (!has_arg) return bad(item, quoted(name) + " needs a number after ':'");
    auto n = parse_u64(item, arg);
    if (!n.ok()) return std::move(n).error();
    if (name == "fail-map") {
      if (*n == 0) return bad(item, "map calls are numbered from 1");
      faults.fail_map_call = *n;
    } else {
      faults.max_completion_delay_ns = *n;
    }
    return {};
  }
  return bad(item, "unknown fault " + quoted(name));
}

}  // namespace

Result<void> apply_fault_spec(std::string_view spec, SimFaults& faults) {
  if (text::trimmed(spec).empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "--inject needs a fault; " + std::string(kGrammar));
  }
  std::size_t start = 0;
  while (start <= spec.size()) {
    const std::size_t comma = spec.find(',', start);
    const std::size_t stop = comma == std::string_view::npos ? spec.size() : comma;
    const std::string_view item = text::trimmed(spec.substr(start, stop - start));
    if (item.empty()) {
      return make_error(ErrorCode::invalid_argument,
                        "--inject " + quoted(spec) + " has an empty item; " +
                            std::string(kGrammar));
    }
    FERRY_TRY(apply_item(item, faults));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return {};
}

Result<SimFaults> parse_fault_specs(std::span<const std::string> specs) {
  SimFaults faults;
  for (const std::string& spec : specs) {
    auto r = apply_fault_spec(spec, faults);
    if (!r.ok()) return std::move(r).error();
  }
  return faults;
}

Result<SimFaults> parse_fault_spec(std::string_view spec) {
  SimFaults faults;
  auto r = apply_fault_spec(spec, faults);
  if (!r.ok()) return std::move(r).error();
  return faults;
}

std::string describe(const SimFaults& faults) {
  std::string out;
  auto add = [&](const std::string& item) {
    if (!out.empty()) out += ',';
    out += item;
  };
  const auto probability = [&](std::string_view name, double p) {
    if (!(p > 0)) return;
    if (p >= 1.0) {
      add(std::string(name));
      return;
    }
    // Shortest fixed-notation text that reads back as the same double.
    char buf[400];
    auto r = std::to_chars(buf, buf + sizeof buf, p, std::chars_format::fixed);
    add(std::string(name) + ":" + std::string(buf, r.ptr));
  };
  probability("pinned-noop", faults.pinned_noop);
  probability("peer-noop", faults.peer_noop);
  if (faults.batch_broken) add("batch-broken");
  if (faults.batch_missing) add("batch-missing");
  if (faults.fail_map_call != 0) add("fail-map:" + std::to_string(faults.fail_map_call));
  if (faults.max_completion_delay_ns != 0) {
    add("delay:" + std::to_string(faults.max_completion_delay_ns));
  }
  return out.empty() ? "none" : out;
}

}  // namespace ferry
