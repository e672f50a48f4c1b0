// qmd's search page: a thin client of the daemon's HTTP API, the routes the CLI speaks.
// Note text reaches the page only as text (textContent, text nodes), never as markup:
// a note holding <script> shows those characters. The state lives in the URL.
"use strict";

const DEBOUNCE_MS = 150;
const RESULTS = 20;
const CONTEXT_LINES = 5;
const WIDEN = 10;
const MIN_MARK = 3; // the CLI's shortest highlighted term
const ENDPOINTS = { search: "/v1/keyword", vsearch: "/v1/vector", query: "/v1/query" };
const DEFAULT_EDITOR_URI = "vscode://file/{path}:{line}:{col}";
const STATES = ["indexed", "pending_update", "skipped", "failed"];
const STATE_NAMES = { indexed: "indexed", pending_update: "pending", skipped: "skipped", failed: "failed" };
const RELEVANCE_TITLE =
  "Relevance: how likely this result is relevant, from its keyword and vector evidence. " +
  "Unlike the score, it means the same for every query, so a low one says the notes may not hold the answer.";
const SCORE_TITLE = "Score: this result's place among this answer's lists (rank fusion, or the reranker's blend); relative to this query only.";

const $ = (id) => document.getElementById(id);
// The state, which the URL mirrors: Chrome ignores history writes that come too fast, so
// the page never reads its state back from the address bar except on load and back/forward.
let current = new URLSearchParams(location.search);
let urlTimer = 0;
const params = () => new URLSearchParams(current);

/** An element with text children only: strings become text nodes, never HTML. */
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

// -- the API --------------------------------------------------------------------

/** A header value as the CLI sends one: the UTF-8 bytes, each a Latin-1 character. */
const latin1 = (text) => String.fromCharCode(...new TextEncoder().encode(text));

function request(method, path, body, signal) {
  const headers = { Accept: "application/json" };
  const index = params().get("index");
  if (index) headers["x-qmd-index"] = index;
  const project = params().get("project"); // a project's own index, named by its folder
  if (project) headers["x-qmd-project"] = latin1(project);
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const payload = body === undefined ? undefined : JSON.stringify(body);
  return fetch(path, { method, headers, body: payload, signal, credentials: "same-origin" });
}

async function failure(res) {
  const data = await res.json().catch(() => ({}));
  const message = typeof data.error === "string" ? data.error : data.error?.message; // the guard answers JSON-RPC
  return new Error(message || `HTTP ${res.status}`);
}

async function call(method, path, body, signal) {
  const res = await request(method, path, body, signal);
  if (!res.ok) throw await failure(res);
  return res.json();
}

/** POST a streaming job (update, embed) and hand each NDJSON event to `onEvent`. */
async function stream(path, body, onEvent) {
  const res = await request("POST", path, body);
  if (!res.ok) throw await failure(res);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + 1);
      if (line.trim()) onEvent(JSON.parse(line));
    }
  }
}

// -- the URL is the state -----------------------------------------------------------

/** A facet in the URL: `key=<JSON value>`, so numbers and booleans keep their type. */
function parseFacet(text) {
  const at = text.indexOf("=");
  if (at <= 0) return null;
  const raw = text.slice(at + 1);
  try {
    return [text.slice(0, at), JSON.parse(raw)];
  } catch {
    return [text.slice(0, at), raw];
  }
}

function state() {
  const p = params();
  return {
    q: p.get("q") || "",
    mode: ENDPOINTS[p.get("mode")] ? p.get("mode") : "search",
    collections: p.getAll("c"),
    facets: p.getAll("f").map(parseFacet).filter(Boolean),
    view: p.get("view"),
    open: p.get("open"),
    from: Math.max(1, Number(p.get("from")) || 1),
    lines: Math.max(1, Number(p.get("lines")) || 40),
    mark: (p.get("mark") || "").split("-").map(Number),
    floor: floorOf(p.get("floor")),
  };
}

