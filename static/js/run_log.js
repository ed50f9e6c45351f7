/* marin-site: a run page's log tail, live while the run is not terminal.
 *
 * Polls the runs API's log endpoint (data-log-url) and the run itself (data-run-url) every
 * few seconds; the log arrives as text and goes in through textContent. Once the run has
 * ended it reads the log one last time and stops. No inline script (the site's CSP).
 */
(() => {
  "use strict";

  const box = document.getElementById("run-log");
  if (!box || box.dataset.live !== "true") return;
  const POLL_MS = 3000;
  const TAIL_CHARS = 16384;
  const TERMINAL = new Set(["finished", "failed", "killed", "crashed"]);
  const status = document.getElementById("log-status");
  const badge = document.getElementById("run-state");
  const code = box.querySelector("code") || box;
  const json = { credentials: "same-origin", headers: { Accept: "application/json" } };

  const readLog = async () => {
    const response = await fetch(box.dataset.logUrl, json);
    if (!response.ok) throw new Error(`log: HTTP ${response.status}`);
    const text = String((await response.json()).logs || "");
    if (text) {
      const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
      code.textContent = text.length > TAIL_CHARS ? text.slice(-TAIL_CHARS) : text;
      if (atBottom) box.scrollTop = box.scrollHeight;
    }
  };

  const readState = async () => {
    const response = await fetch(box.dataset.runUrl, json);
    if (!response.ok) throw new Error(`run: HTTP ${response.status}`);
    const state = String((await response.json()).state || "");
    if (badge && state && badge.dataset.state !== state) {
      badge.className = `badge state-${state}`;
      badge.dataset.state = state;
      badge.textContent = state;
    }
    return state;
  };

  const say = (text) => { if (status) status.textContent = text; };

  const tick = async () => {
    if (document.hidden) { setTimeout(tick, POLL_MS); return; }
    let state = "";
    try {
      state = await readState();
      await readLog();
    } catch (error) {
      say("live: retrying");
      setTimeout(tick, POLL_MS);
      return;
    }
    if (TERMINAL.has(state)) {
      box.dataset.live = "false";
      say(`the run ${state}`);
      return;
    }
    say("live: updates every few seconds");
    setTimeout(tick, POLL_MS);
  };
  say("live: updates every few seconds");
  tick();
})();
