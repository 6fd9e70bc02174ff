// A blackboard client in JavaScript, written from docs/protocol.md and
// docs/security.md alone.
//
// Usage: node interop.mjs '<json scenario>'   (or the scenario in $BB_INTEROP_SCENARIO)
//
// It connects as an agent (docs/protocol.md, "From another language"): with the
// agent's `.creds` file (`creds`), verifying the server's TLS certificate with
// the CA file `ca`, and with the reply-inbox prefix `_INBOX.<agent id>`, the
// agent id being the `name` claim of the credential's user JWT. It uses only
// the subjects an agent may use (docs/security.md §3): publishes to
// `$KV.<bucket>.<board>.>`, direct gets of the last message of one subject
// (`$JS.API.DIRECT.GET.<stream>.<subject>`, no body) and one-shot consumers
// created through `$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`.
//
// The scenario names the NATS URL, the credential and CA files, the bucket, the
// board and section, the key the Python SDK wrote (`read_key`) and the key to
// create (`create_key`). The program:
//   (a) reads the Python entry by direct get and decodes its msgpack envelope,
//       checks its fields, decodes the key back from the subject, and reads it
//       again at its revision (a one-shot consumer from that stream sequence);
//   (b) updates that key with compare-and-set (msgpack envelope) and creates
//       `create_key` (create = CAS on revision 0) as JSON with Bb-Encoding: json;
//   (c) retries the update with the now stale revision and reports the error.
// With `"mode": "refusals"` it instead reports what the server refuses: a
// connection without a credential, and a write to `board` (one the agent holds
// no right on), next to a write to `own_board` (one it does), a direct get on
// `board`, and the bare direct get whose body names the subject.
// It prints one JSON line with what it saw and wrote, and exits 0; any
// protocol violation it notices exits 1 with {"ok": false, "error": ...}.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { connect, createInbox, credsAuthenticator, headers as natsHeaders, Empty } from "nats";
import { encode as mpEncode, decode as mpDecode } from "@msgpack/msgpack";

// ---------------------------------------------------------------- protocol
const PLAIN_KEY = /^[A-Za-z0-9_-]{1,256}$/;
const NAME = /^[A-Za-z0-9_-]{1,128}$/;
const MAX_KEY_TOKEN = 1024;
const WRONG_LAST_SEQUENCE = 10071;

/** User key -> KV key token (docs/protocol.md, "Key encoding"). */
export function encodeKey(key) {
  if (typeof key !== "string" || key.length === 0) throw new Error("a key must be a non-empty string");
  if (PLAIN_KEY.test(key)) return key;
  const token = "=" + Buffer.from(key, "utf8").toString("base64url"); // unpadded base64url
  if (token.length > MAX_KEY_TOKEN) throw new Error(`key too long once encoded (${token.length})`);
  return token;
}

/** KV key token -> user key. */
export function decodeKey(token) {
  if (!token.startsWith("=")) {
    if (!PLAIN_KEY.test(token)) throw new Error(`not a key token: ${token}`);
    return token;
  }
  return Buffer.from(token.slice(1), "base64url").toString("utf8");
}

function checkName(value, what) {
  if (!NAME.test(value)) throw new Error(`invalid ${what}: ${value}`);
  return value;
}

function entrySubject(bucket, board, section, key) {
  return `$KV.${checkName(bucket, "bucket")}.${checkName(board, "board")}.${checkName(section, "section")}.${encodeKey(key)}`;
}

function parseEntrySubject(bucket, subject) {
  const prefix = `$KV.${bucket}.`;
  if (!subject.startsWith(prefix)) throw new Error(`not an entry subject: ${subject}`);
  const parts = subject.slice(prefix.length).split(".");
  if (parts.length !== 3) throw new Error(`not an entry subject: ${subject}`);
  return { board: parts[0], section: parts[1], key: decodeKey(parts[2]) };
}

function envelope(value, author, { contentType = "application/json", tags = [], metadata = {} } = {}) {
  return {
    v: 1,
    value,
    content_type: contentType,
    tags,
    metadata,
    author,
    created_at: new Date().toISOString(),
  };
}

/** Decode a stored KV message into an entry: its subject, revision (stream
 * sequence) and stored time, its headers and payload. */
function decodeEntry(bucket, subject, revision, storedAt, h, data) {
  const op = h?.get("KV-Operation") || "PUT";
  const entry = { ...parseEntrySubject(bucket, subject), subject, revision, stored_at: storedAt, operation: op };
  if (op !== "PUT" || data.length === 0) return entry;
  const json = (h?.get("Bb-Encoding") || "").toLowerCase() === "json";
  const env = json ? JSON.parse(new TextDecoder().decode(data)) : mpDecode(data);
  if (env === null || typeof env !== "object" || !("value" in env)) throw new Error("not an entry envelope");
  return { ...entry, encoding: json ? "json" : "msgpack", envelope: env };
}

