// Record signatures in JavaScript, written from docs/protocol.md §13 (canonical
// encoding) and §14 (signatures) alone: the canonical encoding of an entry
// envelope, the bb-sig/1 signing input, signing with the nkey seed of a
// `.creds` file, reading a certificate (a user JWT) and the verdicts of §14.5;
// and batch signatures (§14.10): one signature over the root of a SHA-256
// Merkle tree of many records' signing inputs, each record with its path.
//
// Ed25519 and the nkey encodings come from nkeys.js (the nats package's own
// dependency), SHA-256 from node:crypto; nothing else is needed.

import { createHash } from "node:crypto";
import { fromPublic, fromSeed } from "nkeys.js";
import { decode as mpDecode } from "@msgpack/msgpack";

export const SCHEME = "bb-sig/1";
export const SIG_KEY = "Bb-Sig-Key";
export const SIG_TIME = "Bb-Sig-Time";
export const SIG = "Bb-Sig";
export const SIG_PATH = "Bb-Sig-Path";
export const BATCH_SCHEME = "bb-sig/1 batch";
const MAX_PATH_STEPS = 32;
const PATH_STEP = /^[LR][A-Za-z0-9_-]{43}$/;
const COVERED = ["Nats-Expected-Last-Subject-Sequence", "KV-Operation", "Nats-TTL"];
const USER_KEY = /^U[A-Z2-7]{55}$/;
const TIME = /^(0|[1-9][0-9]{0,18})$/;
const SIG_TEXT = /^[A-Za-z0-9_-]{86}$/;
const NAME = /^[A-Za-z0-9_-]{1,128}$/;
const KINDS = new Set(["agent", "worker", "operator"]);
const utf8 = new TextEncoder();

// ---------------------------------------------------------------- canonical encoding (§13)
/** Bytes accumulated big-endian. */
class Out {
  constructor() { this.parts = []; }
  byte(...b) { this.parts.push(Uint8Array.from(b)); }
  bytes(b) { this.parts.push(b); }
  uint(n, size) { // n: BigInt
    const b = new Uint8Array(size);
    for (let i = size - 1; i >= 0; i--) { b[i] = Number(n & 0xffn); n >>= 8n; }
    this.parts.push(b);
  }
  done() {
    const len = this.parts.reduce((a, p) => a + p.length, 0);
    const all = new Uint8Array(len);
    let at = 0;
    for (const p of this.parts) { all.set(p, at); at += p.length; }
    return all;
  }
}

/** The smallest header of a str, bin, array or map (rules 4 and 6). */
function header(out, n, fix, fixMax, [c8, c16, c32]) {
  if (n <= fixMax) out.byte(fix | n);
  else if (n < 0x100 && c8) out.byte(c8, n);
  else if (n < 0x10000) { out.byte(c16); out.uint(BigInt(n), 2); }
  else { out.byte(c32); out.uint(BigInt(n), 4); }
}

/** An integer in its smallest msgpack form (rule 5). */
function int(out, value) {
  const n = BigInt(value);
  if (n >= 0n && n <= 0x7fn) return out.byte(Number(n));
  if (n < 0n && n >= -32n) return out.byte(Number(n & 0xffn));
  if (n > 0n) {
    for (const [code, size] of [[0xcc, 1], [0xcd, 2], [0xce, 4], [0xcf, 8]]) {
      if (n < 1n << BigInt(8 * size)) { out.byte(code); return out.uint(n, size); }
    }
    throw new Error(`integer ${n} does not fit in 64 bits`);
  }
  for (const [code, size] of [[0xd0, 1], [0xd1, 2], [0xd2, 4], [0xd3, 8]]) {
    if (n >= -(1n << BigInt(8 * size - 1))) { out.byte(code); return out.uint(BigInt.asUintN(8 * size, n), size); }
  }
  throw new Error(`integer ${n} does not fit in 64 bits`);
}

function str(out, s) {
  const b = utf8.encode(s);
  header(out, b.length, 0xa0, 31, [0xd9, 0xda, 0xdb]);
  out.bytes(b);
}

function compareBytes(a, b) {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] - b[i];
  return a.length - b.length;
}