/** The relevance floor a full query asks for (`min_relevance`): a probability in (0, 1], else none. */
function floorOf(text) {
  const value = Number(text);
  return text && value > 0 && value <= 1 ? value : 0;
}

/** Change some URL parameters (null or [] drops one); `push` makes a history entry Esc can go back from. */
function setUrl(changes, push = false) {
  if (push && urlTimer) writeUrl(false); // the entry being left keeps its own state
  const p = params();
  for (const [key, value] of Object.entries(changes)) {
    p.delete(key);
    for (const v of Array.isArray(value) ? value : [value]) if (v !== null && v !== "") p.append(key, String(v));
  }
  current = p;
  if (push) writeUrl(true);
  else if (!urlTimer) urlTimer = setTimeout(() => writeUrl(false), 100); // typing writes once it pauses
}

function writeUrl(push) {
  clearTimeout(urlTimer);
  urlTimer = 0;
  const url = current.toString() ? `/?${current}` : "/";
  if (push) history.pushState({ pushed: true }, "", url);
  else history.replaceState(history.state, "", url);
}

/** The metadata filter of the chosen facets: values of one key are alternatives, keys all apply. */
function filterOf(facets) {
  const byKey = new Map();
  for (const [field, value] of facets) {
    if (!byKey.has(field)) byKey.set(field, []);
    byKey.get(field).push({ field, operator: "eq", value });
  }
  const perKey = [...byKey.values()].map((ops) => (ops.length === 1 ? ops[0] : { operator: "or", operands: ops }));
  if (perKey.length === 0) return null;
  return perKey.length === 1 ? perKey[0] : { operator: "and", operands: perKey };
}

// -- text as the CLI shows it ---------------------------------------------------------

/** `file:from[:count]`, the range before a qmd:// link's query string (qmd/uri.py `with_range`). */
function withRange(file, ...numbers) {
  const suffix = numbers.map((n) => `:${n}`).join("");
  if (!file.startsWith("qmd:")) return file + suffix;
  const at = file.indexOf("?");
  return at < 0 ? file + suffix : file.slice(0, at) + suffix + file.slice(at);
}

function contextLine(context) {
  if (!context) return "";
  return context
    .trim()
    .split(/[ \t]*(?:\r?\n[ \t]*){2,}/)
    .map((level) => level.replace(/[ \t]*\r?\n[ \t]*|\r/g, " ").trim())
    .filter(Boolean)
    .join(" | ");
}

