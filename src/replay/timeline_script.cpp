// The timeline page's script (timeline_html.cpp puts it between the page's
// head, which holds the data, and its end): it draws the chart, the layouts and
// the tables from the embedded JSON (timeline_page.hpp says what it holds).
#include "replay/timeline_page.hpp"

namespace ferry::replay {

extern const std::string_view kTimelineScript = R"JS(
(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('ferry-data').textContent);
  var C = D.chart, E = D.events;
  var N = D.samples, B = C.first.length;
  var PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#79706e'];
  var SERIES = [
    { key: 'reserved_bytes', name: 'reserved (mapped)', color: '#3b6fb6', area: true },
    { key: 'allocated_bytes', name: 'live (allocated)', color: '#2a9d3a' },
    { key: 'pending_free_bytes', name: 'pending free', color: '#e07b00' },
    { key: 'cached_bytes', name: 'cached (mapped, no block)', color: '#8a5cc2', dash: '5 3' }
  ];
  // An imported PyTorch snapshot: its own reserved bytes (live segments) beside ferry's.
  if (C.torch_reserved_bytes) {
    SERIES.push({ key: 'torch_reserved_bytes', name: 'PyTorch reserved (its segments)', color: '#222222', dash: '2 3' });
  }
  // The private pools of the trace's graphs (graph.hpp): blocks kept for them, inside the live bytes.
  if (C.graph_pool_reserved_bytes) {
    SERIES.push({ key: 'graph_pool_reserved_bytes', name: 'graph pools (kept for graphs)', color: '#c2185b', dash: '6 2' });
    SERIES.push({ key: 'graph_pool_allocated_bytes', name: 'graph pools, held by the program', color: '#f06292', dash: '1 2' });
  }
  var UNMAPPED = '#f1f2f4', MAPPED = '#cfd6df', CACHED = '#dccff2';

  function steps(n) { return n + (n === 1 ? ' step' : ' steps'); }
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

  // --- the pool over time: a canvas, one column per chart entry -----------------
  // Each entry stands for C.count[c] consecutive samples from C.first[c]: its
  // min, max and last value per series are drawn, so every peak survives.
  var CW = 1040, CH = 330, ML = 78, MR = 18, MT = 22, MB = 54, EV = 12;  // EV: the events strip under the axis
  var PW = CW - ML - MR, PH = CH - MT - MB;
  var xMode = 'op', picked = -1;
  var t0 = B ? C.now_ns[0] : 0, t1 = B ? C.now_ns[B - 1] : 0;
  if (t1 <= t0) document.querySelector('#x-controls [data-x="time"]').disabled = true;

  var ymax = 1;
  SERIES.forEach(function (s) { C[s.key + '_max'].forEach(function (v) { if (v > ymax) ymax = v; }); });
  // The capacity line is drawn when it does not squash the series flat.
  var showCapacity = D.capacity > 0 && D.capacity <= ymax * 1.6;
  if (showCapacity) ymax = Math.max(ymax, D.capacity);
  ymax *= 1.05;

