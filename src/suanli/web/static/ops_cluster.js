// suanli console: the cluster heat map. The server drew the boxes and cells once; this paints their colours from
// a compact state ({v, nodes: {name: [[util, temp, health, owner], ...]}, owners}) and polls it, never rebuilding.
(function () {
  var heat = document.getElementById("heat");
  if (!heat) { return; }
  var labels = heat.dataset.labels.split("|");  // no data, ok, draining, down, unhealthy, free
  var HEALTH = ["#2e7d32", "#f0a30a", "#4b5563", "#d32f2f"];
  var NODATA = "#d7dbe2";
  var cells = {};  // node name -> its cell elements, in GPU order
  var total = 0;
  heat.querySelectorAll("a.hm-node").forEach(function (a) {
    cells[a.dataset.node] = a.children; total += a.children.length;
  });
  var state = JSON.parse(document.getElementById("heat-state").textContent);
  var mode = "util";

  function lerp(a, b, x) { return Math.round(a + (b - a) * x); }
  function util(u) {  // pale blue (idle) to deep blue (busy)
    var x = Math.max(0, Math.min(1, u / 100));
    return "rgb(" + lerp(225, 8, x) + "," + lerp(236, 69, x) + "," + lerp(247, 148, x) + ")";
  }
  function temp(t) {  // 30 °C blue through 65 °C yellow to 90 °C red
    var x = Math.max(0, Math.min(1, (t - 30) / 60));
    return "hsl(" + Math.round(230 - 230 * x) + ",75%," + (x > 0.5 ? 48 : 55) + "%)";
  }
  function owner(i) { return i < 0 ? "#eef0f3" : "hsl(" + Math.round((i * 137.508) % 360) + ",60%,52%)"; }
  function colour(c) {
    if (mode === "health") { return HEALTH[c[2]]; }
    if (mode === "owner") { return owner(c[3]); }
    if (mode === "temp") { return c[1] === null ? NODATA : temp(c[1]); }
    return c[0] === null ? NODATA : util(c[0]);
  }
  function paint() {
    var painted = 0;
    for (var name in state.nodes) {
      var els = cells[name], vals = state.nodes[name];
      if (!els) { continue; }
      for (var i = 0; i < els.length && i < vals.length; i++) { els[i].style.background = colour(vals[i]); painted++; }
    }
    heat.dataset.painted = String(painted);
    heat.dataset.mode = mode;
    legend();
  }
  function chip(colourValue, text) {
    return '<span class="hm-chip" style="background:' + colourValue + '"></span>' + text + " ";
  }
  function legend() {
    var el = document.getElementById("hm-legend"), html = "";
    if (mode === "util") { html = chip(util(0), "0%") + chip(util(50), "50%") + chip(util(100), "100%"); }
    else if (mode === "temp") { html = chip(temp(30), "30°C") + chip(temp(60), "60°C") + chip(temp(90), "90°C"); }
    else if (mode === "health") { for (var h = 0; h < 4; h++) { html += chip(HEALTH[h], labels[h + 1]); } }
    else {
      html = chip(owner(-1), labels[5]);
      state.owners.forEach(function (o, i) { html += chip(owner(i), o.replace(/[<>&"]/g, "")); });
    }
    if (mode === "util" || mode === "temp") { html += chip(NODATA, labels[0]); }
    el.innerHTML = html;
  }
  function info(e) {
    var cell = e.target;
    if (cell.tagName !== "I") { return; }
    var a = cell.parentNode, i = Array.prototype.indexOf.call(a.children, cell), c = (state.nodes[a.dataset.node] || [])[i];
    if (!c) { return; }
    var who = c[3] >= 0 ? state.owners[c[3]] : labels[5];
    document.getElementById("hm-info").textContent = a.dataset.node + (heat.dataset.aggregate === "1" ? "" : " / GPU " + i) +
      " · " + (c[0] === null ? labels[0] : c[0] + "%") + " · " + (c[1] === null ? "—" : c[1] + "°C") +
      " · " + labels[c[2] + 1] + " · " + who;
  }
  function poll() {
    fetch("/ops/cluster/_/state", { headers: { Accept: "application/json" } }).then(function (r) {
      if (r.redirected || !r.ok) { throw new Error(r.status); }
      return r.json();
    }).then(function (s) {
      if (s.v !== state.v) { location.reload(); return; }  // nodes came or went: redraw the boxes
      state = s; paint();
      document.getElementById("hm-at").textContent = new Date().toLocaleTimeString();
    }).catch(function () {}).then(function () { setTimeout(poll, Number(heat.dataset.poll) || 3000); });
  }
  document.querySelectorAll('input[name="hm-mode"]').forEach(function (r) {
    r.addEventListener("change", function () { mode = r.value; paint(); });
    if (r.checked) { mode = r.value; }
  });
  heat.addEventListener("mouseover", info);
  heat.dataset.cells = String(total);
  paint();
  heat.dataset.drawn = "1";
  if (window.performance && performance.mark) { performance.mark("heatmap-drawn"); }
  setTimeout(poll, Number(heat.dataset.poll) || 3000);
})();
