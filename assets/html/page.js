// pgbelow's report page: draws the timeline panels (uPlot) from the JSON in
// #pgbelow-data on one shared x axis — the cursor and a drag-zoom apply to
// every panel, a double-click zooms all out — shades the checkpoints and an
// incident's escalated windows, draws its onset, and marks the window of the
// finding selected.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("pgbelow-data").textContent);
  var palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var charts = [];
  var highlight = null;
  var syncing = false;
  var HEIGHT = 200;

  function shade(u) {
    var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
    function band(a, b, color) {
      var x0 = u.valToPos(a, "x", true), x1 = u.valToPos(b, "x", true);
      var l = Math.max(u.bbox.left, Math.min(x0, x1));
      var r = Math.min(u.bbox.left + u.bbox.width, Math.max(x0, x1));
      if (r >= l) {
        ctx.fillStyle = color;
        ctx.fillRect(l, top, Math.max(r - l, 2), h);
      }
    }
    ctx.save();
    (data.checkpoints || []).forEach(function (c) {
      band(c.start, c.end, "rgba(245,160,40,0.20)");
    });
    (data.escalated || []).forEach(function (c) {
      band(c.start, c.end, "rgba(40,110,220,0.12)");
    });
    if (highlight) band(highlight[0], highlight[1], "rgba(200,30,30,0.25)");
    // watch's incident: its onset, a line across every panel.
    if (data.onset != null) {
      var x = u.valToPos(data.onset, "x", true);
      if (x >= u.bbox.left && x <= u.bbox.left + u.bbox.width) {
        ctx.fillStyle = "rgba(200,0,0,0.9)";
        ctx.fillRect(x - 1, top, 2, h);
      }
    }
    ctx.restore();
  }

  function zoomAll(min, max) {
    syncing = true;
    charts.forEach(function (c) { c.setScale("x", { min: min, max: max }); });
    syncing = false;
  }

  function onScale(u, key) {
    if (key !== "x" || syncing) return;
    var min = u.scales.x.min, max = u.scales.x.max;
    syncing = true;
    charts.forEach(function (c) {
      if (c !== u) c.setScale("x", { min: min, max: max });
    });
    syncing = false;
  }

  function make(el) {
    var p = data.panels[+el.getAttribute("data-panel")];
    var series = [{ label: "t (s)" }];
    p.labels.forEach(function (label, i) {
      var s = { label: label, stroke: palette[i % palette.length], width: 1.5, spanGaps: true, points: { show: false } };
      if (p.step[i]) s.paths = uPlot.paths.stepped({ align: 1 });
      if (p.dash && p.dash[i]) s.dash = [6, 4];
      series.push(s);
    });
    var opts = {
      width: Math.max(el.clientWidth, 300),
      height: HEIGHT,
      series: series,
      scales: { x: { time: false } },
      axes: [{ label: "seconds" }, { label: p.unit, size: 64 }],
      cursor: {
        sync: { key: "pgbelow" },
        drag: { x: true, y: false },
        bind: {
          dblclick: function () {
            return function () { zoomAll(data.start || 0, data.end); return null; };
          }
        }
      },
      hooks: { drawClear: [shade], setScale: [onScale] }
    };
    var u = new uPlot(opts, [p.x].concat(p.ys), el);
    return u;
  }

  var els = document.querySelectorAll(".chart[data-panel]");
  for (var i = 0; i < els.length; i++) {
    charts.push(make(els[i]));
    if (i === 0 && window.performance && performance.mark) {
      performance.mark("pgbelow-first-chart");
    }
  }
  zoomAll(data.start || 0, data.end);
  document.documentElement.setAttribute("data-charts-drawn", String(charts.length));

  window.addEventListener("resize", function () {
    charts.forEach(function (c) {
      c.setSize({ width: Math.max(c.root.parentNode.clientWidth, 300), height: HEIGHT });
    });
  });

  function select(card) {
    var was = card.classList.contains("selected");
    var cards = document.querySelectorAll(".finding.selected");
    for (var i = 0; i < cards.length; i++) cards[i].classList.remove("selected");
    highlight = null;
    if (!was) {
      card.classList.add("selected");
      var w = card.getAttribute("data-window");
      if (w) highlight = w.split(",").map(Number);
    }
    charts.forEach(function (c) { c.redraw(false); });
  }
  var cards = document.querySelectorAll(".finding");
  for (var j = 0; j < cards.length; j++) {
    cards[j].addEventListener("click", function (e) {
      if (e.target.closest("summary, details table")) return;
      select(e.currentTarget);
    });
    cards[j].addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); select(e.currentTarget); }
    });
  }
})();

// A query's flame graphs load when its <details> opens: inferno lays a
// graph out at the width it is shown at, and a closed one has none.
// (toggle does not bubble: caught on the way down.)
document.addEventListener("toggle", function (e) {
  var d = e.target;
  if (!d.open || !d.classList || !d.classList.contains("query-flames")) return;
  var frames = d.querySelectorAll("iframe[data-src]");
  for (var i = 0; i < frames.length; i++) {
    frames[i].src = frames[i].getAttribute("data-src");
    frames[i].removeAttribute("data-src");
  }
}, true);
