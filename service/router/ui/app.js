// qstate /ui: a live view of the router's own JSON API, polled every POLL_MS; the
// leaderboard is pushed by the router (GET /v1/watch/...?top=N, Server-Sent Events).
// Plain JS, no framework, no build step. Every string from the API reaches the page as
// text (textContent), never as HTML.
"use strict";

const API = new URL("../v1/", location.href); // relative: works behind a path prefix too
const POLL_MS = 1500;
const RECENT = 10; // windows in the "recent windows" table
const TOP_N = 10; // keys on the leaderboard
const RETRY_MIN_MS = 250; // a watch stream that failed or ended is opened again after this,
const RETRY_MAX_MS = 5000; // doubling up to this
const SILENT_MS = 45000; // nothing (not even the router's 15 s ping) for this long: reopen
const SVG = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);
const catalog = new Map(); // job -> [OperatorInfo]
let keySeq = 0; // answers to an older lookup never overwrite a newer one
let timer = null;

// ---- helpers -----------------------------------------------------------------------

// Counts are exact int64: a number past 2^53 keeps its digits (JSON.parse's source access),
// so what the page shows is what the shard holds.
function parseExact(text) {
  return JSON.parse(text, (_k, v, ctx) =>
    typeof v === "number" && !Number.isSafeInteger(v) && ctx && /^-?\d+$/.test(ctx.source)
      ? BigInt(ctx.source) : v);
}

// A router that asks for tokens answers 401: the page asks for one and keeps it for this tab
// only (sessionStorage), sent as a bearer token; never in the URL, never in localStorage.
const TOKEN_KEY = "qstate-token";

function authHeaders(accept) {
  const headers = { accept };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.authorization = `Bearer ${token}`;
  return headers;
}

function parseBody(text) {
  try { return parseExact(text); } catch (_) { return { message: text }; }
}

async function api(path, params) {
  const url = new URL(path, API);
  for (const [k, v] of Object.entries(params || {})) url.searchParams.set(k, String(v));
  const r = await fetch(url, { cache: "no-store", headers: authHeaders("application/json") });
  if (r.status === 401) $("token-form").hidden = false;
  const body = parseBody(await r.text());
  return { ok: r.ok, status: r.status, body };
}

// one path segment: dots too, so a key "." or ".." never becomes a segment the URL
// resolves away
const segment = (v) => encodeURIComponent(v).replace(/\./g, "%2E");

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = el("tr");
  for (const c of cells) {
    const td = c instanceof Node ? c : el("td", c);
    if (!(c instanceof Node) && (typeof c === "number" || typeof c === "bigint")) {
      td.className = "num";
    }
    tr.append(td);
  }
  return tr;
}

function iso(ms) {
  if (ms === null || ms === undefined) return "—";
  const d = new Date(Number(ms));
  return isNaN(d.getTime()) ? String(ms) : d.toISOString().replace(".000Z", "Z");
}

function age(ms) {
  if (ms === null || ms === undefined || !isFinite(ms)) return "—";
  const s = Math.abs(ms) / 1000;
  const sign = ms < 0 ? "in " : "";
  const tail = ms < 0 ? "" : " ago";
  if (s < 10) return `${sign}${s.toFixed(1)} s${tail}`;
  if (s < 120) return `${sign}${Math.round(s)} s${tail}`;
  if (s < 7200) return `${sign}${Math.round(s / 60)} min${tail}`;
  if (s < 172800) return `${sign}${Math.round(s / 3600)} h${tail}`;
  return `${sign}${Math.round(s / 86400)} d${tail}`;
}

function fmtValue(v) {
  if (v === null || v === undefined) return "null";
  return String(v); // BigInt and Number alike, every digit
}

function windowText(w) {
  if (!w || w.start === null) return "not windowed";
  return `[${iso(w.start)}, ${iso(w.end)})`;
}

function setOptions(select, values) {
  const now = Array.from(select.options, (o) => o.value);
  if (now.length === values.length && now.every((v, i) => v === values[i])) return false;
  const keep = select.value;
  select.replaceChildren(...values.map((v) => { const o = el("option", v); o.value = v; return o; }));
  if (values.includes(keep)) select.value = keep;
  return true;
}

function selected() {
  return { job: $("job").value, operator: $("operator").value, state: $("state").value,
           key: $("key").value, savepoint: $("savepoint").value.trim() };
}

// Every read, the leaderboard's too: as of the savepoint typed, else live.
function asOf(s, params) {
  return s.savepoint ? { ...(params || {}), savepoint: s.savepoint } : params;
}

