// blackboard inspect: the page. Plain JavaScript, no build step, no CDN; it reads the inspector's
// JSON API (docs/inspector.md) and the board's server-sent events, and writes nothing.
"use strict";

(() => {
  const ROW_H = 26;          // px, the height of one entry row (app.css --row)
  const PAGE = 200;          // entries asked per page
  const OVERSCAN = 12;       // rows rendered beyond the visible ones
  const MARK_MS = 15000;     // how long a live mark (new, changed) stays

  // What tests and bench/inspector_bench.py read: when the first page of a board was on screen
  // (performance.now(), ms since navigation) and when each live event reached the DOM (Date.now()).
  const probe = { firstRender: null, boardLoads: 0, applied: {}, events: 0 };
  window.__inspector = probe;

  const state = {
    agent: null, boards: [], board: null, tab: "board", section: "", prefix: "",
    rows: [], index: new Map(), next: null, total: 0, loading: false, sections: new Set(),
    selected: null, maxRevision: 0, loadedRevision: null, asof: null, source: null, votes: [], messagesTimer: null,
    generation: 0,
  };

  // ---- small helpers -------------------------------------------------------------------------
  const $ = (sel) => document.querySelector(sel);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  class ApiError extends Error {
    constructor(status, body) {
      super((body && body.error) || `HTTP ${status}`);
      this.status = status;
      this.type = (body && body.type) || "Error";
    }
  }

  async function api(path, options) {
    const response = await fetch(path, Object.assign({ headers: { accept: "application/json" } }, options || {}));
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (!response.ok) throw new ApiError(response.status, body);
    return body;
  }

  function post(path, payload) {
    return api(path, { method: "POST", headers: { "content-type": "application/json", accept: "application/json" },
                       body: JSON.stringify(payload) });
  }

  const enc = encodeURIComponent;
  const boardPath = (suffix) => `/api/boards/${enc(state.board)}${suffix}`;
  const entryId = (section, key) => `${section}/${key}`;

  let errorTimer = null;
  function showError(error) {
    const box = $("#error");
    box.textContent = error instanceof ApiError ? `${error.type}: ${error.message}` : String(error.message || error);
    box.hidden = false;
    clearTimeout(errorTimer);
    errorTimer = setTimeout(() => { box.hidden = true; }, 8000);
  }

  function when(value) {
    if (!value) return "";
    const date = new Date(value);
    if (Number.isNaN(date.getTime())) return String(value);
    const pad = (n) => String(n).padStart(2, "0");
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} `
      + `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  }

  // A time as the list shows it: the time of day today, else the date.
  function clock(value) {
    const full = when(value);
    if (!full) return "";
    const today = when(new Date()).slice(0, 10);
    return full.startsWith(today) ? full.slice(11) : full.slice(0, 10);
  }

  function short(value, n) {
    const text = typeof value === "string" ? value : JSON.stringify(value);
    if (text === undefined) return "";
    return text.length > n ? text.slice(0, n - 1) + "…" : text;
  }

  // ---- JSON tree and diff --------------------------------------------------------------------
  function jsonTree(value, depth) {
    depth = depth || 0;
    if (value === null) return el("span", { class: "z", text: "null" });
    if (typeof value === "string") return el("span", { class: "s", text: JSON.stringify(value) });
    if (typeof value === "number") return el("span", { class: "n", text: String(value) });
    if (typeof value === "boolean") return el("span", { class: "b", text: String(value) });
    const isArray = Array.isArray(value);
    const keys = isArray ? value.map((_, i) => i) : Object.keys(value);
    const open = isArray ? "[" : "{";
    const close = isArray ? "]" : "}";
    if (keys.length === 0) return el("span", { text: open + close });
    const details = el("details", { open: depth < 2 });
    details.append(el("summary", { text: `${open} ${keys.length} ${isArray ? "items" : "keys"} ${close}` }));
    for (const k of keys) {
      details.append(el("div", { class: "leaf" },
        el("span", { class: "k", text: isArray ? `${k}: ` : `${JSON.stringify(k)}: ` }),
        jsonTree(value[k], depth + 1)));
    }
    return details;
  }

  function renderValue(entry) {
    const box = el("div", { class: "value", "data-testid": "value", "data-kind": entry.value_kind || "" });
    const kind = entry.value_kind;
    if (kind === "image" && entry.object_url) {
      box.append(el("img", { src: entry.object_url, alt: `${entry.section}/${entry.key}` }));
    } else if (kind === "json") {
      box.append(el("div", { class: "json" }, jsonTree(entry.value)));
    } else if (kind === "text") {
      box.append(el("pre", { text: String(entry.value) }));
    } else if (kind === "object") {
      box.append(el("p", {}, `object of ${entry.size ?? "?"} bytes (${entry.content_type || "unknown type"}) `,
        entry.object_url ? el("a", { href: entry.object_url, target: "_blank", text: "open" }) : null));
      if (entry.value !== undefined && entry.value !== null) box.append(el("div", { class: "json" }, jsonTree(entry.value)));
    } else {
      box.append(el("p", { class: "hint" }, `${entry.size ?? "?"} bytes of ${entry.content_type || "binary"} `,
        entry.object_url ? el("a", { href: entry.object_url, download: "", text: "download" }) : null));
      if (entry.value !== undefined && entry.value !== null) box.append(el("pre", { text: short(entry.value, 2000) }));
    }
    return box;
  }

  function asLines(value) {
    if (value === undefined) return [];
    const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
    return (text ?? "null").split("\n");
  }

  // A line diff by longest common subsequence (values are small; past 1,500 lines a side, a
  // plain before/after is shown instead).
  function lineDiff(a, b) {
    if (a.length > 1500 || b.length > 1500) {
      return [...a.map((t) => ["del", t]), ...b.map((t) => ["add", t])];
    }
    const n = a.length, m = b.length;
    const lcs = Array.from({ length: n + 1 }, () => new Uint16Array(m + 1));
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
      }
    }
    const out = [];
    let i = 0, j = 0;
    while (i < n && j < m) {
      if (a[i] === b[j]) { out.push(["same", a[i]]); i++; j++; }
      else if (lcs[i + 1][j] >= lcs[i][j + 1]) { out.push(["del", a[i]]); i++; }
      else { out.push(["add", b[j]]); j++; }
    }
    while (i < n) out.push(["del", a[i++]]);
    while (j < m) out.push(["add", b[j++]]);
    return out;
  }

  function renderDiff(older, newer) {
    const box = el("div", { class: "diff", "data-testid": "diff" });
    for (const [op, text] of lineDiff(asLines(older), asLines(newer))) {
      const sign = op === "add" ? "+ " : op === "del" ? "- " : "  ";
      box.append(el("div", { class: op, text: sign + text }));
    }
    return box;
  }

  // ---- boards and sections -------------------------------------------------------------------
  function renderBoards() {
    const list = $("#boards");
    list.replaceChildren(...state.boards.map((name) => el("li", {
      class: name === state.board ? "active" : "", "data-board": name, "data-testid": "board", text: name,
      onclick: () => navigate({ board: name, section: "" }),
    })));
    if (state.boards.length === 0) list.append(el("li", { class: "hint", text: "no readable board" }));
  }

  function renderSections() {
    const list = $("#sections");
    const names = [...state.sections].sort();
    const item = (name, label) => el("li", {
      class: name === state.section ? "active" : "", "data-section": name, "data-testid": "section", text: label,
      onclick: () => navigate({ section: name }),
    });
    list.replaceChildren(item("", "all sections"), ...names.map((name) => item(name, name)));
  }

  // ---- the entries list (virtualised: only the visible rows are in the DOM) ------------------
  function rowClass(row) {
    let cls = "row";
    if (row.mark) cls += ` ${row.mark}`;
    if (state.selected && state.selected === entryId(row.section, row.key)) cls += " selected";
    return cls;
  }

  function renderRows() {
    const pane = $("#entries");
    const spacer = $("#entries-spacer");
    spacer.style.height = `${state.rows.length * ROW_H}px`;
    const first = Math.max(0, Math.floor(pane.scrollTop / ROW_H) - OVERSCAN);
    const last = Math.min(state.rows.length, Math.ceil((pane.scrollTop + pane.clientHeight) / ROW_H) + OVERSCAN);
    const nodes = [];
    for (let i = first; i < last; i++) {
      const row = state.rows[i];
      const id = entryId(row.section, row.key);
      nodes.push(el("div", {
        class: rowClass(row), style: `top:${i * ROW_H}px`, "data-testid": "entry-row", "data-key": id,
        "data-revision": row.revision, "data-mark": row.mark || "", onclick: () => selectEntry(row.section, row.key),
      },
      el("span", { class: "c-section", text: row.section }),
      el("span", { class: "c-key" }, row.mark ? el("span", { class: `mark ${row.mark}`, text: row.mark }) : null, row.key),
      el("span", { class: "c-rev", text: row.revision }),
      el("span", { class: "c-author", text: row.author || "" }),
      el("span", { class: "c-time", title: when(row.created_at), text: clock(row.created_at) }),
      el("span", { class: "c-preview", text: row.op === "delete" || row.op === "purge" ? `(${row.op}d)` : short(row.preview ?? "", 200) })));
    }
    spacer.replaceChildren(...nodes);
    const shown = state.asof ? `as of revision ${state.asof.revision ?? "?"}: ` : "";
    $("#count").textContent = `${shown}${state.rows.length} of ${state.total} entries`;
    if (state.next && !state.loading && last >= state.rows.length - 3 * OVERSCAN) loadMore();
  }

  let frame = 0;
  function scheduleRows() {
    if (frame) return;
    frame = requestAnimationFrame(() => { frame = 0; renderRows(); });
  }

  function noteRevision(revision) {
    if (typeof revision === "number" && revision > state.maxRevision) {
      state.maxRevision = revision;
      const slider = $("#asof");
      const atMax = !state.asof;
      slider.max = String(revision);
      if (atMax) slider.value = String(revision);
    }
  }

  function addRows(entries) {
    for (const entry of entries) {
      const id = entryId(entry.section, entry.key);
      if (state.index.has(id)) continue;
      state.index.set(id, entry);
      state.rows.push(entry);
      state.sections.add(entry.section);
      noteRevision(entry.revision);
    }
  }

  // A page of the live board, or of the board as of a revision or time (state.asof).
  function entriesQuery(cursor) {
    const params = new URLSearchParams({ limit: String(PAGE) });
    if (state.asof) {
      if (state.asof.at) params.set("at", state.asof.at); else params.set("revision", String(state.asof.wanted));
    }
    if (state.section) params.set("section", state.section);
    if (state.prefix) params.set("prefix", state.prefix);
    if (cursor) params.set("cursor", cursor);
    return boardPath(`${state.asof ? "/asof" : "/entries"}?${params}`);
  }

  async function loadEntries() {
    const generation = ++state.generation;
    state.rows = []; state.index = new Map(); state.next = null; state.total = 0; state.asof = null;
    state.loadedRevision = null;
    document.body.classList.remove("asof");
    $("#asof-value").textContent = "live";
    $("#entries").scrollTop = 0;
    if (!state.board) { renderRows(); return; }
    state.loading = true;
    try {
      const page = await api(entriesQuery(null));
      if (generation !== state.generation) return;
      if (Array.isArray(page.sections)) page.sections.forEach((s) => state.sections.add(s));
      addRows(page.entries || []);
      noteRevision(page.revision);
      state.loadedRevision = typeof page.revision === "number" ? page.revision : null;
      state.next = page.next || null;
      state.total = page.total ?? state.rows.length;
      renderRows();
      renderSections();
      probe.boardLoads += 1;
      if (probe.firstRender === null) probe.firstRender = performance.now();
    } catch (error) {
      if (generation === state.generation) { renderRows(); showError(error); }
    } finally {
      if (generation === state.generation) state.loading = false;
    }
  }

  async function loadMore() {
    if (!state.next || state.loading) return;
    const generation = state.generation;
    state.loading = true;
    try {
      const page = await api(entriesQuery(state.next));
      if (generation !== state.generation) return;
      if (state.asof) { for (const e of page.entries || []) if (!state.index.has(entryId(e.section, e.key))) { state.index.set(entryId(e.section, e.key), e); state.rows.push(e); } }
      else addRows(page.entries || []);
      state.next = page.next || null;
      if (typeof page.total === "number") state.total = page.total;
      scheduleRows();
      renderSections();
    } catch (error) {
      showError(error);
    } finally {
      if (generation === state.generation) state.loading = false;
    }
  }

  // ---- live events ---------------------------------------------------------------------------
  function matchesView(event) {
    if (state.section && event.section !== state.section) return false;
    if (state.prefix && !String(event.key).startsWith(state.prefix)) return false;
    return true;
  }

  const OPS = { PUT: "put", DEL: "delete", DELETE: "delete", PURGE: "purge" };

  function applyEntryEvent(event) {
    event.op = OPS[String(event.op).toUpperCase()] || String(event.op || "put").toLowerCase();
    probe.events += 1;
    noteRevision(event.revision);
    if (state.asof || !matchesView(event)) return;
    const id = entryId(event.section, event.key);
    const existing = state.index.get(id);
    const removed = event.op === "delete" || event.op === "purge";
    if (existing) {
      Object.assign(existing, event);
      existing.mark = removed ? "deleted" : (existing.mark === "new" ? "new" : "changed");
      if (removed) existing.preview = "";
    } else if (!removed) {
      const row = Object.assign({}, event, { mark: "new" });
      state.index.set(id, row);
      state.rows.unshift(row);
      state.total += 1;
      if (!state.sections.has(event.section)) { state.sections.add(event.section); renderSections(); }
    } else {
      return;
    }
    const row = state.index.get(id);
    const stamp = Date.now();
    row.markedAt = stamp;
    if (!removed) {
      setTimeout(() => {
        if (row.markedAt === stamp && row.mark !== "deleted") { row.mark = null; scheduleRows(); }
      }, MARK_MS);
    }
    renderRows();
    probe.applied[id] = { at: Date.now(), op: event.op, revision: event.revision };
    if (state.selected === id && state.tab === "board") selectEntry(event.section, event.key, true);
  }

  function connectEvents() {
    if (state.source) { state.source.close(); state.source = null; }
    const live = $("#live");
    live.className = "off"; live.textContent = "offline";
    if (!state.board) return;
    const source = new EventSource(boardPath("/events"));
    state.source = source;
    // The stream starts with "ready" once the server listens for this page (then it is live); a
    // later one is a reconnection (the server dropped a listener that fell behind, or the
    // connection broke): what changed meanwhile is reloaded, as it is when the board moved on
    // between the first page's snapshot and the start of the stream.
    let readies = 0;
    source.addEventListener("ready", (message) => {
      readies += 1;
      live.className = "on"; live.textContent = "live";
      let revision = null;
      try { revision = JSON.parse(message.data).revision; } catch (error) { revision = null; }
      noteRevision(revision);
      const missed = readies === 1 && state.loadedRevision !== null && typeof revision === "number"
        && revision > state.loadedRevision;
      if ((readies > 1 || missed) && source === state.source && !state.asof) {
        loadEntries();
        if (state.tab === "votes") loadVotes();
      }
    });
    source.onerror = () => { live.className = "off"; live.textContent = "reconnecting"; };
    source.addEventListener("entry", (message) => {
      try { applyEntryEvent(JSON.parse(message.data)); } catch (error) { showError(error); }
    });
    source.addEventListener("vote", (message) => {
      try { applyVoteEvent(JSON.parse(message.data)); } catch (error) { showError(error); }
    });
  }

  // ---- entry detail: value, history, diff ----------------------------------------------------
  async function selectEntry(section, key, keepHistoryPick) {
    state.selected = entryId(section, key);
    scheduleRows();
    const detail = $("#detail");
    const generation = state.generation;
    const id = state.selected;
    try {
      const suffix = `${enc(section)}/${enc(key)}`;
      const asofRow = state.asof ? state.index.get(id) : null;
      const [entry, history] = await Promise.all([
        asofRow ? Promise.resolve(Object.assign({ value_kind: asofRow.value !== undefined ? "json" : "text",
                                                   value: asofRow.value !== undefined ? asofRow.value : asofRow.preview }, asofRow))
          : state.asof ? Promise.resolve({ missing: new Error(`not on the board as of revision ${state.asof.revision}`) })
            : api(boardPath(`/entry/${suffix}`)).catch((error) => ({ missing: error })),
        api(boardPath(`/history/${suffix}`)).catch(() => ({ revisions: [] })),
      ]);
      if (generation !== state.generation || state.selected !== id) return;
      const parts = [el("h3", { "data-testid": "detail-key", text: `${section} / ${key}` })];
      if (entry.missing) {
        parts.push(el("p", { class: "hint", text: entry.missing.status === 404 ? "deleted: no current value" : entry.missing.message }));
      } else {
        parts.push(el("dl", { class: "meta" },
          el("dt", { text: "revision" }), el("dd", { "data-testid": "detail-revision", text: entry.revision }),
          el("dt", { text: "author" }), el("dd", { text: entry.author || "" }),
          el("dt", { text: "time" }), el("dd", { text: when(entry.created_at) }),
          el("dt", { text: "type" }), el("dd", { text: `${entry.content_type || ""} (${entry.value_kind || "?"}, ${entry.size ?? "?"} bytes)` }),
          el("dt", { text: "tags" }), el("dd", {}, (entry.tags || []).map((t) => el("span", { class: "tag", text: t }))),
          el("dt", { text: "metadata" }), el("dd", {}, entry.metadata && Object.keys(entry.metadata).length
            ? el("div", { class: "json" }, jsonTree(entry.metadata, 2)) : "")));
        parts.push(el("h4", { text: "value" }), renderValue(entry));
      }
      parts.push(renderHistory(history.revisions || [], keepHistoryPick));
      detail.replaceChildren(...parts);
    } catch (error) {
      showError(error);
    }
  }

  let historyPick = null;
  function renderHistory(revisions, keepPick) {
    const box = el("div", { "data-testid": "history" });
    box.append(el("h4", { text: `history (${revisions.length})` }));
    if (revisions.length === 0) return box;
    const sorted = [...revisions].sort((a, b) => a.revision - b.revision);
    const byRev = new Map(sorted.map((r) => [r.revision, r]));
    if (!keepPick || !historyPick || !byRev.has(historyPick.a) || !byRev.has(historyPick.b)) {
      const b = sorted[sorted.length - 1].revision;
      const a = sorted.length > 1 ? sorted[sorted.length - 2].revision : b;
      historyPick = { a, b };
    }
    const diffBox = el("div", {});
    const table = el("table", { class: "revs" },
      el("tr", {}, el("th", { text: "from" }), el("th", { text: "to" }), el("th", { text: "rev" }),
        el("th", { text: "op" }), el("th", { text: "author" }), el("th", { text: "time" }), el("th", { text: "value" })));
    const redraw = () => {
      for (const tr of table.querySelectorAll("tr[data-revision]")) {
        const rev = Number(tr.dataset.revision);
        tr.className = rev === historyPick.a ? "pick-a" : rev === historyPick.b ? "pick-b" : "";
        tr.querySelector("input[name=a]").checked = rev === historyPick.a;
        tr.querySelector("input[name=b]").checked = rev === historyPick.b;
      }
      const older = byRev.get(historyPick.a), newer = byRev.get(historyPick.b);
      diffBox.replaceChildren(el("h4", { text: `diff r${historyPick.a} → r${historyPick.b}` }),
        renderDiff(older.op === "put" || !older.op ? older.value : undefined, newer.op === "put" || !newer.op ? newer.value : undefined));
    };
    for (const r of [...sorted].reverse()) {
      table.append(el("tr", { "data-revision": r.revision, "data-testid": "history-row" },
        el("td", {}, el("input", { type: "radio", name: "a", onchange: () => { historyPick.a = r.revision; redraw(); } })),
        el("td", {}, el("input", { type: "radio", name: "b", onchange: () => { historyPick.b = r.revision; redraw(); } })),
        el("td", { text: r.revision }), el("td", { text: r.op || "put" }), el("td", { text: r.author || "" }),
        el("td", { text: when(r.created_at) }),
        el("td", { class: "json", "data-testid": "history-value", text: r.op && r.op !== "put" ? "—" : short(r.value, 80) })));
    }
    box.append(table, diffBox);
    redraw();
    return box;
  }

  // ---- as of -----------------------------------------------------------------------------------
  // The board as of a revision (the slider) or a time: its entries then, paged like the live list.
  async function loadAsOf(wanted, label) {
    if (!state.board) return;
    const generation = ++state.generation;
    state.asof = wanted;
    state.loading = true;
    try {
      const page = await api(entriesQuery(null));
      if (generation !== state.generation) return;
      state.asof.revision = page.revision;
      document.body.classList.add("asof");
      $("#asof-value").textContent = label || `rev ${page.revision}`;
      state.rows = []; state.index = new Map();
      for (const entry of page.entries || []) { state.index.set(entryId(entry.section, entry.key), entry); state.rows.push(entry); }
      state.next = page.next || null;
      state.total = page.total ?? state.rows.length;
      $("#entries").scrollTop = 0;
      renderRows();
      if (state.selected) {
        const [section, ...rest] = state.selected.split("/");
        selectEntry(section, rest.join("/"), true);
      }
    } catch (error) {
      if (generation === state.generation) { state.asof = null; showError(error); }
    } finally {
      if (generation === state.generation) state.loading = false;
    }
  }

  function setupAsOf() {
    const slider = $("#asof");
    slider.addEventListener("input", () => {
      const at = Number(slider.value);
      $("#asof-value").textContent = at >= state.maxRevision ? "live" : `rev ${at}`;
    });
    slider.addEventListener("change", () => {
      const at = Number(slider.value);
      if (at >= state.maxRevision && state.asof) loadEntries();
      else if (at < state.maxRevision) loadAsOf({ wanted: at });
    });
    $("#asof-at").addEventListener("change", (event) => {
      const value = event.target.value;
      if (!value) return;
      loadAsOf({ at: new Date(value).toISOString() }, when(new Date(value)));
    });
    $("#asof-live").addEventListener("click", () => {
      slider.value = String(state.maxRevision);
      $("#asof-at").value = "";
      loadEntries();
    });
    let prefixTimer = null;
    $("#prefix").addEventListener("input", (event) => {
      clearTimeout(prefixTimer);
      prefixTimer = setTimeout(() => { state.prefix = event.target.value; loadEntries(); }, 250);
    });
    $("#entries").addEventListener("scroll", scheduleRows);
    window.addEventListener("resize", scheduleRows);
  }

  // ---- votes ---------------------------------------------------------------------------------
  function label(value) {
    return typeof value === "string" ? value : short(value, 60);
  }

  // The tally as bars: one per candidate (tally.votes by candidate index), then reject and
  // abstain; a tally of another shape shows its numbers by name.
  function tallyBars(p) {
    const tally = p.tally || {};
    const options = Array.isArray(p.options) ? p.options : [];
    const bars = [];
    if (Array.isArray(tally.votes) || options.length) {
      options.forEach((o, i) => bars.push([label(o), (tally.votes || [])[i] || 0]));
      if (tally.reject) bars.push(["reject", tally.reject]);
      if (tally.abstain) bars.push(["abstain", tally.abstain]);
    } else {
      for (const [name, v] of Object.entries(tally)) if (typeof v === "number") bars.push([name, v]);
    }
    const most = Math.max(1, ...bars.map(([, n]) => n));
    return bars.map(([name, n]) => el("div", { class: "bar", "data-choice": name },
      el("span", { class: "label", title: name, text: name }),
      el("span", { class: "track" }, el("span", { class: "fill", style: `width:${(100 * n) / most}%;display:block` })),
      el("span", { class: "num", "data-testid": "tally-count", text: n })));
  }

  // A ballot's choice: a candidate index ("reject" and "abstain" as they are).
  function choiceLabel(p, choice) {
    if (Number.isInteger(choice) && Array.isArray(p.options) && choice < p.options.length) return label(p.options[choice]);
    return label(choice);
  }

  function policyText(policy) {
    if (!policy) return "";
    if (typeof policy !== "object") return String(policy);
    const parts = [];
    for (const [k, v] of Object.entries(policy)) {
      if (v === null || v === undefined || k === "v") continue;
      if (typeof v === "object" && Object.keys(v).length === 0) continue;
      parts.push(`${k} ${typeof v === "object" ? short(v, 40) : v}`);
    }
    return parts.join(", ");
  }

  function outcomeView(p) {
    const o = p.outcome;
    if (!o) return el("div", { class: "outcome open", "data-testid": "outcome-open", text: p.open === false ? "closed" : "open" });
    let decided;
    if (typeof o !== "object") decided = String(o);
    else if (o.status === "accepted") {
      const candidate = o.value !== undefined && o.value !== null ? o.value
        : (Array.isArray(p.options) && o.candidate !== null && o.candidate !== undefined ? p.options[o.candidate] : o.candidate);
      decided = `accepted: ${label(candidate)}`;
    } else decided = String(o.status || short(o, 120));
    const ce = p.committed_entry;
    return el("div", { class: "outcome", "data-testid": "outcome" }, "outcome ", el("b", { text: decided }),
      typeof o === "object" && o.closed_by ? ` (by ${o.closed_by})` : "",
      ce ? el("span", {}, " → wrote ", el("a", {
        href: "#", "data-testid": "committed-entry",
        text: `${ce.section}/${ce.key}${ce.revision ? ` r${ce.revision}` : ""}`,
        onclick: (event) => { event.preventDefault(); navigate({ tab: "board" }); selectEntry(ce.section, ce.key); },
      })) : null);
  }

  function renderProposal(p) {
    const ballots = p.ballots || [];
    const total = p.tally && typeof p.tally.ballots === "number" ? p.tally.ballots : ballots.length;
    return el("div", { class: "card", "data-testid": "proposal", "data-id": p.id, "data-open": p.open ? "1" : "0" },
      el("h3", { text: p.question || `${p.section}/${p.key}` }),
      el("div", { class: "sub" }, `${p.section}/${p.key}`, p.proposer ? ` · by ${p.proposer}` : "",
        ` · ${policyText(p.policy)}`, p.deadline ? ` · deadline ${when(p.deadline)}` : "",
        ` · `, el("span", { "data-testid": "ballot-count", text: `${total} ballot${total === 1 ? "" : "s"}` })),
      ...tallyBars(p),
      ballots.length ? el("ul", { class: "ballots", "data-testid": "ballots" }, ballots.map((b) => el("li", {},
        el("b", { text: b.voter }), ` → ${choiceLabel(p, b.choice)}`,
        b.reason ? el("span", { class: "reason", text: ` “${b.reason}”` }) : "",
        b.rejected ? el("span", { class: "reason", text: ` (not counted: ${b.rejected})` }) : "",
        b.at ? el("span", { class: "reason", text: ` · ${when(b.at)}` }) : ""))) : null,
      outcomeView(p));
  }

  function renderVotes() {
    const box = $("#votes");
    if (!state.votes.length) { box.replaceChildren(el("p", { class: "empty", text: "No proposals on this board." })); return; }
    box.replaceChildren(...state.votes.map(renderProposal));
  }

  async function loadVotes() {
    if (!state.board) return;
    const board = state.board;
    try {
      const body = await api(boardPath("/votes"));
      if (board !== state.board) return;
      state.votes = body.proposals || [];
      renderVotes();
    } catch (error) {
      showError(error);
    }
  }

  let votesTimer = null;
  // A vote event carries the whole proposal (its tally, ballots and outcome): it replaces the
  // card in place; an event of another shape (only proposal_id) makes the list reload.
  function applyVoteEvent(event) {
    if (event.id && (event.section || event.question !== undefined)) {
      const i = state.votes.findIndex((x) => x.id === event.id);
      if (i >= 0) state.votes[i] = event; else state.votes.unshift(event);
      if (state.tab === "votes") renderVotes();
      return;
    }
    clearTimeout(votesTimer);
    votesTimer = setTimeout(() => { if (state.tab === "votes") loadVotes(); }, 150);
  }

  // ---- messages ------------------------------------------------------------------------------
  async function loadMessages() {
    const params = new URLSearchParams({ limit: "200" });
    const agent = $("#msg-agent").value.trim();
    const type = $("#msg-type").value.trim();
    const kind = $("#msg-kind").value;
    if (kind) params.set("kind", kind);
    if (agent) params.set("agent", agent);
    if (type) params.set("type", type);
    try {
      const body = await api(`/api/messages?${params}`);
      const list = $("#messages");
      const messages = body.messages || [];
      if (!messages.length) { list.replaceChildren(el("li", { class: "empty", text: "No messages." })); return; }
      list.replaceChildren(...messages.map((m) => el("li", { class: m.kind || "", "data-testid": "message", "data-type": m.type || "" },
        el("span", { class: "when", text: when(m.created_at) }),
        el("span", { class: "kind", text: m.kind || "" }),
        el("span", { class: "route" }, el("b", { text: m.from || "?" }), " → ",
          m.kind === "topic" ? `#${m.topic || ""}` : m.kind === "broadcast" ? `board ${m.board || "*"}`
            : Array.isArray(m.to) ? m.to.join(", ") : (m.to || ""),
          "  ", el("span", { class: "tag", text: m.type || "" })),
        el("span", { class: "preview", text: short(m.preview ?? "", 300) }))));
    } catch (error) {
      showError(error);
    }
  }

  // ---- search --------------------------------------------------------------------------------
  async function runSearch(event) {
    if (event) event.preventDefault();
    const query = $("#q").value.trim();
    if (!query) return;
    const payload = { query, target: $("#target").value, mode: $("#mode").value, top_k: Number($("#top_k").value) || 10 };
    const min = $("#min_score").value;
    if (min !== "") payload.min_score = Number(min);
    const boards = $("#search-boards").value.split(",").map((b) => b.trim()).filter(Boolean);
    if (boards.length === 1) payload.board = boards[0];
    else if (boards.length > 1) payload.boards = boards;
    const filters = $("#filters").value.trim();
    if (filters) {
      try { payload.filters = JSON.parse(filters); } catch (error) { showError(new Error("filters: not JSON")); return; }
    }
    const box = $("#hits");
    box.replaceChildren(el("p", { class: "hint", text: "searching…" }));
    try {
      const body = await post("/api/search", payload);
      const hits = body.hits || [];
      if (!hits.length) { box.replaceChildren(el("p", { class: "empty", "data-testid": "no-hits", text: "No hits." })); return; }
      box.replaceChildren(...hits.map((h) => {
        const scores = Object.entries(h.scores || {}).filter(([, v]) => typeof v === "number");
        const lifecycle = lifecycleOf(h);
        const card = el("div", { class: "hit", "data-testid": "hit", "data-id": h.id },
          el("div", {}, el("span", { class: "score fused", text: `score ${Number(h.score).toFixed(3)}` }), " ",
            el("b", { text: h.agent || "" }), ` · ${h.board || ""} · ${h.kind || ""}${h.key ? ` · ${h.key}` : ""}`),
          el("div", { class: "text", text: short(h.text ?? h.value ?? "", 500) }),
          el("div", { class: "scores" }, scores.map(([name, v]) => el("span", {
            class: `score${name === "fused" ? " fused" : ""}`, "data-testid": "score", text: `${name} ${v.toFixed(3)}` })),
          lifecycle.map((t) => el("span", { class: "score", text: t }))));
        card.addEventListener("click", () => {
          for (const other of box.querySelectorAll(".hit.selected")) other.classList.remove("selected");
          card.classList.add("selected");
          if (h.target === "entry") { navigate({ tab: "board", board: h.board || state.board }); selectEntry(h.section, h.key); }
          else loadMemory(h.board || state.board, h.id);
        });
        return card;
      }));
    } catch (error) {
      box.replaceChildren();
      showError(error);
    }
  }

  // A memory's lifecycle in a few words: archived, superseded, merged, contested, else live.
  function lifecycleOf(h) {
    const out = [];
    if (h.target === "entry") return [`entry r${h.revision}`];
    if (h.archived_at) out.push(`archived${h.archive_reason ? ` (${h.archive_reason})` : ""}`);
    if (h.superseded_by) out.push(`superseded by ${h.superseded_by}`);
    if (h.merged_into) out.push(`merged into ${h.merged_into}`);
    if (h.contested_by) out.push(`contested (${h.contested_by})`);
    if (!out.length) out.push("live");
    if (typeof h.importance === "number") out.push(`importance ${h.importance.toFixed(2)}`);
    if (typeof h.confidence === "number") out.push(`confidence ${h.confidence.toFixed(2)}`);
    if (h.seen_count > 1) out.push(`seen ${h.seen_count}×`);
    if (h.hits) out.push(`recalled ${h.hits}×`);
    return out;
  }

  async function loadMemory(board, id) {
    const box = $("#memory");
    try {
      const detail = await api(`/api/memory/${enc(board)}/${enc(id)}`);
      const m = detail.memory || detail;
      const sources = detail.sources || [];
      const versions = detail.versions || [];
      box.replaceChildren(el("h3", { text: id }),
        el("dl", { class: "meta", "data-testid": "memory-lifecycle" },
          el("dt", { text: "lifecycle" }), el("dd", { text: lifecycleOf(m).join(" · ") }),
          el("dt", { text: "author" }), el("dd", { text: m.agent || "" }),
          el("dt", { text: "kind" }), el("dd", { text: m.kind || "" }),
          el("dt", { text: "valid" }), el("dd", { text: `${when(m.valid_from)} → ${m.valid_to ? when(m.valid_to) : "open"}` }),
          el("dt", { text: "provenance" }), el("dd", { text: `${m.source || "no source"}; ${sources.length} source${sources.length === 1 ? "" : "s"}, ${versions.length} other version${versions.length === 1 ? "" : "s"}` })),
        el("h4", { text: "memory" }),
        el("div", { class: "json", "data-testid": "memory-detail" }, jsonTree(detail, 0)));
    } catch (error) {
      showError(error);
    }
  }

  // ---- system --------------------------------------------------------------------------------
  function table(rows) {
    const columns = [];
    for (const row of rows) for (const k of Object.keys(row)) if (!columns.includes(k)) columns.push(k);
    return el("table", { class: "grid" }, el("tr", {}, columns.map((c) => el("th", { text: c }))),
      rows.map((row) => el("tr", {}, columns.map((c) => el("td", {
        text: row[c] === null || row[c] === undefined ? "" : typeof row[c] === "object" ? short(row[c], 120) : String(row[c]) })))));
  }

  function renderSystemPart(name, value) {
    let body;
    if (Array.isArray(value)) {
      body = value.length === 0 ? el("p", { class: "hint", text: "none" })
        : value.every((v) => v && typeof v === "object" && !Array.isArray(v)) ? table(value)
          : el("ul", {}, value.map((v) => el("li", { text: short(v, 200) })));
    } else if (value && typeof value === "object") {
      const entries = Object.entries(value);
      const rows = (v) => Array.isArray(v) && v.length > 0 && v.every((x) => x && typeof x === "object" && !Array.isArray(x));
      body = entries.every(([, v]) => v && typeof v === "object" && !Array.isArray(v))
        ? table(entries.map(([k, v]) => Object.assign({ name: k }, v)))
        : el("div", {},
          el("dl", { class: "meta" }, entries.filter(([, v]) => !rows(v)).map(([k, v]) => [el("dt", { text: k }),
            el("dd", { text: v === null || v === undefined ? "—" : typeof v === "object" ? short(v, 200) : String(v) })])),
          entries.filter(([, v]) => rows(v)).map(([k, v]) => [el("h4", { text: k }), table(v)]));
    } else {
      body = el("p", { class: "big", text: value === null || value === undefined ? "—" : String(value) });
    }
    return el("div", { class: "card", "data-testid": `system-${name}` }, el("h3", { text: name.replace(/_/g, " ") }), body);
  }

  async function loadSystem() {
    try {
      const body = await api("/api/system");
      const order = ["servers", "worker_lag", "embedding_backlog", "dead_letters", "streams", "consumers", "worker",
                     "jetstream", "database", "agent"];
      const rank = (k) => (order.includes(k) ? order.indexOf(k) : order.length);
      const parts = Object.entries(body).sort(([a], [b]) => rank(a) - rank(b));
      $("#system").replaceChildren(...parts.map(([k, v]) => renderSystemPart(k, v)));
    } catch (error) {
      $("#system").replaceChildren(el("p", { class: "empty", text: error.message }));
      if (!(error instanceof ApiError && error.status === 503)) showError(error);
    }
  }

  // ---- navigation ----------------------------------------------------------------------------
  function readHash() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    return { board: params.get("board") || "", tab: params.get("tab") || "board", section: params.get("section") || "" };
  }

  function navigate(change) {
    const current = readHash();
    const next = Object.assign({ board: state.board || current.board, tab: state.tab, section: state.section }, change);
    const params = new URLSearchParams();
    if (next.board) params.set("board", next.board);
    if (next.tab && next.tab !== "board") params.set("tab", next.tab);
    if (next.section) params.set("section", next.section);
    const hash = `#${params}`;
    if (location.hash === hash) route(); else location.hash = hash;
  }

  function showTab(tab) {
    state.tab = tab;
    for (const button of document.querySelectorAll("#tabs button")) button.classList.toggle("active", button.dataset.tab === tab);
    for (const section of document.querySelectorAll(".tab")) section.classList.toggle("active", section.id === `tab-${tab}`);
    clearInterval(state.messagesTimer);
    if (tab === "votes") loadVotes();
    if (tab === "messages") { loadMessages(); state.messagesTimer = setInterval(loadMessages, 3000); }
    if (tab === "system") loadSystem();
    if (tab === "board") scheduleRows();
  }

  function route() {
    const wanted = readHash();
    let board = wanted.board;
    const searchBoards = $("#search-boards");
    if (!searchBoards.value || searchBoards.value === state.board) searchBoards.value = board || state.boards[0] || "";
    if (board && !state.boards.includes(board)) {
      showError(new Error(`board ${board} is not readable by ${state.agent || "this identity"}`));
      board = "";
    }
    if (!board && state.boards.length) board = state.boards[0];
    const boardChanged = board !== state.board;
    const sectionChanged = wanted.section !== state.section;
    state.board = board || null;
    state.section = wanted.section;
    if (boardChanged) {
      state.sections = new Set();
      state.selected = null;
      state.votes = [];
      state.maxRevision = 0;
      $("#asof").max = "0";
      $("#detail").replaceChildren(el("p", { class: "hint", text: "Select an entry." }));
      connectEvents();
    }
    renderBoards();
    renderSections();
    if (boardChanged || sectionChanged) loadEntries();
    showTab(wanted.tab);
  }

  async function start() {
    for (const button of document.querySelectorAll("#tabs button")) {
      button.addEventListener("click", () => navigate({ tab: button.dataset.tab }));
    }
    $("#votes-refresh").addEventListener("click", loadVotes);
    $("#msg-refresh").addEventListener("click", loadMessages);
    $("#msg-kind").addEventListener("change", loadMessages);
    for (const id of ["#msg-agent", "#msg-type"]) {
      $(id).addEventListener("keydown", (event) => { if (event.key === "Enter") loadMessages(); });
    }
    $("#system-refresh").addEventListener("click", loadSystem);
    $("#search-form").addEventListener("submit", runSearch);
    setupAsOf();
    try {
      const [who, boards] = await Promise.all([api("/api/whoami"), api("/api/boards")]);
      state.agent = who.agent;
      state.boards = boards.boards || [];
      $("#whoami").textContent = who.agent;
    } catch (error) {
      showError(error);
    }
    window.addEventListener("hashchange", route);
    route();
  }

  start();
})();
