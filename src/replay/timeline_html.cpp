// The timeline as one self-contained HTML page: the data embedded as JSON, an
// inline script that draws it as SVG. No external resources (no fonts, no
// scripts, no stylesheets, no namespace URIs: the HTML parser puts inline <svg>
// markup in the SVG namespace by itself).
#include <string>
#include <string_view>

#include "ferry/pool_timeline.hpp"

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

<script type="application/json" id="ferry-data">@@DATA@@</script>
<script>
(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('ferry-data').textContent);
  var S = D.samples;
  var N = S.index.length;
  var PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#79706e'];
  var SERIES = [
    { key: 'reserved_bytes', name: 'reserved (mapped)', color: '#3b6fb6', area: true },
    { key: 'allocated_bytes', name: 'live (allocated)', color: '#2a9d3a' },
    { key: 'pending_free_bytes', name: 'pending free', color: '#e07b00' },
    { key: 'cached_bytes', name: 'cached (mapped, no block)', color: '#8a5cc2', dash: '5 3' }
  ];
  var UNMAPPED = '#f1f2f4', MAPPED = '#cfd6df', CACHED = '#dccff2';

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c];
    });
  }
  function bytes(b) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'], i = 0, v = b;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    if (i === 0) return v + ' B';
    return (v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0)) + ' ' + u[i];
  }
  function nanos(ns) {
    if (ns < 1e3) return ns + ' ns';
    if (ns < 1e6) return (ns / 1e3).toFixed(1) + ' us';
    if (ns < 1e9) return (ns / 1e6).toFixed(2) + ' ms';
    return (ns / 1e9).toFixed(3) + ' s';
  }
  function hex(n) { return '0x' + n.toString(16); }
  function streamColor(s) { return PALETTE[s % PALETTE.length]; }
  function f1(x) { return Math.round(x * 10) / 10; }

  // A "nice" step near span/count: 1, 2 or 5 times a power of `base`ish.
  function niceStep(span, count) {
    var raw = span / Math.max(1, count);
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  function niceBytesStep(span, count) {
    var unit = 1;
    while (unit * 1024 <= span / Math.max(1, count)) unit *= 1024;
    return niceStep(span / unit, count) * unit;
  }

  // --- header ---------------------------------------------------------------
  var R = D.report;
  document.getElementById('trace-name').textContent = D.trace;
  document.getElementById('subtitle').textContent =
    D.backend + ' / ' + D.device + ', pool capacity ' + bytes(D.capacity) + ', granule ' +
    bytes(D.granule) + ', seed ' + D.seed + ', ' + R.ops + ' ops, ' + nanos(R.device_time_ns || 0) + ' of device time';
  var ratio = R.peak_reserved_bytes ? (R.peak_live_bytes / R.peak_reserved_bytes * 100).toFixed(1) + ' %' : '-';
  var errs = 0;
  for (var k in R.errors) errs += R.errors[k];
  var cards = [
    ['verdict', '<b class="' + (R.verdict === 'pass' ? 'pass' : 'fail') + '">' + esc(R.verdict) + '</b>'],
    ['peak live', '<b>' + bytes(R.peak_live_bytes) + '</b>'],
    ['peak reserved', '<b>' + bytes(R.peak_reserved_bytes) + '</b>'],
    ['live / reserved at peak', '<b>' + ratio + '</b>'],
    ['checks (corrupt)', '<b>' + R.checks + ' (' + R.corrupt + ')</b>'],
    ['errors (unexpected)', '<b>' + errs + ' (' + R.unexpected_errors + ')</b>'],
    ['OOMs', '<b>' + R.ooms + '</b>'],
    ['reclaims', '<b>' + R.reclaims + '</b>']
  ];
  document.getElementById('cards').innerHTML = cards.map(function (c) {
    return '<div class="card">' + c[1] + '<span>' + esc(c[0]) + '</span></div>';
  }).join('');
  if (D.note) document.getElementById('note').innerHTML = '<div class="note">' + esc(D.note) + '</div>';

  // --- the pool over time -----------------------------------------------------
  var CW = 1040, CH = 330, ML = 78, MR = 18, MT = 22, MB = 54, EV = 12;  // EV: the events strip under the axis
  var PW = CW - ML - MR, PH = CH - MT - MB;
  var xMode = 'op';
  var t0 = N ? S.now_ns[0] : 0, t1 = N ? S.now_ns[N - 1] : 0;
  if (t1 <= t0) document.querySelector('#x-controls [data-x="time"]').disabled = true;

  var ymax = 1;
  SERIES.forEach(function (s) { S[s.key].forEach(function (v) { if (v > ymax) ymax = v; }); });
  // The capacity line is drawn when it does not squash the series flat.
  var showCapacity = D.capacity > 0 && D.capacity <= ymax * 1.6;
  if (showCapacity) ymax = Math.max(ymax, D.capacity);
  ymax *= 1.05;

  function X(i) {
    if (xMode === 'time' && t1 > t0) return ML + (S.now_ns[i] - t0) / (t1 - t0) * PW;
    return ML + (N > 1 ? i / (N - 1) * PW : 0);
  }
  function Y(v) { return MT + PH - v / ymax * PH; }

  // Step-after path; samples that land on one pixel column are drawn as that
  // column's min..max, so peaks survive any number of samples.
  function seriesPath(vals) {
    var d = '', i = 0, first = true;
    while (i < N) {
      var px = Math.round(X(i) * 2) / 2;
      var a = vals[i], mn = a, mx = a, last = a, j = i + 1;
      while (j < N && Math.round(X(j) * 2) / 2 === px) {
        var v = vals[j];
        if (v < mn) mn = v;
        if (v > mx) mx = v;
        last = v;
        j++;
      }
      d += first ? 'M' + px + ' ' + f1(Y(a)) : 'H' + px + 'V' + f1(Y(a));
      if (mn !== mx) d += 'V' + f1(Y(mx)) + 'V' + f1(Y(mn)) + 'V' + f1(Y(last));
      first = false;
      i = j;
    }
    return d;
  }

  function sampleAt(px) {
    if (N === 0) return -1;
    if (xMode === 'time' && t1 > t0) {
      var t = t0 + (px - ML) / PW * (t1 - t0), lo = 0, hi = N - 1;
      while (lo < hi) {  // the last sample at or before t
        var mid = (lo + hi + 1) >> 1;
        if (S.now_ns[mid] <= t) lo = mid; else hi = mid - 1;
      }
      return lo;
    }
    return Math.max(0, Math.min(N - 1, Math.round((px - ML) / PW * (N - 1))));
  }

  function drawChart() {
    var h = [];
    h.push('<svg id="chart-svg" width="' + CW + '" height="' + CH + '" viewBox="0 0 ' + CW + ' ' + CH + '">');
    // y grid
    var ys = niceBytesStep(ymax, 5);
    for (var v = 0; v <= ymax; v += ys) {
      h.push('<line x1="' + ML + '" x2="' + (ML + PW) + '" y1="' + f1(Y(v)) + '" y2="' + f1(Y(v)) + '" stroke="#eceff3"/>');
      h.push('<text x="' + (ML - 6) + '" y="' + f1(Y(v) + 4) + '" text-anchor="end">' + bytes(v) + '</text>');
    }
    // x ticks
    if (xMode === 'time' && t1 > t0) {
      var ts = niceStep(t1 - t0, 8);
      for (var t = 0; t <= t1 - t0; t += ts) {
        var x = ML + t / (t1 - t0) * PW;
        h.push('<line x1="' + f1(x) + '" x2="' + f1(x) + '" y1="' + (MT + PH + EV) + '" y2="' + (MT + PH + EV + 4) + '" stroke="#8a939e"/>');
        h.push('<text x="' + f1(x) + '" y="' + (MT + PH + EV + 16) + '" text-anchor="middle">' + nanos(Math.round(t)) + '</text>');
      }
      h.push('<text x="' + (ML + PW / 2) + '" y="' + (CH - 4) + '" text-anchor="middle">virtual time since the start</text>');
    } else {
      var os = Math.max(1, niceStep(Math.max(1, N - 1), 10));
      for (var o = 0; o <= N - 1; o += os) {
        var xo = X(o);
        h.push('<line x1="' + f1(xo) + '" x2="' + f1(xo) + '" y1="' + (MT + PH + EV) + '" y2="' + (MT + PH + EV + 4) + '" stroke="#8a939e"/>');
        h.push('<text x="' + f1(xo) + '" y="' + (MT + PH + EV + 16) + '" text-anchor="middle">' + o + '</text>');
      }
      h.push('<text x="' + (ML + PW / 2) + '" y="' + (CH - 4) + '" text-anchor="middle">operations (trace order)</text>');
    }
    h.push('<line x1="' + ML + '" x2="' + (ML + PW) + '" y1="' + (MT + PH) + '" y2="' + (MT + PH) + '" stroke="#8a939e"/>');
    h.push('<rect x="' + ML + '" y="' + (MT + PH + 1) + '" width="' + PW + '" height="' + (EV - 1) + '" fill="#f6f7f9"/>');
    if (showCapacity) {
      h.push('<line x1="' + ML + '" x2="' + (ML + PW) + '" y1="' + f1(Y(D.capacity)) + '" y2="' + f1(Y(D.capacity)) +
             '" stroke="#b3261e" stroke-dasharray="6 4"/>');
      h.push('<text x="' + (ML + PW - 4) + '" y="' + f1(Y(D.capacity) - 4) + '" text-anchor="end" style="fill:#b3261e">capacity ' +
             bytes(D.capacity) + '</text>');
    }
    // layout moments
    D.layouts.forEach(function (l) {
      var xi = X(l.index);
      h.push('<line x1="' + f1(xi) + '" x2="' + f1(xi) + '" y1="' + MT + '" y2="' + (MT + PH) + '" stroke="#6b7480" stroke-dasharray="2 3"/>');
      var nearEnd = xi > ML + PW - 60;  // labels near the right edge go to the left of their line
      h.push('<text x="' + f1(nearEnd ? xi - 3 : xi + 3) + '" y="' + (MT - 8) + '"' + (nearEnd ? ' text-anchor="end"' : '') + '>' +
             esc(l.moment === 'line' ? 'line ' + l.line : l.moment) + '</text>');
    });
    // series, the area first
    SERIES.forEach(function (s) {
      if (N === 0) return;
      var d = seriesPath(S[s.key]);
      if (s.area) {
        h.push('<path d="' + d + 'V' + f1(Y(0)) + 'H' + f1(X(0)) + 'Z" fill="' + s.color + '" fill-opacity="0.12" stroke="none"/>');
      }
      h.push('<path d="' + d + '" fill="none" stroke="' + s.color + '" stroke-width="1.6"' +
             (s.dash ? ' stroke-dasharray="' + s.dash + '"' : '') + '/>');
    });
    // OOMs and reclaims, as marks under the axis
    for (var i = 1; i < N; i++) {
      if (S.ooms[i] > S.ooms[i - 1]) {
        var xm = f1(X(i));
        h.push('<path d="M' + xm + ' ' + (MT + PH + 2) + 'l-4.5 9h9z" fill="#b3261e"><title>out_of_memory after line ' +
               S.line[i] + ' (' + esc(S.op[i]) + ')</title></path>');
      }
      if (S.reclaims[i] > S.reclaims[i - 1]) {
        var xr = f1(X(i));
        h.push('<line x1="' + xr + '" x2="' + xr + '" y1="' + (MT + PH + 1) + '" y2="' + (MT + PH + EV) +
               '" stroke="#8a5cc2" stroke-width="2"><title>reclaim after line ' + S.line[i] + '</title></line>');
      }
    }
    h.push('<line id="cursor" x1="0" x2="0" y1="' + MT + '" y2="' + (MT + PH) + '" stroke="#1d232b" stroke-width="0.8" visibility="hidden"/>');
    h.push('<rect id="hover" x="' + ML + '" y="' + MT + '" width="' + PW + '" height="' + PH + '" fill="transparent"/>');
    h.push('</svg>');
    var chart = document.getElementById('chart');
    var tip = document.getElementById('tip');
    chart.innerHTML = h.join('');
    chart.appendChild(tip);
    var svg = document.getElementById('chart-svg');
    var cursor = document.getElementById('cursor');
    var hover = document.getElementById('hover');
    hover.addEventListener('mousemove', function (ev) {
      var r = svg.getBoundingClientRect();
      var px = (ev.clientX - r.left) * CW / r.width;
      var i = sampleAt(px);
      if (i < 0) return;
      var x = X(i);
      cursor.setAttribute('x1', x);
      cursor.setAttribute('x2', x);
      cursor.setAttribute('visibility', 'visible');
      var where = S.op[i] === 'start' ? 'before the first op' : S.op[i] === 'end' ? 'after the end (all freed)' :
        'op ' + S.index[i] + ', line ' + S.line[i] + ': <b>' + esc(S.op[i]) + '</b>';
      var rows = [where, 't = ' + nanos(S.now_ns[i] - t0)];
      SERIES.forEach(function (s) {
        rows.push('<span style="color:' + s.color + '">&#9632;</span> ' + esc(s.name) + ': ' + bytes(S[s.key][i]));
      });
      rows.push('live as requested: ' + bytes(S.requested_bytes[i]));
      rows.push('OOMs ' + S.ooms[i] + ', reclaims ' + S.reclaims[i]);
      tip.innerHTML = rows.join('<br>');
      tip.style.display = 'block';
      var left = (x * r.width / CW) + 14;
      if (left > r.width - 260) left = (x * r.width / CW) - 260;
      tip.style.left = left + 'px';
      tip.style.top = (MT + 6) + 'px';
    });
    hover.addEventListener('mouseleave', function () {
      tip.style.display = 'none';
      cursor.setAttribute('visibility', 'hidden');
    });
  }

  document.getElementById('chart-legend').innerHTML = SERIES.map(function (s) {
    return '<span><i style="background:' + s.color + '"></i>' + esc(s.name) + '</span>';
  }).join('') + (showCapacity ? '<span><i style="background:#b3261e"></i>capacity</span>' : '') +
    '<span><i style="background:#b3261e;border-radius:50%"></i>out of memory (events)</span>' +
    '<span><i style="background:#8a5cc2;width:3px"></i>reclaim (events)</span>';
  Array.prototype.forEach.call(document.querySelectorAll('#x-controls button'), function (b) {
    b.addEventListener('click', function () {
      if (b.disabled) return;
      xMode = b.getAttribute('data-x');
      Array.prototype.forEach.call(document.querySelectorAll('#x-controls button'), function (o) {
        o.className = o === b ? 'on' : '';
      });
      drawChart();
    });
  });
  drawChart();

  // --- the layout -------------------------------------------------------------
  var LW = 1040, LL = 96, LR = 10, ROW = 24, GAP = 5, MAXROWS = 10;

  function drawLayout(l) {
    var snap = l.snapshot, h = [], y = 4, legendStreams = {};
    var st = snap.stats;
    document.getElementById('layout-title').innerHTML =
      '<b>' + esc(l.title) + '</b><div class="muted">live ' + bytes(st.allocated_bytes) + ', pending free ' +
      bytes(st.pending_free_bytes) + ', reserved ' + bytes(st.reserved_bytes) + ', cached ' + bytes(st.cached_bytes) +
      '; ' + snap.blocks.length + ' blocks in ' + snap.segments.length + ' reserved ranges; t = ' + nanos(l.now_ns - t0) + '</div>';
    var body = [];
    snap.segments.forEach(function (seg) {
      var blocks = snap.blocks.filter(function (b) { return b.addr >= seg.base && b.addr < seg.base + seg.bytes; });
      var end = 0;
      seg.mapped.forEach(function (r) { end = Math.max(end, r[0] + r[1] - seg.base); });
      blocks.forEach(function (b) { end = Math.max(end, b.addr + b.bytes - seg.base); });
      var g = seg.granule || 1;
      end = Math.ceil(end / g) * g;
      var head = '<div class="seg">' + esc(seg.kind) + ' range <code>' + hex(seg.base) + '</code> <span class="muted">' +
        bytes(seg.bytes) + ' of address space; ' + bytes(seg.mapped_bytes) + ' mapped, ' + bytes(seg.cached_bytes) +
        ' cached; ' + blocks.length + ' blocks' + (end ? '; drawn: the first ' + bytes(end) : '') + '</span></div>';
      if (end === 0) {
        body.push(head + '<div class="muted">nothing mapped and no blocks</div>');
        return;
      }
      var granules = end / g;
      var perRow = Math.max(1, Math.ceil(granules / MAXROWS));
      var rowBytes = perRow * g;
      var rows = Math.ceil(end / rowBytes);
      var W = LW - LL - LR;
      var H = rows * (ROW + GAP) + 4;
      var s = ['<svg width="' + LW + '" height="' + H + '" viewBox="0 0 ' + LW + ' ' + H + '">',
        '<defs><pattern id="hatch-' + esc(seg.kind) + '" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">' +
        '<rect width="6" height="6" fill="#ffffff" fill-opacity="0.35"/><line x1="0" y1="0" x2="0" y2="6" stroke="#1d232b" stroke-width="1.6" stroke-opacity="0.55"/></pattern></defs>'];
      function rowY(r) { return 2 + r * (ROW + GAP); }
      // Draws [off, off+len) of the range, split across rows.
      function span(off, len, attrs, title, minw) {
        var out = [];
        while (len > 0) {
          var r = Math.floor(off / rowBytes), inRow = off - r * rowBytes;
          var take = Math.min(len, rowBytes - inRow);
          var x = LL + inRow / rowBytes * W, w = take / rowBytes * W;
          if (minw && w < minw) w = minw;
          out.push('<rect x="' + f1(x) + '" y="' + rowY(r) + '" width="' + Math.max(0.3, f1(w)) + '" height="' + ROW + '" ' + attrs + '>' +
                   (title ? '<title>' + esc(title) + '</title>' : '') + '</rect>');
          off += take;
          len -= take;
        }
        return out.join('');
      }
      for (var r = 0; r < rows; r++) {
        var rb = Math.min(rowBytes, end - r * rowBytes);
        s.push('<rect x="' + LL + '" y="' + rowY(r) + '" width="' + f1(rb / rowBytes * W) + '" height="' + ROW + '" fill="' + UNMAPPED + '" stroke="#dde2e8" stroke-width="0.5"/>');
        s.push('<text x="' + (LL - 6) + '" y="' + (rowY(r) + ROW / 2 + 4) + '" text-anchor="end">+' + bytes(r * rowBytes) + '</text>');
      }
      seg.mapped.forEach(function (m) {
        s.push(span(m[0] - seg.base, m[1], 'fill="' + MAPPED + '"', 'mapped granules: ' + bytes(m[1]) + ' at +' + bytes(m[0] - seg.base)));
      });
      seg.cached.forEach(function (c) {
        s.push(span(c[0] - seg.base, c[1], 'fill="' + CACHED + '"', 'cached (mapped, no block): ' + bytes(c[1]) + ' at +' + bytes(c[0] - seg.base)));
      });
      // granule boundaries, when they are far enough apart to see
      var gpx = g / rowBytes * W;
      if (gpx >= 10) {
        for (var r2 = 0; r2 < rows; r2++) {
          for (var gx = gpx; gx < W - 0.5; gx += gpx) {
            s.push('<line x1="' + f1(LL + gx) + '" x2="' + f1(LL + gx) + '" y1="' + rowY(r2) + '" y2="' + (rowY(r2) + ROW) + '" stroke="#ffffff" stroke-width="1"/>');
          }
        }
      }
      blocks.forEach(function (b, bi) {
        legendStreams[b.stream] = true;
        var pending = b.state !== 'live';
        var title = (b.owner ? b.owner + ': ' : '') + bytes(b.bytes) + ' at ' + hex(b.addr) + ' (+' + bytes(b.addr - seg.base) +
          '), ' + (pending ? 'pending free' : 'live') + ', stream ' + b.stream;
        // Neighbours alternate in shade, so adjacent blocks of one stream stay apart.
        var opacity = pending ? 0.55 : bi % 2 ? 0.78 : 1;
        s.push(span(b.addr - seg.base, b.bytes, 'fill="' + streamColor(b.stream) + '" fill-opacity="' + opacity + '"' +
                    ' stroke="#ffffff" stroke-width="0.6"', title, 1));
        if (pending) s.push(span(b.addr - seg.base, b.bytes, 'fill="url(#hatch-' + esc(seg.kind) + ')" pointer-events="none"', '', 1));
        // The owner's name inside the block's first piece, when it fits.
        var off = b.addr - seg.base, r0 = Math.floor(off / rowBytes);
        var w0 = Math.min(b.bytes, (r0 + 1) * rowBytes - off) / rowBytes * W;
        var label = b.owner || bytes(b.bytes);
        if (w0 >= label.length * 6.2 + 8) {
          s.push('<text x="' + f1(LL + (off - r0 * rowBytes) / rowBytes * W + 4) + '" y="' + (rowY(r0) + ROW / 2 + 4) +
                 '" style="fill:#ffffff;paint-order:stroke" stroke="#000000" stroke-opacity="0.35" stroke-width="2" pointer-events="none">' + esc(label) + '</text>');
        }
      });
      s.push('</svg>');
      body.push(head + s.join(''));
    });
    document.getElementById('layout').innerHTML = body.join('');
    var streams = Object.keys(legendStreams).map(Number).sort(function (a, b) { return a - b; });
    document.getElementById('layout-legend').innerHTML =
      streams.map(function (s) { return '<span><i style="background:' + streamColor(s) + '"></i>live, stream ' + s + '</span>'; }).join('') +
      '<span><i style="background:repeating-linear-gradient(45deg,#8a939e 0 2px,#d5dae0 2px 5px)"></i>pending free (still used by queued work)</span>' +
      '<span><i style="background:' + MAPPED + '"></i>mapped, between blocks</span>' +
      '<span><i style="background:' + CACHED + '"></i>cached granule</span>' +
      '<span><i style="background:' + UNMAPPED + '"></i>reserved, unmapped</span>';
    // the blocks as a table
    var rows = ['<table><tr><th>owner</th><th class="n">address</th><th class="n">bytes</th><th>state</th><th class="n">stream</th></tr>'];
    var shown = Math.min(snap.blocks.length, 5000);
    for (var i = 0; i < shown; i++) {
      var b = snap.blocks[i];
      rows.push('<tr><td>' + esc(b.owner || '') + '</td><td class="n"><code>' + hex(b.addr) + '</code></td><td class="n">' + bytes(b.bytes) +
                '</td><td>' + esc(b.state) + '</td><td class="n">' + b.stream + '</td></tr>');
    }
    rows.push('</table>');
    if (shown < snap.blocks.length) rows.push('<div class="muted">' + (snap.blocks.length - shown) + ' more not listed</div>');
    document.getElementById('blocks-summary').textContent = 'blocks at this moment (' + snap.blocks.length + ')';
    document.getElementById('blocks').innerHTML = rows.join('');
  }

  var controls = document.getElementById('layout-controls');
  if (D.layouts.length === 0) {
    controls.textContent = 'no layout was taken';
  } else {
    controls.innerHTML = D.layouts.map(function (l, i) {
      return '<button data-i="' + i + '"' + (i === 0 ? ' class="on"' : '') + '>' +
        esc(l.moment === 'line' ? 'at line ' + l.line : l.moment === 'peak' ? 'peak reserved' : 'end of trace') + '</button>';
    }).join('');
    Array.prototype.forEach.call(controls.querySelectorAll('button'), function (b) {
      b.addEventListener('click', function () {
        Array.prototype.forEach.call(controls.querySelectorAll('button'), function (o) { o.className = o === b ? 'on' : ''; });
        drawLayout(D.layouts[Number(b.getAttribute('data-i'))]);
      });
    });
    drawLayout(D.layouts[0]);
  }
})();
</script>
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
  // DATA first, then TITLE, whose placeholder comes earlier in the page: neither
  // value can then be mistaken for the other's placeholder.
  replace_once(page, "@@DATA@@", script_safe(timeline_json(timeline)));
  replace_once(page, "@@TITLE@@", html_text(timeline.trace));
  return page;
}

}  // namespace ferry
