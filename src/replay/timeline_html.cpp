// The timeline as one self-contained HTML page: the data embedded as JSON
// (timeline_page.hpp: bounded), an inline script that draws the chart on a
// canvas and the layouts as SVG. No external resources (no fonts, no
// scripts, no stylesheets, no namespace URIs: the HTML parser puts inline <svg>
// markup in the SVG namespace by itself).
#include <string>
#include <string_view>

#include "ferry/pool_timeline.hpp"
#include "replay/timeline_page.hpp"

namespace ferry {
namespace {

constexpr std::string_view kPage = R"HTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ferry snapshot: @@TITLE@@</title>
<style>
  body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 20px 28px; color: #1d232b; background: #fff; }
  h1 { font-size: 20px; margin: 0 0 2px; }
  h2 { font-size: 16px; margin: 26px 0 6px; }
  .sub { color: #5b6572; margin-bottom: 12px; }
  .cards { display: flex; flex-wrap: wrap; gap: 8px; margin: 8px 0 4px; }
  .card { border: 1px solid #dde2e8; border-radius: 6px; padding: 6px 10px; min-width: 92px; }
  .card b { display: block; font-size: 16px; }
  .card span { color: #5b6572; font-size: 12px; }
  .pass { color: #1d7a32; } .fail { color: #b3261e; }
  .oom { background: #fdecea; border: 1px solid #f0b4ae; padding: 6px 10px; border-radius: 6px; margin: 8px 0; }
  .oom pre { white-space: pre-wrap; margin: 4px 0 0; font-size: 12px; }
  .oom button { font: inherit; font-size: 12px; padding: 1px 8px; border: 1px solid #b9c2cc; background: #fff; border-radius: 4px; cursor: pointer; }
  .note { background: #fff6d6; border: 1px solid #e8d48a; padding: 6px 10px; border-radius: 6px; margin: 8px 0; }
  .legend { display: flex; flex-wrap: wrap; gap: 14px; margin: 4px 0 6px; font-size: 13px; }
  .legend i { display: inline-block; width: 14px; height: 10px; margin-right: 5px; vertical-align: middle; border: 1px solid rgba(0,0,0,.25); }
  .controls button { font: inherit; padding: 3px 10px; margin-right: 4px; border: 1px solid #b9c2cc; background: #f6f8fa; border-radius: 4px; cursor: pointer; }
  .controls button.on { background: #1d232b; color: #fff; border-color: #1d232b; }
  .controls { margin: 6px 0; }
  .chart { position: relative; }
  svg { display: block; font: 11px system-ui, sans-serif; }
  svg text { fill: #3c4550; }
  .tip { position: absolute; pointer-events: none; background: rgba(255,255,255,.96); border: 1px solid #b9c2cc; border-radius: 4px; padding: 5px 8px; font-size: 12px; white-space: nowrap; display: none; box-shadow: 0 1px 4px rgba(0,0,0,.12); }
  table { border-collapse: collapse; font-size: 12px; margin-top: 6px; }
  td, th { border-bottom: 1px solid #eceff3; padding: 2px 10px 2px 0; text-align: left; }
  td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
  .seg { margin: 10px 0 2px; font-weight: 600; }
  .muted { color: #5b6572; font-weight: normal; }
  code { font-size: 12px; }
</style>
</head>
<body>
<h1>ferry snapshot: <span id="trace-name"></span></h1>
<div class="sub" id="subtitle"></div>
<div class="cards" id="cards"></div>
<div id="note"></div>
<div id="oom"></div>

<h2>Pool over time</h2>
<div class="controls" id="x-controls">x axis: <button data-x="op" class="on">operations</button><button data-x="time">virtual time</button></div>
<div class="legend" id="chart-legend"></div>
<div class="chart" id="chart"><div class="tip" id="tip"></div></div>

<h2>Layout</h2>
<div class="controls" id="layout-controls"></div>
<div id="layout-title"></div>
<div class="legend" id="layout-legend"></div>
<div id="layout"></div>
<details id="blocks-details"><summary id="blocks-summary">blocks</summary><div id="blocks"></div></details>

<h2>Largest live blocks at the peak</h2>
<div id="largest"></div>

<script type="application/json" id="ferry-data">@@DATA@@</script>
<script>
)HTML";

// The page after its script.
constexpr std::string_view kPageEnd = R"HTML(</script>
</body>
</html>
)HTML";

std::string html_text(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// JSON inside <script>: '<' only occurs inside JSON strings there, where \u003c
// means the same, so no "</script>" or "<!--" can end or confuse the element.
std::string script_safe(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (char c : json) {
    if (c == '<') out += "\\u003c";
    else out += c;
  }
  return out;
}

void replace_once(std::string& page, std::string_view key, const std::string& value) {
  const std::size_t at = page.find(key);
  if (at != std::string::npos) page.replace(at, key.size(), value);
}

}  // namespace

std::string timeline_html(const PoolTimeline& timeline) {
  std::string page(kPage);
  page += replay::kTimelineScript;
  page += kPageEnd;
  // DATA first, then TITLE, whose placeholder comes earlier in the page: neither
  // value can then be mistaken for the other's placeholder.
  replace_once(page, "@@DATA@@", script_safe(replay::timeline_page_json(timeline)));
  replace_once(page, "@@TITLE@@", html_text(timeline.trace));
  return page;
}

}  // namespace ferry
