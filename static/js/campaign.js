/* The campaign page's charts (runs/campaigns): the stitched telemetry by tokens seen, the
 * data mix stacked, the ladder's projection against FLOPs; interventions (dashed) and
 * restarts (dotted) drawn on every chart; polled while the campaign is live.
 * No inline script or style: the page's CSP allows this file and uPlot only. */
(() => {
  "use strict";
  const box = document.getElementById("campaign-charts");
  if (!box) return;
  const statusLine = document.getElementById("campaign-status");
  const pollMs = Math.max(1000, Number(box.dataset.pollMs) || 3000);
  const PALETTE = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7480", "#57606a"];
  const plots = new Map();
  let latest = null;
  let version = 0;

  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text != null) node.textContent = text;
    return node;
  };
  // Units (static/js/units.js): axis titles, and ticks in each key's format.
  const units = window.MarinUnits;
  const short = (v) => units.tick("count", v);
  const metaOf = (key) => ((latest && latest.metrics) || {})[key] || { label: key, title: key, unit: "", format: "number" };
  const pct = (v) => (v == null || !isFinite(v) ? "–" : `${(100 * v).toFixed(1)}%`);
  const duration = (s) => {
    if (s == null || !isFinite(s)) return "–";
    const minutes = Math.floor(s / 60);
    const days = Math.floor(minutes / 1440);
    const hours = Math.floor((minutes % 1440) / 60);
    if (days) return `${days} d ${hours} h`;
    if (hours) return `${hours} h ${minutes % 60} min`;
    return `${minutes} min`;
  };
  const setText = (id, text) => { const node = document.getElementById(id); if (node) node.textContent = text; };
  const width = (target) => Math.max(240, target.clientWidth || 600);

  /** Intervention (dashed) and restart (dotted) lines at x values, with labels. */
  const markers = (xOf) => {
    const out = [];
    for (const i of latest.interventions || []) {
      const x = xOf(i);
      if (x != null) out.push({ x, kind: "intervention", label: i.title, id: i.id });
    }
    for (const r of (latest.restarts || []).slice(1)) {
      const x = xOf(r);
      if (x != null) out.push({ x, kind: "restart", label: `attempt ${r.order} (${r.phase})`, id: r.run });
    }
    return out;
  };
  const drawMarkers = (u, list) => {
    const ctx = u.ctx;
    const { top, height } = u.bbox;
    ctx.save();
    for (const m of list) {
      const x = u.valToPos(m.x, "x", true);
      if (!isFinite(x) || x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.strokeStyle = m.kind === "intervention" ? "#bc4c00" : "#57606a";
      ctx.setLineDash(m.kind === "intervention" ? [6, 4] : [2, 3]);
      ctx.lineWidth = 1.5 * devicePixelRatio;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
    }
    ctx.restore();
  };
  /** The annotations as elements too: readable labels, hover titles, and testable. */
  const placeLabels = (u, list, layer) => {
    layer.replaceChildren();
    for (const m of list) {
      const left = u.valToPos(m.x, "x");
      if (!isFinite(left) || left < 0 || left > u.over.clientWidth) continue;
      const tag = el("span", `annotation annotation-${m.kind}`, m.kind === "intervention" ? "▼" : "↻");
      tag.title = m.label;
      tag.dataset.annotation = m.kind;
      tag.dataset.id = String(m.id);
      tag.style.left = `${left}px`;
      layer.append(tag);
    }
  };

  const plot = (figure, opts, data, list) => {
    const target = figure.querySelector(".chart-plot");
    const old = plots.get(figure);
    if (old && old.sig === opts.sig) {
      old.list = list;
      old.plot.setData(data); // the labels follow in the draw hook, once the scales moved
      figure.dataset.drawn = "true";
      return;
    }
    if (old) old.plot.destroy();
    target.replaceChildren();
    const state = { sig: opts.sig, list };
    const u = new uPlot(
      {
        width: width(target),
        height: window.innerWidth < 600 ? 200 : 240,
        scales: {
          x: { time: false, distr: opts.logX ? 3 : 1 },
          y: opts.fromZero ? { range: (self, min, max) => [0, Math.max(1, max)] } : { distr: opts.logY ? 3 : 1 },
        },
        series: opts.series,
        bands: opts.bands || [],
        legend: { show: false },
        cursor: { drag: { x: true, y: false, setScale: true }, points: { show: false } },
        axes: [
          { values: units.ticks(opts.xFormat || "count", figure, "xTicks") },
          { size: 64, values: units.ticks(opts.yFormat || "number", figure, "yTicks") },
        ],
        hooks: {
          draw: [(self) => {
            drawMarkers(self, state.list);
            if (state.layer) placeLabels(self, state.list, state.layer);
          }],
        },
      },
      data,
      target,
    );
    state.plot = u;
    state.layer = el("div", "annotations");
    u.over.append(state.layer);
    placeLabels(u, list, state.layer);
    plots.set(figure, state);
    figure.dataset.drawn = "true";
  };

  const xName = () => (latest.x === "tokens" ? "tokens" : "step");
  const xTitle = () => (latest.x === "tokens" ? "Tokens seen" : "Step");
  const xOfEvent = (e) => (latest.x === "tokens" ? e.tokens : e.step);

  const drawKey = (figure) => {
    const s = (latest.series || {})[figure.dataset.chartKey];
    if (!s || !s.step || !s.step.length) { figure.dataset.drawn = "false"; return; }
    const xs = latest.x === "tokens" && s.tokens ? s.tokens : s.step;
    const colour = PALETTE[0];
    const series = [
      { label: xName() },
      { label: figure.dataset.chartKey, stroke: colour, width: 1.5, spanGaps: true },
      { label: "max", stroke: "rgba(0,0,0,0)", points: { show: false } },
      { label: "min", stroke: "rgba(0,0,0,0)", points: { show: false } },
    ];
    const data = [xs, s.value, s.max || s.value, s.min || s.value];
    const meta = metaOf(figure.dataset.chartKey);
    units.axisTitles(figure, meta.title, xTitle());
    plot(figure, { sig: `key|${meta.title}`, series, bands: [{ series: [2, 3], fill: "rgba(31,111,235,0.12)" }], yFormat: meta.format }, data, markers(xOfEvent));
    figure.dataset.points = String(xs.length);
  };

  const drawMixture = (figure) => {
    const keys = latest.mixture || [];
    const first = keys.length ? latest.series[keys[0]] : null;
    if (!first) { figure.dataset.drawn = "false"; return; }
    const xs = latest.x === "tokens" && first.tokens ? first.tokens : first.step;
    const stepsOf = first.step;
    // Each source onto the first source's steps, then summed from the bottom up.
    const layers = keys.map((key) => {
      const s = latest.series[key];
      const at = new Map(s.step.map((step, i) => [step, s.value[i]]));
      return stepsOf.map((step) => at.get(step) ?? null);
    });
    const stacked = [];
    let running = stepsOf.map(() => 0);
    for (const layer of layers) {
      running = running.map((v, i) => v + (layer[i] ?? 0));
      stacked.push(running.slice());
    }
    const series = [{ label: xName() }];
    const bands = [];
    keys.forEach((key, i) => {
      const colour = PALETTE[i % PALETTE.length];
      series.push({ label: key.replace("mixture/weight/", ""), stroke: colour, width: 1, fill: i === 0 ? `${colour}55` : undefined });
      if (i > 0) bands.push({ series: [i + 1, i], fill: `${colour}55` });
    });
    units.axisTitles(figure, "Share of the data (stacked)", xTitle());
    plot(figure, { sig: `mix|${keys.join(",")}`, series, bands, fromZero: true, yFormat: "fraction" }, [xs, ...stacked], markers(xOfEvent));
    const legend = figure.querySelector(".chart-legend");
    if (legend) {
      legend.replaceChildren(...keys.map((key, i) => {
        const item = el("span", "legend-item");
        const swatch = el("span", "swatch");
        swatch.style.backgroundColor = PALETTE[i % PALETTE.length];
        item.append(swatch, document.createTextNode(key.replace("mixture/weight/", "")));
        return item;
      }));
    }
  };

  const projectionData = (() => {
    const node = document.getElementById("projection-data");
    try { return node ? JSON.parse(node.textContent) : null; } catch (error) { return null; }
  })();

  const drawProjection = (figure) => {
    const p = projectionData;
    if (!p || !p.curve) { figure.dataset.drawn = "false"; return; }
    const perToken = latest.flops_per_token;
    const loss = (latest.series || {})[latest.loss_key];
    // One x axis: the projection's grid and the campaign's FLOPs, merged.
    const live = new Map();
    if (loss && loss.tokens && perToken) loss.tokens.forEach((t, i) => { if (t > 0) live.set(t * perToken, loss.value[i]); });
    const grid = new Map(p.curve.flops.map((x, i) => [x, i]));
    const ladder = new Map(p.points.map(([x, y]) => [x, y]));
    const xs = Array.from(new Set([...grid.keys(), ...live.keys(), ...ladder.keys()])).sort((a, b) => a - b);
    // No band (the fit left no degrees of freedom): its edges are empty, nothing is shaded.
    const pick = (name) => xs.map((x) => (grid.has(x) && p.curve[name] ? p.curve[name][grid.get(x)] : null));
    const data = [xs, pick("loss"), pick("high"), pick("low"), xs.map((x) => ladder.get(x) ?? null), xs.map((x) => live.get(x) ?? null)];
    const series = [
      { label: "FLOPs" },
      { label: "projection", stroke: "#8250df", width: 1.5, dash: [6, 4], spanGaps: true },
      { label: "high", stroke: "rgba(0,0,0,0)", spanGaps: true, points: { show: false } },
      { label: "low", stroke: "rgba(0,0,0,0)", spanGaps: true, points: { show: false } },
      { label: "ladder", stroke: "rgba(0,0,0,0)", points: { show: true, size: 8, fill: "#8250df" } },
      { label: "campaign", stroke: PALETTE[0], width: 1.5, spanGaps: true },
    ];
    const flopsMarks = markers((e) => (e.tokens != null && perToken ? e.tokens * perToken : null));
    units.axisTitles(figure, metaOf(latest.loss_key).title, "Training compute (FLOPs)");
    plot(figure, { sig: "projection", series, bands: p.curve.low ? [{ series: [2, 3], fill: "rgba(130,80,223,0.15)" }] : [], logX: true, logY: true, xFormat: "si", yFormat: "number" }, data, flopsMarks);
  };

  const showProgress = (p) => {
    if (!p) return;
    const tokens = document.getElementById("progress-tokens");
    if (tokens) tokens.value = p.tokens_fraction || 0;
    const flops = document.getElementById("progress-flops");
    if (flops) flops.value = p.flops_fraction || 0;
    setText("progress-tokens-text", `${short(p.tokens) || "–"} of ${short(p.target_tokens)} (${pct(p.tokens_fraction)})`);
    setText("progress-flops-text", `${p.flops == null ? "–" : p.flops.toPrecision(3)} of ${p.target_flops.toPrecision(3)} (${pct(p.flops_fraction)})`);
    setText("progress-step", p.step == null ? "–" : String(p.step));
    setText("progress-rate", p.tokens_per_second == null ? "–" : Math.round(p.tokens_per_second).toLocaleString("en"));
    setText("progress-eta", duration(p.eta_seconds));
    if (p.phase) setText("campaign-phase", p.phase);
  };

  /** The attempts' states and the open alerts, from the same poll as the charts. */
  const showAttempts = (restarts) => {
    for (const r of restarts || []) {
      const badge = document.querySelector(`tr[data-run-id="${Number(r.run)}"] [data-attempt-state]`);
      if (!badge || !r.state || badge.textContent === r.state) continue;
      badge.textContent = r.state;
      badge.className = `badge state-${r.state.replace(/[^a-z-]/g, "")}`;
    }
  };
  const showAlerts = (alerts) => {
    const section = document.getElementById("campaign-alerts");
    if (!section || !Array.isArray(alerts)) return;
    const shown = JSON.stringify(alerts.map((a) => [a.title, a.url]));
    if (section.dataset.shown === shown) return;
    section.dataset.shown = shown;
    section.dataset.openAlerts = String(alerts.length);
    const heading = section.querySelector("h2");
    const body = alerts.length ? el("ul", "alerts") : el("p", "muted", "No alerts open.");
    for (const a of alerts) {
      const item = el("li", "alert");
      item.setAttribute("role", "alert");
      const link = el("a", "", a.title);
      if (typeof a.url === "string" && a.url.startsWith("/")) link.href = a.url;
      item.append(link, " ", el("span", "muted small", `since ${String(a.opened_at).slice(0, 16).replace("T", " ")}`));
      body.append(item);
    }
    section.replaceChildren(heading, body);
  };

  const drawAll = () => {
    if (!latest || typeof uPlot === "undefined") return;
    for (const figure of box.querySelectorAll("figure.chart")) {
      const kind = figure.dataset.chartKind;
      if (kind === "mixture") drawMixture(figure);
      else if (kind === "projection") drawProjection(figure);
      else drawKey(figure);
    }
    showProgress(latest.progress);
    showAttempts(latest.restarts);
    showAlerts(latest.alerts);
    box.dataset.version = String(version);
  };

  const load = async () => {
    const url = new URL(box.dataset.seriesUrl, location.href);
    url.searchParams.set("points", "500");
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const data = await response.json();
    latest = data;
    version += 1;
    drawAll();
    return data;
  };

  let live = box.dataset.live === "true";
  const setLive = (value) => {
    live = value;
    box.dataset.live = value ? "true" : "false";
    if (statusLine) statusLine.textContent = value ? "live: updates every few seconds" : "";
  };
  const tick = async () => {
    if (!live) return;
    if (!document.hidden) {
      try {
        const data = await load();
        setLive(Boolean(data.active));
      } catch (error) {
        if (statusLine) statusLine.textContent = "The chart data could not be loaded; retrying.";
      }
    }
    if (live) setTimeout(tick, pollMs);
  };
  const start = () => {
    load().catch(() => { if (statusLine) statusLine.textContent = "The chart data could not be loaded."; });
    if (live) setTimeout(tick, pollMs);
    let resizing = 0;
    window.addEventListener("resize", () => {
      clearTimeout(resizing);
      resizing = setTimeout(() => {
        for (const [figure, state] of plots) state.plot.setSize({ width: width(figure.querySelector(".chart-plot")), height: state.plot.height });
      }, 150);
    });
  };
  if (typeof uPlot === "undefined") window.addEventListener("load", start, { once: true });
  else start();
})();