  // The chart entry holding sample i.
  function columnOf(i) {
    var lo = 0, hi = B - 1;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (C.first[mid] <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
  function timeX(ns) { return ML + (ns - t0) / (t1 - t0) * PW; }
  function X(i) {  // x of sample i
    if (xMode === 'time' && t1 > t0) return timeX(C.now_ns[columnOf(i)]);
    return ML + (N > 1 ? i / (N - 1) * PW : 0);
  }
  function colX(c) { return X(C.first[c]); }
  function Y(v) { return MT + PH - v / ymax * PH; }

  // The sample under x = px: in time, the first of the entry at or before it.
  function sampleAt(px) {
    if (N === 0) return -1;
    if (xMode === 'time' && t1 > t0) {
      var t = t0 + (px - ML) / PW * (t1 - t0), lo = 0, hi = B - 1;
      while (lo < hi) {
        var mid = (lo + hi + 1) >> 1;
        if (C.now_ns[mid] <= t) lo = mid; else hi = mid - 1;
      }
      return C.first[lo];
    }
    return Math.max(0, Math.min(N - 1, Math.round((px - ML) / PW * (N - 1))));
  }

  var canvas = document.createElement('canvas');
  canvas.id = 'chart-canvas';
  canvas.style.width = CW + 'px';
  canvas.style.height = CH + 'px';
  canvas.style.cursor = 'crosshair';
  var chartBox = document.getElementById('chart');
  chartBox.insertBefore(canvas, chartBox.firstChild);

  // A line and a label on one 2D context.
  function pen(g) {
    return {
      g: g,
      line: function (x1, y1, x2, y2, color, dash) {
        g.beginPath();
        g.setLineDash(dash || []);
        g.strokeStyle = color;
        g.moveTo(x1, y1);
        g.lineTo(x2, y2);
        g.stroke();
        g.setLineDash([]);
      },
      text: function (s, x, y, align, color) {
        g.fillStyle = color || '#3c4550';
        g.textAlign = align || 'left';
        g.fillText(s, x, y);
      }
    };
  }

  // Under the series: the byte grid, the x axis in the mode picked, the event strip, the
  // capacity line and the layout moments.
  function drawAxes(p) {
    var ys = niceBytesStep(ymax, 5);
    for (var v = 0; v <= ymax; v += ys) {
      p.line(ML, Y(v), ML + PW, Y(v), '#eceff3');
      p.text(bytes(v), ML - 6, Y(v) + 4, 'right');
    }
    if (xMode === 'time' && t1 > t0) {
      var ts = niceStep(t1 - t0, 8);
      for (var t = 0; t <= t1 - t0; t += ts) {
        var x = ML + t / (t1 - t0) * PW;
        p.line(x, MT + PH + EV, x, MT + PH + EV + 4, '#8a939e');
        p.text(nanos(Math.round(t)), x, MT + PH + EV + 16, x > ML + PW - 24 ? 'right' : 'center');
      }
      p.text('virtual time since the start', ML + PW / 2, CH - 4, 'center');
    } else {
      var os = Math.max(1, niceStep(Math.max(1, N - 1), 10));
      for (var o = 0; o <= N - 1; o += os) {
        var xo = X(o);
        p.line(xo, MT + PH + EV, xo, MT + PH + EV + 4, '#8a939e');
        p.text(String(o), xo, MT + PH + EV + 16, xo > ML + PW - 24 ? 'right' : 'center');
      }
      p.text('operations (trace order)' + (B < N ? '; ' + N + ' samples in ' + B + ' columns (min to max each)' : ''),
             ML + PW / 2, CH - 4, 'center');
    }
    p.line(ML, MT + PH, ML + PW, MT + PH, '#8a939e');
    p.g.fillStyle = '#f6f7f9';
    p.g.fillRect(ML, MT + PH + 1, PW, EV - 1);
    if (showCapacity) {
      p.line(ML, Y(D.capacity), ML + PW, Y(D.capacity), '#b3261e', [6, 4]);
      p.text('capacity ' + bytes(D.capacity), ML + PW - 4, Y(D.capacity) - 4, 'right', '#b3261e');
    }
    D.layouts.forEach(function (l) {
      var xi = X(l.index);
      p.line(xi, MT, xi, MT + PH, '#6b7480', [2, 3]);
      var nearEnd = xi > ML + PW - 60;  // labels near the right edge go to the left of their line
      p.text(l.moment === 'line' ? 'line ' + l.line : l.moment === 'oom' ? 'first OOM' : l.moment,
             nearEnd ? xi - 3 : xi + 3, MT - 8, nearEnd ? 'right' : 'left');
    });
  }

  // One series as a path: each column's min-to-max span, then its last value.
  function tracePath(g, key) {
    var last = C[key], mn = C[key + '_min'], mx = C[key + '_max'];
    g.beginPath();
    g.moveTo(colX(0), Y(mx[0]));
    for (var c = 0; c < B; c++) {
      var xc = colX(c);
      if (c > 0) g.lineTo(xc, Y(last[c - 1]));
      if (mn[c] !== mx[c]) { g.lineTo(xc, Y(mx[c])); g.lineTo(xc, Y(mn[c])); }
      g.lineTo(xc, Y(last[c]));
    }
    g.lineTo(ML + PW, Y(last[B - 1]));
  }

  function strokePath(g, color, dash) {
    g.setLineDash(dash || []);
    g.strokeStyle = color;
    g.lineWidth = 1.6;
    g.stroke();
    g.setLineDash([]);
    g.lineWidth = 1;
  }

  // The series, the areas first, then the reserved series' outline over its area.
  function drawSeries(g) {
    if (B === 0) return;
    SERIES.forEach(function (s) {
      tracePath(g, s.key);
      if (s.area) {
        g.save();
        g.lineTo(ML + PW, Y(0));
        g.lineTo(colX(0), Y(0));
        g.closePath();
        g.globalAlpha = 0.12;
        g.fillStyle = s.color;
        g.fill();
        g.restore();
        return;
      }
      strokePath(g, s.color, s.dash ? s.dash.split(' ').map(Number) : []);
    });
    tracePath(g, SERIES[0].key);
    strokePath(g, SERIES[0].color);
  }

  // Over the series: OOMs and reclaims as marks under the axis, and the picked point.
  function drawMarks(p) {
    var g = p.g;
    E.reclaim.forEach(function (i) { p.line(X(i), MT + PH + 1, X(i), MT + PH + EV, '#8a5cc2'); });
    g.fillStyle = '#b3261e';
    E.oom.forEach(function (i) {
      var xm = X(i);
      g.beginPath();
      g.moveTo(xm, MT + PH + 2);
      g.lineTo(xm - 4.5, MT + PH + 11);
      g.lineTo(xm + 4.5, MT + PH + 11);
      g.closePath();
      g.fill();
    });
    if (picked >= 0) {
      var xp = X(picked);
      g.lineWidth = 2;
      p.line(xp, MT, xp, MT + PH, '#1d232b');
      g.lineWidth = 1;
    }
  }

  function drawChart() {
    var dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(CW * dpr);
    canvas.height = Math.round(CH * dpr);
    var g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, CW, CH);
    g.font = '11px system-ui, sans-serif';
    g.lineWidth = 1;
    var p = pen(g);
    drawAxes(p);
    drawSeries(g);
    drawMarks(p);
  }

  var tip = document.getElementById('tip');
  function pxOf(ev) {
    var r = canvas.getBoundingClientRect();
    return { x: (ev.clientX - r.left) * CW / r.width, w: r.width };
  }
  canvas.addEventListener('mousemove', function (ev) {
    var p = pxOf(ev), i = sampleAt(p.x);
    if (i < 0) return;
    var c = columnOf(i), from = C.first[c], to = from + C.count[c] - 1;
    var where = C.count[c] === 1 ?
      (C.op[c] === 'start' ? 'before the first op' : C.op[c] === 'end' ? 'after the end (all freed)' :
        'op ' + from + ', line ' + C.line[c] + ': <b>' + esc(C.op[c]) + '</b>') :
      'ops ' + from + ' to ' + to + ' (last: line ' + C.line[c] + ', ' + esc(C.op[c]) + ')';
    var rows = [where, 't = ' + nanos(C.now_ns[c] - t0)];
    SERIES.forEach(function (s) {
      var lo = C[s.key + '_min'][c], hi = C[s.key + '_max'][c];
      rows.push('<span style="color:' + s.color + '">&#9632;</span> ' + esc(s.name) + ': ' +
                (lo === hi ? bytes(hi) : bytes(lo) + ' to ' + bytes(hi)));
    });
    rows.push('live as requested: ' + bytes(C.requested_bytes[c]));
    rows.push('OOMs ' + C.ooms[c] + ', reclaims ' + C.reclaims[c]);
    rows.push('<span class="muted">click: the layout here</span>');
    tip.innerHTML = rows.join('<br>');
    tip.style.display = 'block';
    var left = (p.x * p.w / CW) + 14;
    if (left > p.w - 280) left = (p.x * p.w / CW) - 280;
    tip.style.left = left + 'px';
    tip.style.top = (MT + 6) + 'px';
  });
  canvas.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
  canvas.addEventListener('click', function (ev) {
    var i = sampleAt(pxOf(ev).x);
    if (i >= 0) showAt(i, true);
  });

  document.getElementById('chart-legend').innerHTML = SERIES.map(function (s) {
    return '<span><i style="background:' + s.color + '"></i>' + esc(s.name) + '</span>';
  }).join('') + (showCapacity ? '<span><i style="background:#b3261e"></i>capacity</span>' : '') +
    '<span><i style="background:#b3261e;border-radius:50%"></i>out of memory (' + steps(E.oom_steps) +
    (E.oom_steps > E.oom.length ? ', the first ' + E.oom.length + ' marked' : '') + ')</span>' +
    '<span><i style="background:#8a5cc2;width:3px"></i>reclaim (' + steps(E.reclaim_steps) +
    (E.reclaim_steps > E.reclaim.length ? ', the first ' + E.reclaim.length + ' marked' : '') + ')</span>';
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

  function drawLayout(l, note) {
    var snap = l.snapshot, legendStreams = {};
    var st = snap.stats;
    document.getElementById('layout-title').innerHTML =
      '<b>' + esc(l.title) + '</b>' + (note ? '<div>' + esc(note) + '</div>' : '') + '<div class="muted">live ' + bytes(st.allocated_bytes) + ', pending free ' +
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
    drawLayoutLegend(legendStreams);
    drawBlockTable(snap);
  }

  function drawLayoutLegend(legendStreams) {
    var streams = Object.keys(legendStreams).map(Number).sort(function (a, b) { return a - b; });
    document.getElementById('layout-legend').innerHTML =
      streams.map(function (s) { return '<span><i style="background:' + streamColor(s) + '"></i>live, stream ' + s + '</span>'; }).join('') +
      '<span><i style="background:repeating-linear-gradient(45deg,#8a939e 0 2px,#d5dae0 2px 5px)"></i>pending free (still used by queued work)</span>' +
      '<span><i style="background:' + MAPPED + '"></i>mapped, between blocks</span>' +
      '<span><i style="background:' + CACHED + '"></i>cached granule</span>' +
      '<span><i style="background:' + UNMAPPED + '"></i>reserved, unmapped</span>';
  }

  // The blocks of one snapshot as a table, the first 5,000 of them.
  function drawBlockTable(snap) {
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
  var K = D.keyframes;
  function momentName(l) {
    return l.moment === 'line' ? 'at line ' + l.line : l.moment === 'peak' ? 'peak reserved' :
      l.moment === 'oom' ? 'first out of memory' : 'end of trace';
  }
  function press(i) {  // i: a layout's button, -1: a point picked on the chart
    Array.prototype.forEach.call(controls.querySelectorAll('button'), function (o) {
      o.className = Number(o.getAttribute('data-i')) === i ? 'on' : '';
    });
  }
  function showLayout(i) {
    press(i);
    picked = D.layouts[i].index;
    drawChart();
    drawLayout(D.layouts[i], '');
  }
  // The layout at sample i: the keyframe at or before it (the first is at 0).
  function showAt(i, fromClick) {
    if (K.length === 0) return;
    var lo = 0, hi = K.length - 1;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (K[mid].index <= i) lo = mid; else hi = mid - 1;
    }
    var k = K[lo];
    press(-1);
    picked = k.index;
    drawChart();
    var gap = K.length > 1 ? Math.round((K[K.length - 1].index - K[0].index) / (K.length - 1)) : 0;
    drawLayout(k, k.index === i ? 'picked on the chart: op ' + i :
      'picked on the chart: op ' + i + '; this is the keyframe at or before it (keyframes are about ' + gap +
      ' ops apart: ' + K.length + ' in the page)');
    if (fromClick && window.history && history.replaceState) history.replaceState(null, '', '#op=' + i);
  }

  if (D.layouts.length === 0) {
    controls.textContent = 'no layout was taken';
  } else {
    controls.innerHTML = D.layouts.map(function (l, i) {
      return '<button data-i="' + i + '">' + esc(momentName(l)) + '</button>';
    }).join('') + '<span class="muted"> or click the chart for the layout at any point</span>';
    Array.prototype.forEach.call(controls.querySelectorAll('button'), function (b) {
      b.addEventListener('click', function () { showLayout(Number(b.getAttribute('data-i'))); });
    });
  }
  var oomLayout = -1;
  D.layouts.forEach(function (l, i) { if (l.moment === 'oom') oomLayout = i; });
  if (R.first_oom) {
    document.getElementById('oom').innerHTML = '<div class="oom"><b>First out of memory: line ' + R.first_oom.line + ' (' +
      esc(R.first_oom.op) + ')</b>' + (oomLayout >= 0 ? ' <button id="oom-layout">show the layout there</button>' : '') +
      '<pre>' + esc(R.first_oom.message) + '</pre></div>';
    if (oomLayout >= 0) {
      document.getElementById('oom-layout').addEventListener('click', function () {
        showLayout(oomLayout);
        document.getElementById('layout-title').scrollIntoView();
      });
    }
  }
  // FILE.html#op=N shows the layout at op N, as a click there would.
  var asked = /^#op=(\d+)$/.exec(window.location.hash);
  if (asked && N > 0) showAt(Math.min(N - 1, Number(asked[1])), false);
  else if (oomLayout >= 0) showLayout(oomLayout);
  else if (D.layouts.length > 0) showLayout(0);
  var largest = D.largest_at_peak || [];
  document.getElementById('largest').innerHTML = largest.length === 0 ? 'no live block at the peak' :
    '<table><tr><th class="n">bytes</th><th class="n">stream</th><th>owner (an imported snapshot names the program\'s frame)</th></tr>' +
    largest.map(function (b) {
      return '<tr><td class="n">' + bytes(b.bytes) + '</td><td class="n">' + b.stream + '</td><td>' + esc(b.owner || '?') + '</td></tr>';
    }).join('') + '</table>';
  document.body.setAttribute('data-drawn', 'yes');
})();
)JS";

}  // namespace ferry::replay