/** A direct get reply: the stored message, or a headers-only status (404). */
function decodeDirect(bucket, msg) {
  const h = msg.headers;
  // A headers-only status reply (e.g. "NATS/1.0 404 Message Not Found").
  if (h && h.code >= 300) return { status: String(h.code), description: h.description };
  if (!h) throw new Error("direct get reply without headers");
  return decodeEntry(bucket, h.get("Nats-Subject"), Number(h.get("Nats-Sequence")), h.get("Nats-Time-Stamp"),
    h, msg.data);
}

/** A consumer delivery's stream sequence and timestamp, from its ack subject
 * (`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ns>.<pending>`;
 * with 11 or more tokens the same fields start at the fifth). */
function ackInfo(reply) {
  const t = (reply || "").split(".");
  if (t[0] !== "$JS" || t[1] !== "ACK" || t.length < 9 || t.length === 10) throw new Error(`not an ack subject: ${reply}`);
  const f = t.length === 9 ? t.slice(2) : t.slice(4);
  const ns = BigInt(f[5]);
  return { streamSeq: Number(f[3]), storedAt: new Date(Number(ns / 1000000n)).toISOString() };
}

/** A JetStream control message (idle heartbeat, flow control): status 100, no payload. */
function isControl(msg) {
  return msg.data.length === 0 && msg.headers?.code === 100;
}

class Board {
  constructor(nc, bucket, inboxPrefix) {
    this.nc = nc;
    this.inboxPrefix = inboxPrefix;
    this.js = nc.jetstream();
    this.bucket = bucket;
    this.stream = `KV_${bucket}`;
  }

  /** The latest revision: a direct get of the last message of the subject, no body. */
  async get(board, section, key) {
    const subject = entrySubject(this.bucket, board, section, key);
    const msg = await this.nc.request(`$JS.API.DIRECT.GET.${this.stream}.${subject}`, Empty, { timeout: 5000 });
    return decodeDirect(this.bucket, msg);
  }

  /** The entry at a revision: a one-shot consumer on the key's subject from that
   * stream sequence (docs/protocol.md §5, "One-shot reads"); its first delivery
   * must be that revision, else the key has no such revision. */
  async getAt(board, section, key, revision) {
    const subject = entrySubject(this.bucket, board, section, key);
    const first = await this.readFirst(subject, revision);
    if (first === null || first.revision !== revision) return { status: "404", description: "no such revision" };
    if (first.operation !== "PUT") return { status: "404", description: `${first.operation} at that revision` };
    return first;
  }

  /** The first message on `subject` with a stream sequence >= `start`, or null. */
  async readFirst(subject, start) {
    const name = `node${randomUUID().replaceAll("-", "").slice(0, 16)}`;
    const deliver = createInbox(this.inboxPrefix); // under _INBOX.<agent id>: the only place we may subscribe
    const sub = this.nc.subscribe(deliver);
    try {
      const config = {
        name, filter_subject: subject, deliver_subject: deliver,
        deliver_policy: "by_start_sequence", opt_start_seq: Math.max(1, start),
        ack_policy: "explicit", max_ack_pending: 1, max_deliver: 1,
        inactive_threshold: 5_000_000_000, mem_storage: true, num_replicas: 1,
      };
      const body = new TextEncoder().encode(JSON.stringify({ stream_name: this.stream, config }));
      const reply = await this.nc.request(`$JS.API.CONSUMER.CREATE.${this.stream}.${name}.${subject}`, body,
        { timeout: 5000 });
      const info = JSON.parse(new TextDecoder().decode(reply.data));
      if (info.error) throw new Error(`consumer refused: ${JSON.stringify(info.error)}`);
      if (!info.num_pending) return null;
      const timer = setTimeout(() => sub.unsubscribe(), 5000);
      try {
        for await (const msg of sub) {
          if (isControl(msg)) continue;
          const { streamSeq, storedAt } = ackInfo(msg.reply);
          return decodeEntry(this.bucket, msg.subject, streamSeq, storedAt, msg.headers, msg.data);
        }
      } finally {
        clearTimeout(timer);
      }
      throw new Error(`the stored message of ${subject} did not arrive`);
    } finally {
      // no CONSUMER.DELETE (an agent may not): the server drops it by its inactive_threshold
      sub.unsubscribe();
    }
  }