/** A user value (rule 4): maps sorted by the bytes of their encoded keys. */
export function canonicalValue(value, out = new Out(), depth = 0) {
  if (depth > 256) throw new Error("nested too deeply for a canonical encoding");
  if (value === null || value === undefined) out.byte(0xc0);
  else if (value === true) out.byte(0xc3);
  else if (value === false) out.byte(0xc2);
  else if (typeof value === "bigint") int(out, value);
  else if (typeof value === "number") {
    if (Number.isNaN(value)) out.byte(0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0);
    else if (Number.isInteger(value) && Math.abs(value) <= 2 ** 53) int(out, value === 0 ? 0 : value);
    else { const b = new DataView(new ArrayBuffer(8)); b.setFloat64(0, value); out.byte(0xcb); out.bytes(new Uint8Array(b.buffer)); }
  } else if (typeof value === "string") str(out, value);
  else if (value instanceof Uint8Array) { header(out, value.length, 0, -1, [0xc4, 0xc5, 0xc6]); out.bytes(value); }
  else if (Array.isArray(value)) {
    header(out, value.length, 0x90, 15, [0, 0xdc, 0xdd]);
    for (const item of value) canonicalValue(item, out, depth + 1);
  } else if (typeof value === "object") {
    const entries = Object.entries(value).map(([k, v]) => [canonicalValue(k).done(), v]);
    entries.sort((a, b) => compareBytes(a[0], b[0]));
    header(out, entries.length, 0x80, 15, [0, 0xde, 0xdf]);
    for (const [k, v] of entries) { out.bytes(k); canonicalValue(v, out, depth + 1); }
  } else throw new Error(`no canonical encoding for ${typeof value}`);
  return out;
}

const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})$/;

/** Microseconds since the Unix epoch of an RFC 3339 timestamp (fraction truncated). */
export function timestampUs(text) {
  const m = RFC3339.exec(text);
  if (!m) throw new Error(`not an RFC 3339 timestamp: ${text}`);
  const [, y, mo, d, h, mi, s, frac = "", zone] = m;
  let us = BigInt(Date.UTC(+y, +mo - 1, +d, +h, +mi, +s)) * 1000n + BigInt((frac + "000000").slice(0, 6));
  if (zone !== "Z" && zone !== "z") {
    const sign = zone[0] === "-" ? -1n : 1n;
    us -= sign * (BigInt(+zone.slice(1, 3)) * 3600n + BigInt(+zone.slice(4, 6)) * 60n) * 1_000_000n;
  }
  return us;
}

/** A schema timestamp in canonical form (rule 3): UTC, six fraction digits, `+00:00`. */
export function canonicalTimestamp(value) {
  const us = typeof value === "bigint" ? value : timestampUs(value);
  const seconds = new Date(Number(us / 1000000n) * 1000).toISOString().slice(0, 19);
  return `${seconds}.${String(us % 1000000n).padStart(6, "0")}+00:00`;
}

/** The canonical encoding of an entry envelope (§13.2: its fields in schema order). */
export function canonicalEnvelope(env) {
  const out = new Out();
  out.byte(0x87);
  str(out, "v"); int(out, env.v ?? 1);
  str(out, "value"); canonicalValue(env.value, out, 1);
  str(out, "content_type"); str(out, env.content_type);
  str(out, "tags"); header(out, (env.tags ?? []).length, 0x90, 15, [0, 0xdc, 0xdd]);
  for (const tag of env.tags ?? []) str(out, tag);
  str(out, "metadata"); canonicalValue(env.metadata ?? {}, out, 1);
  str(out, "author"); str(out, env.author);
  str(out, "created_at"); str(out, canonicalTimestamp(env.created_at));
  return out.done();
}

/** A map of string keys to encoded values, in the order given (a record map: rule 2). */
function recordMap(out, fields) {
  header(out, fields.length, 0x80, 15, [0, 0xde, 0xdf]);
  for (const [name, write] of fields) { str(out, name); write(); }
}

/** The canonical encoding of a long-term memory record (§13.2): its twelve fields in schema
 *  order, defaults written, then the version-2 extensions `key`, `occurred_at`, `confidence`
 *  and `provenance`, each only when set (rule 2: an extension that is null is left out). */
