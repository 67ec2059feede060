// suanli console: a workload's per-GPU charts (uPlot), refreshed from the page's metrics route.
(function () {
  var COLORS = ["#1f6feb", "#d97706", "#16a34a", "#dc2626", "#7c3aed", "#0891b2", "#db2777", "#65a30d"];

  function table(gpus, metric) {
    // one x axis (seconds) across every GPU's readings; a GPU without a reading at a time gets null there
    var xs = {}, rows = gpus.map(function (g) {
      var m = {};
      g.points.forEach(function (p) { var t = Date.parse(p[0]) / 1000; xs[t] = 1; m[t] = p[metric]; });
      return m;
    });
    var x = Object.keys(xs).map(Number).sort(function (a, b) { return a - b; });
    return [x].concat(rows.map(function (m) { return x.map(function (t) { return t in m ? m[t] : null; }); }));
  }

  function draw(root, body) {
    var gpus = body.gpus || [], n = 0;
    gpus.forEach(function (g) { n += g.points.length; });
    root.dataset.points = String(n);
    var empty = root.querySelector("#charts-empty");
    if (empty) { empty.hidden = n > 0; }
    if (!n || !window.uPlot) { return; }
    root.querySelectorAll(".chart").forEach(function (el) {
      var data = table(gpus, Number(el.dataset.metric));
      if (el._plot && el._plot.series.length === gpus.length + 1) { el._plot.setData(data); return; }
      if (el._plot) { el._plot.destroy(); }
      var series = [{}].concat(gpus.map(function (g, i) {
        return { label: g.label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true };
      }));
      el._plot = new uPlot({ title: el.dataset.title, width: Math.min(el.clientWidth || 640, 900), height: 160,
        series: series, scales: { x: { time: true }, y: el.dataset.metric === "1" ? { range: [0, 100] } : { auto: true } } },
        data, el);
    });
  }

  function refresh(root) {
    fetch(root.dataset.src, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : { gpus: [] }; })
      .then(function (body) { draw(root, body); })
      .catch(function () {});
  }

  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("charts");
    if (!root) { return; }
    refresh(root);
    if (root.dataset.live === "yes") { setInterval(function () { refresh(root); }, 5000); }
  });
})();
