// hoss operator dashboard: renders the dispatcher's /status every 2 s. No other data source, no dependencies.
// Everything that comes from the cluster (pod names, messages) is set as text, never parsed as markup.
"use strict";

const REFRESH_MS = 2000;
const FETCH_TIMEOUT_MS = 5000;
const NODES_SHOWN = 1000;
const GPU = "nvidia.com/gpu";
const ALLOWED = new Set(["reserved", "fits", "not-enforced", "not-a-binding"]);
const SVG_NS = "http://www.w3.org/2000/svg";

const $ = (testid) => document.querySelector(`[data-testid="${testid}"]`);

// Counters of the previous refresh, to derive each worker's pods/s between refreshes.
let previousCounters = new Map();
let renders = 0;

// --- small DOM helpers ---------------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = String(value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function setText(testid, text, value) {
  const node = $(testid);
  node.textContent = text;
  if (value !== undefined) node.dataset.value = String(value);
}

function fillBody(table, rows, columns, emptyText) {
  const body = table.tBodies[0];
  if (rows.length === 0) {
    body.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: columns, text: emptyText })));
  } else {
    body.replaceChildren(...rows);
  }
}

// --- formatting ----------------------------------------------------------------------------------------------

function fmtInt(n) {
  return Number(n).toLocaleString("en-US");
}

