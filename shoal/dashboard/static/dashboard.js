// shoal dashboard: renders the state that /events streams (see shoal/dashboard/app.py).
// Charts are small SVG drawings made here, so the page needs nothing from the internet.
"use strict";
const PAGE = document.body.dataset.page;
const main = document.getElementById("main");
const statusEl = document.getElementById("status");
const ringHistory = [];  // [t, messages/s over all workers], kept by the page
let ended = false;

function esc(v) {
  return String(v === null || v === undefined ? "" : v).replace(/[&<>"']/g,
    c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") {
    if (!Number.isInteger(v)) return Math.abs(v) >= 1e4 ? Math.round(v).toLocaleString("en") : v.toPrecision(4).replace(/\.?0+$/, "");
    return v.toLocaleString("en");
  }
  return esc(v);
}
function clock(s) {
  if (s === null || s === undefined) return "?";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), ss = s % 60;
  return (h ? h + ":" + String(m).padStart(2, "0") : m) + ":" + String(ss).padStart(2, "0");
}
function setStatus(cls, text) { statusEl.className = "status " + cls; statusEl.textContent = text; }

// -- charts -------------------------------------------------------------------------------
function lineChart(points, w = 260, h = 70) {
  const pts = points.filter(p => typeof p[1] === "number");
  if (pts.length < 2) return `<svg width="${w}" height="${h}"><text x="4" y="${h / 2}" font-size="11" fill="#889">${pts.length ? fmt(pts[0][1]) : "no data yet"}</text></svg>`;
  const t0 = pts[0][0], t1 = pts[pts.length - 1][0] || t0 + 1;
  let lo = Math.min(...pts.map(p => p[1])), hi = Math.max(...pts.map(p => p[1]));
  if (hi === lo) { lo = Math.min(0, lo); hi = hi > lo ? hi : lo + 1; }
  const x = t => 2 + (w - 4) * (t - t0) / Math.max(1e-9, t1 - t0);
  const y = v => h - 12 - (h - 16) * (v - lo) / (hi - lo);
  const d = pts.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join("");
  return `<svg width="${w}" height="${h}"><path d="${d}" fill="none" stroke="#27a" stroke-width="1.5"/>` +
    `<text x="2" y="${h - 1}" font-size="10" fill="#889">min ${fmt(lo)}</text>` +
    `<text x="${w - 2}" y="10" font-size="10" fill="#889" text-anchor="end">max ${fmt(hi)} · last ${fmt(pts[pts.length - 1][1])}</text></svg>`;
}
function timeline(history, now, span = 60, w = 240, h = 18) {
  // one cell per sample: colour = busy fraction; a red tick where the worker stole work
  let out = `<svg class="timeline" width="${w}" height="${h}"><rect width="${w}" height="${h}" fill="#eef"/>`;
  const cw = Math.max(2, w / span);
  for (const [t, busy, steals] of history) {
    const x = w - (now - t) / span * w - cw;
    if (x < -cw) continue;
    const fill = busy === null ? "#ddd" : `hsl(${140 - 140 * (1 - busy)},55%,${88 - 50 * busy}%)`;
    out += `<rect x="${x.toFixed(1)}" width="${cw.toFixed(1)}" height="${h}" fill="${fill}"><title>busy ${busy === null ? "?" : Math.round(100 * busy) + "%"}, steals ${steals}</title></rect>`;
    if (steals > 0) out += `<path d="M${(x + cw / 2).toFixed(1)},0 l3,5 l-6,0z" fill="#c22"/>`;
  }
  return out + "</svg>";
}
function card(k, v) { return `<div class="card"><div class="v">${v}</div><div class="k">${esc(k)}</div></div>`; }