export function canonicalMemory(rec, out = new Out()) {
  const present = (v) => v !== null && v !== undefined;
  const fields = [
    ["v", () => int(out, rec.v ?? 1)],
    ["id", () => str(out, rec.id)],
    ["board", () => str(out, rec.board)],
    ["agent", () => str(out, rec.agent)],
    ["kind", () => str(out, rec.kind ?? "episodic")],
    ["text", () => str(out, rec.text)],
    ["tags", () => canonicalValue(rec.tags ?? [], out, 1)],
    ["metadata", () => canonicalValue(rec.metadata ?? {}, out, 1)],
    ["importance", () => canonicalValue(rec.importance ?? 0.5, out, 1)],
    ["source", () => canonicalValue(rec.source ?? null, out, 1)],
    ["read_only", () => canonicalValue(rec.read_only ?? false, out, 1)],
    ["created_at", () => str(out, canonicalTimestamp(rec.created_at))],
  ];
  if (present(rec.key)) fields.push(["key", () => str(out, rec.key)]);
  if (present(rec.occurred_at)) fields.push(["occurred_at", () => str(out, canonicalTimestamp(rec.occurred_at))]);
  if (present(rec.confidence)) fields.push(["confidence", () => canonicalValue(rec.confidence, out, 1)]);
  if (present(rec.provenance)) {
    fields.push(["provenance", () => {
      header(out, rec.provenance.length, 0x90, 15, [0, 0xdc, 0xdd]);
      for (const ref of rec.provenance) {  // a SourceRef: every field, nil when absent
        recordMap(out, [["stream", () => str(out, ref.stream)], ["seq", () => int(out, ref.seq)],
          ["key", () => canonicalValue(ref.key ?? null, out, 2)], ["sig", () => canonicalValue(ref.sig ?? null, out, 2)]]);
      }
    }]);
  }
  if (present(rec.metadata_order)) fields.push(["metadata_order", () => canonicalValue(rec.metadata_order, out, 1)]);
  recordMap(out, fields);
  return out.done();
}

// ---------------------------------------------------------------- signing (§14.1-14.3)
const b64url = (bytes) => Buffer.from(bytes).toString("base64url");
const unb64url = (text) => new Uint8Array(Buffer.from(text, "base64url"));

/** The bytes a signature covers: eight lines, each ended by "\n", then the record bytes. */
export function signingInput(subject, headers, signedAtUs, publicKey, record) {
  const msgId = headers.get("Nats-Msg-Id");
  if (!msgId) throw new Error("a signed message needs a Nats-Msg-Id");
  const lines = [SCHEME, subject, msgId, String(signedAtUs), ...COVERED.map((h) => headers.get(h) || ""), publicKey];
  const head = utf8.encode(lines.map((l) => `${l}\n`).join(""));
  const all = new Uint8Array(head.length + record.length);
  all.set(head);
  all.set(record, head.length);
  return all;
}

/** The signer of a `.creds` file: its user nkey seed and its JWT (the certificate). */
export function signerFromCreds(credsText) {
  const jwt = /BEGIN NATS USER JWT-+\s*(\S+)\s*-+END NATS USER JWT/.exec(credsText)?.[1];
  const seed = /BEGIN USER NKEY SEED-+\s*(\S+)\s*-+END USER NKEY SEED/.exec(credsText)?.[1];
  if (!jwt || !seed) throw new Error("not a NATS .creds file");
  return signerFromSeed(seed, jwt);
}

export function signerFromSeed(seed, jwt = null) {
  const kp = fromSeed(utf8.encode(seed));
  return { kp, publicKey: kp.getPublicKey(), certificate: jwt };
}

/** Add the three signature headers to `headers` (a nats.js MsgHdrs) for `record` on `subject`. */
export function sign(signer, subject, headers, record, signedAtUs = BigInt(Date.now()) * 1000n) {
  const data = signingInput(subject, headers, signedAtUs, signer.publicKey, record);
  headers.set(SIG_KEY, signer.publicKey);
  headers.set(SIG_TIME, String(signedAtUs));
  headers.set(SIG, b64url(signer.kp.sign(data)));
}

// ---------------------------------------------------------------- batch signatures (§14.10)
function sha256(...parts) {
  const h = createHash("sha256");
  for (const part of parts) h.update(part);
  return new Uint8Array(h.digest());
}

/** A record's leaf: SHA-256 of 0x00 and its signing input. */
export const leafHash = (input) => sha256(Uint8Array.of(0), input);
/** An inner node: SHA-256 of 0x01, the left and the right child. */
export const nodeHash = (left, right) => sha256(Uint8Array.of(1), left, right);

/** What a batch's signature covers: "bb-sig/1 batch", a line feed, the 32 bytes of the root. */
export function batchMessage(root) {
  const head = utf8.encode(`${BATCH_SCHEME}\n`);
  const all = new Uint8Array(head.length + root.length);
  all.set(head);
  all.set(root, head.length);
  return all;
}

