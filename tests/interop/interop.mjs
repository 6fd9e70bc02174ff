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
// It signs what it writes and verifies what it reads (docs/protocol.md §14,
// in signing.mjs): at connect it publishes its certificate (the user JWT of its
// `.creds`) to `bb.keys.cert.<its public key>`, and signs every write with the
// nkey seed of the same file.
//
// The scenario names the NATS URL, the credential and CA files, the bucket, the
// board and section, the key the Python SDK wrote (`read_key`) and the key to
// create (`create_key`). The program:
//   (a) reads the Python entry by direct get and decodes its msgpack envelope,
//       checks its fields, decodes the key back from the subject, and reads it
//       again at its revision (a one-shot consumer from that stream sequence);
//       it verifies the SDK's signature both times (the writer's certificate
//       fetched from the key registry and checked against the account key of
//       its own credential), and a tampered copy, which must not verify;
//   (b) updates that key with compare-and-set (a signed msgpack envelope) and
//       creates `create_key` (create = CAS on revision 0) as JSON with
//       Bb-Encoding: json, signed over the record's canonical encoding;
//   (c) retries the update with the now stale revision and reports the error;
//   (d) in section `attack_section`: publishes to `tamper_key` a payload changed
//       after signing, and to `forged_key` an entry whose author is
//       `forged_author`, signed with its own key; it reads both back and
//       reports its own verdicts;
//   (e) with `batch_keys`: reads those entries of `batch_section`, which the SDK
//       wrote through a pipeline (signed in one batch, docs/protocol.md §14.10),
//       verifies each (one signature check for the batch), and checks that the
//       first does not verify with the second's path, nor without a path;
//   (f) with `node_batch_keys`: writes one entry to each of those keys of
//       `batch_section`, the writes signed as one batch, and reads them back.
// With `"mode": "refusals"` it instead reports what the server refuses: a
// connection without a credential, and a write to `board` (one the agent holds
// no right on), next to a write to `own_board` (one it does), a direct get on
// `board`, and the bare direct get whose body names the subject.
// With `"mode": "memory_canonical"` it connects nowhere: it prints the canonical encoding
// of each memory record of `records` (version 1 and 2, §13.2).
// With `"mode": "example"` it connects nowhere: it computes the worked example
// of docs/protocol.md §14.9 from the scenario's inputs and prints the record's
// canonical bytes, the signing input and the signature; with
// `"mode": "example_batch"`, that of §14.10 (the leaves, the root, the batch
// message, the signature and each record's path).
// It prints one JSON line with what it saw and wrote, and exits 0; any
// protocol violation it notices exits 1 with {"ok": false, "error": ...}.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { connect, createInbox, credsAuthenticator, headers as natsHeaders, Empty } from "nats";
import { decode as mpDecode } from "@msgpack/msgpack";
import {
  batchMessage, canonicalEnvelope, canonicalMemory, canonicalOfPayload, issuerOf, leafHash, readCertificate, sign, signBatch,
  signerFromCreds, signerFromSeed, signingInput, SIG, SIG_PATH, timestampUs, verdict,
} from "./signing.mjs";

// ---------------------------------------------------------------- protocol
const PLAIN_KEY = /^[A-Za-z0-9_-]{1,256}$/;
const NAME = /^[A-Za-z0-9_-]{1,128}$/;
const MAX_KEY_TOKEN = 1024;
const WRONG_LAST_SEQUENCE = 10071;
const KEYS_STREAM = "BB_KEYS";

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
 * sequence) and stored time (RFC 3339, and microseconds: what a signature's time
 * is compared with), its headers and payload. */
