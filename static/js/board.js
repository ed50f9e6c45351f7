/* The board's Pareto chart (proposals/board): a track's metric against training FLOPs, both
 * axes logarithmic; verified entries filled, unverified hollow, and the Pareto frontier as
 * a step line (no entry has both fewer FLOPs and a lower value). Drawn with uPlot from
 * /board/chart.json. No inline script or style: the page's CSP allows this file and uPlot. */
(() => {
  "use strict";
  const box = document.getElementById("board-chart");
  if (!box || typeof uPlot === "undefined") return;
  const figure = box.querySelector("figure");
  const target = figure.querySelector(".chart-plot");
  const units = window.MarinUnits;

  /** One x axis for all three series: every point's FLOPs and the frontier's, merged and
   *  sorted (uPlot wants ascending x); each series is null where it has no point. */
  const columns = (data) => {
    const rows = [];
    for (const p of data.points) rows.push([p.flops, p.verified ? p.value : null, p.verified ? null : p.value, null]);
    for (const f of data.frontier) rows.push([f.flops, null, null, f.value]);
    rows.sort((a, b) => a[0] - b[0]);
    return [0, 1, 2, 3].map((i) => rows.map((r) => r[i]));
  };

  const draw = (data) => {
    if (!data.points.length && !data.frontier.length) return;
    target.replaceChildren();
    const dot = (fill, stroke) => ({ show: true, size: 6, fill, stroke, width: 1 });
    const none = () => null;
    new uPlot(
      {
        width: Math.max(240, target.clientWidth || 600),
        height: window.innerWidth < 600 ? 220 : 280,
        scales: { x: { time: false, distr: 3 }, y: { distr: 3 } },
        series: [
          {},
          { label: "verified", stroke: "#1a7f37", paths: none, points: dot("#1a7f37", "#1a7f37") },
          { label: "unverified", stroke: "#9a6700", paths: none, points: dot("#ffffff", "#9a6700") },
          { label: "Pareto frontier", stroke: "#8250df", width: 1.5, spanGaps: true, paths: uPlot.paths.stepped({ align: 1 }), points: { show: false } },
        ],
        legend: { show: true, live: false },
        cursor: { drag: { x: true, y: true, setScale: true } },
        axes: [
          { values: units.ticks("si", figure, "xTicks") },
          { size: 64, values: units.ticks("number", figure, "yTicks") },
        ],
      },
      columns(data),
      target,
    );
    figure.dataset.drawn = "true";
    figure.dataset.points = String(data.points.length);
    figure.dataset.frontier = String(data.frontier.length);
    if (units.axisTitles) units.axisTitles(figure, data.metric, "training FLOPs");
  };

  fetch(box.dataset.chartUrl, { headers: { Accept: "application/json" } })
    .then((r) => (r.ok ? r.json() : Promise.reject(new Error(String(r.status)))))
    .then(draw)
    .catch((e) => { figure.dataset.drawn = "error"; figure.append(document.createTextNode(`The chart could not be drawn (${e.message}).`)); });
})();
