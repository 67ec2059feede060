// suanli console: one uPlot line chart from the page's inline data ({t: [ISO times], series: {name: [values]}}).
(function () {
  var el = document.getElementById("chart"), src = document.getElementById("chart-data");
  if (!el || !src || !window.uPlot) { return; }
  var data = JSON.parse(src.textContent);
  if (!data.t || !data.t.length) { return; }
  var names = Object.keys(data.series);
  var cols = [data.t.map(function (t) { return Date.parse(t) / 1000; })];
  var series = [{}];
  names.forEach(function (n, i) {
    cols.push(data.series[n].map(function (v) { return v === null ? null : Number(v); }));  // null: a gap; display only: the table beside it shows the exact figures
    series.push({ label: n, stroke: "hsl(" + Math.round((i * 137.508 + 210) % 360) + ",65%,45%)", width: i ? 1.5 : 2.5 });
  });
  var opts = { width: Math.min(el.clientWidth || 900, 1100), height: 260, series: series,
    axes: [{}, { label: el.dataset.unit }], scales: { x: { time: true } } };
  new uPlot(opts, cols, el);
  el.dataset.drawn = "1";
})();
