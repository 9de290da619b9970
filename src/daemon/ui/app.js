// maintd's status page. Reads the API's lists with their watches (a held request answered
// when the list changes) and renders them. Every value is set as text or as an attribute,
// never parsed as markup: node names, details and diagnose errors come from nodes.
"use strict";

const WAIT_S = 30; // how long the daemon may hold a watch
const LATE_S = 5; // beyond the watch's span before the page gives a watch up
const RETRY_MS = 2000; // after a failed request
const FACTS_MS = 5000; // leader and fencing summary, which have no watch
const PAGE = { events: 500, nodes: 500, fences: 50 };

const view = { gen: 0, aborts: [], errors: new Map() };

function $(id) { return document.getElementById(id); }

// An element with text and attributes; children may be elements or strings.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, String(v));
  }
  const add = (c) => {
    if (c === undefined || c === null || c === false) return;
    if (Array.isArray(c)) c.forEach(add);
    else e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  };
  children.forEach(add);
  return e;
}

function badge(text, tone) { return el("span", { class: "badge " + (tone || "") }, text); }

// ns since the epoch, as the API gives times.
function when(ns) {
  if (ns === null || ns === undefined) return el("span", { class: "muted" }, "–");
  const d = new Date(ns / 1e6);
  return el("time", { datetime: d.toISOString(), title: d.toString() }, ago(d));
}

function ago(d) {
  const s = Math.round((Date.now() - d.getTime()) / 1000);
  if (s < 0) return "in " + span(-s);
  return span(s) + " ago";
}

function span(s) {
  if (s < 90) return s + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  if (s < 172800) return Math.round(s / 3600) + " h";
  return Math.round(s / 86400) + " d";
}

function json(v, max) {
  let t = typeof v === "string" ? v : JSON.stringify(v, null, 1);
  if (t === undefined) t = "";
  if (max && t.length > max) t = t.slice(0, max) + "…";
  return el("pre", {}, t);
}

function cell(label, ...children) { return el("td", { "data-label": label }, ...children); }

function tone(status) {
  return {
    completed: "ok", done: "ok", succeeded: "ok", active: "ok",
    pending: "info", running: "info", noted: "muted", new: "info",
    failed: "bad", error: "bad", inactive: "bad", canceled: "warn", final: "muted",
  }[status] || "";
}

function query(list) {
  const p = new URLSearchParams();
  const node = $("node").value.trim();
  if (node) p.set("node", node);
  if (list === "nodes" && $("problems").checked) p.set("status", "unreachable");
  p.set("limit", PAGE[list]);
  return p;
}

// --- rendering -------------------------------------------------------------------------------

function renderEvents(events, more) {
  const rows = events.map((e) => {
    const jobs = el("ul", { class: "plain" }, ...e.jobs.map((j) =>
      el("li", { title: j.detail || "" }, j.kind + " #" + j.id + " (round " + j.round + ") ",
        badge(j.status, tone(j.status)))));
    const tag = el("div", {}, el("code", {}, e.tag), " ",
      e.acknowledged ? badge("acknowledged", "ok") : e.tagged ? badge("on node", "info") : null);
    const fence = e.fence ? el("div", {}, "fence: " + e.fence.step + " ", badge(e.fence.status, tone(e.fence.status)),
      e.fence.fenced ? " fenced" : "", e.fence.released ? " released" : "") : null;
    const details = e.original && e.original.details !== undefined ? json(e.original.details, 2000) : null;
    return el("tr", { "data-event": e.id, "data-node": e.node },
      cell("node", e.node),
      cell("action", e.action),
      cell("status", badge(e["repair-status"], tone(e["repair-status"])), fence),
      cell("jobs", jobs),
      cell("tag", tag),
      cell("note", e.note || ""),
      cell("details", details),
      cell("updated", when(e.updated)));
  });
  fill("events", rows, events.length, more);
}