  /** Write an envelope; expectedRevision 0 = create, n = compare-and-set, null = put. */
  async write(board, section, key, env, { expectedRevision = null, encoding = "msgpack" } = {}) {
    const subject = entrySubject(this.bucket, board, section, key);
    const h = natsHeaders();
    h.set("Nats-Msg-Id", randomUUID());
    if (expectedRevision !== null) h.set("Nats-Expected-Last-Subject-Sequence", String(expectedRevision));
    let payload;
    if (encoding === "json") {
      h.set("Bb-Encoding", "json");
      payload = new TextEncoder().encode(JSON.stringify(env));
    } else {
      payload = mpEncode(env);
    }
    try {
      const ack = await this.js.publish(subject, payload, { headers: h, timeout: 5000 });
      return { ok: true, revision: ack.seq, subject };
    } catch (err) {
      const api = err?.api_error;
      if (!api) throw err;
      const result = { ok: false, err_code: api.err_code, code: api.code, description: api.description };
      if (api.err_code === WRONG_LAST_SEQUENCE) {
        const m = /(\d+)\s*$/.exec(api.description || "");
        result.current_revision = m ? Number(m[1]) : null;
      }
      return result;
    }
  }
}

function expect(cond, message) {
  if (!cond) throw new Error(message);
}

// ---------------------------------------------------------------- connecting
/** The principal a `.creds` file is for: the `name` claim of its user JWT. */
export function credsPrincipal(credsText) {
  const m = /BEGIN NATS USER JWT-+\s*(\S+)\s*-+END NATS USER JWT/.exec(credsText);
  if (!m) throw new Error("not a NATS .creds file (no user JWT)");
  const claims = JSON.parse(Buffer.from(m[1].split(".")[1], "base64url").toString("utf8"));
  return checkName(claims.name, "principal");
}

/** Connect as the agent whose `.creds` file is `creds`, verifying the server with
 * the CA file `ca`. Returns the connection and its reply-inbox prefix. */
async function connectAgent(sc, { creds = sc.creds } = {}) {
  const opts = { servers: sc.url, name: "bb-interop-node", timeout: 5000, reconnect: false, tls: { caFile: sc.ca } };
  let agent = null;
  if (creds) {
    const text = readFileSync(creds);
    agent = credsPrincipal(text.toString("utf8"));
    if (sc.agent) expect(agent === sc.agent, `the credential is for ${agent}, not ${sc.agent}`);
    opts.authenticator = credsAuthenticator(new Uint8Array(text));
    opts.inboxPrefix = `_INBOX.${agent}`; // an agent may subscribe only below _INBOX.<agent id>.
  }
  const nc = await connect(opts);
  return { nc, agent, inboxPrefix: opts.inboxPrefix };
}

