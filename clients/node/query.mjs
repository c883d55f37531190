#!/usr/bin/env node
// Minimal qstate client: one gRPC request, the answer as JSON on stdout; or a watch over HTTP.
//
//   node query.mjs get      JOB OPERATOR STATE KEY    [--from MS --to MS] [--addr HOST:PORT]
//   node query.mjs multiget JOB OPERATOR STATE KEY... [--from MS --to MS] [--addr HOST:PORT]
//   node query.mjs top      JOB OPERATOR STATE [--n N] [--asc] [--window MS] [--addr HOST:PORT]
//   node query.mjs watch    JOB OPERATOR STATE KEY... | --top N [--asc]
//                           [--from-batch B] [--max-events N] [--max-reconnects N] [--url URL]
//
// top: the N keys (default 10) with the largest (--asc: smallest) value in one window across
// every partition, ties by key; --window: the window starting at or holding MS (default:
// the current one, the oldest window still open at the watermark).
// watch: the router's Server-Sent Events (GET /v1/watch/...), one JSON line per event (its
// data as the router sent it) as batches are committed: the latest window of each KEY (1 to
// 100) that changed, or (--top N) the current window's top-N board whenever it changed; the
// first event is a snapshot of them all. A dropped connection, the end of the stream, a 503
// or a 429 reconnects (backoff from 0.2 s doubling, at most 5 s, at least the Retry-After)
// and resumes after the last event's batch (--from-batch B: start after batch B); any other
// refusal ends it with the exit code below. --max-events N: exit 0 after N events.
// --max-reconnects N: give up after N failed reconnections in a row (default: never), with
// exit 4 when the router was out of reach, 3 when it kept answering 503 or 429.
// It speaks HTTP: --url, else $QSTATE_ROUTER_URL, else http://127.0.0.1:8000.
// Address: --addr, else $QSTATE_GRPC, else 127.0.0.1:50051. TLS: --ca FILE (else
// $QSTATE_TLS_CA), the CA bundle that signed the router's certificate; plain text without it
// (watch: an https:// URL, verified with --ca, else the system's CAs).
// Read your writes: --min-batch N answers as of batch N or a later one.
// --direct (else $QSTATE_CLIENT_DIRECT=true; get, multiget): on a cluster, each key asked at a
// router on its owner's node, as the job's cluster map (DescribeClusterMap) names it, keys
// split by owner; a router of the map that cannot be reached, or that the token may not go
// to in plain text, is replaced by --addr, which forwards the keys.
// --savepoint NAME (get, multiget, top): as of that savepoint of the job (qstate savepoint
// create).
// --allow-stale (else $QSTATE_CLIENT_ALLOW_STALE=true; get, multiget, top): when a partition's
// owner cannot answer, a follower of it (an operator with replicas) may, as of its own batch
// (the answer's batch); without it that read is UNAVAILABLE (exit 3) until the owner answers.
// Token: --token (else $QSTATE_TOKEN, else the content of --token-file or $QSTATE_TOKEN_FILE),
// sent as "authorization: Bearer ..." metadata (watch: header); never in plain text off
// loopback: without --ca (watch: to an http:// URL) to another host it refuses (exit 2) unless
// --allow-insecure or QSTATE_ALLOW_INSECURE=true says the network protects it (a service mesh).
// int64 fields (batch, watermark_ms, start_ms, end_ms, int_value) are printed as decimal
// strings, so counts beyond 2^53 stay exact; double values are JSON numbers (watch: the
// router's JSON as sent, numbers as numbers: parse big counts exactly).
// Exit codes, the same as `qstate get`'s (service/exit_codes.py, README: Exit codes): 0 ok;
// 1 NOT_FOUND; 2 INVALID_ARGUMENT or bad usage; 3 UNAVAILABLE or RESOURCE_EXHAUSTED; 4 the
// router cannot be reached; 5 UNAUTHENTICATED or PERMISSION_DENIED; 6 any other error.
// Errors go to stderr as "CODE_NAME: message" (watch: the HTTP status's gRPC name, e.g. 404
// NOT_FOUND, 400 INVALID_ARGUMENT).
import { readFileSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import { createParser } from "eventsource-parser";
import xxhash from "xxhash-wasm";

const PROTO = fileURLToPath(new URL("../../proto/qstate.proto", import.meta.url));
// a copy of service/exit_codes.py's table (tests/clients check that they agree)
const EXIT = { NOT_FOUND: 1, INVALID_ARGUMENT: 2, USAGE: 2, UNAVAILABLE: 3,
  RESOURCE_EXHAUSTED: 3, UNREACHABLE: 4, UNAUTHENTICATED: 5, PERMISSION_DENIED: 5, OTHER: 6 };
// The stream is quiet between batches but the router sends a comment every 15 s: a connection
// silent for longer than this is gone. Reconnect backoff as the Python client's Client.watch.
const WATCH_IDLE_MS = 45_000;
const BACKOFF_MS = 200;
const MAX_BACKOFF_MS = 5_000;
// a key's partition: pmod(xxhash64(utf8(key), seed 42), partitions) on the signed hash, as
// the job partitions it (proto/qstate.proto, OperatorMap)
const SEED = 42n;
// the gRPC name of an HTTP error status (the router's errors map one to one, docs: errors)
const HTTP_CODE = { 400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
  404: "NOT_FOUND", 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
  500: "INTERNAL", 503: "UNAVAILABLE" };

const USAGE = "usage: query.mjs get JOB OPERATOR STATE KEY [--from MS --to MS] [--savepoint NAME] [--allow-stale] [--addr HOST:PORT] [--direct] [--ca FILE] [--token T | --token-file F] [--allow-insecure]\n" +
  "       query.mjs multiget JOB OPERATOR STATE KEY... [--from MS --to MS] [--savepoint NAME] [--allow-stale] [--addr HOST:PORT] [--direct]\n" +
  "       query.mjs top JOB OPERATOR STATE [--n N] [--asc] [--window MS] [--savepoint NAME] [--allow-stale] [--addr HOST:PORT]\n" +
  "       query.mjs watch JOB OPERATOR STATE KEY... | --top N [--asc] [--from-batch B] [--max-events N] [--max-reconnects N] [--url URL]";

function usage(msg) {
  console.error(`${msg}\n${USAGE}`);
  process.exit(EXIT.USAGE);
}

let args;
try {
  args = parseArgs({
    allowPositionals: true,
    options: { from: { type: "string" }, to: { type: "string" }, addr: { type: "string" },
               ca: { type: "string" }, token: { type: "string" },
               "token-file": { type: "string" }, "allow-insecure": { type: "boolean" },
               "min-batch": { type: "string" }, savepoint: { type: "string" },
               n: { type: "string" },
               asc: { type: "boolean" }, window: { type: "string" }, top: { type: "string" },
               "from-batch": { type: "string" }, "max-events": { type: "string" },
               "max-reconnects": { type: "string" },
               url: { type: "string" }, direct: { type: "boolean" },
               "allow-stale": { type: "boolean" } },
  });
} catch (e) {
  usage(e.message);
}
const { values: opts, positionals: [cmd, job, operator, state, ...keys] } = args;
if (!["get", "multiget", "top", "watch"].includes(cmd)) {
  usage(`unknown command: ${cmd ?? "(none)"}`);
}
if (cmd === "watch" ? state === undefined || (keys.length === 0) === (opts.top === undefined)
  : cmd === "top" ? keys.length !== 0 || state === undefined
  : keys.length === 0 || (cmd === "get" && keys.length !== 1)) usage(`${cmd}: wrong arguments`);
if (cmd === "watch") {
  if (opts.top !== undefined && !/^\d+$/.test(opts.top)) usage(`not a count: ${opts.top}`);
  if (opts.asc && opts.top === undefined) usage("--asc goes with --top");
  if (opts["from-batch"] !== undefined && !/^(-1|\d+)$/.test(opts["from-batch"])) {
    usage(`not a batch number: ${opts["from-batch"]}`);
  }
  if (opts["max-events"] !== undefined && !/^[1-9]\d*$/.test(opts["max-events"])) {
    usage(`not a count of events: ${opts["max-events"]}`);
  }
  if (opts["max-reconnects"] !== undefined && !/^\d+$/.test(opts["max-reconnects"])) {
    usage(`not a count of reconnections: ${opts["max-reconnects"]}`);
  }
  if (opts.addr !== undefined) usage("watch speaks HTTP: give the router's --url, not --addr");
  if (opts.direct) usage("--direct goes with get and multiget");
  if (opts["allow-stale"]) usage("--allow-stale goes with get, multiget and top");
}
if (opts.n !== undefined && !/^\d+$/.test(opts.n)) usage(`not a count: ${opts.n}`);
if (opts.window !== undefined && !/^-?\d+$/.test(opts.window)) {
  usage(`not epoch milliseconds: ${opts.window}`);
}
if ((opts.from === undefined) !== (opts.to === undefined)) usage("--from and --to go together");
for (const v of [opts.from, opts.to]) {
  if (v !== undefined && !/^-?\d+$/.test(v)) usage(`not epoch milliseconds: ${v}`);
}
if (opts["min-batch"] !== undefined && !/^\d+$/.test(opts["min-batch"])) {
  usage(`not a batch number: ${opts["min-batch"]}`);
}

const addr = opts.addr ?? process.env.QSTATE_GRPC ?? "127.0.0.1:50051";
const direct = opts.direct || (cmd !== "watch" && process.env.QSTATE_CLIENT_DIRECT === "true");
const ca = opts.ca ?? process.env.QSTATE_TLS_CA;
let url;
if (cmd === "watch") {
  const given = opts.url ?? process.env.QSTATE_ROUTER_URL ?? "http://127.0.0.1:8000";
  try {
    url = new URL(given);
  } catch {
    usage(`not a URL: ${given}`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") usage(`not an http(s) URL: ${given}`);
}
// trimmed: a secret read from a file ends in a line break; never echoed back
const tokenFile = opts["token-file"] ?? process.env.QSTATE_TOKEN_FILE;
let token = opts.token ?? process.env.QSTATE_TOKEN ?? "";
if (!token && tokenFile) {
  try {
    token = readFileSync(tokenFile, "utf8");
  } catch (e) {
    usage(`client token file ${tokenFile}: ${e.code ?? e.message}`);
  }
}
token = token.trim();
if (token && !/^[\x21-\x7e]+$/.test(token)) {
  usage("the token holds a space, a control or a non-ASCII character (the token is not shown)");
}
const host = (url ? url.hostname : addr.replace(/:\d+$/, "")).replace(/^\[|\]$/g, "");
const loopback = host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
const insecureOk = opts["allow-insecure"] || process.env.QSTATE_ALLOW_INSECURE === "true";
const plainText = url ? url.protocol === "http:" : !ca;
if (token && plainText && !loopback && !insecureOk) {
  usage(`refusing to send the client token to ${host} in plain text: give ` +
        `${url ? "an https:// URL" : "--ca"} (TLS), or ` +
        "--allow-insecure (QSTATE_ALLOW_INSECURE=true) where the network protects it");
}
if (cmd === "watch") {
  await watch();
  await new Promise((done) => process.stdout.write("", done));  // what it printed is out
  process.exit(0);
}

// keepCase: field names as in the .proto; longs: String keeps int64 exact;
// defaults: unset scalars print as their zero value (unset optional/oneof fields stay absent).
const pkg = grpc.loadPackageDefinition(protoLoader.loadSync(PROTO, {
  keepCase: true, longs: String, enums: String, defaults: true,
}));
const creds = ca ? grpc.credentials.createSsl(readFileSync(ca)) : grpc.credentials.createInsecure();
const client = new pkg.qstate.v1.QueryableState(addr, creds);
const peers = new Map();  // --direct: the routers of the cluster map asked, by address
const metadata = new grpc.Metadata();
if (token) metadata.set("authorization", `Bearer ${token}`);

// which state every request reads: read your writes (as of this batch or later: the router
// waits a while for it), or as of a savepoint
const asOf = {
  ...(opts["min-batch"] === undefined ? {} : { min_batch: opts["min-batch"] }),
  ...(opts.savepoint === undefined ? {} : { savepoint: opts.savepoint }),
  ...(opts["allow-stale"] || process.env.QSTATE_CLIENT_ALLOW_STALE === "true"
    ? { allow_stale: true } : {}),
};
const range = {
  ...(opts.from === undefined ? {} : { from_ms: opts.from, to_ms: opts.to }), ...asOf,
};
const top = {
  n: opts.n ?? "10", ascending: Boolean(opts.asc),
  ...(opts.window === undefined ? {} : { window_start_ms: opts.window }), ...asOf,
};
const [method, request] = cmd === "get"
  ? ["Get", { job, operator, state, key: keys[0], ...range }]
  : cmd === "top" ? ["Top", { job, operator, state, ...top }]
  : ["MultiGet", { job, operator, state, keys, ...range }];

const deadline = Date.now() + 10_000;
try {
  const response = direct && cmd !== "top" ? await askOwners() : await ask(client, method, request);
  console.log(JSON.stringify(response, null, 2));
} catch (err) {
  const name = grpc.status[err.code] ?? String(err.code);
  const retry = err.metadata?.get("retry-after-ms")?.[0];
  console.error(`${name}: ${err.details}${retry ? ` (retry after ${retry} ms)` : ""}`);
  process.exit(unreachable(err) ? EXIT.UNREACHABLE : EXIT[name] ?? EXIT.OTHER);
} finally {
  for (const c of [client, ...peers.values()]) c.close();
}

function ask(c, m, req) {
  return new Promise((resolve, reject) => c[m](req, metadata, { deadline },
    (err, response) => (err ? reject(err) : resolve(response))));
}

// UNAVAILABLE from the channel itself (nothing answers at the address), not from a router
function unreachable(err) {
  return err.code === grpc.status.UNAVAILABLE &&
    /No connection established|ECONNREFUSED|ENOTFOUND|EHOSTUNREACH/.test(err.details ?? "");
}

// --direct: each key asked at a router on its owner's node, as the job's cluster map names
// it (DescribeClusterMap; docs/querying.md), which reads it in-process: no hop. The map is a
// hint: any router answers any key, so a key the map does not place, a router the token
// may not go to in plain text, or one that cannot be reached, is asked at --addr, which
// forwards it.
async function askOwners() {
  let map;
  try {
    map = await ask(client, "DescribeClusterMap", { job });
  } catch {
    map = undefined;  // none to follow (an older router, an unknown job): --addr answers
  }
  const op = map?.operators.find((o) => o.operator === operator && o.partitions > 0);
  const groups = new Map();  // address -> indices of keys
  const { h64 } = op ? await xxhash() : {};
  keys.forEach((k, i) => {
    let at = addr;
    if (op) {
      const p = Number(((BigInt.asIntN(64, h64(k, SEED)) % BigInt(op.partitions)) +
        BigInt(op.partitions)) % BigInt(op.partitions));
      const there = op.owners[p]?.owner?.read_at?.[0]?.grpc;
      if (there && mayAsk(there)) at = there;
    }
    if (!groups.has(at)) groups.set(at, []);
    groups.get(at).push(i);
  });
  const answers = await Promise.all([...groups].map(async ([at, which]) => {
    const req = { ...request, ...(cmd === "get" ? {} : { keys: which.map((i) => keys[i]) }) };
    try {
      return [which, await ask(peer(at), method, req)];
    } catch (err) {
      if (at === addr || !unreachable(err)) throw err;
      console.error(`router ${at} of the cluster map cannot be reached; asking ${addr}`);
      return [which, await ask(client, method, req)];
    }
  }));
  if (cmd === "get") return answers[0][1];
  const results = new Array(keys.length);
  for (const [which, got] of answers) which.forEach((i, j) => { results[i] = got.results[j]; });
  return { results };
}

// the token goes to a router of the map under --addr's rule: TLS, loopback or --allow-insecure
function mayAsk(at) {
  const h = at.replace(/:\d+$/, "").replace(/^\[|\]$/g, "");
  const loop = h === "localhost" || h === "::1" || /^127\.\d+\.\d+\.\d+$/.test(h);
  return !token || !plainText || loop || insecureOk;
}

function peer(at) {
  if (at === addr) return client;
  if (!peers.has(at)) peers.set(at, new pkg.qstate.v1.QueryableState(at, creds));
  return peers.get(at);
}

// --- watch: Server-Sent Events over HTTP(S) ------------------------------------------------

function watchUrl(from) {
  const u = new URL(url);
  u.pathname = `${u.pathname.replace(/\/+$/, "")}/v1/watch/${[job, operator, state]
    .map(encodeURIComponent).join("/")}`;
  const q = new URLSearchParams(keys.map((k) => ["key", k]));
  if (opts.top !== undefined) {
    q.append("top", opts.top);
    q.append("order", opts.asc ? "asc" : "desc");
  }
  if (from !== undefined) q.append("from_batch", String(from));
  u.search = q.toString();
  return u;
}

// One connection: resolves with the refusal ({status, retryAfterS, message}) when the router
// answered an error, or null when the stream ended or dropped; onEvent gets each event and
// returns false to stop.
function stream(from, onEvent) {
  return new Promise((resolve) => {
    const u = watchUrl(from);
    const headers = { accept: "text/event-stream", "cache-control": "no-cache" };
    if (token) headers.authorization = `Bearer ${token}`;
    const tls = u.protocol === "https:";
    const req = (tls ? https : http).get(u, {
      headers, ...(tls && ca ? { ca: readFileSync(ca) } : {}),
    });
    let done = false;
    const finish = (v) => {
      if (!done) {
        done = true;
        resolve(v);
      }
    };
    req.setTimeout(WATCH_IDLE_MS, () => req.destroy(new Error(
      `nothing from the router for ${WATCH_IDLE_MS / 1000} s`)));
    req.on("error", (e) => {
      if (!done) console.error(`watch: connection lost (${e.code ?? e.message})`);
      finish(null);
    });
    req.on("response", (res) => {
      res.setEncoding("utf8");
      if (res.statusCode >= 400) {
        let body = "";
        res.on("data", (c) => { body += c; });
        res.on("end", () => {
          let message;
          try {
            message = JSON.parse(body).message;
          } catch {
            message = body.trim();
          }
          const retry = Number.parseFloat(res.headers["retry-after"] ?? "");
          finish({ status: res.statusCode, message: message || `HTTP ${res.statusCode}`,
                   retryAfterS: Number.isFinite(retry) ? retry : 0 });
        });
        return;
      }
      const parser = createParser({
        onEvent(ev) {
          if (done) return;
          if (onEvent(ev) === false) {
            finish(null);
            req.destroy();
          }
        },
      });
      res.on("data", (chunk) => { if (!done) parser.feed(chunk); });
      res.on("end", () => finish(null));
      res.on("error", () => finish(null));  // also reported on req
    });
  });
}

async function watch() {
  const max = opts["max-events"] === undefined ? Infinity : Number(opts["max-events"]);
  const maxReconnects = opts["max-reconnects"] === undefined ? Infinity
    : Number(opts["max-reconnects"]);
  let last = opts["from-batch"] === undefined ? undefined : Number(opts["from-batch"]);
  let attempt = 0;
  let seen = 0;
  for (;;) {
    const refused = await stream(last, (ev) => {
      let batch;
      try {
        batch = JSON.parse(ev.data).batch;
      } catch {
        batch = undefined;
      }
      if (!Number.isInteger(batch)) {
        console.error(`INTERNAL: the router sent an event that is not a watch event: ` +
                      `${ev.data.slice(0, 200)}`);
        process.exit(EXIT.OTHER);
      }
      console.log(ev.data);
      last = batch;
      attempt = 0;
      seen += 1;
      return seen < max;
    });
    if (seen >= max) return;
    let wait = BACKOFF_MS * 2 ** Math.min(attempt, 10);
    if (refused) {
      const name = HTTP_CODE[refused.status] ?? `HTTP_${refused.status}`;
      if (refused.status !== 429 && refused.status !== 503) {
        console.error(`${name}: ${refused.message}`);
        process.exit(EXIT[name] ?? EXIT.OTHER);
      }
      wait = Math.max(wait, refused.retryAfterS * 1000);
      console.error(`watch: ${name}: ${refused.message}`);
    }
    if (attempt >= maxReconnects) {  // the Python client's max_reconnects
      console.error(`watch: giving up after ${attempt + 1} failed connections in a row ` +
                    "(--max-reconnects)");
      process.exit(refused ? EXIT.UNAVAILABLE : EXIT.UNREACHABLE);
    }
    wait = Math.min(wait, MAX_BACKOFF_MS);
    console.error(`watch: reconnecting in ${(wait / 1000).toFixed(1)} s, resuming ` +
                  `${last === undefined ? "from a snapshot" : `after batch ${last}`}`);
    await new Promise((r) => setTimeout(r, wait));
    attempt += 1;
  }
}