function renderNodes(nodes, more) {
  const rows = nodes.map((n) => {
    const reach = n.reachable
      ? el("div", {}, badge("reachable", "ok"))
      : el("div", {}, badge("unreachable", "bad"), " since ", when(n["unreachable-since"]));
    if (n.offline) reach.append(" ", badge("offline", "warn"));
    // Never fenced, powered or remedied while it lasts: the operator must see why.
    if (n.maintenance) reach.append(el("div", { class: "maintenance" }, badge("maintenance", "warn"), " " + n.maintenance));
    if (n["last-error"] && !n.reachable) reach.append(el("div", { class: "muted" }, n["last-error"]));
    const offset = n["clock-offset-ms"];
    if (offset !== null && offset !== undefined) {
      const text = "clock " + (offset >= 0 ? "+" : "") + (Math.abs(offset) >= 1000 ? (offset / 1000).toFixed(1) + " s" : offset + " ms");
      reach.append(" ", Math.abs(offset) >= 1000 ? badge(text, "warn") : el("span", { class: "muted" }, text));
    }
    const report = n["last-report"]
      ? el("div", {}, badge(n["last-report"].status, n["last-report"].status === "Ok" ? "ok" : "warn"),
          " diagnosed ", when(n["diagnosed-at"]))
      : el("span", { class: "muted" }, "none yet");
    const rejected = n["rejected-reports"] > 0
      ? el("div", {}, badge(n["rejected-reports"], "bad"), " ", n["last-rejection"] || "")
      : "0";
    return el("tr", { "data-node": n.name },
      cell("node", n.name),
      cell("reachability", reach),
      cell("last report", report),
      cell("diagnose error", n["diagnose-error"] ? json(n["diagnose-error"], 2000) : ""),
      cell("rejected", rejected),
      cell("fencing", cellsFencing(n)),
      cell("watchers", watchers(n.witnesses)),
      cell("tags", el("ul", { class: "plain" }, ...n.tags.map((t) => el("li", {}, el("code", {}, t))))));
  });
  fill("nodes", rows, nodes.length, more);
}

function cellsFencing(n) {
  const f = n.fencing;
  if (!f) return el("span", { class: "muted" }, "no plan");
  const methods = f.methods.map((m) => m.method + " (" + m.agent + ") " + (m.ok ? "ok" : "failing"));
  return el("div", { title: methods.join("\n") }, badge(f.state, tone(f.state)), " ", f.detail);
}

function watchers(w) {
  if (!w) return el("span", { class: "muted" }, "–");
  const d = el("div", {});
  if (w.partitioned) d.append(badge("partitioned", "warn"), " ");
  d.append("heard by " + w["heard-by"].length + " of " + w.watchers.length);
  if (w["lost-by"].length) d.append(el("div", { class: "bad" }, "lost by " + w["lost-by"].join(", ")));
  if (w.unheard.length) d.append(el("div", { class: "muted" }, "no view from " + w.unheard.join(", ")));
  return d;
}

function renderFences(flows, more) {
  const cards = flows.map((f) => {
    const flags = ["isolated", "fenced", "released", "reclaimed", "canceled", "marked"]
      .filter((k) => f[k]).map((k) => badge(k, k === "canceled" ? "warn" : "info"));
    const head = el("h3", {}, el("span", { class: "node" }, f.node), " ", f.step, " ",
      badge(f.status, tone(f.status)), ...flags);
    const facts = el("div", { class: "muted" }, "detected ", when(f.detected),
      f["fenced-at"] ? [" · fenced ", when(f["fenced-at"])] : "",
      f["released-at"] ? [" · released ", when(f["released-at"])] : "",
      f.retries ? " · " + f.retries + " retries" : "");
    const w = f.witnesses || {};
    const said = [];
    if (w.collector) said.push("collector silent");
    if (w.condition) said.push("condition " + w.condition);
    if (w.peers && w.peers.length) said.push("lost by " + w.peers.map((p) => p.watcher).join(", "));
    if (w.manual) said.push("asked for by " + w.manual);
    const witnesses = said.length ? el("div", {}, "witnesses: " + said.join("; ")) : null;
    const alarm = f.alarm ? el("div", { class: "bad" }, "alarm: " + f.alarm) : null;
    const timeline = el("ol", { class: "timeline" }, ...f.history.map((h) =>
      el("li", {}, when(h.at), " ", h.step, " ", badge(h.status, tone(h.status)), " ", h.note)));
    const calls = f.calls.length ? el("table", { class: "calls" },
      el("thead", {}, el("tr", {}, ...["when", "agent", "action", "result", "ms", "output"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...f.calls.map((c) => el("tr", {},
        cell("when", when(c.at)), cell("agent", c.agent + " (" + c.method + ")" + (c.host ? " on " + c.host : "")),
        cell("action", c.action), cell("result", badge(c.ok ? "ok" : "failed", c.ok ? "ok" : "bad"), " code " + c.code),
        cell("ms", c["elapsed-ms"]), cell("output", json(c.output, 500)))))) : null;
    return el("article", { class: "flow", "data-flow": f.id, "data-node": f.node },
      head, facts, witnesses, alarm, timeline, calls);
  });
  fill("fences", cards, flows.length, more);
}

function fill(list, children, n, more) {
  $(list + (list === "fences" ? "-list" : "-rows")).replaceChildren(...children);
  $(list + "-count").textContent = "(" + n + (more ? "+" : "") + ")";
  $(list + "-empty").hidden = n > 0;
  $(list + "-more").hidden = !more;
  $("updated").replaceChildren(new Date().toLocaleTimeString());
}

function renderFacts(leader, summary) {
  if (leader) {
    const who = leader.leader ? leader.identity : (leader.holder || "unknown");
    $("leader").replaceChildren(who, leader.elected ? " (term " + leader.term + ")" : "",
      leader.leader ? "" : " · this replica is a standby");
  }
  if (summary) {
    const f = el("span", {}, badge(summary.state, tone(summary.state)));
    if (summary.inactive && summary.inactive.length) f.append(" inactive on " + summary.inactive.join(", "));
    if (summary.paused) f.append(" ", badge("paused", "warn"), " " + summary.paused.reason + (summary.paused.by ? " (by " + summary.paused.by + ") " : " "), when(summary.paused.since || null));
    $("fencing").replaceChildren(f);
  }
}

// --- fetching --------------------------------------------------------------------------------

function status(name, err) {
  if (err) view.errors.set(name, err); else view.errors.delete(name);
  const c = $("conn");
  if (view.errors.size) {
    c.dataset.state = "error";
    c.textContent = "reconnecting: " + [...view.errors.values()][0];
  } else {
    c.dataset.state = "live";
    c.textContent = "live";
  }
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(t); resolve(); });
  });
}