// -- pages --------------------------------------------------------------------------------
function renderWorkers(st) {
  const p = st.pilot;
  if (!p) { main.innerHTML = "<p>no pilot here</p>"; return; }
  const link = document.getElementById("dask-link");
  link.innerHTML = p.dask_dashboard ? `<a href="${esc(p.dask_dashboard)}" target="_blank">dask dashboard ↗</a>` : "";
  const tot = p.totals || {};
  const now = p.t || Date.now() / 1000;
  if (typeof tot.ring_msgs_per_s === "number" && (!ringHistory.length || ringHistory[ringHistory.length - 1][0] !== now)) {
    ringHistory.push([now, tot.ring_msgs_per_s]);
    if (ringHistory.length > 120) ringHistory.shift();
  }
  const dask = (p.nodes || []).length > 0;
  let html = (p.error ? `<div class="error-box">${esc(p.error)}</div>` : "") +
    `<div class="cards">${card("backend", esc(p.backend))}${card("workers", p.workers.length)}` +
    `${dask ? card("hosts", Object.keys(p.hosts || {}).length) : ""}${card("tasks run", fmt(tot.tasks))}${card("busy (mean)", tot.busy === null || tot.busy === undefined ? "–" : fmt(tot.busy) + "%")}` +
    `${card("steals local / remote", `<span id="steals-local">${fmt(tot.stolen_local)}</span> / <span id="steals-remote">${fmt(tot.stolen_remote)}</span>`)}` +
    `${card("ring messages/s", fmt(tot.ring_msgs_per_s))}${card("workers replaced", fmt(tot.replaced))}` +
    `${card("outstanding tasks", fmt((p.driver || {}).outstanding))}` +
    // an elastic pilot (jobs=(low, high)): its jobs now and its newest decision with the reason
    `${(p.driver || {}).elastic ? card(`batch jobs (${p.driver.elastic.low}:${p.driver.elastic.high})`, `<span id="elastic-jobs">${fmt(p.driver.elastic.jobs)}</span>` +
      ((p.driver.elastic.decisions || []).length ? `<div class="muted" id="elastic-last">${esc(p.driver.elastic.decisions.slice(-1)[0].action + ": " + p.driver.elastic.decisions.slice(-1)[0].reason)}</div>` : "")) : ""}</div>`;
  html += `<h2>Workers</h2><table id="workers"><thead><tr>${dask ? '<th class="text">host</th><th class="text">dask worker</th>' : ""}` +
    `<th>worker</th><th>pid</th><th>CPU</th><th>NUMA node</th><th class="text">state</th><th>tasks</th>` +
    `<th>busy %</th><th>CPU %</th><th>queued</th><th>stolen local</th><th>stolen remote</th><th>ring msgs/s</th>` +
    `<th class="text">replaced</th><th class="text">last minute (busy; ▼ steal)</th></tr></thead><tbody>`;
  for (const r of p.workers) {
    html += `<tr class="worker${r.replaced ? " replaced" : ""}" data-worker="${esc(r.worker)}" data-pid="${esc(r.pid)}">` +
      (dask ? `<td class="text host">${esc(r.host || "?")}</td><td class="text node-addr">${esc(r.dask_worker)}</td>` : "") +
      `<td class="worker-id">${esc(r.worker)}</td><td class="pid">${esc(r.pid)}</td><td class="cpu">${fmt(r.cpu)}</td>` +
      `<td class="node">${fmt(r.node)}</td><td class="text state state-${esc(r.state)}">${esc(r.state)}</td>` +
      `<td class="tasks">${fmt(r.tasks_total)}</td><td class="busy">${fmt(r.busy)}</td><td>${fmt(r.cpu_percent)}</td>` +
      `<td>${fmt(r.queued)}</td><td>${fmt(r.stolen_local)}</td><td>${fmt(r.stolen_remote)}</td><td>${fmt(r.ring_msgs_per_s)}</td>` +
      `<td class="text replaced-info">${r.replaced ? `replaced ${r.replaced}× (was pid ${r.previous_pids.map(esc).join(", ")})` : ""}</td>` +
      `<td class="text">${timeline(r.history, now)}</td></tr>`;
  }
  html += "</tbody></table>";
  html += `<h2>Ring traffic (all workers, messages/s)</h2><figure>${lineChart(ringHistory, 520, 90)}</figure>`;
  html += `<figure><figcaption>steals by locality</figcaption>${stealBars(tot)}</figure>`;
  main.innerHTML = html;
}
function stealBars(tot) {
  const l = tot.stolen_local || 0, r = tot.stolen_remote || 0, m = Math.max(1, l + r);
  return `<div>same NUMA node <span class="bar" style="width:${(200 * l / m).toFixed(0)}px"></span> ${fmt(l)}</div>` +
    `<div>other node <span class="bar failed" style="width:${(200 * r / m).toFixed(0)}px"></span> ${fmt(r)}</div>`;
}