function operatorInfo(job, name) {
  return (catalog.get(job) || []).find((o) => o.name === name) || null;
}

// ---- the selection, kept in the URL's fragment so a view can be shared --------------

function saveHash() {
  const s = selected();
  const h = new URLSearchParams();
  for (const k of ["job", "operator", "state", "key", "savepoint"]) if (s[k]) h.set(k, s[k]);
  history.replaceState(null, "", "#" + h.toString());
  wanted = h;
}

let wanted = new URLSearchParams(location.hash.slice(1)); // what to select once it exists

function fillSelects() {
  const job = $("job");
  if (setOptions(job, Array.from(catalog.keys())) && wanted.has("job")) {
    job.value = wanted.get("job");
  }
  const ops = (catalog.get(job.value) || []).map((o) => o.name);
  if (setOptions($("operator"), ops) && wanted.has("operator")) {
    $("operator").value = wanted.get("operator");
  }
  const op = operatorInfo(job.value, $("operator").value);
  if (setOptions($("state"), op ? op.states.map((s) => s.name) : []) && wanted.has("state")) {
    $("state").value = wanted.get("state");
  }
}

// ---- jobs ---------------------------------------------------------------------------

async function refreshJobs() {
  const list = await api("jobs");
  if (!list.ok) throw new Error(`jobs: ${list.body.message || list.status}`);
  const infos = await Promise.all(list.body.jobs.map((j) => api(`jobs/${encodeURIComponent(j.name)}`)));
  catalog.clear();
  for (const info of infos) if (info.ok) catalog.set(info.body.name, info.body.operators);
  fillSelects();
  const now = Date.now();
  const rows = [];
  for (const [job, ops] of catalog) {
    for (const o of ops) {
      const w = o.window;
      const win = w.kind === "none" ? "none"
        : `${w.kind} ${w.size_ms / 1000} s` + (w.kind === "sliding" ? ` / ${w.slide_ms / 1000} s` : "")
          + (w.kind === "session" ? ` gap ${w.gap_ms / 1000} s` : "");
      const tr = row([job, o.name, o.key, o.states.map((s) => `${s.name} (${s.type})`).join(", "),
                      win, `${o.partitions_available} / ${o.partitions}`, o.last_batch,
                      o.last_batch >= 0 ? `${iso(o.watermark)} (${age(now - o.watermark)})` : "—"]);
      tr.children[5].className = "num";
      if (o.partitions_available < o.partitions) tr.className = "bad";
      rows.push(tr);
    }
  }
  $("jobs").querySelector("tbody").replaceChildren(...rows);
}

// ---- one key --------------------------------------------------------------------------

function clearAnswer(message) {
  $("chart").replaceChildren();
  $("value").textContent = "—";
  $("window").textContent = "";
  $("batch").textContent = "—";
  $("watermark").textContent = "—";
  $("asof").textContent = "—";
  $("message").textContent = message || "";
  $("windows").querySelector("tbody").replaceChildren();
}

async function refreshKey() {
  const s = selected();
  const seq = ++keySeq;
  if (!s.job || !s.operator || !s.state || !s.key) {
    clearAnswer(s.key ? "" : "Type a key to see its current value.");
    return;
  }
  const path = ["state", s.job, s.operator, s.state].map(segment).join("/")
    + "/" + segment(s.key);
  const latest = await api(path, asOf(s));
  if (seq !== keySeq) return;
  const fetched = Date.now();
  if (!latest.ok) {
    clearAnswer(latest.body.message || `HTTP ${latest.status}`);
    if (latest.body.batch !== undefined && latest.body.batch !== null) {
      $("batch").textContent = String(latest.body.batch);
    }
    return;
  }
  const a = latest.body;
  const w = a.windows[a.windows.length - 1];
  $("value").textContent = fmtValue(w.value);
  $("window").textContent = windowText(w);
  $("batch").textContent = String(a.batch);
  $("watermark").textContent = `${iso(a.watermark)} (${age(fetched - a.watermark)})`;
  $("asof").dataset.fetched = String(fetched);
  $("asof").textContent = `fetched ${age(0)}`;
  $("message").textContent = "";
  await refreshWindows(s, path, w, seq);
}