async function why(r) {
  try { const b = await r.json(); return r.status + ": " + (b.message || b.error); }
  catch (_) { return "HTTP " + r.status; }
}

// Keeps one list current: a first read, then watches that the daemon answers on a change.
async function watch(list, render, gen, signal) {
  let etag = null;
  while (gen === view.gen) {
    const p = query(list);
    const headers = {};
    if (etag) { p.set("wait", WAIT_S); headers["If-None-Match"] = etag; }
    try {
      // A watch the daemon can no longer answer (a cut network) is given up after its span, so
      // the page says it is reconnecting instead of waiting for the socket to time out.
      const limit = AbortSignal.any([signal, AbortSignal.timeout((WAIT_S + LATE_S) * 1000)]);
      const r = await fetch("/1/" + (list === "events" ? "status" : list) + "?" + p, { headers, signal: limit, cache: "no-store" });
      if (r.status === 200) {
        etag = r.headers.get("ETag");
        const body = await r.json();
        if (gen === view.gen) render(body, r.headers.has("x-next-cursor"));
        status(list, null);
      } else if (r.status === 304) {
        status(list, null);
      } else {
        status(list, list + " " + await why(r));
        etag = null;
        await sleep(RETRY_MS, signal);
      }
    } catch (e) {
      if (signal.aborted) return;
      status(list, list + ": " + e.message);
      // The next request is a plain read, answered at once: a held watch would keep the page
      // saying "reconnecting" for its whole span after the daemon is back.
      etag = null;
      await sleep(RETRY_MS, signal);
    }
  }
}

// The audit trail's newest commands: who sent what, and how it was answered.
function renderCommands(commands) {
  const rows = commands.map((c) => el("tr", {},
    el("td", {}, c.operator),
    el("td", {}, el("code", {}, c.method + " " + c.path)),
    el("td", {}, c.status ? badge(String(c.status), c.status < 300 ? "ok" : "warn") : badge("no answer", "warn")),
    el("td", {}, when(c.at))));
  $("commands-rows").replaceChildren(...rows);
  $("commands-empty").hidden = commands.length > 0;
}

async function facts(gen, signal) {
  while (gen === view.gen) {
    try {
      const [l, s, a] = await Promise.all(["/1/leader", "/1/fences/summary", "/1/audit?limit=10"].map((u) => fetch(u, { signal, cache: "no-store" })));
      renderFacts(l.ok ? await l.json() : null, s.ok ? await s.json() : null);
      if (a.ok) renderCommands(await a.json());
      status("facts", l.ok && s.ok ? null : "leader or fencing summary " + await why(l.ok ? s : l));
    } catch (e) {
      if (signal.aborted) return;
      status("facts", e.message);
    }
    await sleep(FACTS_MS, signal);
  }
}

function start() {
  for (const a of view.aborts) a.abort();
  view.gen += 1;
  view.errors.clear();
  const gen = view.gen;
  const ac = new AbortController();
  view.aborts = [ac];
  watch("events", renderEvents, gen, ac.signal);
  watch("fences", renderFences, gen, ac.signal);
  watch("nodes", renderNodes, gen, ac.signal);
  facts(gen, ac.signal);
}

// Relative times age between changes of their list.
function age() {
  for (const t of document.querySelectorAll("time[datetime]")) {
    t.textContent = ago(new Date(t.getAttribute("datetime")));
  }
}

document.addEventListener("DOMContentLoaded", () => {
  setInterval(age, 5000);
  let timer = null;
  const restart = () => { clearTimeout(timer); timer = setTimeout(start, 300); };
  $("node").addEventListener("input", restart);
  $("problems").addEventListener("change", start);
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); start(); });
  start();
});