function editorLink(absPath, line, template) {
  const path = encodeURI(absPath).replace(/\?/g, "%3F").replace(/#/g, "%23");
  return template
    .replace("{path}", path)
    .replace("{line}", String(Math.max(1, line)))
    .replace("{col}", "1")
    .replace("{column}", "1");
}

/** `text` as text nodes with the query's terms in <mark>: one alternation, longest first. */
function highlighted(text, terms) {
  const words = [...new Set(terms.filter((t) => t.length >= MIN_MARK))].sort((a, b) => b.length - a.length);
  if (!words.length) return [document.createTextNode(text)];
  const pattern = new RegExp(words.map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|"), "gi");
  const parts = [];
  let last = 0;
  for (const m of text.matchAll(pattern)) {
    parts.push(document.createTextNode(text.slice(last, m.index)), el("mark", {}, m[0]));
    last = m.index + m[0].length;
  }
  parts.push(document.createTextNode(text.slice(last)));
  return parts;
}

/** A probability as a percentage, truncated so a result below a floor never reads as at it. */
function percent(p) {
  const v = p * 100 + 1e-9;
  if (v >= 10) return `${Math.floor(v)}%`;
  return v >= 0.1 ? `${(Math.floor(v * 10) / 10).toFixed(1)}%` : "<0.1%";
}

/** A floor as its select's option says it: 0.02 is "2%". */
const floorText = (floor) => `${Number((floor * 100).toFixed(2))}%`;

function metaValue(value) {
  if (Array.isArray(value)) return value.map(metaValue).join(", ");
  return typeof value === "object" && value !== null ? JSON.stringify(value) : String(value);
}

function duration(seconds) {
  const s = Math.round(seconds);
  if (s >= 3600) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return s >= 60 ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s` : `${s}s`;
}

/** A running embed in one line, as `qmd status` says it (client/formats.py `embed_progress_line`). */
function embedLine(run) {
  const who = run.source === "embed" ? "qmd embed" : "background, for what the watcher indexed";
  if (!run.documents_total) return `starting (${who}; ${run.model})`;
  const eta = run.eta_s !== null && run.documents_done ? ` · ETA ${duration(run.eta_s)}` : "";
  return (
    `${run.documents_done}/${run.documents_total} documents · ${run.chunks_embedded} chunks embedded · ` +
    `${run.chunks_per_s.toFixed(1)} chunks/s${eta} (${who}; ${run.model})`
  );
}

/** Stages skipped or partial, as `qmd query` prints them on stderr. */
function stageLines(answer) {
  return (answer.stages || [])
    .filter((st) => st.status === "skipped" || st.status === "partial")
    .map((st) => {
      const timing = st.status !== "skipped" || st.ms ? ` (${st.ms.toFixed(0)} ms)` : "";
      return `${st.stage}: ${st.status}${timing}` + (st.detail ? ` - ${st.detail}` : "");
    });
}

function showNotes(box, { warnings = [], info = [], errors = [] }) {
  box.replaceChildren(
    ...errors.map((t) => el("p", { class: "error" }, t)),
    ...warnings.map((t) => el("p", { class: "warning" }, t)),
    ...info.map((t) => el("p", { class: "muted" }, t)),
  );
}

// -- views ------------------------------------------------------------------------

function showView(name) {
  $("search-view").hidden = name !== "search";
  $("doc-view").hidden = name !== "doc";
  $("status-view").hidden = name !== "status";
  document.body.dataset.view = name;
  if (name !== "status") clearInterval(statusTimer);
}

/** Render whatever the URL says: the page's one entry point, on load and on back/forward. */
function route() {
  const s = state();
  $("q").value = s.q;
  $("mode").value = s.mode;
  showFloor(s);
  if (s.view === "status") {
    showView("status");
    showStatus();
  } else if (s.open) {
    showView("doc");
    openDoc();
  } else {
    showView("search");
    refreshFilters();
    if (lastSearch !== searchKey(s)) runSearch();
  }
}

// -- search -----------------------------------------------------------------------

let timer = 0;
let inflight = null;
let lastSearch = null;
let hits = [];
let selected = -1;
let editorUri = sessionStorage.getItem("qmd-editor-uri") || DEFAULT_EDITOR_URI;

const searchKey = (s) => JSON.stringify([s.q, s.mode, s.collections, s.facets, s.floor]);

/** The floor's select, shown in full query mode only (the other routes have no relevance); a
 * floor from a link that no option names gets its own. */
function showFloor(s) {
  const box = $("floor");
  box.hidden = s.mode !== "query";
  const value = s.floor ? String(s.floor) : "";
  if (![...box.options].some((o) => o.value === value)) box.append(el("option", { value }, `relevance ≥ ${floorText(s.floor)}`));
  box.value = value;
}

function scheduleSearch() {
  clearTimeout(timer);
  timer = setTimeout(runSearch, DEBOUNCE_MS);
}

async function runSearch() {
  clearTimeout(timer);
  const s = state();
  if (inflight) inflight.abort(); // a stale answer is never painted
  lastSearch = searchKey(s);
  if (!s.q.trim()) {
    inflight = null;
    paintResults([], s.q);
    showNotes($("notes"), {});
    return;
  }
  const ctl = new AbortController();
  inflight = ctl;
  document.body.dataset.busy = "true";
  const body = { query: s.q, limit: RESULTS, filter: filterOf(s.facets) };
  if (s.collections.length) body.collections = s.collections;
  if (s.mode === "query" && s.floor) body.min_relevance = s.floor;
  try {
    const answer = await call("POST", ENDPOINTS[s.mode], body, ctl.signal);
    if (answer.editor_uri) sessionStorage.setItem("qmd-editor-uri", (editorUri = answer.editor_uri));
    const info = [...stageLines(answer)];
    if (answer.filter) info.push(`filter: ${answer.filter.eligible} of ${answer.filter.documents} documents eligible`);
    const closest = !answer.results.length && answer.closest ? answer.closest : null;
    if (closest) info.push(`No result above the relevance floor (${floorText(s.floor)}); the closest:`);
    else if (!answer.results.length) info.push(answer.below_min_score ? "No results above the minimum score." : "No results.");
    showNotes($("notes"), { warnings: answer.warnings || [], info });
    paintResults(closest ? [closest] : answer.results, s.q, Boolean(closest));
  } catch (err) {
    if (err.name === "AbortError") return;
    showNotes($("notes"), { errors: [err.message] });
    paintResults([], s.q);
  } finally {
    if (inflight === ctl) {
      inflight = null;
      delete document.body.dataset.busy;
    }
  }
}

function hitPointer(hit) {
  return withRange(hit.file, hit.start_line, hit.end_line - hit.start_line + 1);
}

/** The URL parameters that open a hit: its lines, a few around them, the hit's own marked. */
function rangeOf(hit) {
  const from = Math.max(1, hit.start_line - CONTEXT_LINES);
  return { open: hit.file, from, lines: hit.end_line + CONTEXT_LINES - from + 1, mark: `${hit.start_line}-${hit.end_line}` };
}

/** A hit's scores: keyword and vector hits their score; a full query's its relevance too, which
 * stands alone where it is the score (a plain query ranked by it, as `qmd query` does). */
function scoreViews(hit, belowFloor) {
  const score = el("span", { class: "score" }, `${Math.floor(hit.score * 100 + 0.5)}%`);
  if (typeof hit.relevance !== "number") return [score];
  const chance = el("span", { class: "relevance", title: RELEVANCE_TITLE }, `relevance ${percent(hit.relevance)}`);
  if (belowFloor) chance.append(" · below the floor");
  if (Math.abs(hit.score - hit.relevance) < 5e-4) return [chance];
  score.title = SCORE_TITLE;
  return [score, chance];
}

function hitView(hit, i, belowFloor = false) {
  const open = params();
  for (const [k, v] of Object.entries(rangeOf(hit))) open.set(k, v);
  const title = el("a", { class: "title", href: `/?${open}` }, hit.title || hit.path);
  title.addEventListener("click", (ev) => {
    ev.preventDefault();
    openHit(i);
  });
  const snippet = el("pre", { class: "snippet" });
  (hit.snippet || "").split("\n").forEach((line, n) => {
    snippet.append(el("span", { class: "ln" }, `${hit.start_line + n}: `), ...highlighted(line, hit.terms || []), "\n");
  });
  const meta = Object.entries(hit.metadata || {});
  const li = el(
    "li",
    {
      class: belowFloor ? "hit below-floor" : "hit",
      tabindex: "-1",
      "aria-selected": "false",
      "data-file": hit.file,
      "data-lines": `${hit.start_line}-${hit.end_line}`,
    },
    el("div", { class: "hit-head" }, ...scoreViews(hit, belowFloor), title),
    el(
      "div",
      { class: "pointer" },
      el("code", {}, hitPointer(hit)),
      " ",
      el("span", { class: "muted" }, `#${hit.docid} · lines ${hit.start_line}-${hit.end_line} of ${hit.total_lines}`),
    ),
    hit.context ? el("div", { class: "context muted" }, `Context: ${contextLine(hit.context)}`) : null,
    snippet,
    meta.length ? el("dl", { class: "meta" }, ...meta.flatMap(([k, v]) => [el("dt", {}, `${k}:`), el("dd", {}, metaValue(v))])) : null,
  );
  li.addEventListener("click", (ev) => {
    if (!ev.target.closest("a")) select(i);
  });
  return li;
}