async function refreshWindows(s, path, latest, seq) {
  const body = $("windows").querySelector("tbody");
  const op = operatorInfo(s.job, s.operator);
  if (latest.start === null || !op) { body.replaceChildren(); return; }
  const step = op.window.slide_ms || op.window.size_ms || op.window.gap_ms || 60000;
  const r = await api(path, asOf(s, { from: latest.start - step * RECENT }));
  if (seq !== keySeq || !r.ok) return;
  const ws = r.body.windows.slice(-RECENT).reverse();
  body.replaceChildren(...ws.map((x) => row([iso(x.start), iso(x.end), x.value === null ? "null" : x.value])));
  drawChart(ws.slice().reverse());
}

// The key's recent windows as bars, oldest left, drawn here (no library, no CDN): each
// bar's height is its value over the largest shown; a null value is a gap.
function drawChart(ws) {
  const svg = $("chart");
  const values = ws.map((w) => (w.value === null ? null : Number(w.value)));
  const top = Math.max(0, ...values.filter((v) => v !== null && isFinite(v)));
  const width = 400 / Math.max(ws.length, 1);
  const bars = ws.map((w, i) => {
    const v = values[i];
    const h = v === null || !isFinite(v) || top <= 0 ? 0 : Math.max(1, (v / top) * 110);
    const bar = document.createElementNS(SVG, "rect");
    bar.setAttribute("x", String(i * width + width * 0.1));
    bar.setAttribute("width", String(width * 0.8));
    bar.setAttribute("y", String(120 - h));
    bar.setAttribute("height", String(h));
    bar.setAttribute("class", "bar");
    const tip = document.createElementNS(SVG, "title");
    tip.textContent = `${iso(w.start)}: ${fmtValue(w.value)}`;
    bar.append(tip);
    return bar;
  });
  svg.replaceChildren(...bars);
}

// ---- the leaderboard, pushed --------------------------------------------------------------
//
// One watch stream of the selected state's board: the router sends the board at once and
// again whenever it changes. EventSource cannot send the token, so this is fetch() with a
// streamed body and a small Server-Sent Events parser. A stream that fails or ends is
// opened again after a backoff (at most RETRY_MAX_MS), resuming after the last event's
// batch; looking up another state aborts the stream and opens that state's.

let watch = null; // { target, abort: AbortController, retry timer, last event id, ... }

// Server-Sent Events out of a stream of text: feed() the chunks, it calls onEvent({id,
// data}) per event (data lines joined by "\n"); ":" lines are comments (the router's
// pings), and onAny() is called for every block, a ping too.
function sseParser(onEvent, onAny) {
  let buf = "";
  return {
    feed(chunk) {
      buf += chunk;
      // line ends are \r\n, \n or \r: keep a trailing \r until the next chunk says which
      const hold = buf.endsWith("\r") ? "\r" : "";
      let text = (hold ? buf.slice(0, -1) : buf).replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = text.indexOf("\n\n")) >= 0) {
        const block = text.slice(0, cut);
        text = text.slice(cut + 2);
        const ev = { id: null, data: [] };
        for (const line of block.split("\n")) {
          if (line === "" || line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const name = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? "" : line.slice(colon + 1);
          if (value.startsWith(" ")) value = value.slice(1);
          if (name === "data") ev.data.push(value);
          else if (name === "id" && !value.includes("\0")) ev.id = value;
        }
        onAny();
        if (ev.data.length) onEvent({ id: ev.id, data: ev.data.join("\n") });
      }
      buf = text + hold;
    },
  };
}

function boardTarget() {
  const s = selected();
  return s.job && s.operator && s.state
    ? `${s.job}\n${s.operator}\n${s.state}\n${s.savepoint}` : "";
}

function stopWatch() {
  if (!watch) return;
  watch.stopped = true;
  clearTimeout(watch.timer);
  clearTimeout(watch.silence);
  watch.abort.abort();
  watch = null;
}

// Watch the selected state's board, unless that stream is already open (or reopening).
// force: open it again anyway (a new token).
function ensureWatch(force) {
  const target = boardTarget();
  if (!force && watch && watch.target === target) return;
  stopWatch();
  if (!target) {
    $("board").querySelector("tbody").replaceChildren();
    $("top-summary").textContent = "";
    $("top-message").textContent = "";
    return;
  }
  const [job, operator, state, savepoint] = target.split("\n");
  watch = { target, job, operator, state, savepoint, abort: new AbortController(),
            timer: null, silence: null, lastId: null, delay: RETRY_MIN_MS, stopped: false,
            shown: false };
  $("board").querySelector("tbody").replaceChildren();
  $("top-summary").textContent = `${job}/${operator}/${state}`;
  $("top-message").textContent = "";
  if (savepoint) savepointBoard(watch).catch((e) => {
    if (!watch || watch.stopped) return;
    $("top-message").textContent = e && e.message ? e.message : String(e);
  });
  else runWatch(watch);
}

