// The master's status page: polls api/job and api/series every second and redraws in place.
// Every URL is relative, so the page works under a prefix too (the Job Server's proxy).
// Everything shown is set with textContent or SVG attributes (never innerHTML): names, reasons
// and addresses come from trainers and users, so they are escaped by construction.
"use strict";

const REFRESH_MS = 1000;
const COLORS = ["#2b7bd6", "#c93434", "#2e9b4f", "#e6a23c", "#8a4fc9", "#555555"];
const SVG_NS = "http://www.w3.org/2000/svg";

// A `?token=` given once is kept for the tab in sessionStorage and taken out of the address bar.
(function keepToken() {
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token");
  if (token) {
    sessionStorage.setItem("paddlecloud-token", token);
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
})();

async function getJSON(path) {
  const token = sessionStorage.getItem("paddlecloud-token");
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const reply = await fetch(path, { headers, cache: "no-store" });
  if (!reply.ok) throw new Error(path + ": " + reply.status + " " + (await reply.text()));
  return reply.json();
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function setText(id, text) { document.getElementById(id).textContent = String(text); }

function ago(seconds) {
  if (seconds < 60) return seconds.toFixed(1) + " s";
  if (seconds < 3600) return (seconds / 60).toFixed(1) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

// A few bars at any epoch count (the master sums the older past and the future): the
// plots and the trainers stay on the first screen.
function epochLabel(e) {
  return e.epochs > 1 ? `epochs ${e.epoch}..${e.epoch + e.epochs - 1}` : "epoch " + e.epoch;
}

function epochNumbers(e) {
  if (e.stage === "future") return e.epochs > 1 ? `to come: ${e.epochs} epochs` : "to come";
  const counts = `${e.done} done, ${e.failed} failed`;
  if (e.stage === "current") return `${e.done} done, ${e.pending} pending, ${e.todo} todo, ${e.failed} failed`;
  if (e.unknown === e.epochs) return "ended (its counts are not known to this master)";
  if (e.unknown) return `${counts}; ${e.unknown} ended under another master, not counted`;
  return counts;
}

function renderEpochs(epochs) {
  const box = document.getElementById("epochs");
  const rows = epochs.map((e) => {
    const total = e.done + e.pending + e.todo + e.failed || 1;
    const row = el("div", null, "epoch");
    row.dataset.epoch = e.epoch;
    row.dataset.epochs = e.epochs;
    row.dataset.stage = e.stage;
    row.append(el("span", epochLabel(e), "label"));
    const bar = el("div", null, "bar");
    for (const part of ["done", "pending", "todo", "failed"]) {
      const span = el("span", null, part);
      span.style.width = (100 * e[part] / total) + "%";
      span.title = part + ": " + e[part];
      bar.append(span);
    }
    row.append(bar);
    row.append(el("span", epochNumbers(e), "numbers"));
    return row;
  });
  box.replaceChildren(...rows);
}

function renderTrainers(trainers, omitted) {
  const rows = trainers.map((t) => {
    const tr = el("tr");
    tr.dataset.trainer = t.trainer;
    tr.append(el("td", t.trainer), el("td", t.session ?? "", "operator-only"), el("td", ago(t.session_age_s)),
      el("td", t.tasks.length ? t.tasks.join(", ") : "-"), el("td", ago(t.since_last_call_s) + " ago"),
      el("td", t.restarts));
    return tr;
  });
  document.getElementById("trainers").replaceChildren(...rows);
  const more = document.getElementById("trainers-omitted");
  more.hidden = omitted === 0;
  more.textContent = omitted ? `${omitted} more trainers alive, not listed: listed are the ${trainers.length} ` +
    "longest since their last call, longest first" : "";
}

function renderFailed(tasks) {
  document.getElementById("failed-section").hidden = tasks.length === 0;
  const rows = tasks.map((t) => {
    const tr = el("tr");
    const reasons = t.reasons.map((r) =>
      `epoch ${r.epoch} attempt ${r.attempt} (trainer ${r.trainer}): ${r.reason}`).join("\n");
    tr.append(el("td", t.task), el("td", t.status), el("td", t.failures), el("td", reasons || "-", "reasons"));
    return tr;
  });
  document.getElementById("failed-tasks").replaceChildren(...rows);
}

// Every live master, leader and standbys, as each announces itself in etcd.
function renderMasters(masters, now) {
  const rows = masters.map((m) => {
    const tr = el("tr");
    tr.dataset.master = m.advertise;
    tr.dataset.role = m.role;
    const page = el("td");
    if (/^https?:\/\//.test(m.page)) {  // a link only to a web page: never a javascript: URL
      const link = el("a", m.page);
      link.href = m.page;
      page.append(link);
    } else {
      page.textContent = m.page || "-";
    }
    tr.append(el("td", m.advertise + (m.this ? " (this master)" : "")), el("td", m.role),
      el("td", ago(Math.max(0, now - m.started))), page);
    return tr;
  });
  document.getElementById("masters").replaceChildren(...rows);
}

function renderJob(job) {
  document.title = job.job + " · " + job.phase + " · paddlecloud";
  document.body.classList.toggle("viewer", job.viewer_role !== "operator");
  setText("jobs-list", job.namespace + "/" + job.job);
  setText("job-name", job.job);
  const phase = document.getElementById("phase");
  phase.textContent = job.phase;
  phase.className = "phase " + job.phase;
  const failure = document.getElementById("failure");
  failure.hidden = job.phase !== "Failed";
  failure.textContent = job.phase === "Failed" ? "Failed: " + (job.failure_reason || "no reason known to this master") : "";
  // Epochs count from 0 here as everywhere (logs, trainers, checkpoints); past the last
  // epoch (the job's end) the last one is shown.
  setText("epoch", job.num_epochs ? Math.min(job.epoch, job.num_epochs - 1) : job.epoch);
  setText("num-epochs", job.num_epochs ? "0.." + (job.num_epochs - 1) : "?");
  setText("done", job.counts.done ?? 0);
  setText("num-tasks", job.num_tasks);
  setText("finished", job.finished_total);
  setText("alive", job.trainers_alive);
  setText("requeued", job.requeued);
  const causes = Object.entries(job.requeues_total).filter(([, n]) => n > 0).map(([c, n]) => `${c} ${n}`);
  setText("requeue-causes", causes.length ? "(" + causes.join(", ") + ")" : "");
  setText("restarts", job.trainer_restarts);
  setText("splits", job.splits_this_epoch ?? 0);
  setText("splits-total", job.splits_total ? `(${job.splits_total} since this master leads)` : "");
  setText("this-master", job.this_master);
  setText("master-role", job.role);
  setText("leader", job.leader || "unknown");
  setText("pservers", job.pservers.length ? job.pservers.join(", ") : "none");
  setText("updated", new Date(job.at * 1000).toLocaleTimeString());
  const summary = job.goodput && job.goodput.summary;
  setText("goodput-summary", summary || "no trainer-second counted yet");
  renderEpochs(job.epochs);
  renderTrainers(job.trainers, job.trainers_omitted);
  renderFailed(job.failed_tasks);
  renderMasters(job.masters, job.at);
}

// A plot's size in CSS pixels, with its viewBox set to it: one unit is one pixel, so labels are
// drawn at their CSS size (page.css) whatever the figure's width. A fixed 400-wide viewBox
// scaled them with the figure, to ~6 px in a narrow one.
const PLOT_LEFT = 40, PLOT_BOTTOM = 16;
function frame(svg) {
  const box = svg.getBoundingClientRect();
  const W = Math.round(box.width) || 400, H = Math.round(box.height) || 120;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  return { W, H };
}

// A line plot of one or more series of equal length (one point per second, the last at the right).
function plot(id, lines) {
  const svg = document.getElementById(id);
  const { W, H } = frame(svg), left = PLOT_LEFT, bottom = PLOT_BOTTOM;
  const n = Math.max(1, ...lines.map((l) => l.values.length));
  const top = Math.max(1, ...lines.map((l) => Math.max(0, ...l.values)));
  const nodes = [];
  const axis = document.createElementNS(SVG_NS, "path");
  axis.setAttribute("class", "axis");
  axis.setAttribute("d", `M${left},2 V${H - bottom} H${W}`);
  nodes.push(axis);
  const label = (x, y, text, anchor) => {
    const t = document.createElementNS(SVG_NS, "text");
    t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("text-anchor", anchor);
    t.textContent = text;
    nodes.push(t);
  };
  label(left - 4, 12, Number.isInteger(top) ? top : top.toFixed(1), "end");
  label(left - 4, H - bottom, "0", "end");
  label(left, H - 2, "-" + ago(n - 1).replace(".0", ""), "start");
  label(W - 2, H - 2, "now", "end");
  lines.forEach((line, k) => {
    const step = (W - left) / Math.max(1, n - 1);
    const offset = n - line.values.length;
    const points = line.values.map((v, i) =>
      `${(left + (i + offset) * step).toFixed(1)},${(H - bottom - (v / top) * (H - bottom - 4)).toFixed(1)}`);
    const poly = document.createElementNS(SVG_NS, "polyline");
    poly.setAttribute("points", points.join(" "));
    poly.setAttribute("stroke", COLORS[k % COLORS.length]);
    poly.dataset.series = line.name;
    nodes.push(poly);
  });
  svg.replaceChildren(...nodes);
}

function renderSeries(s) {
  plot("plot-finished", [{ name: "finished", values: s.finished_per_s }]);
  const causes = Object.keys(s.requeues);
  plot("plot-requeues", causes.map((c) => ({ name: c, values: s.requeues[c] })));
  const legend = document.getElementById("plot-requeues-legend");
  legend.replaceChildren(...causes.map((c, k) => el("span", " " + c, "k" + (k % COLORS.length))));
  plot("plot-alive", [{ name: "alive", values: s.trainers_alive }]);
  plot("plot-restarts", [{ name: "trainers", values: s.trainer_restarts },
                          { name: "groups", values: s.group_restarts },
                          { name: "resizes", values: s.resizes }]);
}

// A stacked area plot of the goodput history: between two points, the trainer-seconds each
// cause gained over the seconds between them, i.e. how many trainers were in that cause; the
// stack's height is the job's trainer slots.
const CAUSE_COLORS = { productive: "#2e9b4f", startup: "#9aa5b1", restart: "#c93434",
  starting: "#e6a23c", checkpoint: "#2b7bd6", data_wait: "#8a4fc9", straggler: "#d6792b",
  idle: "#c9c34f", recomputed: "#7a1f1f", failover: "#555555" };

function goodputLayers(h) {
  const layers = h.causes.map((c) => ({ name: c, values: [] }));
  for (let i = 1; i < h.at.length; i++) {
    const dt = h.at[i] - h.at[i - 1];
    h.causes.forEach((c, k) => {
      const gained = h.seconds[c][i] - h.seconds[c][i - 1];
      layers[k].values.push(dt > 0 ? Math.max(0, gained) / dt : 0);
    });
  }
  return layers;
}

function renderGoodput(h) {
  const svg = document.getElementById("plot-goodput");
  const layers = goodputLayers(h).filter((l) => l.values.some((v) => v > 0.001));
  const n = layers.length ? layers[0].values.length : 0;
  const { W, H } = frame(svg), left = PLOT_LEFT, bottom = PLOT_BOTTOM;
  const tops = Array.from({ length: n }, (_, i) => layers.reduce((sum, l) => sum + l.values[i], 0));
  const top = Math.max(1, ...tops);
  const x = (i) => (left + (n > 1 ? i / (n - 1) : 0) * (W - left)).toFixed(1);
  const y = (v) => (H - bottom - (v / top) * (H - bottom - 4)).toFixed(1);
  const nodes = [];
  const axis = document.createElementNS(SVG_NS, "path");
  axis.setAttribute("class", "axis");
  axis.setAttribute("d", `M${left},2 V${H - bottom} H${W}`);
  nodes.push(axis);
  const below = new Array(n).fill(0);
  for (const layer of layers) {
    const above = below.map((b, i) => b + layer.values[i]);
    const edge = above.map((v, i) => `${x(i)},${y(v)}`);
    const back = below.map((v, i) => `${x(i)},${y(v)}`).reverse();
    const area = document.createElementNS(SVG_NS, "polygon");
    area.setAttribute("points", [...edge, ...back].join(" "));
    area.setAttribute("fill", CAUSE_COLORS[layer.name] || "#999");
    area.dataset.series = layer.name;
    nodes.push(area);
    above.forEach((v, i) => { below[i] = v; });
  }
  const t = document.createElementNS(SVG_NS, "text");
  t.setAttribute("x", left - 4); t.setAttribute("y", 12); t.setAttribute("text-anchor", "end");
  t.textContent = Number.isInteger(top) ? top : top.toFixed(1);
  nodes.push(t);
  svg.replaceChildren(...nodes);
  const legend = document.getElementById("plot-goodput-legend");
  legend.replaceChildren(...layers.map((l) => {
    const key = el("span", " " + l.name);
    key.style.color = CAUSE_COLORS[l.name] || "#999";
    return key;
  }));
}

async function refresh() {
  const started = performance.now();
  try {
    const [job, series, goodput] = await Promise.all(
      [getJSON("api/job"), getJSON("api/series"), getJSON("api/goodput")]);
    const fetched = performance.now();
    renderJob(job);
    renderSeries(series);
    renderGoodput(goodput);
    document.getElementById("offline").hidden = true;
    // Read by the benchmark: fetch + draw, and draw alone (the browser lays out after).
    window.lastRefreshMs = performance.now() - started;
    window.lastDrawMs = performance.now() - fetched;
    window.renders = (window.renders || 0) + 1;
  } catch (error) {
    const offline = document.getElementById("offline");
    offline.hidden = false;
    offline.textContent = "the master does not answer (" + error.message + "); retrying";
  }
  setTimeout(refresh, REFRESH_MS);
}

refresh();
