// modpipe review console. Post texts are hostile input: everything from the API goes into the page
// through textContent / setAttribute only (el() below), never innerHTML.
"use strict";

const state = { queue: [], blocks: [], selected: null, queueHistory: [], csrf: null, role: null };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, String(v));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path, options) {
  const response = await fetch(path, options);
  if (response.status === 401) { window.location.assign("/login"); throw new Error("signed out"); }
  if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
  return response.json();
}

// The page's own polling: the server does not count it as the moderator's activity (idle expiry).
function poll(path) { return api(path, { headers: { "X-Console-Refresh": "1" } }); }

function send(path, body) {
  return api(path, { method: "POST", headers: { "Content-Type": "application/json", "X-CSRF-Token": state.csrf },
    body: JSON.stringify(body) });
}

function reasonText(r) { return r.description || r.feature || JSON.stringify(r); }
function fill(id, ...children) { document.getElementById(id).replaceChildren(...children.filter(c => c !== null && c !== undefined)); }

function fmtP(p) { return p === null || p === undefined ? "-" : (100 * p).toFixed(1) + "%"; }
function fmtWait(s) { return s === null || s === undefined ? "" : s < 120 ? `${Math.round(s)} s` : `${Math.round(s / 60)} min`; }

function postItem(post, list) {
  const buttons = list === "queue" && state.role === "moderator" ? el("span", { class: "actions" },
    el("button", { class: "spam", "data-action": "spam", onclick: ev => { ev.stopPropagation(); label(post.post_id, "spam"); } }, "spam (s)"),
    " ",
    el("button", { class: "ham", "data-action": "ham", onclick: ev => { ev.stopPropagation(); label(post.post_id, "ham"); } }, "ham (h)")) : null;
  const li = el("li", { "data-post-id": post.post_id, class: state.selected === post.post_id ? "selected" : "" },
    el("div", { class: "row" },
      el("div", { class: "meta" },
        el("span", { class: "verdict-" + post.verdict }, post.verdict), " · spam ", fmtP(post.spam_probability),
        " · text ", fmtP(post.text_probability), " · ", post.user_id, post.waiting_s !== null ? " · waiting " + fmtWait(post.waiting_s) : "",
        post.degraded ? " · decided without the text model" : ""),
      buttons),
    el("div", { class: "text" }, post.text === null ? "(text not seen yet)" : post.text),
    post.url ? el("div", { class: "meta" }, "link: ", post.url) : null,
    el("div", { class: "meta" }, (post.reasons || []).map(reasonText).join("; ")));
  li.addEventListener("click", () => select(post.post_id));
  return li;
}

function renderLists() {
  const queue = document.getElementById("queue");
  queue.replaceChildren(...state.queue.map(p => postItem(p, "queue")));
  document.getElementById("queue-size").textContent = `(${state.queueSize})`;
  document.getElementById("blocks").replaceChildren(...state.blocks.map(p => postItem(p, "blocks")));
  const selected = queue.querySelector("li.selected");
  if (selected) selected.scrollIntoView({ block: "nearest" });
}

async function refresh() {
  try {
    const [queue, blocks, stats] = await Promise.all([poll("/api/queue?limit=100"), poll("/api/blocks?limit=20"), poll("/api/stats?window=120")]);
    state.queue = queue.posts; state.queueSize = queue.size; state.blocks = blocks.posts;
    if (!state.selected && state.queue.length) state.selected = state.queue[0].post_id;
    renderLists();
    drawCharts(stats);
  } catch (err) { console.error(err); }
}

async function label(postId, value) {
  if (state.role !== "moderator") return;
  await send("/api/label", { post_id: postId, label: value });
  const i = state.queue.findIndex(p => p.post_id === postId);
  state.queue = state.queue.filter(p => p.post_id !== postId);
  state.queueSize = Math.max(0, state.queueSize - 1);
  if (state.selected === postId) state.selected = state.queue.length ? state.queue[Math.min(i, state.queue.length - 1)].post_id : null;
  renderLists();
  document.body.setAttribute("data-last-label", `${postId}:${value}`);
}

