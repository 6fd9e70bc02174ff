// A blackboard client in JavaScript, written from docs/protocol.md alone.
//
// Usage: node interop.mjs '<json scenario>'   (or the scenario in $BB_INTEROP_SCENARIO)
//
// The scenario names the NATS URL, the bucket, the board and section, the key
// the Python SDK wrote (`read_key`) and the key to create (`create_key`).
// The program:
//   (a) reads the Python entry by direct get and decodes its msgpack envelope,
//       checks its fields, decodes the key back from the subject, and reads it
//       again at its revision (direct get by sequence);
//   (b) updates that key with compare-and-set (msgpack envelope) and creates
//       `create_key` (create = CAS on revision 0) as JSON with Bb-Encoding: json;
//   (c) retries the update with the now stale revision and reports the error.
// It prints one JSON line with what it saw and wrote, and exits 0; any
// protocol violation it notices exits 1 with {"ok": false, "error": ...}.

import { randomUUID } from "node:crypto";
import { connect, headers as natsHeaders, Empty } from "nats";
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

/** Decode a stored KV message (direct get reply) into an entry. */
function decodeStored(bucket, msg) {
  const h = msg.headers;
  // A headers-only status reply (e.g. "NATS/1.0 404 Message Not Found").
  if (h && h.code >= 300) return { status: String(h.code), description: h.description };
  if (!h) throw new Error("direct get reply without headers");
  const subject = h.get("Nats-Subject");
  const op = h.get("KV-Operation") || "PUT";
  const entry = {
    ...parseEntrySubject(bucket, subject),
    subject,
    revision: Number(h.get("Nats-Sequence")),
    stored_at: h.get("Nats-Time-Stamp"),
    operation: op,
  };
  if (op !== "PUT" || msg.data.length === 0) return entry;
  const json = (h.get("Bb-Encoding") || "").toLowerCase() === "json";
  const env = json ? JSON.parse(new TextDecoder().decode(msg.data)) : mpDecode(msg.data);
  if (env === null || typeof env !== "object" || !("value" in env)) throw new Error("not an entry envelope");
  return { ...entry, encoding: json ? "json" : "msgpack", envelope: env };
}

class Board {
  constructor(nc, bucket) {
    this.nc = nc;
    this.js = nc.jetstream();
    this.bucket = bucket;
    this.stream = `KV_${bucket}`;
  }

  async get(board, section, key) {
    const subject = entrySubject(this.bucket, board, section, key);
    const msg = await this.nc.request(`$JS.API.DIRECT.GET.${this.stream}.${subject}`, Empty, { timeout: 5000 });
    return decodeStored(this.bucket, msg);
  }

  async getAt(board, section, key, revision) {
    const subject = entrySubject(this.bucket, board, section, key);
    const req = new TextEncoder().encode(JSON.stringify({ seq: revision }));
    const msg = await this.nc.request(`$JS.API.DIRECT.GET.${this.stream}`, req, { timeout: 5000 });
    const entry = decodeStored(this.bucket, msg);
    if (entry.status) return entry;
    if (entry.subject !== subject) return { status: "404", description: "revision of another key" };
    return entry;
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

// ---------------------------------------------------------------- scenario
async function run(sc) {
  const nc = await connect({ servers: sc.url, name: "bb-interop-node", timeout: 5000 });
  try {
    const bb = new Board(nc, sc.bucket);
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

const raw = process.argv[2] ?? process.env.BB_INTEROP_SCENARIO;
if (!raw) {
  console.error("usage: node interop.mjs '<json scenario>'");
  process.exit(2);
}
try {
  const result = await run(JSON.parse(raw));
  console.log(JSON.stringify(result));
} catch (err) {
  console.log(JSON.stringify({ ok: false, error: String(err?.stack ?? err) }));
  process.exit(1);
}
