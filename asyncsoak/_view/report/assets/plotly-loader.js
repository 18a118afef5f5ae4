// plotly.js, gzip'd and base64'd in the page: decompressed by the browser, then run.  Every
// figure waits on window.asyncsoakPlotly, which resolves to Plotly once it is defined.
window.asyncsoakPlotly = (function () {
  var bytes = Uint8Array.from(atob("__PLOTLY_GZIP_BASE64__"), function (c) {
    return c.charCodeAt(0);
  });
  var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new Response(stream).text().then(function (source) {
    var script = document.createElement("script");
    script.textContent = source;
    document.head.appendChild(script);
    return window.Plotly;
  });
})();
