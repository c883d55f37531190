#!/usr/bin/env node
// Minimal qstate gRPC client: one request, the answer as JSON on stdout.
//
//   node query.mjs get      JOB OPERATOR STATE KEY    [--from MS --to MS] [--addr HOST:PORT]
//   node query.mjs multiget JOB OPERATOR STATE KEY... [--from MS --to MS] [--addr HOST:PORT]
//   node query.mjs top      JOB OPERATOR STATE [--n N] [--asc] [--window MS] [--addr HOST:PORT]
//
// top: the N keys (default 10) with the largest (--asc: smallest) value in one window across
// every partition, ties by key; --window: the window starting at or holding MS (default:
// the current one, the oldest window still open at the watermark).
// Address: --addr, else $QSTATE_GRPC, else 127.0.0.1:50051. TLS: --ca FILE (else
// $QSTATE_TLS_CA), the CA bundle that signed the router's certificate; plain text without it.
// Read your writes: --min-batch N answers as of batch N or a later one.
// Token: --token (else $QSTATE_TOKEN, else the content of --token-file or $QSTATE_TOKEN_FILE),
// sent as "authorization: Bearer ..." metadata; never in plain text off loopback: without
// --ca to another host it refuses (exit 64) unless --allow-insecure or
// QSTATE_ALLOW_INSECURE=true says the network protects it (a service mesh).
// int64 fields (batch, watermark_ms, start_ms, end_ms, int_value) are printed as decimal
// strings, so counts beyond 2^53 stay exact; double values are JSON numbers.
// Exit codes: 0 ok, 2 NOT_FOUND, 3 UNAVAILABLE, 4 INVALID_ARGUMENT, 5 UNAUTHENTICATED or
// PERMISSION_DENIED, 1 any other gRPC error, 64 bad usage. Errors go to stderr as "CODE_NAME: message".
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const PROTO = fileURLToPath(new URL("../../proto/qstate.proto", import.meta.url));
const EXIT = { NOT_FOUND: 2, UNAVAILABLE: 3, INVALID_ARGUMENT: 4, UNAUTHENTICATED: 5,
  PERMISSION_DENIED: 5 };
const USAGE = "usage: query.mjs get JOB OPERATOR STATE KEY [--from MS --to MS] [--addr HOST:PORT] [--ca FILE] [--token T | --token-file F] [--allow-insecure]\n" +
  "       query.mjs multiget JOB OPERATOR STATE KEY... [--from MS --to MS] [--addr HOST:PORT]\n" +
  "       query.mjs top JOB OPERATOR STATE [--n N] [--asc] [--window MS] [--addr HOST:PORT]";

function usage(msg) {
  console.error(`${msg}\n${USAGE}`);
  process.exit(64);
}

let args;
try {
  args = parseArgs({
    allowPositionals: true,
    options: { from: { type: "string" }, to: { type: "string" }, addr: { type: "string" },
               ca: { type: "string" }, token: { type: "string" },
               "token-file": { type: "string" }, "allow-insecure": { type: "boolean" },
               "min-batch": { type: "string" }, n: { type: "string" },
               asc: { type: "boolean" }, window: { type: "string" } },
  });
} catch (e) {
  usage(e.message);
}
const { values: opts, positionals: [cmd, job, operator, state, ...keys] } = args;
if (!["get", "multiget", "top"].includes(cmd)) usage(`unknown command: ${cmd ?? "(none)"}`);
if (cmd === "top" ? keys.length !== 0 || state === undefined
  : keys.length === 0 || (cmd === "get" && keys.length !== 1)) usage(`${cmd}: wrong arguments`);
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

// keepCase: field names as in the .proto; longs: String keeps int64 exact;
// defaults: unset scalars print as their zero value (unset optional/oneof fields stay absent).
const pkg = grpc.loadPackageDefinition(protoLoader.loadSync(PROTO, {
  keepCase: true, longs: String, enums: String, defaults: true,
}));
const addr = opts.addr ?? process.env.QSTATE_GRPC ?? "127.0.0.1:50051";
const ca = opts.ca ?? process.env.QSTATE_TLS_CA;
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
const host = addr.replace(/:\d+$/, "").replace(/^\[|\]$/g, "");
const loopback = host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
const insecureOk = opts["allow-insecure"] || process.env.QSTATE_ALLOW_INSECURE === "true";
if (token && !ca && !loopback && !insecureOk) {
  usage(`refusing to send the client token to ${host} in plain text: give --ca (TLS), or ` +
        "--allow-insecure (QSTATE_ALLOW_INSECURE=true) where the network protects it");
}
const creds = ca ? grpc.credentials.createSsl(readFileSync(ca)) : grpc.credentials.createInsecure();
const client = new pkg.qstate.v1.QueryableState(addr, creds);
const metadata = new grpc.Metadata();
if (token) metadata.set("authorization", `Bearer ${token}`);

const range = {
  ...(opts.from === undefined ? {} : { from_ms: opts.from, to_ms: opts.to }),
  // read your writes: as of this batch or later (the router waits a while for it)
  ...(opts["min-batch"] === undefined ? {} : { min_batch: opts["min-batch"] }),
};
const top = {
  n: opts.n ?? "10", ascending: Boolean(opts.asc),
  ...(opts.window === undefined ? {} : { window_start_ms: opts.window }),
  ...(opts["min-batch"] === undefined ? {} : { min_batch: opts["min-batch"] }),
};
const [method, request] = cmd === "get"
  ? ["Get", { job, operator, state, key: keys[0], ...range }]
  : cmd === "top" ? ["Top", { job, operator, state, ...top }]
  : ["MultiGet", { job, operator, state, keys, ...range }];

client[method](request, metadata, { deadline: Date.now() + 10_000 }, (err, response) => {
  client.close();
  if (err) {
    const name = grpc.status[err.code] ?? String(err.code);
    const retry = err.metadata?.get("retry-after-ms")?.[0];
    console.error(`${name}: ${err.details}${retry ? ` (retry after ${retry} ms)` : ""}`);
    process.exit(EXIT[name] ?? 1);
  }
  console.log(JSON.stringify(response, null, 2));
});
