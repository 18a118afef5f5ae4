(function () {
var plot = document.getElementById("{plot_id}");
var startMs = __START_MS__, xSeconds = __X_SECONDS__, xUnit = __X_UNIT__;
var box = document.getElementById("readout");
var line = document.createElement("div");
line.className = "crosshair";
plot.style.position = "relative";
plot.appendChild(line);
function nearest(xs, x) {
  var lo = 0, hi = xs.length - 1;
  if (hi < 0 || x < xs[0]) { return -1; }
  while (lo < hi) {
    var mid = (lo + hi + 1) >> 1;
    if (xs[mid] <= x) { lo = mid; } else { hi = mid - 1; }
  }
  return lo;
}
function fmt(v, unit) {
  if (v === null || v === undefined) { return "n/a"; }
  var a = Math.abs(v), text = a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toPrecision(3);
  return text + (unit ? " " + unit : "");
}
function clock(x) {
  var seconds = x * xSeconds, rel = seconds < 60 ? seconds.toFixed(1) + " s" :
    Math.floor(seconds / 60) + " min " + Math.round(seconds % 60) + " s";
  if (startMs === null) { return rel; }
  var wall = new Date(startMs + seconds * 1000).toISOString().slice(11, 19);
  return rel + " since the start · " + wall + " UTC";
}
// An element holding ``text`` as text: panel titles and line names come from the run (a
// process names itself), so they never go through innerHTML.
function element(tag, text) {
  var e = document.createElement(tag);
  if (text !== undefined) { e.textContent = text; }
  return e;
}
function show(x) {
  var list = element("dl"), panel = null;
  plot.data.forEach(function (trace) {
    if (!trace.meta || trace.visible === "legendonly") { return; }
    var i = nearest(trace.x, x);
    if (i < 0) { return; }
    if (trace.meta[0] !== panel) { panel = trace.meta[0]; list.appendChild(element("dt", panel)); }
    var row = element("dd");
    row.appendChild(element("span", String(trace.meta[1])));
    row.appendChild(document.createTextNode(" " + fmt(trace.y[i], trace.meta[2])));
    list.appendChild(row);
  });
  box.replaceChildren(element("b", clock(x)), list);
  box.hidden = false;
  var axis = plot._fullLayout.xaxis;
  line.style.left = (axis._offset + axis.l2p(x)) + "px";
  line.style.display = "block";
}
plot.on("plotly_hover", function (e) {
  if (e.points && e.points.length) { show(e.points[0].x); }
});
plot.on("plotly_unhover", function () { line.style.display = "none"; box.hidden = true; });
var rescaling = false;
plot.on("plotly_relayout", function (change) {
  if (rescaling) { return; }
  var range = null, reset = false;
  Object.keys(change).forEach(function (key) {
    var m = key.match(/^xaxis\d*\.range\[0\]$/);
    if (m) { range = [change[key], change[key.replace("[0]", "[1]")]]; }
    if (/^xaxis\d*\.range$/.test(key)) { range = change[key]; }
    if (/^xaxis\d*\.autorange$/.test(key)) { reset = true; }
  });
  if (!range && !reset) { return; }
  var spans = {};
  plot.data.forEach(function (trace) {
    if (!trace.meta || trace.meta[0] === "Time since the last progress") { return; }
    var axis = "yaxis" + (trace.yaxis || "y").slice(1);
    var s = spans[axis] || (spans[axis] = [Infinity, -Infinity]);
    if (reset) { return; }
    for (var i = 0; i < trace.x.length; i++) {
      var v = trace.y[i];
      if (v === null || trace.x[i] < range[0] || trace.x[i] > range[1]) { continue; }
      if (v < s[0]) { s[0] = v; } if (v > s[1]) { s[1] = v; }
    }
  });
  var update = {};
  Object.keys(spans).forEach(function (axis) {
    var s = spans[axis];
    if (reset || !isFinite(s[0])) { update[axis + ".autorange"] = true; return; }
    var pad = (s[1] - s[0]) * 0.08 || Math.abs(s[1]) * 0.05 || 1;
    update[axis + ".range"] = [s[0] - pad, s[1] + pad];
  });
  rescaling = true;
  Plotly.relayout(plot, update).then(function () { rescaling = false; });
});
})();