/** The hits of an answer, or (`belowFloor`) the one closest hit a relevance floor dropped. */
function paintResults(results, query, belowFloor = false) {
  hits = results;
  selected = -1;
  $("results").replaceChildren(...results.map((hit, i) => hitView(hit, i, belowFloor)));
  $("results").dataset.query = query;
}

function select(i) {
  const items = $("results").children;
  if (!items.length) return;
  selected = Math.max(0, Math.min(items.length - 1, i));
  for (const [n, item] of [...items].entries()) item.setAttribute("aria-selected", String(n === selected));
  items[selected].focus();
  items[selected].scrollIntoView({ block: "nearest" });
}

function openHit(i) {
  const hit = hits[i];
  if (!hit) return;
  setUrl(rangeOf(hit), true);
  sessionStorage.setItem("qmd-abs-path", hit.abs_path || "");
  route();
}

// -- filters: collections and metadata facets -------------------------------------------

let collectionNames = null;
let facetScope = null;

async function refreshFilters() {
  const s = state();
  try {
    if (collectionNames === null) {
      collectionNames = (await call("GET", "/v1/collections")).collections.map((c) => [c.name, c.files]);
    }
    $("collections").replaceChildren(
      el("legend", {}, "Collections"),
      ...collectionNames.map(([name, files]) => checkbox("c", name, `${name} (${files})`, s.collections.includes(name))),
    );
    const scope = JSON.stringify(s.collections);
    if (facetScope === scope) return markFacets(s);
    facetScope = scope;
    const meta = await call("POST", "/v1/metadata", s.collections.length ? { collections: s.collections } : {});
    $("facets").replaceChildren(...meta.keys.map(facetView));
    markFacets(s);
  } catch (err) {
    showNotes($("notes"), { errors: [err.message] });
  }
}

