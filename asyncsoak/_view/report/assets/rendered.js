var plot = document.getElementById("{plot_id}");
var marker = document.getElementById("render-status");
var titles = Array.prototype.map.call(
  plot.querySelectorAll(".annotation-text"), function (e) { return e.textContent; });
marker.dataset.subplots = String(plot.querySelectorAll(".cartesianlayer > .subplot").length);
marker.dataset.traces = String(plot.querySelectorAll(".scatterlayer .trace").length);
marker.dataset.titles = titles.join("|");
// Each y axis's title: what it measures, and in what unit.
marker.dataset.ytitles = Array.prototype.map.call(
  plot.querySelectorAll('.infolayer text[class$="title"][class^="y"]'),
  function (e) { return e.textContent; }).join("|");
marker.dataset.labels = Array.prototype.map.call(
  plot.querySelectorAll(".textpoint"), function (e) { return e.textContent; }).join("|");
// Where the verdict and the evidence end on the page: a reader must see them without scrolling.
["verdict", "evidence", "cause"].forEach(function (id) {
  var box = document.getElementById(id);
  if (box) { marker.dataset[id + "Bottom"] = String(Math.round(
    box.getBoundingClientRect().bottom + window.scrollY)); }
});
// Milliseconds from the start of navigation to the figure drawn: the report's load-and-draw.
marker.dataset.drawnMs = String(Math.round(performance.now()));
marker.dataset.state = "rendered";