function fmtRate(n) {
  if (n >= 100) return n.toFixed(0);
  if (n >= 10) return n.toFixed(1);
  return n.toFixed(2);
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, seconds);
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d`;
}

const BYTE_RESOURCES = new Set(["memory", "ephemeral-storage"]);

// Base units (milli-CPU, bytes, counts) as people read them.
function fmtQuantity(resource, units) {
  if (resource === "cpu") {
    const cores = units / 1000;
    return Number.isInteger(cores) ? String(cores) : cores.toFixed(1);
  }
  if (BYTE_RESOURCES.has(resource) || resource.startsWith("hugepages-")) {
    const steps = [["Ti", 2 ** 40], ["Gi", 2 ** 30], ["Mi", 2 ** 20], ["Ki", 2 ** 10]];
    for (const [suffix, size] of steps) {
      if (units >= size) {
        const value = units / size;
        return `${Number.isInteger(value) ? value : value.toFixed(1)}${suffix}`;
      }
    }
    return String(units);
  }
  return fmtInt(units);
}

function share(used, alloc) {
  if (!alloc) return used > 0 ? 1 : 0;
  return used / alloc;
}

function shortName(resource) {
  return { cpu: "cpu", memory: "mem", pods: "pods", [GPU]: "gpu", "ephemeral-storage": "disk" }[resource]
    || resource.replace(/^.*\//, "").slice(0, 5);
}

// --- sections ------------------------------------------------------------------------------------------------

function renderHeader(status) {
  const role = $("role");
  role.textContent = status.leader ? "leader" : `follower (leader: ${status.leader_identity || "none"})`;
  role.className = `badge ${status.leader ? "ok" : "warn"}`;
  const redis = $("redis");
  redis.textContent = status.redis === "ok" ? "redis ok" : "redis unreachable";
  redis.className = `badge ${status.redis === "ok" ? "ok" : "bad"}`;
  redis.title = status.redis;
  setText("identity", `dispatcher ${status.identity}`);
  const updated = $("last-update");
  updated.textContent = `updated ${new Date((status.generated_unix || Date.now() / 1000) * 1000).toLocaleTimeString()}`;
  updated.dataset.generated = String(status.generated_unix ?? "");
}

function renderBanner(problems) {
  const banner = $("banner");
  if (problems.length === 0) {
    banner.hidden = true;
    banner.dataset.state = "ok";
    banner.textContent = "";
    return;
  }
  banner.hidden = false;
  banner.dataset.state = problems[0].state;
  banner.textContent = problems.map((p) => p.text).join(" · ");
}

function statusProblems(status) {
  const problems = [];
  if (status.redis !== "ok") {
    problems.push({ state: "redis", text: `Redis ${status.redis}: workers, ledger and resolver data are missing; `
      + "scheduling pauses until Redis answers." });
  }
  if (!status.leader) {
    problems.push({ state: "not-leader", text: `This dispatcher (${status.identity}) is not the leader `
      + `(leader: ${status.leader_identity || "none"}): it does not dispatch; queues shown are its own view.` });
  }
  return problems;
}

function renderKpis(status) {
  const t = status.throughput;
  setText("bound-total", fmtInt(t.bound_total), t.bound_total);
  setText("rate-1m", fmtRate(t.bound_per_second_1m), t.bound_per_second_1m);
  setText("dispatched-total", fmtInt(t.dispatched_total), t.dispatched_total);
  const pendingTotal = status.pending ? status.pending.total : status.queues.pending_total;
  setText("pending-total", fmtInt(pendingTotal), pendingTotal);
  const alive = status.workers.filter((w) => w.alive).length;
  setText("workers-alive", `${alive} / ${status.workers.length}`, alive);
  setText("conflicts", fmtInt(status.conflicts), status.conflicts);
  const verdicts = status.resolver ? status.resolver.verdicts : {};
  const denied = Object.entries(verdicts).filter(([reason]) => !ALLOWED.has(reason)).reduce((a, [, n]) => a + n, 0);
  setText("denials-total", status.resolver ? fmtInt(denied) : "–", denied);
  const ledger = status.ledger;
  setText("ledger", ledger ? (ledger.ready ? "ready" : "NOT READY") : "–", ledger ? String(ledger.ready) : "");
  setText("ledger-nodes", ledger ? `(${fmtInt(ledger.nodes)} nodes)` : "");
  $("ledger").classList.toggle("bad", Boolean(ledger && !ledger.ready));
}

function renderChart(status) {
  const box = $("throughput-chart");
  const t = status.throughput;
  const history = t.history || [];
  const width = 800;
  const height = 150;
  const pad = { left: 38, right: 8, top: 8, bottom: 18 };
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img",
    "aria-label": "bound pods per second over the last 10 minutes" });
  const end = status.generated_unix || (history.length ? history[history.length - 1].at : Date.now() / 1000);
  const span = 600;
  const start = end - span;
  const peak = Math.max(1, ...history.map((s) => s.bound_per_second));
  const magnitude = 10 ** Math.floor(Math.log10(peak));
  const top = Math.ceil(peak / magnitude) * magnitude;
  const x = (at) => pad.left + ((at - start) / span) * (width - pad.left - pad.right);
  const y = (v) => pad.top + (1 - v / top) * (height - pad.top - pad.bottom);
  for (const fraction of [0, 0.5, 1]) {
    const value = top * fraction;
    chart.append(svg("line", { class: "grid-line", x1: pad.left, x2: width - pad.right, y1: y(value), y2: y(value) }));
    chart.append(svg("text", { x: pad.left - 4, y: y(value) + 3, "text-anchor": "end" }, fmtRate(value)));
  }
  for (let minutes = 10; minutes >= 0; minutes -= 2) {
    const anchor = minutes === 0 ? "end" : minutes === 10 ? "start" : "middle";
    chart.append(svg("text", { x: x(end - minutes * 60), y: height - 4, "text-anchor": anchor },
      minutes === 0 ? "now" : `-${minutes}m`));
  }
  const points = history.filter((s) => s.at >= start);
  box.dataset.samples = String(points.length);
  box.dataset.peak = String(points.length ? Math.max(...points.map((s) => s.bound_per_second)) : 0);
  if (points.length === 0) {
    chart.append(svg("text", { class: "empty", x: width / 2, y: height / 2, "text-anchor": "middle" },
      "no samples yet"));
  } else {
    const interval = t.history_interval_seconds || 5;
    // Each sample covers the interval before its time: draw it as a step.
    let line = "";
    for (const s of points) {
      const x0 = x(Math.max(start, s.at - interval));
      const x1 = x(s.at);
      const yv = y(s.bound_per_second);
      line += `${line ? "L" : "M"}${x0.toFixed(1)},${yv.toFixed(1)}L${x1.toFixed(1)},${yv.toFixed(1)}`;
    }
    const first = x(Math.max(start, points[0].at - interval)).toFixed(1);
    const last = x(points[points.length - 1].at).toFixed(1);
    const base = y(0).toFixed(1);
    chart.append(svg("path", { class: "area", d: `M${first},${base}${line.replace(/^M/, "L")}L${last},${base}Z` }));
    chart.append(svg("path", { class: "line", d: line }));
  }
  box.replaceChildren(chart);
}

const NOT_ROUTED = "alive, but the leader sends it no new pods: stalled, an unhealthy loop, or started since it "
  + "last read the heartbeats";

function renderWorkers(status, fetchedAt) {
  const rows = [];
  const nextCounters = new Map();
  for (const w of status.workers) {
    const bound = w.counters.bound || 0;
    nextCounters.set(w.id, { bound, at: fetchedAt });
    const before = previousCounters.get(w.id);
    let rate = "–";
    if (w.alive && before && fetchedAt > before.at && bound >= before.bound) {
      rate = fmtRate((bound - before.bound) / ((fetchedAt - before.at) / 1000));
    }
    const unrouted = w.alive && w.routed === false;  // routed is null on a dispatcher that is not the leader
    rows.push(el("tr", { class: w.alive ? "" : "dead", "data-worker": w.id, "data-alive": String(w.alive) },
      el("td", { text: w.id }),
      el("td", unrouted ? { text: "yes, not routed", title: NOT_ROUTED } : { text: w.alive ? "yes" : "DEAD" }),
      el("td", { text: w.policies.join(", ") || "–" }),
      el("td", { class: "num", text: fmtInt(w.queue_depth) }),
      el("td", { class: "num", text: fmtInt(w.in_flight) }),
      el("td", { class: "num", text: fmtInt(w.outstanding) }),
      el("td", { class: "num", "data-testid": "worker-bound", text: fmtInt(bound) }),
      el("td", { class: "num", text: rate }),
      el("td", { class: "num", text: fmtInt(w.counters.conflicts || 0) }),
      el("td", { class: "num", text: fmtAge(w.heartbeat_age_seconds) }),
    ));
  }
  previousCounters = nextCounters;
  fillBody($("workers"), rows, 10, status.redis === "ok" ? "no worker registered" : "unknown: Redis unreachable");
}

function renderResolver(status) {
  const box = $("verdicts");
  const resolver = status.resolver;
  if (!resolver) {
    box.replaceChildren(el("div", { class: "muted", text: "unknown: Redis unreachable" }));
    setText("resolver-instances", "");
    fillBody($("denials"), [], 4, "unknown");
    return;
  }
  setText("resolver-instances", `${resolver.instances.length} instance(s) · verdicts by reason`);
  const entries = Object.entries(resolver.verdicts).sort((a, b) => b[1] - a[1]);
  const most = Math.max(1, ...entries.map(([, n]) => n));
  box.replaceChildren(...(entries.length ? entries.map(([reason, count]) =>
    el("div", { class: `row ${ALLOWED.has(reason) ? "allowed" : "denied"}`, "data-reason": reason },
      el("span", { class: "clip", text: reason, title: reason }),
      el("span", { class: "bar" }, barFill(count / most)),
      el("span", { class: "count", text: fmtInt(count) }),
    )) : [el("div", { class: "muted", text: "no bindings judged yet" })]));
  const now = status.generated_unix || Date.now() / 1000;
  const rows = resolver.recent_denials.slice(0, 12).map((d) =>
    el("tr", { "data-pod": d.pod, title: d.message },
      el("td", {}, el("span", { class: "clip", text: d.pod })),
      el("td", {}, el("span", { class: "clip", text: d.node })),
      el("td", { text: d.reason }),
      el("td", { class: "num", text: fmtAge(now - d.at) }),
    ));
  fillBody($("denials"), rows, 4, "no denials");
}

function barFill(fraction) {
  const fill = el("i");
  fill.style.width = `${Math.min(100, Math.max(0, fraction * 100)).toFixed(1)}%`;
  if (fraction > 1) fill.className = "over";
  return fill;
}

function renderGpu(status) {
  const box = $("gpu-summary");
  const gpu = status.gpu;
  if (!gpu || gpu.gpu_nodes === 0) {
    box.replaceChildren(el("h2", { text: "GPUs" }), el("div", { class: "muted", text: gpu ? "no GPU nodes" : "unknown" }));
    box.dataset.stranded = gpu ? "0" : "";
    return;
  }
  box.dataset.stranded = String(gpu.stranded_gpus);
  const frag = el("div", { class: "frag", title: "GPU nodes: fully free / partly used / full" });
  for (const [cls, n] of [["f-free", gpu.fully_free_nodes], ["f-partly", gpu.partly_used_nodes], ["f-full", gpu.full_nodes]]) {
    const part = el("i", { class: cls });
    part.style.width = `${(100 * n) / gpu.gpu_nodes}%`;
    frag.append(part);
  }
  const fact = (label, value, cls) => el("span", { class: cls || "" }, `${label} `, el("b", { text: value }));
  box.replaceChildren(
    el("h2", {}, "GPUs ", el("span", { class: "muted", text: `${fmtInt(gpu.used_gpus)} / ${fmtInt(gpu.gpus)} in use` })),
    frag,
    el("div", { class: "facts" },
      fact("GPU nodes", fmtInt(gpu.gpu_nodes)),
      fact("fully free", fmtInt(gpu.fully_free_nodes)),
      fact("partly used", fmtInt(gpu.partly_used_nodes)),
      fact("full", fmtInt(gpu.full_nodes)),
      fact("stranded GPUs", fmtInt(gpu.stranded_gpus), "stranded"),
    ),
  );
}

function usage(resources, resource) {
  const total = resources[resource];
  if (!total || !total.alloc) return "–";
  return `${fmtQuantity(resource, total.used)} / ${fmtQuantity(resource, total.alloc)} `
    + `(${Math.round(100 * share(total.used, total.alloc))}%)`;
}

function renderPools(status) {
  // Pools only when nodes carry the label: one unnamed pool says nothing the totals do not.
  $("pools").hidden = status.pools.every((p) => p.name === null);
  const rows = status.pools.map((p) =>
    el("tr", { "data-pool": p.name ?? "" },
      el("td", { text: p.name ?? "(no pool)" }),
      el("td", { class: "num", text: fmtInt(p.nodes) }),
      el("td", { text: usage(p.resources, "cpu") }),
      el("td", { text: usage(p.resources, "memory") }),
      el("td", { text: usage(p.resources, GPU) }),
    ));
  fillBody($("pools"), rows, 5, status.redis === "ok" ? "no nodes" : "unknown");
}

function nodeCard(node) {
  const gpus = node.alloc[GPU] || 0;
  const card = el("div", { class: gpus ? "node gpu" : "node", "data-node": node.name, "data-gpu": String(gpus > 0),
    "data-bound": node.bound, "data-assumed": node.assumed });
  card.append(
    el("div", { class: "name", text: node.name, title: node.name }),
    el("div", { class: "meta" },
      el("span", { text: node.pool ?? "no pool" }),
      el("span", {}, `b${node.bound}`, node.assumed ? el("span", { class: "assumed", text: ` a${node.assumed}` }) : ""),
    ),
  );
  const resources = ["cpu", "memory", "pods", ...Object.keys(node.alloc).filter(
    (r) => !["cpu", "memory", "pods", GPU].includes(r) && node.alloc[r] > 0 && r !== "ephemeral-storage")];
  for (const resource of resources) {
    if (!(resource in node.alloc)) continue;
    const used = node.used[resource] || 0;
    const alloc = node.alloc[resource];
    const row = el("div", { class: "res", title: `${resource}: ${fmtQuantity(resource, used)} of `
      + `${fmtQuantity(resource, alloc)} requested (bound + assumed)` },
      el("span", { text: shortName(resource) }), el("span", { class: "bar" }, barFill(share(used, alloc))));
    card.append(row);
  }
  if (gpus) {
    const used = node.used[GPU] || 0;
    const slots = el("span", { class: "slots", title: `GPUs: ${used} of ${gpus} in use` });
    if (gpus <= 16) {
      for (let i = 0; i < gpus; i += 1) slots.append(el("i", { class: i < used ? "on" : "" }));
    } else {
      slots.append(el("span", { class: "bar" }, barFill(share(used, gpus))));
    }
    card.append(el("div", { class: "res" }, el("span", { text: "gpu" }), slots));
  }
  return card;
}

function renderNodes(status) {
  const nodes = status.nodes || [];
  // GPU nodes first (fragmentation is what one looks for there), then by pool and name.
  const ordered = [...nodes].sort((a, b) => ((b.alloc[GPU] || 0) > 0) - ((a.alloc[GPU] || 0) > 0)
    || String(a.pool ?? "\uffff").localeCompare(String(b.pool ?? "\uffff")) || a.name.localeCompare(b.name));
  const shown = ordered.slice(0, NODES_SHOWN);
  const box = $("nodes");
  const cards = shown.map(nodeCard);
  if (ordered.length > shown.length) {
    cards.push(el("div", { class: "more", text: `…and ${fmtInt(ordered.length - shown.length)} more nodes` }));
  }
  if (cards.length === 0) cards.push(el("div", { class: "muted", text: status.redis === "ok" ? "no nodes" : "unknown" }));
  box.replaceChildren(...cards);
  const bound = nodes.reduce((a, n) => a + n.bound, 0);
  const assumed = nodes.reduce((a, n) => a + n.assumed, 0);
  setText("nodes-summary", `${fmtInt(nodes.length)} nodes · ${fmtInt(bound)} bound · ${fmtInt(assumed)} assumed`);
}

function renderPending(status) {
  const pending = status.pending || { total: status.queues.pending_total, pods: [] };
  const now = status.generated_unix || Date.now() / 1000;
  const rows = pending.pods.map((p) =>
    el("tr", { "data-pod": p.pod, "data-reason": p.reason },
      el("td", {}, el("span", { class: "clip", text: p.pod, title: p.pod })),
      el("td", { text: p.policy }),
      el("td", { class: "num", text: fmtAge(now - p.since) }),
      el("td", { text: p.gang ?? "" }),
      el("td", { class: "why" }, el("span", { class: `tag ${p.reason}`, text: p.reason }),
        el("span", { "data-testid": "pending-message", text: p.message })),
    ));
  fillBody($("pending"), rows, 5, "no pending pods");
  setText("pending-shown", pending.total > pending.pods.length
    ? `oldest ${fmtInt(pending.pods.length)} of ${fmtInt(pending.total)}` : `${fmtInt(pending.total)}`);
}

function renderGangs(status) {
  const gangs = status.gangs || [];
  // Gangs only when there are some: the pending pods get the room otherwise.
  $("gangs").closest(".panel").hidden = gangs.length === 0;
  $("pending").closest(".panel").classList.toggle("full", gangs.length === 0);
  const rows = gangs.map((g) =>
    el("tr", { "data-gang": g.gang },
      el("td", {}, el("span", { class: "clip", text: g.gang })),
      el("td", { class: "num", text: fmtInt(g.pending) }),
      el("td", { class: "num", text: fmtInt(g.dispatched) }),
      el("td", { class: "num", text: g.min_available ?? "?" }),
    ));
  fillBody($("gangs"), rows, 4, "no gangs pending");
}

function renderRescheduler(status) {
  // The hoss-rescheduler leader's last plans (README: GPU defragmentation); the panel only when one runs.
  const resched = status.rescheduler;
  $("rescheduler").closest(".panel").hidden = !resched;
  if (!resched) return;
  const plans = resched.plans || [];
  const rows = plans.map((p) =>
    el("tr", {},
      el("td", { text: p.pending ? `room for ${p.pending} on ${p.pending_node}` : "defragment" }),
      el("td", { text: (p.moves || []).map((m) => `${m.pod} (${m.gpus}) ${m.from} \u2192 ${m.to}`).join(", ") }),
      el("td", { text: `${p.before.stranded} / ${p.before.whole_free} \u2192 ${p.after.stranded} / ${p.after.whole_free}` }),
      el("td", { text: p.detail ? `${p.outcome}: ${p.detail}` : p.outcome }),
    ));
  fillBody($("rescheduler"), rows, 4, "no plan yet");
  setText("rescheduler-summary", `${fmtInt(resched.rounds || 0)} rounds, ${fmtInt(resched.evictions || 0)} evictions`);
}

function renderQuotas(status) {
  const quotas = status.quotas || [];
  // Elastic quotas only when there are some.
  $("quotas").closest(".panel").hidden = quotas.length === 0;
  const rows = [];
  for (const q of quotas) {
    const resources = [...new Set([...Object.keys(q.min), ...Object.keys(q.max)])].sort();
    for (const r of resources) {
      const borrowed = q.borrowed[r] || 0;
      rows.push(el("tr", { "data-quota": q.namespace, "data-resource": r, "data-borrowed": String(borrowed) },
        el("td", {}, el("span", { class: "clip", text: q.namespace })),
        el("td", { text: r }),
        el("td", { class: "num", text: fmtQuantity(r, q.used[r] || 0) }),
        el("td", { class: "num", text: fmtQuantity(r, q.min[r] || 0) }),
        el("td", { class: "num", text: r in q.max ? fmtQuantity(r, q.max[r]) : "-" }),
        el("td", { class: "num", text: borrowed ? fmtQuantity(r, borrowed) : "" }),
      ));
    }
  }
  fillBody($("quotas"), rows, 6, "no elastic quotas");
}

function render(status, fetchedAt) {
  renderHeader(status);
  renderBanner(statusProblems(status));
  renderKpis(status);
  renderChart(status);
  renderWorkers(status, fetchedAt);
  renderResolver(status);
  renderGpu(status);
  renderPools(status);
  renderNodes(status);
  renderPending(status);
  renderGangs(status);
  renderRescheduler(status);
  renderQuotas(status);
  renders += 1;
  document.body.dataset.loaded = "true";
  document.body.dataset.renders = String(renders);
  document.body.dataset.stale = "false";
}

// --- the refresh loop ----------------------------------------------------------------------------------------


// With --access=kubernetes, /status needs a bearer token: given once as /#token=<token> (the fragment never reaches
// a server or a log), kept for this tab only (sessionStorage), and sent with every read of /status.
function authHeaders() {
  const match = /(?:^#|&)token=([^&]+)/.exec(window.location.hash);
  if (match) {
    sessionStorage.setItem("hoss-token", decodeURIComponent(match[1]));
    history.replaceState(null, "", window.location.pathname + window.location.search);
  }
  const token = sessionStorage.getItem("hoss-token");
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function fetchStatus() {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  try {
    const response = await fetch("/status", { cache: "no-store", signal: abort.signal, headers: authHeaders() });
    if (response.status === 401 || response.status === 403) {
      const why = (await response.json().catch(() => ({}))).error || "";
      throw new Error(`HTTP ${response.status}: ${why} (open the dashboard as /#token=<a Kubernetes token>)`);
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    return await response.json();
  } finally {
    clearTimeout(timer);
  }
}

async function refresh() {
  let status = null;
  try {
    status = await fetchStatus();
  } catch (error) {
    const reason = error && error.name === "AbortError" ? `no answer within ${FETCH_TIMEOUT_MS / 1000}s` : String(error);
    renderBanner([{ state: "fetch", text: `Cannot fetch /status (${reason}); showing the last data received, `
      + "retrying every 2 s." }]);
    document.body.dataset.stale = "true";
  }
  setTimeout(refresh, REFRESH_MS);
  // A rendering bug surfaces in the console (and fails the browser test); it does not stop the refreshes.
  if (status !== null) render(status, Date.now());
}

refresh();