function checkbox(param, value, label, checked) {
  const box = el("input", { type: "checkbox", "data-param": param, "data-value": value });
  box.checked = checked;
  box.addEventListener("change", onFilterChange);
  return el("label", {}, box, " ", label);
}

function facetView(key) {
  const boxes = key.types.flatMap((type) =>
    type.values.map((v) => {
      const label = el("span", {}, metaValue(v.value), " ", el("span", { class: "count" }, `(${v.documents})`));
      return checkbox("f", `${key.key}=${JSON.stringify(v.value)}`, label, false);
    }),
  );
  return boxes.length ? el("fieldset", { class: "facet" }, el("legend", {}, key.key), ...boxes) : "";
}

function markFacets(s) {
  const chosen = new Set(s.facets.map(([k, v]) => `${k}=${JSON.stringify(v)}`));
  for (const box of $("facets").querySelectorAll("input")) box.checked = chosen.has(box.dataset.value);
}

function onFilterChange() {
  const chosen = (param) =>
    [...document.querySelectorAll(`#filters input[data-param="${param}"]`)].filter((b) => b.checked).map((b) => b.dataset.value);
  setUrl({ c: chosen("c"), f: chosen("f") });
  refreshFilters();
  runSearch();
}

// -- a result's range -----------------------------------------------------------------

let doc = null;