// A savepoint's board does not change: asked once (GET /v1/top ...&savepoint=NAME), again
// while its partitions open (503 with Retry-After).
async function savepointBoard(w) {
  const url = new URL(["top", w.job, w.operator, w.state].map(segment).join("/"), API);
  url.searchParams.set("n", String(TOP_N));
  url.searchParams.set("order", "desc");
  url.searchParams.set("savepoint", w.savepoint);
  for (;;) {
    const r = await fetch(url, { cache: "no-store", headers: authHeaders("application/json"),
                                 signal: w.abort.signal });
    const body = parseBody(await r.text());
    if (w.stopped || watch !== w) return;
    if (r.ok) {
      drawTop(body);
      $("top-summary").textContent += ` · savepoint ${w.savepoint}`;
      return;
    }
    if (r.status === 401) $("token-form").hidden = false;
    $("top-message").textContent = body.message || `HTTP ${r.status}`;
    if (r.status !== 503 && r.status !== 429) return;
    const after = Number(r.headers.get("retry-after")) || 1;
    await new Promise((done) => { w.timer = setTimeout(done, Math.min(after, 5) * 1000); });
    if (w.stopped || watch !== w) return;
  }
}

async function runWatch(w) {
  let failure = null;
  try {
    failure = await streamBoard(w);
  } catch (e) {
    failure = e && e.message ? e.message : String(e);
  }
  if (w.stopped || watch !== w) return; // aborted on purpose: a newer watch took over
  clearTimeout(w.silence);
  if (failure) {
    $("top-message").textContent = w.shown ? `${failure} · reconnecting…` : failure;
  }
  const delay = w.delay;
  w.delay = Math.min(RETRY_MAX_MS, w.delay * 2);
  w.abort = new AbortController();
  w.timer = setTimeout(() => runWatch(w), delay);
}

// One stream, until it ends: null when it just ended, else what went wrong.
async function streamBoard(w) {
  const url = new URL(["watch", w.job, w.operator, w.state].map(segment).join("/"), API);
  url.searchParams.set("top", String(TOP_N));
  url.searchParams.set("order", "desc");
  const headers = authHeaders("text/event-stream");
  if (w.lastId !== null) {
    url.searchParams.set("from_batch", w.lastId); // resume after the last event's batch
    headers["last-event-id"] = w.lastId;
  }
  const r = await fetch(url, { cache: "no-store", headers, signal: w.abort.signal });
  if (!r.ok) { // e.g. session windows: the router says why there is no board
    if (r.status === 401) $("token-form").hidden = false;
    const body = parseBody(await r.text());
    if (!w.shown) $("board").querySelector("tbody").replaceChildren();
    return body.message || `HTTP ${r.status}`;
  }
  if (!r.body) return "this browser cannot read a streamed answer";
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  const alive = () => { // the router pings every 15 s: silence this long is a dead stream
    clearTimeout(w.silence);
    w.silence = setTimeout(() => w.abort.abort(), SILENT_MS);
  };
  const parser = sseParser((ev) => {
    if (w.stopped || watch !== w) return;
    if (ev.id !== null && /^-?\d+$/.test(ev.id)) w.lastId = ev.id;
    const e = parseExact(ev.data);
    w.delay = RETRY_MIN_MS; // a stream that delivers: the next failure retries soon
    if (e.top) drawTop(e.top);
  }, alive);
  alive();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      alive();
      parser.feed(decoder.decode(value, { stream: true }));
    }
  } catch (e) {
    if (w.abort.signal.aborted && !w.stopped) return "the watch went silent";
    throw e;
  }
  parser.feed(decoder.decode());
  return null;
}

function drawTop(b) {
  const body = $("board").querySelector("tbody");
  watch.shown = true;
  $("top-message").textContent = "";
  $("top-summary").textContent = `${b.job}/${b.operator}/${b.state} · ` +
    `${b.window ? `window ${windowText(b.window)}` : "not windowed"} · batch ${b.batch}`;
  body.replaceChildren(...b.entries.map((e, i) => {
    const key = el("a", e.key);
    key.href = "#";
    key.addEventListener("click", (ev) => { ev.preventDefault(); $("key").value = e.key; onSelection(); });
    const td = el("td");
    td.append(key);
    return row([i + 1, td, e.value]);
  }));
  if (!b.entries.length) $("top-message").textContent = "no key has a value in this window yet";
}