function decodeEntry(bucket, subject, revision, storedAt, storedAtUs, h, data) {
  const op = h?.get("KV-Operation") || "PUT";
  const entry = { ...parseEntrySubject(bucket, subject), subject, revision, stored_at: storedAt,
    stored_at_us: storedAtUs, operation: op, headers: h, payload: data };
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
  const stamp = h.get("Nats-Time-Stamp");
  return decodeEntry(bucket, h.get("Nats-Subject"), Number(h.get("Nats-Sequence")), stamp, timestampUs(stamp),
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
  return { streamSeq: Number(f[3]), storedAt: new Date(Number(ns / 1000000n)).toISOString(), storedAtUs: ns / 1000n };
}

/** A JetStream control message (idle heartbeat, flow control): status 100, no payload. */
function isControl(msg) {
  return msg.data.length === 0 && msg.headers?.code === 100;
}

class Board {
  constructor(nc, bucket, inboxPrefix, signer) {
    this.nc = nc;
    this.signer = signer;
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
          const { streamSeq, storedAt, storedAtUs } = ackInfo(msg.reply);
          return decodeEntry(this.bucket, msg.subject, streamSeq, storedAt, storedAtUs, msg.headers, msg.data);
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

  /** Write envelopes [{section, key, env}] (puts), signed as one batch (docs/protocol.md
   * §14.10); each is published as its own message, in order. Returns their acks. */
  async writeBatch(board, writes) {
    const prepared = writes.map(({ section, key, env }) => {
      const h = natsHeaders();
      h.set("Nats-Msg-Id", randomUUID());
      return { subject: entrySubject(this.bucket, board, section, key), headers: h, record: canonicalEnvelope(env) };
    });
    signBatch(this.signer, prepared);
    const out = [];
    for (const { subject, headers, record } of prepared) {
      const ack = await this.js.publish(subject, record, { headers, timeout: 5000 });
      out.push({ ok: true, revision: ack.seq, subject, path: headers.get(SIG_PATH), signature: headers.get(SIG) });
    }
    return out;
  }

  /** Write an envelope, signed; expectedRevision 0 = create, n = compare-and-set, null = put.
   * The payload is the envelope's canonical encoding (msgpack), or with encoding
   * "json" its JSON (the signature still covers the canonical encoding).
   * `tamper` (a test of readers): the envelope actually sent, changed after signing. */
  async write(board, section, key, env, { expectedRevision = null, encoding = "msgpack", tamper = null } = {}) {
    const subject = entrySubject(this.bucket, board, section, key);
    const h = natsHeaders();
    h.set("Nats-Msg-Id", randomUUID());
    if (expectedRevision !== null) h.set("Nats-Expected-Last-Subject-Sequence", String(expectedRevision));
    const record = canonicalEnvelope(env);
    let payload = record;
    if (encoding === "json") {
      h.set("Bb-Encoding", "json");
      payload = new TextEncoder().encode(JSON.stringify(env));
    }
    sign(this.signer, subject, h, record); // after every covered header is set
    if (tamper !== null) payload = canonicalEnvelope(tamper);
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

/** The key registry (docs/protocol.md §14.6): certificates and revocations on BB_KEYS,
 * read by direct get of the last message of a subject. */
class Keys {
  constructor(nc, trustedAccounts) {
    this.nc = nc;
    this.trusted = trustedAccounts;
    this.certs = new Map();
    this.revoked = {};
    // the batch roots already checked, and how many signature checks were made
    this.memo = { roots: new Map(), checks: 0 };
  }

  async last(subject) {
    const msg = await this.nc.request(`$JS.API.DIRECT.GET.${KEYS_STREAM}.${subject}`, Empty, { timeout: 5000 });
    return msg.headers && msg.headers.code >= 300 ? null : msg;
  }

  /** Publish our own certificate (our user JWT) unless the registry holds it already. */
  async publishOwn(signer) {
    const subject = `bb.keys.cert.${signer.publicKey}`;
    const held = await this.last(subject);
    if (held && new TextDecoder().decode(held.data) === signer.certificate) return { subject, published: false };
    const h = natsHeaders();
    h.set("Nats-Msg-Id", `cert-${signer.publicKey}-${randomUUID()}`);
    await this.nc.jetstream().publish(subject, new TextEncoder().encode(signer.certificate), { headers: h,
      timeout: 5000 });
    return { subject, published: true };
  }

  /** Fetch (once) the certificate of a key and the revocations record. */
  async ensure(publicKey) {
    if (!this.certs.has(publicKey)) {
      const msg = await this.last(`bb.keys.cert.${publicKey}`);
      this.certs.set(publicKey, msg ? readCertificate(publicKey, new TextDecoder().decode(msg.data), this.trusted)
        : null);
    }
    const rev = await this.last("bb.keys.revocations");
    this.revoked = rev ? mpDecode(rev.data).revoked ?? {} : {};
  }

  certificate(publicKey) {
    return this.certs.get(publicKey) ?? null;
  }

  revokedAt(publicKey) {
    return this.revoked[publicKey] ?? null;
  }

  /** The verdict on a stored entry (docs/protocol.md §14.5), its signer's certificate fetched first. */
  async verify(entry, payload = entry.payload, headers = entry.headers) {
    const key = headers?.get("Bb-Sig-Key");
    if (key) await this.ensure(key);
    return verdict({
      subject: entry.subject, headers, payload, storedAtUs: entry.stored_at_us,
      author: entry.operation === "PUT" ? entry.envelope?.author ?? null : null,
      canonical: () => canonicalOfPayload(headers, payload),
    }, this, { memo: this.memo });
  }
}

function expect(cond, message) {
  if (!cond) throw new Error(message);
}

/** A copy of message headers with `name` set to `value` (or removed when null). */
function withHeader(h, name, value) {
  const copy = natsHeaders();
  for (const k of h.keys()) {
    if (k === name) continue;
    for (const v of h.values(k)) copy.append(k, v);
  }
  if (value !== null) copy.set(name, value);
  return copy;
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
 * the CA file `ca`, and publish its certificate. Returns the connection, its
 * reply-inbox prefix, its signer and the key registry (which trusts the account
 * that issued its own credential). */
async function connectAgent(sc, { creds = sc.creds } = {}) {
  const opts = { servers: sc.url, name: "bb-interop-node", timeout: 5000, reconnect: false, tls: { caFile: sc.ca } };
  let agent = null;
  let signer = null;
  if (creds) {
    const text = readFileSync(creds);
    agent = credsPrincipal(text.toString("utf8"));
    if (sc.agent) expect(agent === sc.agent, `the credential is for ${agent}, not ${sc.agent}`);
    opts.authenticator = credsAuthenticator(new Uint8Array(text));
    opts.inboxPrefix = `_INBOX.${agent}`; // an agent may subscribe only below _INBOX.<agent id>.
    signer = signerFromCreds(text.toString("utf8"));
  }
  const nc = await connect(opts);
  let keys = null;
  let certificate = null;
  if (signer) {
    keys = new Keys(nc, [issuerOf(signer.certificate)]);
    certificate = await keys.publishOwn(signer);
  }
  return { nc, agent, inboxPrefix: opts.inboxPrefix, signer, keys, certificate };
}

// ---------------------------------------------------------------- scenario
async function run(sc) {
  const { nc, inboxPrefix, signer, keys, certificate } = await connectAgent(sc);
  try {
    const bb = new Board(nc, sc.bucket, inboxPrefix, signer);
    const out = { ok: true, public_key: signer.publicKey, certificate };

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
    // the SDK's signature, as any reader checks it; and a copy changed after signing
    const tampered = canonicalEnvelope({ ...env, value: { ...env.value, title: "changed after signing" } });
    const signerKey = read.headers.get("Bb-Sig-Key");
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
      verdict: await keys.verify(read),
      at_revision_verdict: await keys.verify(atRev),
      tampered_verdict: await keys.verify(read, tampered),
      signer: keys.certificate(signerKey)?.principal ?? null,
      signer_kind: keys.certificate(signerKey)?.kind ?? null,
      // the SDK sends the canonical encoding (docs/protocol.md §14.3): ours of its record is the same bytes
      canonical_payload: Buffer.compare(Buffer.from(canonicalOfPayload(read.headers, read.payload)),
        Buffer.from(read.payload)) === 0,
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

    // the revision read in (a) is still readable by sequence; the latest is ours, and verifies
    const old = await bb.getAt(sc.board, sc.section, sc.read_key, read.revision);
    const latest = await bb.get(sc.board, sc.section, sc.read_key);
    out.history_check = { old_revision: old.revision, old_author: old.envelope?.author,
      latest_revision: latest.revision, latest_author: latest.envelope?.author,
      old_verdict: await keys.verify(old), latest_verdict: await keys.verify(latest) };
    const createdBack = await bb.get(sc.board, sc.section, sc.create_key);
    out.create.verdict = await keys.verify(createdBack);

    // (d) attacks a reader must catch: a payload changed after signing, another agent as author
    const honest = envelope({ amount: 10 }, sc.author, { tags: ["from-node"] });
    const tamper = await bb.write(sc.board, sc.attack_section, sc.tamper_key, honest,
      { tamper: { ...honest, value: { amount: 1000000 } } });
    expect(tamper.ok, `tampered write refused by the server: ${JSON.stringify(tamper)}`);
    const forged = await bb.write(sc.board, sc.attack_section, sc.forged_key,
      envelope("written by someone else", sc.forged_author));
    expect(forged.ok, `forged write refused by the server: ${JSON.stringify(forged)}`);
    out.tamper = { ...tamper, verdict: await keys.verify(await bb.get(sc.board, sc.attack_section, sc.tamper_key)) };
    out.forged = { ...forged, verdict: await keys.verify(await bb.get(sc.board, sc.attack_section, sc.forged_key)) };

    // (e) the SDK's pipelined writes, signed in one batch: each verifies, the batch's signature checked once;
    // the first record with the second's path (or with none) does not verify
    if (sc.batch_keys) {
      const entries = [];
      for (const key of sc.batch_keys) {
        const e = await bb.get(sc.board, sc.batch_section, key);
        expect(!e.status, `direct get of ${key} failed: ${e.status} ${e.description}`);
        entries.push(e);
      }
      const before = keys.memo.checks;
      const verdicts = [];
      for (const e of entries) verdicts.push(await keys.verify(e));
      const checks = keys.memo.checks - before;
      const [first, second] = entries;
      out.batch = {
        verdicts,
        signature_checks: checks,
        values: entries.map((e) => e.envelope.value),
        paths: entries.map((e) => e.headers.get(SIG_PATH) || null),
        signatures: [...new Set(entries.map((e) => e.headers.get(SIG)))].length,
        swapped_path_verdict: await keys.verify(first, first.payload,
          withHeader(first.headers, SIG_PATH, second.headers.get(SIG_PATH))),
        no_path_verdict: await keys.verify(first, first.payload, withHeader(first.headers, SIG_PATH, null)),
        bad_path_verdict: await keys.verify(first, first.payload, withHeader(first.headers, SIG_PATH, "R-short")),
      };
    }

    // (f) three writes signed by us as one batch, read back and verified by ourselves
    if (sc.node_batch_keys) {
      const written = await bb.writeBatch(sc.board, sc.node_batch_keys.map((key, i) => ({
        section: sc.batch_section, key, env: envelope({ n: i, from: "node batch" }, sc.author, { tags: ["batch"] }),
      })));
      const verdicts = [];
      for (const key of sc.node_batch_keys) verdicts.push(await keys.verify(await bb.get(sc.board, sc.batch_section,
        key)));
      out.node_batch = { written, verdicts };
    }
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

  const { nc, agent, inboxPrefix, signer } = await connectAgent(sc);
  try {
    out.agent = agent;
    const bb = new Board(nc, sc.bucket, inboxPrefix, signer);
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

/** docs/protocol.md §14.9, computed from its inputs (no server). */
function example(sc) {
  const record = canonicalEnvelope(JSON.parse(sc.record));
  const signer = signerFromSeed(sc.seed);
  const h = natsHeaders();
  h.set("Nats-Msg-Id", sc.msg_id);
  if (sc.expected) h.set("Nats-Expected-Last-Subject-Sequence", sc.expected);
  sign(signer, sc.subject, h, record, BigInt(sc.signed_at_us));
  const input = signingInput(sc.subject, h, BigInt(sc.signed_at_us), signer.publicKey, record);
  return { ok: true, public_key: signer.publicKey, record_hex: Buffer.from(record).toString("hex"),
    signing_input_hex: Buffer.from(input).toString("hex"), signature: h.get("Bb-Sig") };
}

/** docs/protocol.md §14.10, computed from its inputs (no server): `records` [{subject, msg_id, record}]. */
function exampleBatch(sc) {
  const signer = signerFromSeed(sc.seed);
  const at = BigInt(sc.signed_at_us);
  const writes = sc.records.map(({ subject, msg_id: msgId, record }) => {
    const h = natsHeaders();
    h.set("Nats-Msg-Id", msgId);
    return { subject, headers: h, record: canonicalEnvelope(JSON.parse(record)) };
  });
  const leaves = writes.map((w) => leafHash(signingInput(w.subject, w.headers, at, signer.publicKey, w.record)));
  const { root } = signBatch(signer, writes, at);
  const hex = (b) => Buffer.from(b).toString("hex");
  return { ok: true, public_key: signer.publicKey, leaves: leaves.map(hex), root: hex(root),
    batch_message_hex: hex(batchMessage(root)), signatures: writes.map((w) => w.headers.get(SIG)),
    times: writes.map((w) => w.headers.get("Bb-Sig-Time")), paths: writes.map((w) => w.headers.get(SIG_PATH)) };
}

/** The canonical encodings (§13) of the memory records `records` (JSON texts), as hex (no server). */
function memoryCanonical(sc) {
  return { ok: true, hex: sc.records.map((r) => Buffer.from(canonicalMemory(JSON.parse(r))).toString("hex")) };
}

const raw = process.argv[2] ?? process.env.BB_INTEROP_SCENARIO;
if (!raw) {
  console.error("usage: node interop.mjs '<json scenario>'");
  process.exit(2);
}
try {
  const sc = JSON.parse(raw);
  const modes = { refusals, example, example_batch: exampleBatch, memory_canonical: memoryCanonical, run };
  const result = await (modes[sc.mode ?? "run"] ?? run)(sc);
  console.log(JSON.stringify(result));
} catch (err) {
  console.log(JSON.stringify({ ok: false, error: String(err?.stack ?? err) }));
  process.exit(1);
}