async function openDoc() {
  const s = state();
  $("doc-pointer").textContent = withRange(s.open, s.from, s.lines);
  try {
    doc = await call("POST", "/v1/get", { file: s.open, from_line: s.from, max_lines: s.lines, line_numbers: false });
  } catch (err) {
    $("doc-lines").replaceChildren(el("li", { class: "error" }, err.message));
    return;
  }
  const [markFrom, markTo] = s.mark;
  const body = doc.body.split("\n");
  $("doc-title").textContent = doc.title || doc.path;
  $("doc-docid").textContent = `#${doc.docid}`;
  $("doc-context").textContent = doc.context ? `Folder Context: ${contextLine(doc.context)}` : "";
  $("doc-lines").replaceChildren(
    ...body.map((text, i) => {
      const n = doc.from_line + i;
      const matched = n >= markFrom && n <= markTo;
      return el(
        "li",
        { class: matched ? "matched" : "", "data-n": String(n) },
        el("span", { class: "gutter", "aria-hidden": "true" }, matched ? "›" : ""),
        el("span", { class: "ln" }, String(n)),
        el("span", { class: "text" }, text),
      );
    }),
  );
  $("doc-range").textContent = `lines ${doc.from_line}-${doc.to_line} of ${doc.total_lines}`;
  $("doc-up").disabled = doc.from_line <= 1;
  $("doc-down").disabled = doc.to_line >= doc.total_lines;
  const pointer = markFrom ? withRange(doc.file, markFrom, markTo - markFrom + 1) : withRange(doc.file, doc.from_line, body.length);
  $("doc-pointer").textContent = pointer;
  const absPath = doc.abs_path || sessionStorage.getItem("qmd-abs-path");
  $("doc-editor").hidden = !absPath;
  if (absPath) $("doc-editor").href = editorLink(absPath, markFrom || doc.from_line, editorUri);
  $("doc-copied").textContent = "";
  $("doc-back").focus();
}

function widen(up) {
  const s = state();
  if (!doc) return;
  const from = up ? Math.max(1, s.from - WIDEN) : s.from;
  const lines = Math.min(s.lines + (s.from - from) + (up ? 0 : WIDEN), doc.total_lines - from + 1);
  setUrl({ from, lines });
  openDoc();
}

async function copyPointer() {
  const text = $("doc-pointer").textContent;
  try {
    await navigator.clipboard.writeText(text);
    $("doc-copied").textContent = "copied";
  } catch {
    getSelection().selectAllChildren($("doc-pointer")); // no clipboard access: select it for Ctrl+C
    $("doc-copied").textContent = "selected: press Ctrl+C to copy";
  }
}

/** Esc: back where the page came from, or (opened straight from a link) to the search. */
function back() {
  if (history.state?.pushed) {
    history.back(); // popstate routes
    return;
  }
  setUrl({ open: null, from: null, lines: null, mark: null, view: null });
  route();
}

// -- status ---------------------------------------------------------------------------

let statusTimer = 0;
const jobs = new Set();

async function showStatus() {
  clearInterval(statusTimer);
  await paintStatus();
  statusTimer = setInterval(() => paintEmbedding(), 1000);
}

async function paintStatus() {
  let st;
  let coverage;
  try {
    [st, coverage] = await Promise.all([call("GET", "/v1/status"), call("GET", "/v1/coverage")]);
  } catch (err) {
    showNotes($("status-notes"), { errors: [err.message] });
    return;
  }
  showNotes($("status-notes"), { warnings: st.warnings || [] });
  const d = st.daemon;
  $("status-summary").replaceChildren(
    el("p", {}, `Index ${st.index}: ${st.documents} documents (${st.index_path})`),
    el("p", {}, `Vectors: ${st.vector.message}`),
    el("p", { class: "muted" }, `qmdd ${st.version}, PID ${d.pid}, up ${d.uptime}s at ${d.url}`),
  );
  const byName = new Map(coverage.collections.map((c) => [c.collection, c]));
  $("status-collections").replaceChildren(...st.collections.map((col) => collectionView(col, byName.get(col.name))));
  const inf = st.inference;
  const models = (inf.models_loaded || []).map((m) => el("li", {}, `${m.role}: ${m.path.split("/").pop()}`));
  $("status-models").replaceChildren(
    ...(inf.models_missing ? [el("li", {}, inf.models_missing)] : []),
    ...(models.length ? models : [el("li", {}, "none loaded (they load on first use)")]),
    el("li", {}, inf.pid ? `worker PID ${inf.pid}: ${inf.offload ? `GPU (${inf.offload})` : "CPU"}, ${inf.n_threads} threads` : "worker not started"),
    ...(inf.warnings || []).map((w) => el("li", { class: "warning" }, w)),
  );
  paintEmbedding(st.embedding);
}