function renderProgress(st) {
  const board = (st.pilot || {}).progress || (st.journal || {}).progress || st.progress || {};
  const topics = Object.keys(board);
  if (!topics.length) {
    main.innerHTML = `<p class="muted" id="no-topics">Nothing published yet. Skeletons (search, all_pairs) publish while they run; ` +
      `your code can too: <code>shoal.publish("train", epoch=3, loss=0.41)</code>.</p>`;
    return;
  }
  let html = "";
  for (const topic of topics) {
    let recs = board[topic];
    const lastRun = recs.length ? recs[recs.length - 1].run : undefined;
    if (lastRun !== undefined) recs = recs.filter(r => r.run === lastRun);  // the latest call only
    const last = recs[recs.length - 1] || {};
    const fields = Object.keys(last).filter(k => k !== "t" && k !== "seq" && k !== "run");
    html += `<section class="topic" data-topic="${esc(topic)}"><h2>${esc(topic)} <span class="muted">${esc(last.state || "")}</span></h2>`;
    html += `<table class="latest"><tr>${fields.map(k => `<th>${esc(k.replace(/_/g, " "))}</th>`).join("")}</tr>` +
      `<tr>${fields.map(k => `<td data-field="${esc(k)}">${fmt(last[k])}</td>`).join("")}</tr></table><div class="charts">`;
    for (const k of fields) {
      if (typeof last[k] !== "number" || k === "elapsed_s") continue;
      html += `<figure data-field="${esc(k)}"><figcaption>${esc(k.replace(/_/g, " "))} over time</figcaption>` +
        `${lineChart(recs.map(r => [r.t, r[k]]))}</figure>`;
    }
    html += "</div></section>";
  }
  main.innerHTML = html;
}

