// cudamem viz: the page's code. Self-contained: no network access, no libraries; every trace
// string reaches the page through textContent only. The data model is documented in
// crates/report/src/viz.rs.
(function () {
  'use strict';

  var errorBox = document.getElementById('error');
  function fail(msg) {
    errorBox.hidden = false;
    errorBox.textContent = 'viewer error: ' + msg;
    document.body.setAttribute('data-render-error', String(msg));
  }
  window.addEventListener('error', function (ev) { fail(ev.message || String(ev)); });

  var D = JSON.parse(document.getElementById('cudamem-data').textContent);
  var ACT = ['alloc', 'free_requested', 'free_completed', 'segment_alloc', 'segment_free',
    'segment_map', 'segment_unmap', 'oom', 'snapshot', 'annotate'];
  var COL = {
    alloc: '#3b6ea5', alloc2: '#5b8cc4', pending: '#f28e2b', free: '#cfe6c4', unmapped: '#ededed',
    segStart: '#1d232a', reserved: '#c0392b', allocated: '#2c6fbb', requested: '#8e9aa6',
    active: '#6a51a3', others: '#b8bec6', cursor: '#111', ann: 'rgba(120,60,160,.35)', oom: '#c0392b'
  };
  var $ = function (id) { return document.getElementById(id); };

  // ---------------------------------------------------------------------------------------
  // formatting
  // ---------------------------------------------------------------------------------------
  function human(b) {
    var neg = b < 0; b = Math.abs(b);
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    var s = i === 0 ? String(Math.round(b)) : b.toFixed(i >= 3 ? 2 : (b >= 100 ? 0 : 1));
    return (neg ? '-' : '') + s + ' ' + u[i];
  }
  function fmtUs(us) {
    var a = Math.abs(us);
    if (a < 1000) return us.toFixed(0) + ' \u00b5s';
    if (a < 1e6) return (us / 1000).toFixed(a < 1e4 ? 2 : 1) + ' ms';
    return (us / 1e6).toFixed(a < 1e7 ? 3 : 1) + ' s';
  }
  function fmtInt(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ','); }
  function hexAddr(P, rel) { return '0x' + (P.dev.base + rel).toString(16); }
  function stackLines(id, max) {
    if (id < 0 || !D.stacks[id]) return ['  <no stack recorded>'];
    var st = D.stacks[id], out = [];
    for (var i = 0; i < st.length && i < max; i++) {
      var f = D.frames[st[i]];
      out.push('  ' + f[0] + '  ' + f[1] + ':' + f[2]);
    }
    if (st.length > max) out.push('  \u2026 ' + (st.length - max) + ' more frames');
    return out;
  }
  function niceStep(raw) {
    var p = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-9))));
    var m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 2.5 ? 2.5 : m <= 5 ? 5 : 10) * p;
  }
  function byteTicks(ymax) {
    var units = [[1 << 30, 'GiB'], [1 << 20, 'MiB'], [1 << 10, 'KiB'], [1, 'B']];
    var u = units[units.length - 1];
    for (var k = 0; k < units.length; k++) { if (ymax >= 2 * units[k][0]) { u = units[k]; break; } }
    var step = niceStep(ymax / u[0] / 5) * u[0], out = [];
    for (var v = 0; v <= ymax * 1.0001; v += step) {
      var n = v / u[0];
      out.push([v, (Math.abs(n - Math.round(n)) < 1e-9 ? String(Math.round(n)) : n.toFixed(1)) + ' ' + u[1]]);
    }
    return out;
  }

  // ---------------------------------------------------------------------------------------
  // canvas helpers
  // ---------------------------------------------------------------------------------------
  function sizeCanvas(c, h) {
    var w = Math.max(320, c.parentElement.clientWidth);
    var dpr = window.devicePixelRatio || 1;
    c.width = Math.round(w * dpr); c.height = Math.round(h * dpr);
    c.style.width = w + 'px'; c.style.height = h + 'px';
    var ctx = c.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    return { ctx: ctx, w: w, h: h };
  }
  var tip = $('tip');
  function showTip(ev, lines) {
    tip.textContent = lines.join('\n');
    tip.hidden = false;
    var x = ev.clientX + 14, y = ev.clientY + 14;
    var r = tip.getBoundingClientRect();
    if (x + r.width > window.innerWidth - 4) x = Math.max(4, ev.clientX - r.width - 14);
    if (y + r.height > window.innerHeight - 4) y = Math.max(4, ev.clientY - r.height - 14);
    tip.style.left = x + 'px'; tip.style.top = y + 'px';
  }
  function hideTip() { tip.hidden = true; }
  function legend(el, items) {
    el.textContent = '';
    items.forEach(function (it) {
      var s = document.createElement('span');
      var sw = document.createElement('span');
      sw.className = 'sw';
      sw.style.background = it[0];
      if (it[2]) { sw.style.height = '3px'; sw.style.verticalAlign = '3px'; sw.style.border = 'none'; }
      s.appendChild(sw);
      s.appendChild(document.createTextNode(it[1]));
      el.appendChild(s);
    });
  }
  var hatch = null;
  function hatchPattern(ctx) {
    if (hatch) return hatch;
    var c = document.createElement('canvas');
    c.width = 6; c.height = 6;
    var g = c.getContext('2d');
    g.fillStyle = COL.unmapped; g.fillRect(0, 0, 6, 6);
    g.strokeStyle = '#c4c8cc'; g.lineWidth = 1;
    g.beginPath(); g.moveTo(0, 6); g.lineTo(6, 0); g.stroke();
    hatch = ctx.createPattern(c, 'repeat');
    return hatch;
  }

  // ---------------------------------------------------------------------------------------
  // preparing one device
  // ---------------------------------------------------------------------------------------
  function prep(dev) {
    var n = dev.n, B = dev.bands, m = B.s.length, i, b;
    var P = { dev: dev, n: n, m: m };
    var S = P.S = Int32Array.from(B.s), FR = P.FR = Int32Array.from(B.fr), E = P.E = Int32Array.from(B.e);
    var SZ = P.SZ = Float64Array.from(B.size), BS = P.BS = Float64Array.from(B.bsize);
    P.AD = Float64Array.from(B.addr); P.ST = Int32Array.from(B.stack);
    var T = P.T = new Float64Array(Math.max(n, 1)), t = 0;
    for (i = 0; i < n; i++) { t += dev.dt[i]; T[i] = t; }
    var openAt = new Int32Array(n + 1).fill(-1), closeAt = new Int32Array(n + 1).fill(-1);
    var freeAt = new Int32Array(n + 1).fill(-1);
    for (b = 0; b < m; b++) {
      if (S[b] >= 0) openAt[S[b]] = b;
      if (E[b] < n) closeAt[E[b]] = b;
      if (FR[b] < n) freeAt[FR[b]] = b;
    }
    P.openAt = openAt; P.closeAt = closeAt; P.freeAt = freeAt;
    var kept = P.kept = new Uint8Array(m);
    if (dev.kept) dev.kept.forEach(function (k) { kept[k] = 1; }); else kept.fill(1);
    P.nKept = dev.kept ? dev.kept.length : m;

    // curves: value after event i
    var dA = new Float64Array(n + 1), dQ = new Float64Array(n + 1), dR = new Float64Array(n + 1);
    for (b = 0; b < m; b++) {
      var s0 = Math.max(S[b], 0);
      dA[s0] += BS[b]; dA[Math.min(FR[b], n)] -= BS[b];
      dQ[s0] += SZ[b]; dQ[Math.min(FR[b], n)] -= SZ[b];
    }
    var r0 = 0;
    dev.init_segs.forEach(function (x) { r0 += x[1]; });
    dev.init_maps.forEach(function (x) { r0 += x[1]; });
    var sg = dev.segs;
    for (i = 0; i < sg.i.length; i++) {
      var a = sg.act[i];
      dR[sg.i[i]] += (a === 3 || a === 5) ? sg.size[i] : -sg.size[i];
    }
    var A = P.A = new Float64Array(Math.max(n, 1)), Q = P.Q = new Float64Array(Math.max(n, 1)),
      R = P.R = new Float64Array(Math.max(n, 1));
    var ca = 0, cq = 0, cr = r0;
    P.maxR = r0; P.maxA = 0;
    for (i = 0; i < n; i++) {
      ca += dA[i]; cq += dQ[i]; cr += dR[i];
      A[i] = ca; Q[i] = cq; R[i] = cr;
      if (cr > P.maxR) P.maxR = cr;
      if (ca > P.maxA) P.maxA = ca;
    }
    layoutTimeline(P);
    prepSegments(P);
    return P;
  }

  // Bands stacked in allocation order; a band's points are (x, offset) where its offset changes.
  function layoutTimeline(P) {
    var n = P.n, m = P.m, S = P.S, E = P.E, BS = P.BS, kept = P.kept, b;
    var off = new Float64Array(m), pts = new Array(m), live = [];
    var top = 0, others = 0, ymax = 0;
    var envX = [], envTop = [], envOth = [];
    function rec(x) {
      var k = envX.length;
      if (k && envX[k - 1] === x) { envTop[k - 1] = top; envOth[k - 1] = others; }
      else { envX.push(x); envTop.push(top); envOth.push(others); }
      if (top + others > ymax) ymax = top + others;
    }
    function open(b, x) {
      if (kept[b]) { off[b] = top; pts[b] = [x, top]; live.push(b); top += BS[b]; }
      else others += BS[b];
      rec(x);
    }
    function close(b, x) {
      if (kept[b]) {
        var p = live.lastIndexOf(b);
        if (p >= 0) {
          live.splice(p, 1);
          for (var q = p; q < live.length; q++) {
            var c = live[q];
            off[c] -= BS[b];
            pts[c].push(x, off[c]);
          }
          top -= BS[b];
        }
      } else others -= BS[b];
      rec(x);
    }
    rec(0);
    for (b = 0; b < m; b++) if (S[b] < 0) open(b, 0);
    for (var i = 0; i < n; i++) {
      if (P.closeAt[i] >= 0) close(P.closeAt[i], i);
      if (P.openAt[i] >= 0) open(P.openAt[i], i);
    }
    P.pts = pts;
    P.env = { x: envX, top: envTop, oth: envOth };
    P.ymaxActive = ymax;
    var colors = new Array(m);
    for (b = 0; b < m; b++) if (kept[b]) colors[b] = 'hsl(' + ((b * 137.508) % 360).toFixed(1) + ',52%,' + (56 + (b % 3) * 6) + '%)';
    P.colors = colors;
    P.keptList = [];
    for (b = 0; b < m; b++) if (kept[b]) P.keptList.push(b);
  }

  // Segment map: which span each expandable range belongs to, and one byte scale for all events.
  function prepSegments(P) {
    var dev = P.dev, sg = dev.segs, i;
    var spanFirst = new Float64Array(dev.spans.length).fill(Infinity);
    dev.init_maps.forEach(function (x) { spanFirst[x[2]] = -1; });
    for (i = 0; i < sg.i.length; i++) if (sg.act[i] === 5 && sg.i[i] < spanFirst[sg.span[i]]) spanFirst[sg.span[i]] = sg.i[i];
    P.spanFirst = spanFirst;
    var total = 0, items = 0, maxTotal = 0, maxItems = 0, seen = new Uint8Array(dev.spans.length);
    dev.init_segs.forEach(function (x) { total += x[1]; items++; });
    for (i = 0; i < dev.spans.length; i++) if (spanFirst[i] < 0) { seen[i] = 1; total += dev.spans[i][1]; items++; }
    maxTotal = total; maxItems = items;
    for (i = 0; i < sg.i.length; i++) {
      var a = sg.act[i];
      if (a === 3) { total += sg.size[i]; items++; }
      else if (a === 4) { total -= sg.size[i]; items--; }
      else if (a === 5 && !seen[sg.span[i]]) { seen[sg.span[i]] = 1; total += dev.spans[sg.span[i]][1]; items++; }
      if (total > maxTotal) maxTotal = total;
      if (items > maxItems) maxItems = items;
    }
    P.rows = 30;
    var g = Math.min(0.006, P.rows * 0.25 / Math.max(maxItems, 1));
    P.rowBytes = Math.max(maxTotal, 1) / (P.rows - maxItems * g);
    P.gapBytes = g * P.rowBytes;
  }

  function addRange(list, a, b) {
    var out = [], placed = false;
    for (var k = 0; k < list.length; k++) {
      var r = list[k];
      if (r[1] < a) out.push(r);
      else if (r[0] > b) { if (!placed) { out.push([a, b]); placed = true; } out.push(r); }
      else { a = Math.min(a, r[0]); b = Math.max(b, r[1]); }
    }
    if (!placed) out.push([a, b]);
    return out;
  }
  function subRange(list, a, b) {
    var out = [];
    for (var k = 0; k < list.length; k++) {
      var r = list[k];
      if (r[1] <= a || r[0] >= b) { out.push(r); continue; }
      if (r[0] < a) out.push([r[0], a]);
      if (r[1] > b) out.push([b, r[1]]);
    }
    return out;
  }

  // The allocator's state just after event i, from the trace's own events.
  function stateAt(P, i) {
    var dev = P.dev, sg = dev.segs, k, b;
    var native = new Map();
    dev.init_segs.forEach(function (x) { native.set(x[0], x[1]); });
    var maps = dev.spans.map(function () { return []; });
    dev.init_maps.forEach(function (x) { maps[x[2]] = addRange(maps[x[2]], x[0], x[0] + x[1]); });
    for (k = 0; k < sg.i.length && sg.i[k] <= i; k++) {
      var a = sg.act[k], ad = sg.addr[k], sz = sg.size[k];
      if (a === 3) native.set(ad, sz);
      else if (a === 4) native.delete(ad);
      else if (a === 5) maps[sg.span[k]] = addRange(maps[sg.span[k]], ad, ad + sz);
      else if (a === 6) maps[sg.span[k]] = subRange(maps[sg.span[k]], ad, ad + sz);
    }
    var items = [];
    native.forEach(function (size, addr) { items.push({ addr: addr, size: size, exp: false, mapped: null, blocks: [] }); });
    for (k = 0; k < dev.spans.length; k++) {
      if (P.spanFirst[k] <= i) items.push({ addr: dev.spans[k][0], size: dev.spans[k][1], exp: true, mapped: maps[k], blocks: [] });
    }
    items.sort(function (x, y) { return x.addr - y.addr; });
    var blocks = [];
    for (b = 0; b < P.m; b++) if (P.S[b] <= i && i < P.E[b]) blocks.push(b);
    blocks.sort(function (x, y) { return P.AD[x] - P.AD[y]; });
    var st = { i: i, items: items, reserved: 0, allocated: 0, pending: 0, nBlocks: blocks.length, largestFree: 0, free: 0, outside: 0 };
    var j = 0;
    for (k = 0; k < blocks.length; k++) {
      b = blocks[k];
      var addr = P.AD[b];
      while (j < items.length && items[j].addr + items[j].size <= addr) j++;
      if (j < items.length && items[j].addr <= addr) items[j].blocks.push(b); else st.outside++;
      if (P.FR[b] <= i) st.pending += P.BS[b]; else st.allocated += P.BS[b];
    }
    var lin = 0;
    items.forEach(function (it) {
      it.lin = lin;
      lin += it.size + P.gapBytes;
      var ranges = it.exp ? it.mapped : [[it.addr, it.addr + it.size]];
      ranges.forEach(function (r) { st.reserved += r[1] - r[0]; });
      // free runs: the mapped ranges minus the blocks
      var free = [];
      ranges.forEach(function (r) {
        var cur = r[0];
        it.blocks.forEach(function (bb) {
          var a0 = P.AD[bb], a1 = a0 + P.BS[bb];
          if (a1 <= cur || a0 >= r[1]) return;
          if (a0 > cur) free.push([cur, a0]);
          cur = Math.max(cur, a1);
        });
        if (cur < r[1]) free.push([cur, r[1]]);
      });
      it.free = free;
      free.forEach(function (f) { var l = f[1] - f[0]; st.free += l; if (l > st.largestFree) st.largestFree = l; });
    });
    st.layoutBytes = lin;
    return st;
  }

  // ---------------------------------------------------------------------------------------
  // views
  // ---------------------------------------------------------------------------------------
  var P = null, view = [0, 1], cur = 0, st = null;
  var ML = 78, MR = 12, MT = 8, MB = 22;

  function xAxis(ctx, X, y0, w) {
    var span = view[1] - view[0];
    var step = Math.max(1, niceStep(span / Math.max(2, Math.floor(w / 110))));
    ctx.fillStyle = '#5f6b76'; ctx.font = '11px system-ui, sans-serif'; ctx.textAlign = 'center';
    ctx.strokeStyle = '#e3e7eb'; ctx.lineWidth = 1;
    for (var v = Math.ceil(view[0] / step) * step; v <= view[1]; v += step) {
      var x = Math.round(X(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, y0); ctx.lineTo(x, y0 + 4); ctx.stroke();
      ctx.fillText(fmtInt(Math.round(v)), x, y0 + 15);
    }
  }
  function yAxis(ctx, Y, ymax, x0, x1) {
    ctx.font = '11px system-ui, sans-serif'; ctx.textAlign = 'right'; ctx.lineWidth = 1;
    byteTicks(ymax).forEach(function (t) {
      var y = Math.round(Y(t[0])) + 0.5;
      ctx.strokeStyle = '#eef1f4'; ctx.beginPath(); ctx.moveTo(x0, y); ctx.lineTo(x1, y); ctx.stroke();
      ctx.fillStyle = '#5f6b76'; ctx.fillText(t[1], x0 - 6, y + 4);
    });
  }
  function geom(g) {
    var pw = g.w - ML - MR, ph = g.h - MT - MB;
    return {
      pw: pw, ph: ph,
      X: function (x) { return ML + (x - view[0]) / (view[1] - view[0]) * pw; },
      inv: function (px) { return view[0] + (px - ML) / pw * (view[1] - view[0]); }
    };
  }

  // (a) timeline
  var tl = $('tl'), tlOver = $('tl-over'), tlG = null, hoverBand = -1;
  function drawTimeline() {
    var g = sizeCanvas(tl, 380), ctx = g.ctx, G = geom(g);
    sizeCanvas(tlOver, 380);
    var showRes = $('tl-res').checked;
    var ymax = Math.max(P.ymaxActive, showRes ? P.maxR : 0, 1) * 1.04;
    var Y = function (y) { return MT + G.ph - y / ymax * G.ph; };
    tlG = { G: G, Y: Y, ymax: ymax, h: g.h, w: g.w };
    yAxis(ctx, Y, ymax, ML, g.w - MR);
    ctx.save();
    ctx.beginPath(); ctx.rect(ML, MT, G.pw, G.ph); ctx.clip();
    var X = function (x) { var v = G.X(x); return v < -1e6 ? -1e6 : v > 1e6 ? 1e6 : v; };
    var kl = P.keptList;
    for (var q = 0; q < kl.length; q++) {
      var b = kl[q], x0 = Math.max(P.S[b], 0), xe = P.E[b];
      if (xe < view[0] || x0 > view[1] || xe <= x0) continue;
      var p = P.pts[b], h = P.BS[b], np = p.length / 2, k;
      ctx.beginPath();
      for (k = 0; k < np; k++) {
        var nx = k + 1 < np ? p[2 * k + 2] : xe, yy = Y(p[2 * k + 1] + h);
        if (k === 0) ctx.moveTo(X(p[0]), yy); else ctx.lineTo(X(p[2 * k]), yy);
        ctx.lineTo(X(nx), yy);
      }
      for (k = np - 1; k >= 0; k--) {
        var nx2 = k + 1 < np ? p[2 * k + 2] : xe, yb = Y(p[2 * k + 1]);
        ctx.lineTo(X(nx2), yb); ctx.lineTo(X(p[2 * k]), yb);
      }
      ctx.closePath();
      ctx.fillStyle = P.colors[b];
      ctx.fill();
    }
    // the summed smaller allocations, on top
    var env = P.env;
    if (P.nKept < P.m && env.x.length) {
      ctx.beginPath();
      ctx.moveTo(X(env.x[0]), Y(env.top[0] + env.oth[0]));
      for (k = 0; k < env.x.length; k++) {
        var ex = k + 1 < env.x.length ? env.x[k + 1] : P.n;
        ctx.lineTo(X(env.x[k]), Y(env.top[k] + env.oth[k])); ctx.lineTo(X(ex), Y(env.top[k] + env.oth[k]));
      }
      for (k = env.x.length - 1; k >= 0; k--) {
        var ex2 = k + 1 < env.x.length ? env.x[k + 1] : P.n;
        ctx.lineTo(X(ex2), Y(env.top[k])); ctx.lineTo(X(env.x[k]), Y(env.top[k]));
      }
      ctx.closePath(); ctx.fillStyle = COL.others; ctx.fill();
    }
    // reserved (dashed, on request), annotations, OOMs
    if (showRes) {
      ctx.setLineDash([5, 3]); ctx.lineWidth = 1.5; ctx.strokeStyle = COL.reserved;
      series(ctx, P.R, G, Y); ctx.stroke(); ctx.setLineDash([]);
    }
    drawMarks(ctx, G, MT, MT + G.ph);
    ctx.restore();
    ctx.strokeStyle = '#9aa5b1'; ctx.lineWidth = 1; ctx.strokeRect(ML + 0.5, MT + 0.5, G.pw, G.ph);
    xAxis(ctx, G.X, MT + G.ph, G.pw);
    var items = [];
    if (showRes) items.push([COL.reserved, 'reserved (segment events)', true]);
    if (P.nKept < P.m) items.push([COL.others, fmtInt(P.m - P.nKept) + ' smaller allocations, summed (' + fmtInt(P.nKept) + ' largest drawn)']);
    items.push(['hsl(210,52%,60%)', fmtInt(P.m) + ' allocations, one color each']);
    if (P.dev.ann.length) items.push([COL.ann, 'annotations (START)', true]);
    if (P.dev.ooms.length) items.push([COL.oom, 'out-of-memory events', true]);
    legend($('tl-legend'), items);
    drawTimelineOverlay();
  }
  function drawMarks(ctx, G, y0, y1) {
    ctx.lineWidth = 1;
    P.dev.ann.forEach(function (a) {
      if (a[1] !== 'START' || a[0] < view[0] || a[0] > view[1]) return;
      var x = Math.round(G.X(a[0])) + 0.5;
      ctx.strokeStyle = COL.ann; ctx.beginPath(); ctx.moveTo(x, y0); ctx.lineTo(x, y1); ctx.stroke();
    });
    P.dev.ooms.forEach(function (i) {
      var x = Math.round(G.X(i)) + 0.5;
      ctx.strokeStyle = COL.oom; ctx.lineWidth = 2; ctx.beginPath(); ctx.moveTo(x, y1 - 10); ctx.lineTo(x, y1); ctx.stroke();
    });
  }
  // A step line through arr over the view, as a per-pixel min/max envelope when dense.
  function series(ctx, arr, G, Y) {
    var n = P.n;
    if (!n) return;
    var i0 = Math.max(0, Math.floor(view[0])), i1 = Math.min(n - 1, Math.ceil(view[1]));
    ctx.beginPath();
    if ((i1 - i0 + 1) / G.pw <= 2) {
      ctx.moveTo(G.X(i0), Y(arr[i0]));
      for (var i = i0 + 1; i <= i1; i++) { ctx.lineTo(G.X(i), Y(arr[i - 1])); ctx.lineTo(G.X(i), Y(arr[i])); }
      ctx.lineTo(G.X(i1 + 1), Y(arr[i1]));
      return;
    }
    var per = (view[1] - view[0]) / G.pw;
    for (var px = 0; px < G.pw; px++) {
      var a = Math.max(0, Math.floor(view[0] + px * per)), b = Math.min(n - 1, Math.floor(view[0] + (px + 1) * per));
      if (a > n - 1) break;
      if (b < a) b = a;
      var lo = arr[a], hi = arr[a];
      for (var j = a + 1; j <= b; j++) { var v = arr[j]; if (v < lo) lo = v; if (v > hi) hi = v; }
      var x = ML + px + 0.5;
      if (px === 0) ctx.moveTo(x, Y(arr[a])); else ctx.lineTo(x, Y(arr[a]));
      if (hi !== lo) { ctx.lineTo(x, Y(hi)); ctx.lineTo(x, Y(lo)); }
      ctx.lineTo(x, Y(arr[b]));
    }
  }
  function drawTimelineOverlay(sel) {
    var g = tlG, ctx = tlOver.getContext('2d');
    var dpr = window.devicePixelRatio || 1;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, g.w, g.h);
    cursorLine(ctx, g.G, MT, MT + g.G.ph);
    if (hoverBand >= 0) {
      var b = hoverBand, p = P.pts[b], h = P.BS[b], np = p.length / 2, xe = P.E[b];
      ctx.save(); ctx.beginPath(); ctx.rect(ML, MT, g.G.pw, g.G.ph); ctx.clip();
      ctx.strokeStyle = '#111'; ctx.lineWidth = 2;
      ctx.beginPath();
      for (var k = 0; k < np; k++) {
        var nx = k + 1 < np ? p[2 * k + 2] : xe;
        ctx.rect(g.G.X(p[2 * k]), g.Y(p[2 * k + 1] + h), Math.max(1, g.G.X(nx) - g.G.X(p[2 * k])), Math.max(1, g.Y(p[2 * k + 1]) - g.Y(p[2 * k + 1] + h)));
      }
      ctx.stroke(); ctx.restore();
    }
    if (sel) selection(ctx, sel, MT, g.G.ph);
  }
  function cursorLine(ctx, G, y0, y1) {
    if (cur < view[0] || cur > view[1]) return;
    var x = Math.round(G.X(cur + 0.5)) + 0.5;
    ctx.strokeStyle = COL.cursor; ctx.lineWidth = 1; ctx.setLineDash([2, 2]);
    ctx.beginPath(); ctx.moveTo(x, y0); ctx.lineTo(x, y1); ctx.stroke(); ctx.setLineDash([]);
  }
  function selection(ctx, sel, y0, h) {
    ctx.fillStyle = 'rgba(40,90,160,.15)'; ctx.strokeStyle = 'rgba(40,90,160,.6)';
    var a = Math.min(sel[0], sel[1]), b = Math.max(sel[0], sel[1]);
    ctx.fillRect(a, y0, b - a, h); ctx.strokeRect(a + 0.5, y0 + 0.5, b - a, h);
  }
  function ptsOffsetAt(p, x) {
    var o = p[1];
    for (var k = 0; k < p.length; k += 2) { if (p[k] <= x) o = p[k + 1]; else break; }
    return o;
  }
  function hitBand(x, y) {
    var kl = P.keptList;
    for (var q = 0; q < kl.length; q++) {
      var b = kl[q];
      if (Math.max(P.S[b], 0) <= x && x < P.E[b]) {
        var o = ptsOffsetAt(P.pts[b], x);
        if (y >= o && y < o + P.BS[b]) return b;
      }
    }
    if (P.nKept < P.m) {
      var env = P.env, k = 0;
      while (k + 1 < env.x.length && env.x[k + 1] <= x) k++;
      if (y >= env.top[k] && y < env.top[k] + env.oth[k]) return -2;
    }
    return -1;
  }
  function bandLines(b) {
    var n = P.n, L = [];
    var sz = P.BS[b] !== P.SZ[b] ? human(P.BS[b]) + ' block (requested ' + human(P.SZ[b]) + ', ' + fmtInt(P.SZ[b]) + ' bytes)' : human(P.BS[b]) + ' (' + fmtInt(P.SZ[b]) + ' bytes)';
    L.push('allocation of ' + sz);
    L.push('address ' + hexAddr(P, P.AD[b]));
    var s = P.S[b], fr = P.FR[b], e = P.E[b];
    var born = s < 0 ? 'before the trace' : 'event ' + fmtInt(s) + ' (t=' + fmtUs(P.T[s]) + ')';
    L.push('allocated at ' + born);
    if (fr < n) {
      var t0 = s < 0 ? 0 : P.T[s];
      L.push('freed at event ' + fmtInt(fr) + (e < n && e !== fr + 1 ? ', completed at ' + fmtInt(e) : '') +
        ' \u2014 lived ' + fmtInt(fr - Math.max(s, 0)) + ' events, ' + fmtUs(P.T[fr] - t0));
    } else L.push('still allocated at the end of the trace');
    L.push('stack (innermost first):');
    return L.concat(stackLines(P.ST[b], 14));
  }

  // (c) curve
  var cv = $('cv'), cvOver = $('cv-over'), cvG = null;
  function drawCurve() {
    var g = sizeCanvas(cv, 200), ctx = g.ctx, G = geom(g);
    sizeCanvas(cvOver, 200);
    var ymax = Math.max(P.maxR, P.maxA, 1) * 1.06;
    var Y = function (y) { return MT + G.ph - y / ymax * G.ph; };
    cvG = { G: G, Y: Y, h: g.h, w: g.w };
    yAxis(ctx, Y, ymax, ML, g.w - MR);
    ctx.save(); ctx.beginPath(); ctx.rect(ML, MT, G.pw, G.ph); ctx.clip();
    ctx.lineWidth = 1.2;
    ctx.strokeStyle = COL.requested; series(ctx, P.Q, G, Y); ctx.stroke();
    ctx.strokeStyle = COL.allocated; series(ctx, P.A, G, Y); ctx.stroke();
    ctx.lineWidth = 1.8; ctx.strokeStyle = COL.reserved; series(ctx, P.R, G, Y); ctx.stroke();
    drawMarks(ctx, G, MT, MT + G.ph);
    ctx.restore();
    ctx.strokeStyle = '#9aa5b1'; ctx.lineWidth = 1; ctx.strokeRect(ML + 0.5, MT + 0.5, G.pw, G.ph);
    xAxis(ctx, G.X, MT + G.ph, G.pw);
    legend($('cv-legend'), [[COL.reserved, 'reserved', true], [COL.allocated, 'allocated (block sizes)', true], [COL.requested, 'requested', true]]);
    drawCurveOverlay();
  }
  function drawCurveOverlay(sel) {
    var g = cvG, ctx = cvOver.getContext('2d');
    var dpr = window.devicePixelRatio || 1;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, g.w, g.h);
    cursorLine(ctx, g.G, MT, MT + g.G.ph);
    if (sel) selection(ctx, sel, MT, g.G.ph);
  }
  function eventLine(i) {
    if (i < 0 || i >= P.n) return '';
    var a = ACT[P.dev.act[i]] || '?', s = 'event ' + fmtInt(i) + ': ' + a;
    var b = a === 'alloc' ? P.openAt[i] : a === 'free_requested' ? P.freeAt[i] : a === 'free_completed' ? P.closeAt[i] : -1;
    if (b >= 0) s += ' ' + human(P.SZ[b]) + ' at ' + hexAddr(P, P.AD[b]);
    if (a.indexOf('segment_') === 0) {
      var sg = P.dev.segs, lo = 0, hi = sg.i.length;
      while (lo < hi) { var mid = (lo + hi) >> 1; if (sg.i[mid] < i) lo = mid + 1; else hi = mid; }
      if (lo < sg.i.length && sg.i[lo] === i) s += ' ' + human(sg.size[lo]) + ' at ' + hexAddr(P, sg.addr[lo]);
    }
    return s + ', t=' + fmtUs(P.T[i]);
  }

  // (b) segment map
  var sm = $('sm'), smOver = $('sm-over'), smG = null, slider = $('sm-slider');
  var RH = 12, RG = 3;
  function drawSegmap() {
    st = stateAt(P, cur);
    var H = P.rows * (RH + RG) + 8;
    var g = sizeCanvas(sm, H), ctx = g.ctx;
    sizeCanvas(smOver, H);
    var pw = g.w - 16, L = 8, T = 4;
    smG = { pw: pw, L: L, T: T, w: g.w, h: g.h };
    var rb = P.rowBytes;
    // Draws bytes [l0, l0 + len) of the layout, wrapped over rows (a bounded loop over rows:
    // stepping by the remaining bytes of a row can stall on floating-point rounding).
    function range(l0, len, color) {
      if (!(len > 0)) return;
      var l1 = l0 + len, r0 = Math.max(0, Math.floor(l0 / rb)), r1 = Math.min(Math.floor(l1 / rb), P.rows + 1);
      ctx.fillStyle = color;
      for (var row = r0; row <= r1; row++) {
        var a = Math.max(l0, row * rb), b = Math.min(l1, (row + 1) * rb);
        if (b <= a) continue;
        ctx.fillRect(L + (a - row * rb) / rb * pw, T + row * (RH + RG), Math.max((b - a) / rb * pw, 0.8), RH);
      }
    }
    // empty rows, faintly
    ctx.fillStyle = '#f7f8f9';
    for (var r = 0; r < P.rows; r++) ctx.fillRect(L, T + r * (RH + RG), pw, RH);
    var pat = hatchPattern(ctx);
    st.items.forEach(function (it) {
      if (it.exp) {
        range(it.lin, it.size, pat);
        it.mapped.forEach(function (m) { range(it.lin + m[0] - it.addr, m[1] - m[0], COL.free); });
      } else range(it.lin, it.size, COL.free);
      it.blocks.forEach(function (b, k) {
        var pending = P.FR[b] <= cur;
        range(it.lin + P.AD[b] - it.addr, P.BS[b], pending ? COL.pending : (k % 2 ? COL.alloc2 : COL.alloc));
      });
      // segment start mark
      var row = Math.floor(it.lin / rb), off = it.lin - row * rb;
      ctx.fillStyle = COL.segStart;
      ctx.fillRect(L + off / rb * pw - 1, T + row * (RH + RG) - 1, 2, RH + 2);
    });
    $('sm-idx').textContent = fmtInt(cur) + ' of ' + fmtInt(P.n);
    var info = eventLine(cur) + '  \u00b7  reserved ' + human(st.reserved) + ' in ' + st.items.length + ' segment' + (st.items.length === 1 ? '' : 's') +
      '  \u00b7  allocated ' + human(st.allocated) + ' in ' + fmtInt(st.nBlocks) + ' blocks' +
      (st.pending ? '  \u00b7  pending free ' + human(st.pending) : '') +
      '  \u00b7  free in segments ' + human(st.free) + ' (largest ' + human(st.largestFree) + ')' +
      (st.outside ? '  \u00b7  ' + fmtInt(st.outside) + ' live blocks outside any recorded segment' +
        (P.dev.segs.i.length || P.dev.init_segs.length ? '' : ' (the trace records no segments)') : '');
    $('sm-info').textContent = info;
    legend($('sm-legend'), [[COL.alloc, 'allocated'], [COL.pending, 'pending free (freed, waiting for stream events)'],
      [COL.free, 'free (cached)'], ['#d9dcdf', 'unmapped pages of an expandable segment'],
      [COL.segStart, 'segment start'], ['transparent', 'one row = ' + human(P.rowBytes)]]);
  }
  function smHit(px, py) {
    if (!st || !smG) return null;
    var row = Math.floor((py - smG.T) / (RH + RG));
    if (row < 0 || py - smG.T - row * (RH + RG) > RH) return null;
    var l = row * P.rowBytes + (px - smG.L) / smG.pw * P.rowBytes;
    var items = st.items, lo = 0, hi = items.length - 1, it = null;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (items[mid].lin <= l) { it = items[mid]; lo = mid + 1; } else hi = mid - 1;
    }
    if (!it || l >= it.lin + it.size) return null;
    var addr = it.addr + (l - it.lin);
    var hit = { it: it, addr: addr, block: -1 };
    it.blocks.forEach(function (b) { if (P.AD[b] <= addr && addr < P.AD[b] + P.BS[b]) hit.block = b; });
    return hit;
  }
  function segLines(h) {
    var it = h.it, L = [];
    var used = 0; it.blocks.forEach(function (b) { used += P.BS[b]; });
    L.push((it.exp ? 'expandable segment span ' : 'segment ') + hexAddr(P, it.addr) + ', ' + human(it.size) +
      (it.exp ? ' (' + human(it.mapped.reduce(function (s, r) { return s + r[1] - r[0]; }, 0)) + ' mapped)' : '') +
      ', ' + it.blocks.length + ' live blocks, ' + human(used));
    if (h.block >= 0) {
      var b = h.block;
      L.push(P.FR[b] <= cur ? 'PENDING FREE (freed at event ' + fmtInt(P.FR[b]) + ', waiting for stream events)' : 'ALLOCATED');
      return L.concat(bandLines(b));
    }
    if (it.exp && !it.mapped.some(function (r) { return r[0] <= h.addr && h.addr < r[1]; })) {
      L.push('unmapped pages');
      return L;
    }
    var f = it.free.filter(function (r) { return r[0] <= h.addr && h.addr < r[1]; })[0];
    if (f) L.push('FREE ' + human(f[1] - f[0]) + ' [' + hexAddr(P, f[0]) + ', ' + hexAddr(P, f[1]) + ')');
    return L;
  }

  // (d) tables and header
  function drawStatic() {
    var dev = P.dev;
    $('title').textContent = D.title;
    var meta = $('meta');
    meta.textContent = '';
    function kv(k, v) {
      var s = document.createElement('span');
      s.appendChild(document.createTextNode(k + ' '));
      var b = document.createElement('b'); b.textContent = v; s.appendChild(b);
      s.appendChild(document.createTextNode('   '));
      meta.appendChild(s);
    }
    kv('trace', D.source);
    kv('view', D.policy);
    kv('settings', D.settings.conf ? D.settings.conf : '(defaults)');
    kv('expandable_segments', String(D.settings.expandable_segments));
    kv('device', String(dev.device));
    kv('events', fmtInt(dev.n));
    kv('allocations', fmtInt(dev.allocations));
    $('note').textContent = D.note;
    var chips = $('peaks');
    chips.textContent = '';
    function chip(k, v) {
      var c = document.createElement('span'); c.className = 'chip';
      c.appendChild(document.createTextNode(k + ' '));
      var b = document.createElement('b'); b.textContent = v; c.appendChild(b);
      chips.appendChild(c);
    }
    chip('peak reserved', human(dev.peak_reserved) + ' at event ' + fmtInt(dev.peak_reserved_at));
    chip('peak allocated', human(dev.peak_allocated));
    chip('peak active', human(dev.peak_active));
    chip('peak requested', human(dev.peak_requested));
    if (dev.peak_requested > 0) chip('reserved / requested', (dev.peak_reserved / dev.peak_requested).toFixed(3));
    if (dev.replay_peak_reserved !== undefined && dev.replay_peak_reserved !== dev.peak_reserved) chip('replay peak reserved', human(dev.replay_peak_reserved));
    if (dev.ooms.length) chip('OOM events', String(dev.ooms.length));
    if (dev.replay_ooms) chip('replay OOMs', String(dev.replay_ooms));
    var none = 'not available: ' + D.note;
    $('sum-end').textContent = dev.summary_end || none;
    $('sum-peak').textContent = dev.summary_peak || none;
    $('footer').textContent = 'generated by ' + D.generator + ' \u2014 a self-contained page: no network requests.';
  }

  // ---------------------------------------------------------------------------------------
  // interaction
  // ---------------------------------------------------------------------------------------
  function setCur(i) {
    cur = Math.max(0, Math.min(P.n - 1, Math.round(i)));
    slider.value = String(cur);
    drawSegmap();
    drawTimelineOverlay();
    drawCurveOverlay();
  }
  var pendingDraw = false;
  slider.addEventListener('input', function () {
    if (pendingDraw) return;
    pendingDraw = true;
    requestAnimationFrame(function () { pendingDraw = false; setCur(+slider.value); });
  });
  $('sm-prev').addEventListener('click', function () { setCur(cur - 1); });
  $('sm-next').addEventListener('click', function () { setCur(cur + 1); });
  $('sm-peak').addEventListener('click', function () { setCur(P.dev.peak_reserved_at); });
  $('sm-end').addEventListener('click', function () { setCur(P.n - 1); });

  function bindChart(over, getG, onHover, redrawOverlay) {
    var drag = null;
    function local(ev) { var r = over.getBoundingClientRect(); return [ev.clientX - r.left, ev.clientY - r.top]; }
    over.addEventListener('mousedown', function (ev) { var p = local(ev); drag = [p[0], p[0]]; ev.preventDefault(); });
    over.addEventListener('mousemove', function (ev) {
      var p = local(ev);
      if (drag) { drag[1] = p[0]; hideTip(); redrawOverlay(drag); return; }
      onHover(ev, p);
    });
    over.addEventListener('mouseleave', function () { hideTip(); if (!drag) { hoverBand = -1; redrawOverlay(); } });
    window.addEventListener('mouseup', function (ev) {
      if (!drag) return;
      var d = drag; drag = null;
      var G = getG().G;
      if (Math.abs(d[1] - d[0]) > 5) {
        var a = G.inv(Math.min(d[0], d[1])), b = G.inv(Math.max(d[0], d[1]));
        a = Math.max(0, a); b = Math.min(P.n, b);
        if (b - a >= 2) { view = [a, b]; drawTimeline(); drawCurve(); return; }
      } else if (ev.target === over) {
        setCur(Math.floor(G.inv(d[0])));
        return;
      }
      redrawOverlay();
    });
    over.addEventListener('dblclick', function () { view = [0, Math.max(P.n, 1)]; drawTimeline(); drawCurve(); });
  }
  bindChart(tlOver, function () { return tlG; }, function (ev, p) {
    var g = tlG, x = g.G.inv(p[0]), y = (MT + g.G.ph - p[1]) / g.G.ph * g.ymax;
    var b = (p[0] >= ML && p[0] <= ML + g.G.pw) ? hitBand(x, y) : -1;
    if (b !== hoverBand) { hoverBand = b; drawTimelineOverlay(); }
    if (b >= 0) showTip(ev, bandLines(b));
    else if (b === -2) {
      var i = Math.max(0, Math.min(P.n - 1, Math.floor(x))), env = P.env, k = 0;
      while (k + 1 < env.x.length && env.x[k + 1] <= x) k++;
      showTip(ev, ['smaller allocations, summed: ' + human(env.oth[k]), eventLine(i)]);
    } else if (x >= 0 && x < P.n) {
      var j = Math.floor(x);
      showTip(ev, [eventLine(j), 'reserved ' + human(P.R[j]) + ', allocated ' + human(P.A[j])]);
    } else hideTip();
  }, drawTimelineOverlay);
  bindChart(cvOver, function () { return cvG; }, function (ev, p) {
    var x = cvG.G.inv(p[0]);
    if (x < 0 || x >= P.n) { hideTip(); return; }
    var i = Math.floor(x);
    showTip(ev, [eventLine(i), 'reserved   ' + human(P.R[i]), 'allocated  ' + human(P.A[i]), 'requested  ' + human(P.Q[i]),
      'reserved - allocated  ' + human(P.R[i] - P.A[i])]);
  }, drawCurveOverlay);
  smOver.addEventListener('mousemove', function (ev) {
    var r = smOver.getBoundingClientRect(), h = smHit(ev.clientX - r.left, ev.clientY - r.top);
    if (h) showTip(ev, segLines(h)); else hideTip();
  });
  smOver.addEventListener('mouseleave', hideTip);
  document.addEventListener('keydown', function (ev) {
    if (ev.target && ev.target.tagName === 'INPUT') return;
    if (ev.key === 'ArrowLeft') setCur(cur - 1);
    else if (ev.key === 'ArrowRight') setCur(cur + 1);
  });

  function renderAll() {
    drawStatic();
    drawTimeline();
    drawCurve();
    drawSegmap();
  }
  function selectDevice(k) {
    P = prep(D.devices[k]);
    view = [0, Math.max(P.n, 1)];
    slider.max = String(Math.max(P.n - 1, 0));
    var m = /event=(\d+)/.exec(window.location.hash);
    cur = Math.min(m ? +m[1] : P.dev.peak_reserved_at, Math.max(P.n - 1, 0));
    slider.value = String(cur);
    renderAll();
  }
  if (D.devices.length > 1) {
    var sel = document.createElement('select');
    D.devices.forEach(function (d, k) {
      var o = document.createElement('option'); o.value = String(k); o.textContent = 'device ' + d.device; sel.appendChild(o);
    });
    sel.addEventListener('change', function () { selectDevice(+sel.value); });
    $('devsel').appendChild(document.createTextNode('device: '));
    $('devsel').appendChild(sel);
  }
  $('tl-res').addEventListener('change', function () { drawTimeline(); });
  var resizeTimer = null;
  window.addEventListener('resize', function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { if (P) { drawTimeline(); drawCurve(); drawSegmap(); } }, 150);
  });

  if (!D.devices.length) {
    $('title').textContent = D.title;
    $('meta').textContent = D.source + ': the trace has no events.';
  } else {
    selectDevice(0);
  }
  // Self-test (page opened with #selftest; run by scripts/viz/browser-test.sh): drives the
  // interactions over the whole trace and cross-checks the segment map against the curves.
  function selfTest() {
    var n = P.n, checks = 0, k, gx, gy;
    for (k = 0; k <= 40; k++) {
      var i = Math.floor(k * Math.max(n - 1, 0) / 40);
      setCur(i);
      if (Math.abs(st.reserved - P.R[i]) > 0.5) throw new Error('event ' + i + ': segment map reserved ' + st.reserved + ' != curve ' + P.R[i]);
      if (Math.abs(st.allocated - P.A[i]) > 0.5) throw new Error('event ' + i + ': segment map allocated ' + st.allocated + ' != curve ' + P.A[i]);
      for (gy = 0; gy < P.rows; gy += 2) {
        for (gx = 0; gx < 24; gx++) {
          var h = smHit(smG.L + (gx + 0.5) * smG.pw / 24, smG.T + gy * (RH + RG) + RH / 2);
          if (h) { segLines(h); checks++; }
        }
      }
      eventLine(i);
    }
    for (gx = 0; gx < 80; gx++) {
      for (gy = 0; gy < 24; gy++) {
        var x = view[0] + (gx + 0.5) * (view[1] - view[0]) / 80, y = (gy + 0.5) * tlG.ymax / 24;
        var b = hitBand(x, y);
        if (b >= 0) { bandLines(b); hoverBand = b; drawTimelineOverlay(); checks++; }
      }
    }
    hoverBand = -1;
    view = [n * 0.25, Math.max(n * 0.5, n * 0.25 + 2)];
    drawTimeline(); drawCurve();
    view = [0, Math.max(n, 1)];
    drawTimeline(); drawCurve();
    setCur(P.dev.peak_reserved_at);
    document.body.setAttribute('data-selftest-ok', String(checks));
  }
  if (D.devices.length && window.location.hash === '#selftest') selfTest();

  var status = $('render-status');
  status.textContent = 'render-ok';
  document.body.setAttribute('data-render-ok', '1');
})();