/** The embed running now, whoever started it: `known` from the status, else asked for. */
async function paintEmbedding(known) {
  let run = known;
  if (run === undefined) {
    try {
      run = (await call("GET", "/v1/embed/progress")).running;
    } catch {
      return;
    }
  }
  const box = $("status-embedding");
  if (!run) {
    box.replaceChildren();
    return;
  }
  const bar = el("progress", { max: String(run.documents_total || 1), value: String(run.documents_done) });
  box.replaceChildren(el("p", { class: "embedding" }, `Embedding: ${embedLine(run)}`), bar);
}

function collectionView(col, cov) {
  const out = el("div", { class: "job", role: "status" });
  const button = (kind, label) => {
    const b = el("button", { type: "button", "data-job": kind, "data-collection": col.name }, label);
    b.addEventListener("click", () => runJob(kind, col.name, out));
    return b;
  };
  const parts = [
    el("h3", {}, col.name),
    el("p", { class: "muted" }, `${col.files} files · ${col.path} (${col.pattern})${col.include_by_default ? "" : " [excluded]"}`),
  ];
  if (col.watch) parts.push(el("p", {}, `Watcher: ${col.watch.mode}${col.watch.reason ? ` (${col.watch.reason})` : ""}, queue ${col.watch.queue}`));
  if (col.last_run) parts.push(el("p", {}, `Last update: ${col.last_run.line}`), ...col.last_run.warnings.map((w) => el("p", { class: "warning" }, w)));
  if (col.metadata_keys) parts.push(el("p", {}, col.metadata_keys));
  if (cov) parts.push(...coverageView(cov));
  parts.push(el("p", {}, button("update", `Update ${col.name}`), " ", button("embed", `Embed ${col.name}`)), out);
  return el("section", { class: "collection", "data-collection": col.name }, ...parts);
}

/** Coverage as a bar of file states, with every number also in words (readable without colour). */
function coverageView(cov) {
  const total = STATES.reduce((sum, k) => sum + cov[k], 0) || 1;
  const chart = el("div", { class: "chart", role: "img", "aria-label": `coverage of ${cov.collection}` });
  for (const k of STATES) {
    if (!cov[k]) continue;
    const seg = el("span", { class: STATE_NAMES[k], title: `${STATE_NAMES[k]}: ${cov[k]}` });
    seg.style.flexGrow = String(cov[k] / total); // CSSOM, which the CSP allows; style="" would not be
    chart.append(seg);
  }
  const legend = el(
    "ul",
    { class: "legend" },
    ...STATES.map((k) => el("li", { "data-state": STATE_NAMES[k] }, `${STATE_NAMES[k]} ${cov[k]}`)),
    el("li", { "data-state": "vectors pending" }, `vectors pending ${cov.pending_vectors}`),
    el("li", { "data-state": "clipped" }, `clipped ${cov.clipped}`),
  );
  const skipped = cov.files.filter((f) => f.state === "skipped" || f.state === "failed");
  const why = skipped.length
    ? el("details", {}, el("summary", {}, `${skipped.length} skipped or failed`), el("ul", {}, ...skipped.map((f) => el("li", {}, `${f.path}: ${f.reason || f.state}`))))
    : null;
  return [chart, legend, why].filter(Boolean);
}

