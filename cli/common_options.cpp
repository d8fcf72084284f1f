#include "common_options.hpp"

#include <cstdio>
#include <filesystem>
#include <optional>

#include "option_values.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/make_backend.hpp"

namespace ferry::cli {

std::string bar_separated(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : "|") + n;
  return s;
}

std::string profile_list() { return bar_separated(profile_names()); }

std::string fault_refusal(BackendKind backend, const SimFaults& faults) {
  BackendSpec spec;  // the default profile: only the faults are in question
  spec.kind = backend;
  spec.faults = faults;
  Result<void> checked = check_spec(spec);
  return checked.ok() ? std::string() : checked.error().message;
}

CLI::Option* add_backend_option(CLI::App& app, BackendKind& backend) {
  std::vector<std::string> names;
  for (const NamedValue<BackendKind>& n : backend_kinds()) names.emplace_back(n.name);
  return app
      .add_option_function<std::string>(
          "--backend", [&backend](const std::string& v) { backend = parse_backend_kind(v).value_or(backend); },
          "Device backend: " + names_in(backend_kinds()))
      ->check(CLI::IsMember(names))
      ->default_str(std::string(to_string(backend)));
}

CLI::Option* add_profile_option(CLI::App& app, std::string& profile) {
  return app.add_option("--profile", profile, "Sim device profile: " + profile_list())
      ->check(checked(
          [](const std::string& name) -> Result<void> {
            if (find_profile(name)) return {};
            return make_error(ErrorCode::invalid_argument,
                              "unknown profile \"" + name + "\" (profiles: " + profile_list() + ")");
          },
          "PROFILE"))
      ->capture_default_str();
}

CLI::Option* add_capacity_option(CLI::App& app, std::string& capacity, const std::string& default_text) {
  return app
      .add_option("--capacity", capacity,
                  std::string("Pool capacity: ") + kByteUnitsHelp + "\n(default: " + default_text +
                      "; more than the device is clamped to it, with a warning)")
      ->check(checked([](const std::string& v) { return parse_byte_size(v); }, "BYTES"));
}

std::string capacity_clamp_warning(std::uint64_t requested, BackendKind backend, const std::string& profile) {
  if (!capabilities_of(backend).profiled) return {};
  const std::optional<DeviceProfile> p = find_profile(profile);
  if (!p || requested <= p->capacity) return {};
  return "warning: --capacity " + text::human_bytes(requested) + " is more than the " + profile + "'s " +
         text::human_bytes(p->capacity) + ": the pool is clamped to the device";
}

std::string overwrite_refusal(const std::string& option, const std::string& output, const std::string& input,
                              const std::string& what) {
  std::error_code ec;
  if (input.empty() || output == "-" || !std::filesystem::equivalent(output, input, ec)) return {};
  return option + " " + output + " would overwrite " + what;
}

CLI::Option* add_seed_option(CLI::App& app, std::string& seed, const std::string& description) {
  return app.add_option("--seed", seed, description)
      ->check(checked([](const std::string& v) { return parse_u64(v); }, "UINT"))
      ->capture_default_str();
}

CLI::Option* add_inject_option(CLI::App& app, std::vector<std::string>& specs) {
  return app
      .add_option("--inject", specs,
                  "Sim faults, repeatable or comma-separated: pinned-noop[:P],\n"
                  "peer-noop[:P], batch-broken, batch-missing, fail-map:N, delay:NS, none")
      ->check(checked(
          [](const std::string& v) -> Result<void> {
            // CLI11 names the option already: "--inject: item 'x': ...".
            Result<SimFaults> f = parse_fault_spec(v);
            if (f.ok()) return {};
            Error e = std::move(f).error();
            if (e.message.rfind("--inject ", 0) == 0) e.message.erase(0, 9);
            return e;
          },
          ""))
      ->type_name("SPEC")
      ->allow_extra_args(false);
}

CLI::Option* add_trace_argument(CLI::App& app, const std::string& name, std::string& path,
                                const std::string& description) {
  return app.add_option(name, path, description)->required();
}

void add_report_options(CLI::App& app, std::string& report, bool& json) {
  app.add_option("--report", report,
                 "Also write the JSON report to FILE; '-' prints it on stdout in place of\n"
                 "the summary, as --json does")
      ->type_name("FILE");
  app.add_flag("--json", json, "Print the JSON report on stdout instead of the summary");
}

}  // namespace ferry::cli
