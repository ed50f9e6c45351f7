/* marin-site results: the run table's live refresh, the metric charts (uPlot) and the
 * scaling ladder, for the proposal page and the compare page.
 *
 * No inline script and no HTML built from data: configuration comes from data-* attributes
 * and json_script blocks, every run label or config value reaches the page through
 * textContent, and the only HTML inserted is the run table rendered (and escaped) by Django.
 * While anything is active the table and the charts refresh every few seconds; polling stops
 * once the server says everything is terminal. A chart that shows lines carries
 * data-drawn="true" (browser tests wait for it).
 */
(() => {
  "use strict";

  const root = document.getElementById("results");
  if (!root) return;

  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const MAX_X = 1200; // above this many distinct steps, lines are resampled onto one grid
  const DEFAULT_CHARTS = 8;
  const TIP_ROWS = 10;
  const BAND_RUNS = 16;

  const readJSON = (id) => {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  };
  const config = readJSON("results-config") || {};
  const pollMs = Math.max(1000, config.pollMs || 3000);
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  };
  document.querySelectorAll(".js-hide").forEach((node) => { node.style.display = "none"; });

  /* ---------------------------------------------------------------- numbers */

  /* Units (static/js/units.js): every axis has a title and ticks in its key's format, and
   * a hovered value is written as the table writes it (runs/metrics/display.py). */
  const units = window.MarinUnits;
  const STEP_TITLE = "Step";
  const metaOf = (key) => ((latest && latest.metrics) || {})[key] || { label: key, title: key, unit: "", format: "number" };

  /** TensorBoard's debiased exponential moving average; weight 0 leaves the values alone. */
  const ema = (values, weight) => {
    if (!weight) return values;
    const out = new Array(values.length);
    let last = 0;
    let n = 0;
    for (let i = 0; i < values.length; i++) {
      const v = values[i];
      if (v == null || !isFinite(v)) { out[i] = null; continue; }
      last = last * weight + (1 - weight) * v;
      n += 1;
      out[i] = last / (1 - Math.pow(weight, n));
    }
    return out;
  };
  const positive = (values) => values.map((v) => (v != null && v > 0 ? v : null));

  /** Index of the step nearest to x in a sorted array of steps. */
  const nearest = (steps, x) => {
    let lo = 0;
    let hi = steps.length - 1;
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (steps[mid] <= x) lo = mid; else hi = mid;
    }
    return Math.abs(steps[hi] - x) < Math.abs(steps[lo] - x) ? hi : lo;
  };

  /* ---------------------------------------------------------------- colours */

  const colourAt = (index, count) => (count <= PALETTE.length ? PALETTE[index % PALETTE.length] : `hsl(${Math.round((360 * index) / count)}, 65%, 42%)`);
  const withAlpha = (colour, alpha) => {
    if (colour.startsWith("hsl(")) return colour.replace("hsl(", "hsla(").replace(")", `, ${alpha})`);
    const n = parseInt(colour.slice(1), 16);
    return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
  };
  const axisValue = (run, axis) => {
    if (axis === "run") return run.id;
    if (run.axes && Object.prototype.hasOwnProperty.call(run.axes, axis)) return run.axes[axis];
    const extra = (config.runAxes || {})[String(run.id)];
    return extra && Object.prototype.hasOwnProperty.call(extra, axis) ? extra[axis] : null;
  };
  const compareValues = (a, b) => {
    if (typeof a === "number" && typeof b === "number") return a - b;
    if (typeof a === "number") return -1;
    if (typeof b === "number") return 1;
    return JSON.stringify(a).localeCompare(JSON.stringify(b));
  };
  const DASHES = [[], [7, 4], [2, 3], [12, 3, 2, 3], [1, 5], [16, 6]];
  /** Run id -> dash pattern, and the legend (value, pattern), for the line-style axis. */
  const dashing = (runs, axis) => {
    if (!axis) return { byRun: new Map(), legend: [] };
    const distinct = [];
    const seen = new Set();
    for (const run of runs) {
      const value = axisValue(run, axis);
      const id = JSON.stringify(value);
      if (!seen.has(id)) { seen.add(id); distinct.push(value); }
    }
    distinct.sort(compareValues);
    const index = new Map(distinct.map((v, i) => [JSON.stringify(v), i]));
    const byRun = new Map(runs.map((run) => [run.id, DASHES[index.get(JSON.stringify(axisValue(run, axis))) % DASHES.length]]));
    return { byRun, legend: distinct.map((v, i) => [v, DASHES[i % DASHES.length]]) };
  };
  /** Run id -> colour, and the legend (value, colour) of the chosen axis. */
  const colouring = (runs, axis) => {
    const distinct = [];
    const seen = new Set();
    for (const run of runs) {
      const value = axisValue(run, axis);
      const id = JSON.stringify(value);
      if (!seen.has(id)) { seen.add(id); distinct.push(value); }
    }
    distinct.sort(compareValues);
    const index = new Map(distinct.map((v, i) => [JSON.stringify(v), i]));
    const byRun = new Map(runs.map((run) => [run.id, colourAt(index.get(JSON.stringify(axisValue(run, axis))), distinct.length)]));
    const legend = distinct.map((v, i) => [v, colourAt(i, distinct.length)]);
    return { byRun, legend };
  };

  /* ---------------------------------------------------------------- run table */

  const tableBox = $("run-table");
  const controls = $("run-table-controls");
  const statusLine = $("live-status");
  const TABLE_PARAMS = ["sort", "group", "columns"];
  /** A multi-valued "columns" (the picker's checkboxes) as one comma-separated value. */
  const columnsOf = (query) => query.getAll("columns").flatMap((v) => v.split(",")).filter(Boolean).join(",");
  let tableQuery = new URLSearchParams();
  for (const name of TABLE_PARAMS) {
    const search = new URLSearchParams(location.search);
    const value = name === "columns" ? columnsOf(search) : search.get(name);
    if (value) tableQuery.set(name, value);
  }

  /* Runs ticked for comparison are kept in this browser (localStorage) across proposal
   * pages until cleared; the compare form sends all of them. */
  const PICK_KEY = "marin-site:compare-runs";
  const compareForm = $("compare-form");
  const storePicks = Boolean(compareForm && compareForm.dataset.pickStore === "true");
  const readPicks = () => {
    try {
      const value = JSON.parse(localStorage.getItem(PICK_KEY) || "[]");
      return Array.isArray(value) ? value.map(String).filter((v) => /^[0-9]{1,18}$/.test(v)) : [];
    } catch (error) {
      return [];
    }
  };
  const writePicks = (ids) => {
    try { localStorage.setItem(PICK_KEY, JSON.stringify(ids.slice(0, 100))); } catch (error) { /* private mode */ }
  };
  const showPicks = () => {
    if (!storePicks) return;
    const picks = readPicks();
    const count = $("compare-picked-count");
    const box = $("compare-picked");
    if (count) count.textContent = String(picks.length);
    if (box) box.hidden = picks.length === 0;
    if (tableBox) {
      const set = new Set(picks);
      tableBox.querySelectorAll("input[name=ids]").forEach((input) => { input.checked = set.has(input.value); });
    }
  };
  if (storePicks) {
    if (tableBox) {
      tableBox.addEventListener("change", (event) => {
        const input = event.target.closest("input[name=ids]");
        if (!input) return;
        const picks = readPicks().filter((id) => id !== input.value);
        if (input.checked) picks.push(input.value);
        writePicks(picks);
        showPicks();
      });
    }
    const clear = $("compare-clear");
    if (clear) clear.addEventListener("click", () => { writePicks([]); showPicks(); });
    compareForm.addEventListener("submit", (event) => {
      const picks = readPicks();
      if (!picks.length) return; // nothing kept: the form sends what is ticked here
      event.preventDefault();
      location.assign(`${compareForm.action}?ids=${picks.join(",")}`);
    });
    window.addEventListener("storage", (event) => { if (event.key === PICK_KEY) showPicks(); });
    showPicks();
  }

  /* Live panels (proposals/live.py): the poll's answer carries, after the table, the page's
   * other panels that follow the runs as <template data-live-panel=NAME data-version=V>.
   * A panel replaces its slot when it says something new, unless the reader is typing in it. */
  const typing = new WeakSet();
  document.addEventListener("input", (event) => {
    const slot = event.target.closest && event.target.closest("[data-live-slot]");
    if (slot) typing.add(slot);
  });
  const applyPanels = (box) => {
    for (const panel of box.querySelectorAll("template[data-live-panel]")) {
      const slot = document.querySelector(`[data-live-slot="${CSS.escape(panel.dataset.livePanel)}"]`);
      panel.remove();
      if (!slot || slot.dataset.version === panel.dataset.version || typing.has(slot)) continue;
      slot.replaceChildren(panel.content.cloneNode(true));
      slot.dataset.version = panel.dataset.version;
    }
  };

  const refreshTable = async () => {
    if (!tableBox || !tableBox.dataset.tableUrl) return null;
    const url = new URL(tableBox.dataset.tableUrl, location.href);
    for (const [name, value] of tableQuery) url.searchParams.set(name, value);
    const response = await fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } });
    if (!response.ok) throw new Error(`run table: HTTP ${response.status}`);
    const html = await response.text();
    const ticked = new Set(Array.from(tableBox.querySelectorAll("input[name=ids]:checked"), (box) => box.value));
    tableBox.innerHTML = html; // rendered and escaped by Django's templates, same origin
    applyPanels(tableBox);
    tableBox.querySelectorAll("input[name=ids]").forEach((box) => { box.checked = ticked.has(box.value); });
    showPicks();
    const box = tableBox.querySelector(".run-table-box");
    const count = $("run-count");
    if (box && count) count.textContent = box.dataset.runCount || "0";
    if (box && box.dataset.keys) addKeys(box.dataset.keys.split(",").filter(Boolean));
    return box;
  };

  const applyQuery = (query) => {
    tableQuery = new URLSearchParams();
    for (const name of [...TABLE_PARAMS, "ids"]) {
      const value = name === "columns" ? columnsOf(query) : query.get(name);
      if (value) tableQuery.set(name, value);
    }
    if (controls) {
      if (controls.elements.sort) controls.elements.sort.value = tableQuery.get("sort") || "";
      if (controls.elements.group) controls.elements.group.value = tableQuery.get("group") || "";
      const shown = new Set((tableQuery.get("columns") || "").split(","));
      controls.querySelectorAll("input[name=columns]").forEach((box) => { box.checked = shown.has(box.value); });
    }
    const page = new URLSearchParams(location.search);
    page.delete("columns");
    for (const name of TABLE_PARAMS) {
      if (tableQuery.get(name)) page.set(name, tableQuery.get(name)); else page.delete(name);
    }
    history.replaceState(null, "", `${location.pathname}${page.toString() ? "?" + page : ""}#results`);
    refreshTable().catch(() => {});
  };

  if (tableBox) {
    tableBox.addEventListener("click", (event) => {
      const link = event.target.closest("a[data-table-query]");
      if (!link) return;
      event.preventDefault();
      applyQuery(new URLSearchParams(link.dataset.tableQuery));
    });
  }
  if (controls) {
    controls.addEventListener("change", () => applyQuery(new URLSearchParams(new FormData(controls))));
    controls.addEventListener("submit", (event) => {
      event.preventDefault();
      applyQuery(new URLSearchParams(new FormData(controls)));
    });
  }

  /* ---------------------------------------------------------------- charts */

  const chartsBox = $("charts");
  const chartsStatus = $("charts-status");
  const legendBox = $("chart-legend");
  const colourSelect = $("chart-colour");
  const addSelect = $("chart-add");
  const dashSelect = $("chart-dash");
  const plots = new Map(); // figure -> {plot, sig, lines, zoomed, tip}
  const view = {
    colour: colourSelect ? colourSelect.value : "run",
    dash: dashSelect ? dashSelect.value : "",
    log: false,
    smooth: 0,
    band: true,
  };
  let latest = null;
  let dataVersion = 0;
  let lastPrint = "";
  /** What changes when a poll brings news: runs, states, and each line's length and end. */
  const fingerprint = (data) => {
    const parts = (data.runs || []).map((run) => `${run.id}:${run.state}`);
    for (const [key, lines] of Object.entries(data.series || {})) {
      for (const l of lines) {
        const n = l.step ? l.step.length : 0;
        parts.push(`${key}:${l.run}:${n}:${n ? l.step[n - 1] : ""}:${n ? l.value[n - 1] : ""}`);
      }
    }
    return parts.join("|");
  };

  const chartKeys = () => (chartsBox ? Array.from(chartsBox.querySelectorAll("figure[data-chart-key]"), (f) => f.dataset.chartKey) : []);
  const chartHeight = () => (window.innerWidth < 600 ? 200 : 260);
  const say = (text) => { if (chartsStatus) chartsStatus.textContent = text; };

  const makeFigure = (key) => {
    const figure = el("figure", "chart");
    figure.id = `chart-${chartsBox.children.length + 1}`;
    figure.dataset.chartKey = key;
    figure.dataset.drawn = "false";
    figure.append(el("figcaption", "", key), el("div", "chart-plot"));
    chartsBox.append(figure);
    return figure;
  };
  /** A chart's caption: the key's declared name, and the key itself when they differ. */
  const caption = (figure) => {
    const key = figure.dataset.chartKey;
    const label = metaOf(key).label;
    const node = figure.querySelector("figcaption");
    if (!node || node.dataset.label === label) return;
    node.dataset.label = label;
    node.replaceChildren(document.createTextNode(label));
    if (label !== key) node.append(" ", el("code", "chart-key", key));
  };

  /** Metric keys the runs report: chart the first few, offer the rest in "Add a chart". */
  function addKeys(keys) {
    if (!chartsBox) return;
    const charted = new Set(chartKeys());
    const offered = new Set(addSelect ? Array.from(addSelect.options, (o) => o.value) : []);
    let added = false;
    for (const key of keys) {
      if (charted.has(key)) continue;
      if (charted.size < DEFAULT_CHARTS) {
        makeFigure(key);
        charted.add(key);
        added = true;
      } else if (addSelect && !offered.has(key)) {
        addSelect.append(new Option(key, key));
        offered.add(key);
      }
    }
    if (added) loadSeries().catch(() => {});
  }

  const seriesUrl = () => {
    const url = new URL(chartsBox.dataset.seriesUrl, location.href);
    url.searchParams.set("keys", chartKeys().join(","));
    return url;
  };

  async function loadSeries() {
    if (!chartsBox || !chartsBox.dataset.seriesUrl || !chartKeys().length) return null;
    const response = await fetch(seriesUrl(), { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) {
      say(`The chart data is unavailable right now (HTTP ${response.status}).`);
      return null;
    }
    const data = await response.json();
    const print = fingerprint(data);
    if (print !== lastPrint || !latest) { // a poll that brings nothing new draws nothing
      latest = data;
      lastPrint = print;
      dataVersion += 1;
      drawAll();
    }
    return data;
  }

  const updateColourOptions = (runs) => {
    for (const select of [colourSelect, dashSelect]) {
      if (!select) continue;
      const present = new Set(Array.from(select.options, (o) => o.value));
      for (const run of runs) {
        for (const axis of Object.keys(run.axes || {})) {
          if (!present.has(axis)) {
            if (select === colourSelect) select.insertBefore(new Option(axis, axis), select.lastElementChild);
            else select.append(new Option(axis, axis));
            present.add(axis);
          }
        }
      }
    }
  };

  const SVG = "http://www.w3.org/2000/svg";
  const dashSample = (pattern) => {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", "28");
    svg.setAttribute("height", "8");
    svg.setAttribute("class", "dash-sample");
    const line = document.createElementNS(SVG, "line");
    line.setAttribute("x1", "0");
    line.setAttribute("y1", "4");
    line.setAttribute("x2", "28");
    line.setAttribute("y2", "4");
    line.setAttribute("stroke", "#364152");
    line.setAttribute("stroke-width", "2");
    if (pattern.length) line.setAttribute("stroke-dasharray", pattern.join(" "));
    svg.append(line);
    return svg;
  };

  const valueText = (value) => (typeof value === "string" ? value : JSON.stringify(value));
  const renderLegend = (legend, dashLegend) => {
    if (!legendBox) return;
    const items = legend.slice(0, 24).map(([value, colour]) => {
      const item = el("span", "legend-item");
      const swatch = el("span", "swatch");
      swatch.style.backgroundColor = colour;
      item.append(swatch, document.createTextNode(`${view.colour} = ${valueText(value)}`));
      return item;
    });
    if (legend.length > 24) items.push(el("span", "legend-item muted", `… ${legend.length - 24} more`));
    for (const [value, pattern] of dashLegend.slice(0, 12)) {
      const item = el("span", "legend-item legend-dash");
      item.append(dashSample(pattern), document.createTextNode(` ${view.dash} = ${valueText(value)}`));
      items.push(item);
    }
    legendBox.replaceChildren(...items);
  };

  /** One chart's lines, smoothed and (on a log scale) without non-positive values. */
  const prepare = (key, colours, dashes) => {
    const runs = new Map((latest.runs || []).map((run) => [run.id, run]));
    return ((latest.series || {})[key] || [])
      .filter((s) => s.step && s.step.length)
      .map((s) => {
        const run = runs.get(s.run) || { id: s.run, label: `#${s.run}`, axes: {} };
        let value = ema(s.value, view.smooth);
        let min = Array.isArray(s.min) && s.min.length === s.step.length ? s.min : null;
        let max = Array.isArray(s.max) && s.max.length === s.step.length ? s.max : null;
        if (view.log) {
          value = positive(value);
          min = min && positive(min);
          max = max && positive(max);
        }
        return { run, label: run.label || `#${run.id}`, colour: colours.get(run.id) || PALETTE[0], dash: (dashes && dashes.get(run.id)) || [], step: s.step, value, min, max };
      });
  };

  const scatterOnto = (xs, steps, ys) => {
    const out = new Array(xs.length).fill(null);
    let j = 0;
    for (let i = 0; i < steps.length; i++) {
      while (xs[j] < steps[i]) j++;
      out[j] = ys[i];
    }
    return out;
  };
  const resampleOnto = (xs, steps, ys) => {
    const out = new Array(xs.length).fill(null);
    const n = steps.length;
    let j = 0;
    for (let i = 0; i < xs.length; i++) {
      const x = xs[i];
      if (x < steps[0] || x > steps[n - 1]) continue;
      while (j < n - 2 && steps[j + 1] < x) j++;
      const k = Math.min(j + 1, n - 1);
      const a = ys[j];
      const b = ys[k];
      if (a == null || b == null) { out[i] = a == null ? b : a; continue; }
      out[i] = steps[k] === steps[j] ? a : a + ((b - a) * (x - steps[j])) / (steps[k] - steps[j]);
    }
    return out;
  };

  /** uPlot wants one x array: the union of every run's steps, or a common grid when large.
   *  The grid and the bands depend on the data, not on smoothing or colours: a chart keeps
   *  them until new data arrives, so moving the smoothing slider only recomputes the lines. */
  const grid = (lines, withBand) => {
    const union = new Set();
    for (const line of lines) for (const s of line.step) union.add(s);
    let xs = Array.from(union).sort((a, b) => a - b);
    const longest = Math.max(...lines.map((l) => l.step.length));
    const size = Math.min(MAX_X, Math.max(200, 2 * longest)); // twice a line's own points
    const exact = xs.length <= size;
    if (!exact) {
      const lo = xs[0];
      const hi = xs[xs.length - 1];
      xs = Array.from({ length: size }, (_, i) => lo + ((hi - lo) * i) / (size - 1));
    }
    const place = exact ? scatterOnto : resampleOnto;
    const band = [];
    if (withBand) {
      for (const l of lines) if (l.min && l.max) band.push(place(xs, l.step, l.max), place(xs, l.step, l.min));
    }
    return { xs, place, band };
  };
  const align = (lines, g) => [g.xs, ...lines.map((l) => g.place(g.xs, l.step, l.value)), ...g.band];

  const showTip = (u, state) => {
    const tip = state.tip;
    const left = u.cursor.left;
    if (left == null || left < 0 || !state.lines.length) { tip.hidden = true; return; }
    const x = u.posToVal(left, "x");
    const rows = [];
    for (const line of state.lines) {
      const i = nearest(line.step, x);
      if (line.value[i] != null) rows.push({ line, value: line.value[i], step: line.step[i] });
    }
    if (!rows.length) { tip.hidden = true; return; }
    rows.sort((a, b) => a.value - b.value);
    const children = [el("div", "tip-head", `step ≈ ${units.tick("count", Math.round(x))}`)];
    for (const row of rows.slice(0, TIP_ROWS)) {
      const line = el("div", "tip-row");
      const swatch = el("span", "swatch");
      swatch.style.backgroundColor = row.line.colour;
      line.append(swatch, el("span", "tip-label", row.line.label), el("span", "tip-value", units.text(state.meta.unit, row.value)));
      children.push(line);
    }
    if (rows.length > TIP_ROWS) children.push(el("div", "tip-more", `… ${rows.length - TIP_ROWS} more runs`));
    tip.replaceChildren(...children);
    tip.hidden = false;
    const flip = left > u.over.clientWidth / 2;
    tip.style.left = flip ? "" : `${left + 14}px`;
    tip.style.right = flip ? `${u.over.clientWidth - left + 14}px` : "";
  };

  const build = (figure, lines, g) => {
    const target = figure.querySelector(".chart-plot");
    target.replaceChildren();
    const withBand = view.band;
    const series = [{ label: "step" }];
    const bands = [];
    for (const line of lines) {
      // A key logged once or twice (a run's final figure) has no line to draw: show its points.
      const sparse = line.step.length < 3;
      const style = { label: line.label, stroke: line.colour, width: line.run.baseline ? 2 : 1, spanGaps: true, points: { show: sparse, size: 7, fill: line.colour } };
      if (line.dash.length) style.dash = line.dash;
      series.push(style);
    }
    if (withBand) {
      for (const line of lines) {
        if (!(line.min && line.max)) continue;
        const edge = { label: `${line.label} (min/max)`, stroke: "rgba(0,0,0,0)", width: 1, spanGaps: true, points: { show: false } };
        bands.push({ series: [series.length, series.length + 1], fill: withAlpha(line.colour, 0.14) });
        series.push({ ...edge }, { ...edge });
      }
    }
    const meta = metaOf(figure.dataset.chartKey);
    const state = { lines, meta, zoomed: false, tip: el("div", "chart-tip") };
    state.tip.hidden = true;
    units.axisTitles(figure, meta.title, STEP_TITLE);
    const plot = new uPlot(
      {
        width: Math.max(240, target.clientWidth || 600),
        height: chartHeight(),
        scales: { x: { time: false }, y: { distr: view.log ? 3 : 1 } },
        series,
        bands,
        legend: { show: false },
        focus: { alpha: 0.3 },
        cursor: {
          drag: { x: true, y: false, setScale: true },
          sync: { key: `marin-results-${root.dataset.planId || "compare"}` },
          points: { show: false },
          focus: { prox: 24 },
        },
        axes: [
          { values: units.ticks("count", figure, "xTicks") },
          { size: 64, values: units.ticks(meta.format, figure, "yTicks") },
        ],
        hooks: {
          setCursor: [(u) => showTip(u, state)],
          setSelect: [(u) => { if (u.select.width > 0) state.zoomed = true; }],
        },
      },
      align(lines, g),
      target,
    );
    plot.over.append(state.tip);
    plot.over.addEventListener("dblclick", () => { state.zoomed = false; });
    state.plot = plot;
    return state;
  };

  /** A chart with no points yet draws nothing: a note says so instead of empty axes. */
  const noPoints = (figure, empty) => {
    let note = figure.querySelector(".chart-empty-note");
    if (empty && !note) {
      note = el("p", "chart-empty-note muted", "No points yet.");
      figure.append(note);
    } else if (!empty && note) {
      note.remove();
    }
    figure.classList.toggle("chart-empty", empty);
  };

  const draw = (figure, colours, dashes) => {
    const lines = prepare(figure.dataset.chartKey, colours, dashes);
    let state = plots.get(figure);
    if (!lines.length) {
      if (state) { state.plot.destroy(); plots.delete(figure); }
      figure.dataset.drawn = "false";
      noPoints(figure, true);
      return;
    }
    noPoints(figure, false);
    caption(figure);
    figure.dataset.lineStyles = String(new Set(lines.map((l) => l.dash.join(","))).size);
    const sig = [view.colour, view.dash, view.log, view.band, metaOf(figure.dataset.chartKey).title, ...lines.map((l) => `${l.run.id}:${l.colour}:${l.dash.join(",")}:${Boolean(l.min)}`)].join("|");
    const gridKey = `${dataVersion}|${view.log}|${view.band}`;
    const g = state && state.gridKey === gridKey ? state.grid : grid(lines, view.band);
    if (state && state.sig === sig) {
      state.lines = lines;
      state.plot.setData(align(lines, g), !state.zoomed);
    } else {
      if (state) state.plot.destroy();
      state = build(figure, lines, g);
      state.sig = sig;
      plots.set(figure, state);
    }
    state.grid = g;
    state.gridKey = gridKey;
    figure.dataset.drawn = "true";
  };

  const bandBox = $("chart-band");
  let bandChosen = false;

  function drawAll() {
    if (!latest || typeof uPlot === "undefined") return;
    const runs = latest.runs || [];
    if (bandBox && !bandChosen) {
      // Dozens of shaded bands hide the lines (and cost the most to paint): off by default
      // above BAND_RUNS runs, one click away.
      view.band = runs.length <= BAND_RUNS;
      bandBox.checked = view.band;
    }
    updateColourOptions(runs);
    const { byRun, legend } = colouring(runs, view.colour);
    const dashes = dashing(runs, view.dash);
    renderLegend(legend, dashes.legend);
    for (const figure of chartsBox.querySelectorAll("figure[data-chart-key]")) draw(figure, byRun, dashes.byRun);
    const drawn = chartsBox.querySelectorAll('figure[data-drawn="true"]').length;
    say(drawn ? "Drag to zoom, double-click to reset; hover for values." : "No metrics yet: charts appear when the runs report them.");
  }

  if (chartsBox) {
    const redraw = () => drawAll();
    colourSelect && colourSelect.addEventListener("change", () => { view.colour = colourSelect.value; redraw(); });
    dashSelect && dashSelect.addEventListener("change", () => { view.dash = dashSelect.value; redraw(); });
    $("chart-log") && $("chart-log").addEventListener("change", (e) => { view.log = e.target.checked; redraw(); });
    bandBox && bandBox.addEventListener("change", () => { bandChosen = true; view.band = bandBox.checked; redraw(); });
    const smooth = $("chart-smooth");
    if (smooth) {
      let frame = 0;
      smooth.addEventListener("input", () => {
        view.smooth = Math.min(0.99, Math.max(0, parseFloat(smooth.value) || 0));
        const out = $("chart-smooth-value");
        if (out) out.textContent = view.smooth.toFixed(2);
        cancelAnimationFrame(frame); // one redraw per frame however fast the slider moves
        frame = requestAnimationFrame(redraw);
      });
    }
    $("chart-reset") && $("chart-reset").addEventListener("click", () => {
      for (const state of plots.values()) state.zoomed = false;
      redraw();
    });
    addSelect && addSelect.addEventListener("change", () => {
      const key = addSelect.value;
      if (!key) return;
      addSelect.remove(addSelect.selectedIndex);
      addSelect.value = "";
      makeFigure(key);
      loadSeries().catch(() => {});
    });
    let pending = 0;
    new ResizeObserver(() => {
      cancelAnimationFrame(pending);
      pending = requestAnimationFrame(() => {
        for (const [figure, state] of plots) {
          const width = figure.querySelector(".chart-plot").clientWidth;
          if (width && Math.abs(width - state.plot.width) > 2) state.plot.setSize({ width, height: chartHeight() });
        }
      });
    }).observe(chartsBox);
  }

  /* ---------------------------------------------------------------- scaling ladder */

  const drawLadder = () => {
    const data = readJSON("ladder-data");
    const figure = $("ladder-chart");
    if (!data || !figure || !data.x.length || typeof uPlot === "undefined") return;
    const target = figure.querySelector(".chart-plot");
    units.axisTitles(figure, data.title || data.metric || "Loss", "Training compute (FLOPs)");
    const series = [{ label: "FLOPs" }];
    const columns = [data.x];
    const count = data.variants.length;
    const legend = [];
    data.variants.forEach((variant, i) => {
      const colour = variant.baseline ? "#111111" : colourAt(i, count);
      const item = el("span", "legend-item");
      const swatch = el("span", "swatch");
      swatch.style.backgroundColor = colour;
      item.append(swatch, document.createTextNode(variant.label));
      legend.push(item);
      series.push({ label: variant.label, stroke: colour, fill: colour, paths: () => null, points: { show: true, size: 8, fill: colour, stroke: colour } });
      columns.push(variant.points);
      if (variant.fit) {
        series.push({ label: `${variant.label} fit`, stroke: colour, width: 1.5, dash: variant.baseline ? undefined : [6, 4], spanGaps: true, points: { show: false } });
        columns.push(variant.fit);
      }
    });
    new uPlot(
      {
        width: Math.max(240, target.clientWidth || 600),
        height: chartHeight() + 40,
        scales: {
          x: { time: false, distr: 3, range: (u, min, max) => [min / 1.6, max * 1.6] },
          y: { distr: 3, range: (u, min, max) => [min / 1.04, max * 1.04] },
        },
        series,
        axes: [
          { values: units.ticks("si", figure, "xTicks") },
          {
            size: 64,
            // Losses of a ladder often span less than a decade: geometric ticks, not powers of 10.
            splits: (u, i, min, max) => Array.from({ length: 5 }, (_, k) => min * Math.pow(max / min, k / 4)),
            values: units.ticks("number", figure, "yTicks"),
          },
        ],
        legend: { show: false },
        cursor: { drag: { x: false, y: false } },
      },
      columns,
      target,
    );
    const legendBox = el("div", "chart-legend");
    legendBox.append(...legend);
    figure.append(legendBox);
    figure.dataset.drawn = "true";
  };

  /* ---------------------------------------------------------------- polling */

  let live = root.dataset.live === "true";
  let timer = 0;
  const setLive = (value) => {
    live = value;
    root.dataset.live = value ? "true" : "false";
    if (statusLine) statusLine.textContent = value ? "live: updates every few seconds" : "";
  };

  const tick = async () => {
    timer = 0;
    if (!live) return;
    if (document.hidden) { timer = setTimeout(tick, pollMs); return; }
    let tableActive = null;
    let seriesActive = null;
    try {
      const [box, data] = await Promise.all([refreshTable(), loadSeries()]);
      if (box) tableActive = box.dataset.active === "true";
      if (data && typeof data.active === "boolean") seriesActive = data.active;
    } catch (error) {
      tableActive = true; // a failed request is retried at the next tick
    }
    const known = [tableActive, seriesActive].filter((v) => v !== null);
    setLive(known.length ? known.some(Boolean) : live);
    if (live) timer = setTimeout(tick, pollMs);
  };

  const start = () => {
    drawLadder();
    loadSeries().catch(() => say("The chart data could not be loaded."));
    if (live) timer = setTimeout(tick, pollMs);
  };
  if (typeof uPlot === "undefined") window.addEventListener("load", start, { once: true });
  else start();
})();