async function runJob(kind, name, out) {
  if (jobs.has(kind + name)) return;
  jobs.add(kind + name);
  const line = el("p", {}, `${kind}: starting`);
  const bar = el("progress", { max: "1", value: "0" });
  out.replaceChildren(line, bar);
  const started = performance.now();
  try {
    await stream(`/v1/${kind}`, { collections: [name] }, (ev) => {
      if (ev.event === "progress") {
        bar.max = String(ev.total || 1);
        bar.value = String(ev.done);
        const rate = kind === "embed" ? `${ev.chunks} chunks · ${ev.chunks_per_s.toFixed(1)} chunks/s` : `${ev.files_per_s.toFixed(0)} files/s`;
        const eta = ev.eta_s !== undefined && ev.eta_s !== null && ev.done < ev.total ? ` · ETA ${duration(ev.eta_s)}` : "";
        line.textContent = `${kind}: ${ev.done}/${ev.total} ${kind === "embed" ? "documents" : "files"} · ${rate}${eta}`;
      } else if (ev.event === "summary") {
        line.textContent = `${kind}: ${ev.line}`;
      } else if (ev.event === "download") {
        line.textContent = `${kind}: downloading the embed model (${Math.floor(ev.done / 2 ** 20)} MB)`;
      } else if (ev.event === "error") {
        throw new Error(ev.error);
      } else if (ev.event === "done") {
        bar.value = bar.max;
        line.textContent = `✓ ${kind} ${name} done (${((performance.now() - started) / 1000).toFixed(1)} s)`;
        line.dataset.done = "true";
      }
    });
  } catch (err) {
    line.textContent = `✗ ${kind} ${name}: ${err.message}`;
    line.className = "error";
  } finally {
    jobs.delete(kind + name);
    collectionNames = null;
    if (!$("status-view").hidden) {
      await paintStatus(); // the collection's new counts; its job line stays
      $("status-collections").querySelector(`[data-collection="${CSS.escape(name)}"] .job`)?.replaceChildren(line);
    }
  }
}

// -- keyboard and wiring --------------------------------------------------------------

function typing(target) {
  return target instanceof HTMLInputElement || target instanceof HTMLSelectElement || target instanceof HTMLTextAreaElement;
}

document.addEventListener("keydown", (ev) => {
  const view = document.body.dataset.view;
  if (ev.key === "Escape") {
    if (view === "doc" || view === "status") {
      ev.preventDefault();
      back();
    } else if (ev.target !== $("q")) {
      $("q").focus();
    }
    return;
  }
  if (ev.key === "/" && !typing(ev.target)) {
    ev.preventDefault();
    if (view !== "search") {
      setUrl({ view: null, open: null, from: null, lines: null, mark: null }, true);
      route();
    }
    $("q").focus();
    $("q").select();
    return;
  }
  if (view !== "search" || !hits.length) return;
  const inResults = ev.target === $("q") || $("results").contains(ev.target) || ev.target === document.body;
  if (!inResults) return;
  if (ev.key === "ArrowDown") {
    ev.preventDefault();
    select(selected + 1);
  } else if (ev.key === "ArrowUp") {
    ev.preventDefault();
    if (selected <= 0) $("q").focus();
    else select(selected - 1);
  } else if (ev.key === "Enter" && ev.target !== $("q") && selected >= 0) {
    ev.preventDefault();
    openHit(selected);
  }
});

$("q").addEventListener("input", () => {
  setUrl({ q: $("q").value });
  scheduleSearch();
});
$("mode").addEventListener("change", () => {
  setUrl({ mode: $("mode").value === "search" ? null : $("mode").value });
  showFloor(state());
  runSearch();
});
$("floor").addEventListener("change", () => {
  setUrl({ floor: $("floor").value });
  runSearch();
});
$("search-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  setUrl({ q: $("q").value });
  runSearch();
});
$("status-link").addEventListener("click", (ev) => {
  ev.preventDefault();
  setUrl({ view: "status", open: null, from: null, lines: null, mark: null }, true);
  route();
});
$("doc-back").addEventListener("click", back);
$("doc-up").addEventListener("click", () => widen(true));
$("doc-down").addEventListener("click", () => widen(false));
$("doc-copy").addEventListener("click", copyPointer);
window.addEventListener("popstate", () => {
  clearTimeout(urlTimer);
  urlTimer = 0;
  current = new URLSearchParams(location.search);
  route();
});
route();