function renderJournal(st) {
  const j = st.journal;
  if (!j) { main.innerHTML = "<p>no journal here</p>"; return; }
  if (j.error) {
    main.innerHTML = `<div class="error-box" id="journal-error">${esc(j.error)}</div>`;
    return;
  }
  const c = j.counts, states = Object.keys(c);
  const ens = (((st.pilot || {}).progress || j.progress || {}).ensemble || []).slice(-1)[0];
  const total = j.total || (ens && ens.total) || null;
  const eta = j.eta_s !== null && j.eta_s !== undefined ? j.eta_s : (ens ? ens.eta : null);
  let html = `<p class="muted">journal <code id="journal-path">${esc(j.path)}</code> · ${j.finished ? "finished" : "in progress"}</p>`;
  if ((j.malformed || []).length) {
    html += `<div class="error-box" id="journal-malformed"><b>malformed rows in this journal</b> (not written by shoal, or damaged):` +
      `<ul>${j.malformed.map(m => `<li>${esc(m)}</li>`).join("")}</ul></div>`;
  }
  html += `<div class="cards" id="journal-summary">` + states.map(s => card(s, `<span class="count-${esc(s)}">${fmt(c[s])}</span>`)).join("") +
    card("settled / known" + (total ? " / total" : ""), `${fmt(j.settled)} / ${fmt(j.known)}${total ? " / " + fmt(total) : ""}`) +
    card("tasks/s", fmt(j.rate)) + card("elapsed", clock(j.elapsed_s)) +
    (j.driver ? card("driver", `<span id="driver">${esc(j.driver)}</span>${j.interrupted ? " · " + fmt(j.interrupted) + " interrupted" : ""}`) : "") +
    card("ETA", `<span id="eta">${j.finished ? "done" : clock(eta)}</span>`) + `</div>`;
  const table = (id, title, rows, labels) => {
    let t = `<h2>${title}</h2><table id="${id}"><tr><th class="text">${title.toLowerCase().replace(/s$/, "")}</th>` +
      (labels ? `<th class="text">state</th>` : "") +
      states.map(s => `<th>${esc(s)}</th>`).join("") + `<th class="text">progress</th></tr>`;
    for (const [name, cs] of Object.entries(rows)) {
      const n = Object.values(cs).reduce((a, b) => a + b, 0) || 1;
      t += `<tr data-name="${esc(name)}"><td class="text">${esc(name)}</td>` +
        (labels ? `<td class="text label">${esc(labels[name] || "")}</td>` : "") +
        states.map(s => `<td class="${esc(s)}">${fmt(cs[s])}</td>`).join("") +
        `<td class="text">${states.map(s => cs[s] ? `<span class="bar ${esc(s)}" style="width:${(160 * cs[s] / n).toFixed(0)}px"></span>` : "").join("")}</td></tr>`;
    }
    return t + "</table>";
  };
  html += table("pipelines", "Pipelines", j.pipelines) + table("stages", "Stages", j.stages, j.labels || {});
  html += `<h2>Failures (${fmt(c.failed)})</h2><div id="failures">`;
  for (const f of j.failures) {
    // the line shoal status prints: the reason once, no "exit code None"
    html += `<details class="failure" data-uid="${esc(f.uid)}" open><summary>${esc(f.line)}</summary>` +
      `<pre class="stderr">${esc(f.stderr_tail || "(no stderr)")}</pre></details>`;
  }
  if (!j.failures.length) html += `<p class="muted">none</p>`;
  html += "</div>";
  const recent = j.recent || [];  // the attempts that ended last, with what they used (newest first)
  if (recent.length) {
    const mib = b => b === null || b === undefined ? "-" : (b / 1048576).toFixed(1) + " MiB";
    const sec = s => s === null || s === undefined ? "-" : s.toFixed(2);
    html += `<h2>Latest attempts</h2><table id="recent"><tr><th class="text">task</th><th>try</th><th class="text">state</th>` +
      `<th class="text">host</th><th class="text">node</th><th>secs</th><th>cpu s</th><th>peak rss</th></tr>` +
      recent.map(a => `<tr data-uid="${esc(a.uid)}"><td class="text">${esc(a.uid)}</td><td>${fmt(a.attempt)}</td>` +
        `<td class="text ${esc(a.state)}">${esc(a.state)}</td><td class="text host">${esc(a.host || "-")}</td>` +
        `<td class="text">${esc(a.node || "-")}</td><td>${sec(a.seconds)}</td><td class="cpu">${sec(a.cpu)}</td>` +
        `<td class="rss">${mib(a.max_rss)}</td></tr>`).join("") + "</table>";
  }
  const jobs = j.job_events || [];  // a dask pilot's batch jobs: grow, shrink, queue state (newest first)
  if (jobs.length) {
    html += `<h2>Batch jobs</h2><table id="job-events"><tr><th class="text">time</th><th class="text">what happened, and why</th></tr>` +
      jobs.map(e => `<tr class="${esc((e.level || "").toLowerCase())}"><td class="text">${esc(new Date(1000 * e.t).toLocaleTimeString())}</td><td class="text">${esc(e.text)}</td></tr>`).join("") +
      "</table>";
  }
  main.innerHTML = html;
}