/** The root over `leaves` and each leaf's path ([[side, sibling], ...], bottom up): level by
 * level, neighbours pair up left to right; the last node of an odd level goes up unchanged. */
export function merkleTree(leaves) {
  if (leaves.length === 0) throw new Error("a batch needs at least one record");
  const paths = leaves.map(() => []);
  let level = leaves.map((hash, i) => ({ hash, under: [i] }));
  while (level.length > 1) {
    const up = [];
    for (let n = 0; n + 1 < level.length; n += 2) {
      const [left, right] = [level[n], level[n + 1]];
      for (const i of left.under) paths[i].push(["R", right.hash]); // the sibling is on the right
      for (const i of right.under) paths[i].push(["L", left.hash]);
      up.push({ hash: nodeHash(left.hash, right.hash), under: [...left.under, ...right.under] });
    }
    if (level.length % 2) up.push(level[level.length - 1]);
    level = up;
  }
  return { root: level[0].hash, paths };
}

/** The root a leaf's path leads to (a sibling on L: node(sibling, h); on R: node(h, sibling)). */
export function foldPath(leaf, path) {
  let h = leaf;
  for (const [side, sibling] of path) h = side === "L" ? nodeHash(sibling, h) : nodeHash(h, sibling);
  return h;
}

/** The Bb-Sig-Path text: per step L or R and the sibling's unpadded base64url, joined by ".". */
export const encodePath = (path) => path.map(([side, sibling]) => side + b64url(sibling)).join(".");

/** A Bb-Sig-Path read: its steps, or null when it is not 1 to 32 steps of the form. */
export function parsePath(text) {
  const steps = text.split(".");
  if (!text || steps.length > MAX_PATH_STEPS) return null;
  const path = [];
  for (const step of steps) {
    if (!PATH_STEP.test(step)) return null;
    const sibling = unb64url(step.slice(1));
    if (sibling.length !== 32 || b64url(sibling) !== step.slice(1)) return null;
    path.push([step[0], sibling]);
  }
  return path;
}

/** Sign many writes ({subject, headers, record}) with one signature: each gets the three
 * headers (the same for all) and its own Bb-Sig-Path. One write alone is signed alone. */
export function signBatch(signer, writes, signedAtUs = BigInt(Date.now()) * 1000n) {
  if (writes.length === 1) return sign(signer, writes[0].subject, writes[0].headers, writes[0].record, signedAtUs);
  const leaves = writes.map((w) => leafHash(signingInput(w.subject, w.headers, signedAtUs, signer.publicKey,
    w.record)));
  const { root, paths } = merkleTree(leaves);
  const signature = b64url(signer.kp.sign(batchMessage(root)));
  writes.forEach((w, i) => {
    w.headers.set(SIG_KEY, signer.publicKey);
    w.headers.set(SIG_TIME, String(signedAtUs));
    w.headers.set(SIG, signature);
    w.headers.set(SIG_PATH, encodePath(paths[i]));
  });
  return { root, paths };
}

// ---------------------------------------------------------------- certificates (§14.6)
function jsonPart(text) {
  return JSON.parse(Buffer.from(text, "base64url").toString("utf8"));
}

/** The claims of a JWT whose signature verifies against its issuer `iss`, else null. */
export function verifiedClaims(jwt) {
  const parts = jwt.trim().split(".");
  if (parts.length !== 3) return null;
  try {
    const claims = jsonPart(parts[1]);
    if (claims === null || typeof claims !== "object") return null;
    const ok = fromPublic(String(claims.iss)).verify(utf8.encode(`${parts[0]}.${parts[1]}`), unb64url(parts[2]));
    return ok ? claims : null;
  } catch {
    return null;
  }
}

/** The issuer of a JWT, unverified (the account of one's own credential). */
export function issuerOf(jwt) {
  return jsonPart(jwt.trim().split(".")[1]).iss;
}

