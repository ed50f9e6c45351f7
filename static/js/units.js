/* marin-site units: how the charts write a metric's values, the same rule as the tables
 * (runs/metrics/display.py, which says how each key is shown in the chart data's
 * `metrics`: its title, unit and tick format). Loaded before results.js and campaign.js.
 *
 * Ticks: "percent" 20%, "fraction" 0.02, "count" 1.2k 3.4M 5B 2T (tokens and steps, as the
 * field writes sizes), "si" 460k 3.2G 100E 1Z (FLOPs, bytes, tokens/s), "seconds" 30 s,
 * 5 min, 2 h, 3 d; "number" plain, with SI prefixes from 10,000. Never a raw number with a
 * prefix after it ("100000000T").
 */
(() => {
  "use strict";

  const SI = [[1e24, "Y"], [1e21, "Z"], [1e18, "E"], [1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  const COUNT = [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "k"]];
  const finite = (v) => v != null && isFinite(v);
  const sig = (v, digits) => String(+v.toPrecision(digits));

  /** 3 significant digits and the largest prefix of the table that fits (the last one
   *  carries anything above it: 2e27 FLOPs is "2000Y", never "2e+27Y"). */
  const prefixed = (v, table) => {
    const a = Math.abs(v);
    for (const [size, prefix] of table) if (a >= size) return sig(v / size, 3) + prefix;
    return a ? sig(v, 3) : "0";
  };

  const seconds = (v) => {
    const a = Math.abs(v);
    if (a < 60) return `${sig(v, 3)} s`;
    if (a < 3600) return `${sig(v / 60, 3)} min`;
    if (a < 86400) return `${sig(v / 3600, 3)} h`;
    return `${sig(v / 86400, 3)} d`;
  };

  /** One tick label in a format (see above). */
  const tick = (format, v) => {
    if (!finite(v)) return "";
    switch (format) {
      case "percent": return `${sig(v, 4)}%`;
      case "fraction": return sig(v, 3);
      case "count": return prefixed(v, COUNT);
      case "si": return prefixed(v, SI);
      case "seconds": return seconds(v);
      default: return Math.abs(v) >= 1e4 ? prefixed(v, SI) : sig(v, 4);
    }
  };

  /** uPlot's `values` for an axis in a format; the labels drawn last are kept on `node`
   *  (data-*-ticks), where a test or a reader's tools can read them. */
  const ticks = (format, node, name) => (u, splits) => {
    const labels = splits.map((v) => tick(format, v));
    if (node) node.dataset[name] = labels.filter(Boolean).join("|");
    return labels;
  };

  const whole = (v) => Math.round(v).toLocaleString("en");
  const fixed = (v, places) => v.toFixed(places);

  /** A value as the tables write it (runs.metrics.display.number_text), for tooltips. */
  const text = (unit, v) => {
    if (!finite(v)) return "–";
    const a = Math.abs(v);
    switch (unit) {
      case "percent": return v === 0 || a >= 0.1 ? `${fixed(v, 1)}%` : `${sig(v, 2)}%`;
      case "fraction": return v === 0 || a >= 0.01 ? fixed(v, 3) : sig(v, 2);
      case "tokens/s": return a >= 100 ? whole(v) : sig(v, 3);
      case "seconds": return `${v.toLocaleString("en", { minimumFractionDigits: 1, maximumFractionDigits: 1 })} s`;
      case "tokens": case "count": case "bytes": return a < 1e12 ? whole(v) : v.toPrecision(3);
      case "flops": return v.toPrecision(3);
      default: return a < 1000 ? fixed(v, 4) : v.toPrecision(4);
    }
  };

  /** The titles of a chart's axes as text beside the plot (uPlot draws on a canvas, which
   *  readers' tools cannot read): the y title above it, the x title below it. */
  const axisTitles = (figure, yTitle, xTitle) => {
    const plot = figure.querySelector(".chart-plot");
    if (!plot) return;
    let y = figure.querySelector(".axis-title-y");
    if (!y) {
      y = document.createElement("div");
      y.className = "axis-title axis-title-y";
      plot.before(y);
    }
    let x = figure.querySelector(".axis-title-x");
    if (!x) {
      x = document.createElement("div");
      x.className = "axis-title axis-title-x";
      plot.after(x);
    }
    y.textContent = yTitle;
    x.textContent = xTitle;
    plot.setAttribute("role", "img");
    plot.setAttribute("aria-label", `${yTitle} against ${xTitle.toLowerCase()}`);
  };

  window.MarinUnits = { tick, ticks, text, axisTitles };
})();