// The graph page: the server lays the journal's workflow out with Graphviz (/api/graph.svg);
// the picture is fetched again when the journal's counts change, at most every 2 s, and shown
// as an <img> (an SVG there runs no script, whatever a journal's names hold).
let graphKey = null, graphAt = 0, graphUrl = null;
function renderGraph(st) {
  const j = st.journal || {};
  const key = JSON.stringify([j.counts, j.stages]);
  if (!document.getElementById("graph-box")) {
    main.innerHTML = `<p class="muted">pipelines, stages and tasks of ${esc(j.path || "the journal")}, coloured by state; ` +
      `a stage of many tasks is one box with its counts. <a href="/api/graph.svg">SVG</a></p>` +
      `<div class="legend">${["pending", "running", "done", "failed", "skipped", "canceled"].map(s => `<span class="swatch state-${s}">${s}</span>`).join(" ")}</div>` +
      `<div id="graph-box">drawing…</div>`;
  }
  const now = Date.now();
  if (key === graphKey || now - graphAt < 2000) return;
  graphKey = key; graphAt = now;
  fetch("/api/graph.svg", {cache: "no-store"}).then(async r => {
    const box = document.getElementById("graph-box");
    if (!r.ok) { box.innerHTML = `<div class="error-box">${esc(await r.text())}</div>`; return; }
    const url = URL.createObjectURL(await r.blob());
    box.innerHTML = `<img id="graph" alt="the workflow's graph" src="${url}">`;
    if (graphUrl) URL.revokeObjectURL(graphUrl);
    graphUrl = url;
  }).catch(e => { graphKey = null; });
}

const RENDER = {workers: renderWorkers, progress: renderProgress, journal: renderJournal, graph: renderGraph};

function onState(st) {
  try { RENDER[PAGE](st); } catch (e) { main.innerHTML = `<div class="error-box">render error: ${esc(e)}</div>`; }
  if (st.closed) {
    const when = (st.pilot || {}).closed_at;
    setStatus("closed", "pilot closed" + (when ? " at " + new Date(when * 1000).toLocaleTimeString() : "") + " — final numbers shown");
    document.body.dataset.closed = "1";
  } else if ((st.journal || {}).error && (PAGE === "journal" || PAGE === "graph")) {
    setStatus("error", "journal error");
  } else {
    setStatus("live", "live · " + new Date().toLocaleTimeString());
  }
}

// The live stream; the server drops a page that stops reading (a suspended laptop) and says
// so when it reconnects ("dropped"); past its cap on open pages it refuses the stream (503)
// and this page polls /api/state every 5 s instead.
let dropNote = "";
let polling = null;
function poll() {
  fetch("/api/state", {cache: "no-store"}).then(r => r.json()).then(st => {
    onState(st);
    if (!st.closed) setStatus("lost", "too many live pages open on this dashboard: refreshing every 5 s (" + new Date().toLocaleTimeString() + ")");
    else clearInterval(polling);
  }).catch(() => setStatus("lost", "the server is gone"));
}
const es = new EventSource("/events");
es.onmessage = ev => {
  onState(JSON.parse(ev.data));
  if (dropNote && !document.body.dataset.closed) setStatus("live", "live · " + new Date().toLocaleTimeString() + " · " + dropNote);
};
es.addEventListener("dropped", ev => {
  const d = JSON.parse(ev.data);
  dropNote = "reconnected: the server had dropped this page at " + new Date(d.at * 1000).toLocaleTimeString() + " because " + d.reason;
  document.body.dataset.dropped = "1";
  setStatus("lost", dropNote);
});
es.addEventListener("end", () => { ended = true; es.close(); });
es.onerror = () => {
  if (ended || document.body.dataset.closed) { es.close(); return; }
  if (es.readyState === EventSource.CLOSED && polling === null) {  // refused, not lost: poll
    polling = setInterval(poll, 5000);
    poll();
    return;
  }
  setStatus("lost", "connection lost (the pilot or the server is gone); retrying…");
};