/** What a certificate says about `publicKey` ({principal, kind}), or null when it is not valid. */
export function readCertificate(publicKey, jwt, trustedAccounts) {
  const claims = verifiedClaims(jwt);
  if (!claims || !trustedAccounts.includes(claims.iss) || claims.sub !== publicKey) return null;
  const nats = claims.nats;
  if (!nats || typeof nats !== "object" || (nats.type ?? "user") !== "user") return null;
  if (typeof claims.name !== "string" || !NAME.test(claims.name) || !Number.isInteger(claims.iat)) return null;
  if (Number.isInteger(claims.exp) && claims.exp > 0 && claims.exp * 1000 <= Date.now()) return null;
  let kind = "agent";
  for (const tag of Array.isArray(nats.tags) ? nats.tags : []) {
    if (typeof tag === "string" && tag.startsWith("bb-kind:")) {
      kind = tag.slice("bb-kind:".length);
      if (!KINDS.has(kind)) return null;
      break;
    }
  }
  return { principal: claims.name, kind };
}

// ---------------------------------------------------------------- verdicts (§14.5)
/** The signature headers of a message: null (unsigned), "malformed", or {key, timeUs, sig, path}
 * (path: null for a record signed alone). */
export function parseSignature(headers) {
  const key = headers?.get(SIG_KEY) || null;
  const time = headers?.get(SIG_TIME) || null;
  const sig = headers?.get(SIG) || null;
  if (key === null && time === null && sig === null) return null;
  if (key === null || time === null || sig === null) return "malformed";
  if (!USER_KEY.test(key) || !TIME.test(time) || !SIG_TEXT.test(sig)) return "malformed";
  const raw = unb64url(sig);
  if (raw.length !== 64 || b64url(raw) !== sig || !headers.get("Nats-Msg-Id")) return "malformed";
  if (!headers.has(SIG_PATH)) return { key, timeUs: BigInt(time), sig: raw, path: null };
  const path = parsePath(headers.get(SIG_PATH));
  return path === null ? "malformed" : { key, timeUs: BigInt(time), sig: raw, path };
}

/**
 * The verdict on one message, in the order of §14.5.
 *   msg: {subject, headers, payload (bytes as received), storedAtUs (BigInt),
 *         author (the record's author field; null for a tombstone), canonical (() => bytes, or null)}
 *   keys: {certificate(publicKey) -> {principal, kind} | null, revokedAt(publicKey) -> unix seconds | null}
 *   memo: {roots: Map, checks: number}: the answers for batch roots already checked (one
 *     signature check per batch), and how many signature checks were made
 */
export function verdict(msg, keys, { maxSkewUs = 30_000_000n, memo = { roots: new Map(), checks: 0 } } = {}) {
  const parsed = parseSignature(msg.headers);
  if (parsed === null) return "unsigned";
  if (parsed === "malformed") return "malformed";
  const cert = keys.certificate(parsed.key);
  if (!cert) return "unknown_key";
  const kp = fromPublic(parsed.key);
  const check = (record) => {
    const input = signingInput(msg.subject, msg.headers, parsed.timeUs, parsed.key, record);
    if (parsed.path === null) {
      memo.checks += 1;
      return kp.verify(input, parsed.sig);
    }
    const root = foldPath(leafHash(input), parsed.path);
    const seen = `${parsed.key}.${b64url(root)}.${b64url(parsed.sig)}`;
    if (!memo.roots.has(seen)) {
      memo.checks += 1;
      memo.roots.set(seen, kp.verify(batchMessage(root), parsed.sig));
    }
    return memo.roots.get(seen);
  };
  let valid = check(msg.payload);
  if (!valid && msg.canonical) { // payload first; then its record's canonical encoding, if that differs
    let record = null;
    try { record = msg.canonical(); } catch { record = null; }
    valid = record !== null && compareBytes(record, msg.payload) !== 0 && check(record);
  }
  if (!valid) return "bad_signature";
  if (msg.author !== null && msg.author !== undefined && cert.principal !== msg.author) return "wrong_author";
  const skew = msg.storedAtUs - parsed.timeUs;
  if (skew > maxSkewUs || -skew > maxSkewUs) return "stale";
  const revoked = keys.revokedAt(parsed.key);
  if (revoked !== null && revoked !== undefined && BigInt(revoked) * 1_000_000n <= msg.storedAtUs) return "revoked";
  return "verified";
}

/** The canonical bytes of an entry payload as received (msgpack, or JSON with Bb-Encoding: json). */
export function canonicalOfPayload(headers, payload) {
  const json = (headers?.get("Bb-Encoding") || "").toLowerCase() === "json" || payload[0] === 0x7b;
  const env = json ? JSON.parse(new TextDecoder().decode(payload)) : mpDecode(payload, { useBigInt64: true });
  return canonicalEnvelope(env);
}