// ---------------------------------------------------------------- scenario
async function run(sc) {
  const { nc, inboxPrefix } = await connectAgent(sc);
  try {
    const bb = new Board(nc, sc.bucket, inboxPrefix);
    const out = { ok: true };

    // (a) read what the Python SDK wrote
    const read = await bb.get(sc.board, sc.section, sc.read_key);
    expect(!read.status, `direct get failed: ${read.status} ${read.description}`);
    const env = read.envelope;
    expect(read.encoding === "msgpack", "the Python SDK writes msgpack by default");
    expect(env.v === 1, `schema version ${env.v}`);
    for (const f of ["value", "content_type", "tags", "metadata", "author", "created_at"]) {
      expect(f in env, `envelope lacks ${f}`);
    }
    expect(Array.isArray(env.tags), "tags must be an array");
    expect(!Number.isNaN(Date.parse(env.created_at)), `created_at not RFC 3339: ${env.created_at}`);
    const atRev = await bb.getAt(sc.board, sc.section, sc.read_key, read.revision);
    expect(atRev.revision === read.revision, "get at revision returned another revision");
    const bytes = env.value?.bytes;
    out.read = {
      board: read.board,
      section: read.section,
      key: read.key, // decoded back from the subject
      token: read.subject.split(".").pop(),
      revision: read.revision,
      value: env.value,
      bytes_hex: bytes instanceof Uint8Array ? Buffer.from(bytes).toString("hex") : null,
      content_type: env.content_type,
      tags: env.tags,
      metadata: env.metadata,
      author: env.author,
      created_at: env.created_at,
      stored_at: read.stored_at,
    };
    if (bytes instanceof Uint8Array) out.read.value = { ...env.value, bytes: null };

    const missing = await bb.get(sc.board, sc.section, sc.missing_key);
    expect(missing.status === "404", `a missing key gave ${JSON.stringify(missing)}`);
    const wrongKey = await bb.getAt(sc.board, sc.section, sc.missing_key, read.revision);
    expect(wrongKey.status === "404", "get at a revision of another key must be not found");
    out.missing = missing;

    // (b) compare-and-set on the Python key (msgpack), create a new key (JSON)
    const upd = await bb.write(
      sc.board, sc.section, sc.read_key,
      envelope(sc.update_value, sc.author, { tags: ["from-node", "cas"], metadata: { lang: "js", step: 1 } }),
      { expectedRevision: read.revision },
    );
    expect(upd.ok, `CAS update failed: ${JSON.stringify(upd)}`);
    const created = await bb.write(
      sc.board, sc.section, sc.create_key,
      envelope(sc.create_value, sc.author, { contentType: "application/json", tags: ["from-node", "json"],
        metadata: { lang: "js", encoding: "json" } }),
      { expectedRevision: 0, encoding: "json" },
    );
    expect(created.ok, `create failed: ${JSON.stringify(created)}`);
    const again = await bb.write(sc.board, sc.section, sc.create_key, envelope("dup", sc.author),
      { expectedRevision: 0 });
    out.update = { revision: upd.revision, subject: upd.subject };
    out.create = { revision: created.revision, subject: created.subject };
    out.create_again = again;

    // (c) stale compare-and-set: the revision read in (a) is no longer the latest
    out.stale = await bb.write(sc.board, sc.section, sc.read_key, envelope("stale", sc.author),
      { expectedRevision: read.revision });
    expect(!out.stale.ok, "a stale compare-and-set was accepted");

    // the revision read in (a) is still readable by sequence; the latest is ours
    const old = await bb.getAt(sc.board, sc.section, sc.read_key, read.revision);
    const latest = await bb.get(sc.board, sc.section, sc.read_key);
    out.history_check = { old_revision: old.revision, old_author: old.envelope?.author,
      latest_revision: latest.revision, latest_author: latest.envelope?.author };
    return out;
  } finally {
    await nc.drain();
  }
}

/** What the server refuses this client (docs/security.md §1). */
async function refusals(sc) {
  const out = { ok: true };

  // no credential: the server refuses the connection
  try {
    const { nc } = await connectAgent(sc, { creds: null });
    await nc.close();
    out.no_credential = { connected: true };
  } catch (err) {
    out.no_credential = { connected: false, code: err?.code ?? null, error: String(err?.message ?? err) };
  }

  const { nc, agent, inboxPrefix } = await connectAgent(sc);
  try {
    out.agent = agent;
    const bb = new Board(nc, sc.bucket, inboxPrefix);
    const env = envelope("written from node", agent, { tags: ["from-node"] });
    const attempt = async (board) => {
      try {
        return await bb.write(board, sc.section, sc.key, env, { expectedRevision: 0 });
      } catch (err) {
        return { ok: false, code: err?.code ?? null, error: String(err?.message ?? err) };
      }
    };
    // a board the agent holds no right on: no ack, the server refuses the publish
    out.foreign_write = await attempt(sc.board);
    // the board it may write (so the refusal above is the board's, not the connection's)
    out.own_write = await attempt(sc.own_board);
    // and it may not read the foreign board either
    try {
      out.foreign_read = await bb.get(sc.board, sc.section, sc.key);
    } catch (err) {
      out.foreign_read = { ok: false, code: err?.code ?? null, error: String(err?.message ?? err) };
    }
    // nor use the bare direct get, whose body names any subject (version 1's read at a revision)
    try {
      const body = new TextEncoder().encode(JSON.stringify({ seq: out.own_write.revision ?? 1 }));
      await nc.request(`$JS.API.DIRECT.GET.${bb.stream}`, body, { timeout: 5000 });
      out.bare_direct_get = { ok: true };
    } catch (err) {
      out.bare_direct_get = { ok: false, code: err?.code ?? null, error: String(err?.message ?? err) };
    }
    return out;
  } finally {
    await nc.drain();
  }
}

const raw = process.argv[2] ?? process.env.BB_INTEROP_SCENARIO;
if (!raw) {
  console.error("usage: node interop.mjs '<json scenario>'");
  process.exit(2);
}
try {
  const sc = JSON.parse(raw);
  const result = await (sc.mode === "refusals" ? refusals(sc) : run(sc));
  console.log(JSON.stringify(result));
} catch (err) {
  console.log(JSON.stringify({ ok: false, error: String(err?.stack ?? err) }));
  process.exit(1);
}