function tickAge() {
  const f = Number($("asof").dataset.fetched || 0);
  if (f && $("asof").textContent !== "—") $("asof").textContent = `fetched ${age(Date.now() - f)}`;
}

// ---- cluster ----------------------------------------------------------------------------

async function refreshCluster() {
  const r = await api("cluster");
  if (r.status === 403) { // a token scoped to some jobs: the rest of the page still works
    $("cluster-summary").textContent = "the cluster view needs a token with scope *";
    $("shards").replaceChildren();
    return;
  }
  if (!r.ok) throw new Error(`cluster: ${r.body.message || r.status}`);
  const c = r.body;
  const groups = c.shards.map((sh) => ({ title: `${sh.id} · ${sh.address}`, up: sh.up,
                                         partitions: sh.partitions, following: sh.following }));
  if (c.unassigned.length) {
    groups.push({ title: "unassigned", up: false, partitions: c.unassigned, following: [] });
  }
  const copies = groups.reduce((n, g) => n + g.following.length, 0);
  const counts = {};
  for (const g of groups) for (const p of g.partitions) counts[p.state] = (counts[p.state] || 0) + 1;
  $("cluster-summary").textContent = `${c.shards.length} shard servers · ` +
    (Object.entries(counts).map(([k, n]) => `${n} ${k}`).join(" · ") || "no partitions") +
    (copies ? ` · ${copies} copies on followers` : "") + ` · as of ${iso(c.now)}`;
  $("shards").replaceChildren(...groups.map((g) => {
    const box = el("div", null, "shard");
    const h = el("h3", g.title);
    h.append(el("span", g.up ? "up" : "down", g.up ? "pill ok" : "pill bad"));
    const table = el("table");
    const head = el("tr");
    for (const t of ["job / operator", "partition", "state", "last batch", "watermark", "freshness",
                     "role"]) {
      head.append(el("th", t, ["partition", "last batch"].includes(t) ? "num" : ""));
    }
    const tbody = el("tbody");
    // owned partitions first; the copies it follows after them, marked as such
    for (const [role, list] of [["owner", g.partitions], ["follower", g.following]]) {
      for (const p of list) {
        const tr = row([`${p.job}/${p.operator}`, p.partition, p.state,
                        p.last_batch === null ? "—" : p.last_batch, iso(p.watermark),
                        p.freshness_s === null ? "—" : age(p.freshness_s * 1000).replace(" ago", ""),
                        role]);
        if (p.state !== "ready") tr.className = "bad";
        tbody.append(tr);
      }
    }
    table.append(el("thead"), tbody);
    table.tHead.append(head);
    box.append(h, table);
    return box;
  }));
}

// ---- the loop ---------------------------------------------------------------------------

async function tick() {
  clearTimeout(timer);
  try {
    const results = await Promise.allSettled([
      refreshJobs().then(() => { ensureWatch(); return refreshKey(); }), refreshCluster()]);
    const failed = results.filter((x) => x.status === "rejected");
    if (failed.length) throw failed[0].reason;
    $("status").textContent = `live · updated ${new Date().toLocaleTimeString()}`;
    $("status").className = "status ok";
  } catch (e) {
    $("status").textContent = `error: ${e && e.message ? e.message : e}`;
    $("status").className = "status bad";
  } finally {
    timer = setTimeout(tick, POLL_MS);
  }
}

let typing = null;
function onSelection() {
  fillSelects();
  saveHash();
  ensureWatch(); // the board of the state looked up: a new stream only if it changed
  clearTimeout(typing);
  typing = setTimeout(() => {
    refreshKey().catch((e) => clearAnswer(String(e)));
  }, 150);
}

document.addEventListener("DOMContentLoaded", () => {
  if (wanted.has("key")) $("key").value = wanted.get("key");
  if (wanted.has("savepoint")) $("savepoint").value = wanted.get("savepoint");
  for (const id of ["job", "operator", "state"]) $(id).addEventListener("change", onSelection);
  $("key").addEventListener("input", onSelection);
  $("savepoint").addEventListener("input", onSelection);
  $("query").addEventListener("submit", (e) => { e.preventDefault(); onSelection(); });
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    $("token-form").hidden = true;
    ensureWatch(true); // the stream again, with the new token
    tick();
  });
  setInterval(tickAge, 500);
  tick();
});