async function select(postId) {
  state.selected = postId; renderLists();
  const d = await api("/api/post/" + encodeURIComponent(postId));
  const rows = Object.entries(d.features || {}).sort().map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, JSON.stringify(v))));
  fill("detail",
    el("h2", {}, "Post ", d.post_id, " by ", el("a", { href: "#", onclick: ev => { ev.preventDefault(); showUser(d.user_id); } }, d.user_id)),
    el("div", { class: "text", id: "detail-text" }, d.text === null ? "(text not seen yet)" : d.text),
    d.url ? el("p", { class: "meta" }, "link: ", d.url) : null,
    el("p", {}, el("span", { class: "verdict-" + d.verdict }, d.verdict), " · spam ", fmtP(d.spam_probability), " · text ", fmtP(d.text_probability),
      " · revision ", d.revision, d.label ? ` · labelled ${d.label} by ${d.labelled_by}` : ""),
    el("h2", {}, "Reasons"), el("ul", {}, ...(d.reasons || []).map(r => el("li", {}, reasonText(r)))),
    el("h2", {}, "Revisions"), el("ul", {}, ...(d.revisions || []).map(r => el("li", {}, `${r.revision}: ${r.verdict} (${fmtP(r.spam_probability)}) at ${r.decided_at}${r.degraded ? " degraded" : ""}`))),
    el("h2", {}, "Features"), el("table", { class: "features" }, ...rows));
}

async function showUser(userId) {
  const u = await api("/api/user/" + encodeURIComponent(userId));
  fill("detail",
    el("h2", {}, "User ", u.user_id, ": ", Object.entries(u.verdicts).map(([k, v]) => `${v} ${k}`).join(", ")),
    el("ol", { class: "posts" }, ...u.posts.map(p => postItem(p, "user"))));
}

function polyline(svg, values, max, color) {
  const n = values.length; if (!n) return;
  const pts = values.map((v, i) => `${(i * 360 / Math.max(1, n - 1)).toFixed(1)},${(88 - 84 * (v || 0) / (max || 1)).toFixed(1)}`).join(" ");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", pts); line.setAttribute("fill", "none"); line.setAttribute("stroke", color); line.setAttribute("stroke-width", "1.5");
  svg.append(line);
}

function drawCharts(stats) {
  const s = stats.series;
  const rate = document.getElementById("chart-rate"); rate.replaceChildren();
  const maxRate = Math.max(1, ...s.map(b => b.allow + b.review + b.block));
  polyline(rate, s.map(b => b.allow), maxRate, "#2a2"); polyline(rate, s.map(b => b.review), maxRate, "#d80"); polyline(rate, s.map(b => b.block), maxRate, "#c22");
  const lat = document.getElementById("chart-latency"); lat.replaceChildren();
  const maxLat = Math.max(1, ...s.map(b => b.p99_ms || 0));
  polyline(lat, s.map(b => b.p50_ms), maxLat, "#36c"); polyline(lat, s.map(b => b.p99_ms), maxLat, "#93c");
  state.queueHistory.push(stats.queue_size); state.queueHistory = state.queueHistory.slice(-60);
  const q = document.getElementById("chart-queue"); q.replaceChildren();
  polyline(q, state.queueHistory, Math.max(1, ...state.queueHistory), "#a50");
}

function move(step) {
  if (!state.queue.length) return;
  const i = state.queue.findIndex(p => p.post_id === state.selected);
  const next = state.queue[Math.max(0, Math.min(state.queue.length - 1, (i < 0 ? 0 : i + step)))];
  state.selected = next.post_id; renderLists();
}

document.addEventListener("keydown", ev => {
  if (ev.target.tagName === "INPUT") return;
  if (ev.key === "j") move(1);
  else if (ev.key === "k") move(-1);
  else if (ev.key === "s" && state.selected) label(state.selected, "spam");
  else if (ev.key === "h" && state.selected) label(state.selected, "ham");
  else if (ev.key === "Enter" && state.selected) select(state.selected);
});

document.addEventListener("DOMContentLoaded", async () => {
  document.getElementById("search").addEventListener("submit", async ev => {
    ev.preventDefault();
    const q = document.getElementById("q").value.trim(); if (!q) return;
    const found = await api("/api/search?q=" + encodeURIComponent(q));
    if (found.post) select(found.post.post_id);
    else if (found.user) showUser(found.user.user_id);
    else fill("detail", el("p", {}, "nothing found for ", q));
  });
  const me = await api("/api/me");
  state.csrf = me.csrf; state.role = me.role;
  document.getElementById("me").textContent = `${me.role}: ${me.moderator}`;
  document.getElementById("sign-out").addEventListener("click", async () => {
    await send("/api/logout", {});
    window.location.assign("/login");
  });
  await refresh();
  setInterval(refresh, 2000);
});
