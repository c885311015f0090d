"use strict";
// The fanout demo page. A person picks a recorded case; POST /demo/streams submits the job on the
// page's behalf (demo mode only) and answers a stream id and a read token. Contract events arrive
// over native EventSource with the token in the query (EventSource cannot set headers). "Drop"
// closes the connection and opens a new one from the id of the last event held (last_event_id, the
// query twin of Last-Event-ID: <seq>.<epoch>); a network cut makes the browser reconnect by itself
// with Last-Event-ID. A stream written again as another generation (a stream.gap with reason
// history-reset, or a 410 history-reset) is shown again from its start: never the old answer's
// first half glued to the new one's second half.
// A stream (re)loaded by link, or shown again after a reset, is read with ?snapshot=1: one
// stream.snapshot message carries its assembled state (every block's text so far), then the events
// after it follow; state.events counts the seqs held, whether applied one by one or by a snapshot.
// Text, reasoning and refusals render as Markdown (marked), sanitized by DOMPurify; raw HTML from a
// model is shown as text, never parsed. The DOM is rendered at most once per animation frame.

const $ = (id) => document.getElementById(id);
const EVENT_TYPES = ["stream.start", "block.start", "block.delta", "block.stop", "stream.done", "stream.error"];
const DEFAULT_CASE = { provider: "anthropic", case: "thinking_with_signature" };
const DROP_RECONNECT_MS = 300;

const blocks = new Map();   // index -> {kind, text, signature, open, name, callId, redacted, parsed, el, body}
const state = {
  streamId: null, token: null, status: "idle", lastSeq: null, lastId: null, events: 0, renders: 0, connections: 0,
  terminal: null, finish: null, error: null, usage: null, resumes: [], log: [], dirty: new Set(), scheduled: false,
  reason: "",   // why the page cannot follow the stream (unknown stream, refused token, no token), shown by the status
};
let source = null;          // the EventSource in use; events of any other are ignored
let pendingResume = null;   // seq held when the next connection opens as a resume
let resets = 0;             // times the stream was shown again from its start (history-reset)
let reconnectTimer = null;
let catalogue = [];

// ---- Markdown, sanitized ----------------------------------------------------------------------
const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
marked.use({ gfm: true, renderer: { html: ({ text }) => escapeHtml(text) } });   // model HTML stays text
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") { node.setAttribute("target", "_blank"); node.setAttribute("rel", "noopener noreferrer"); }
});
function markdown(text) {
  return DOMPurify.sanitize(marked.parse(text, { async: false }), { RETURN_DOM_FRAGMENT: true });
}

// ---- rendering --------------------------------------------------------------------------------
function scheduleRender(index) {
  if (index !== undefined && blocks.has(index)) state.dirty.add(index);
  if (!state.scheduled) { state.scheduled = true; requestAnimationFrame(render); }
}

function blockElement(index, b) {
  const container = $("blocks");
  const el = document.createElement(b.kind === "reasoning" ? "details" : "div");
  el.className = "block"; el.dataset.kind = b.kind; el.dataset.index = String(index);
  if (b.kind === "reasoning") {
    el.open = true;
    el.appendChild(document.createElement("summary")).textContent = b.redacted ? "reasoning (redacted)" : "reasoning";
  }
  if (b.kind === "tool_call") {
    const head = el.appendChild(document.createElement("div"));
    head.className = "tool-head";
    head.appendChild(document.createElement("span")).className = "tool-name";
    head.appendChild(document.createElement("span")).className = "meta call-id";
    el.appendChild(document.createElement("pre")).className = "args";
  } else {
    const body = el.appendChild(document.createElement("div"));
    body.className = "body"; body.dir = "auto";   // right-to-left answers read right to left
  }
  const after = [...container.children].find((c) => Number(c.dataset.index) > index);
  container.insertBefore(el, after || null);
  return el;
}

function renderBlock(b, index) {
  if (!b.el) b.el = blockElement(index, b);
  b.el.dataset.open = String(b.open);
  b.el.dataset.cut = String(Boolean(b.cut));
  if (b.kind === "tool_call") {
    b.el.querySelector(".tool-name").textContent = b.name ?? "tool call";
    b.el.querySelector(".call-id").textContent = ` ${b.callId ?? ""}`;
    const args = b.el.querySelector(".args");
    args.classList.toggle("partial", b.open);
    if (b.open) args.textContent = b.text ? `${b.text}  (arguments streaming, ${b.text.length} chars)` : "(arguments streaming)";
    else if (b.cut) args.textContent = `${b.text}  (cut off: not executable)`;
    else args.textContent = b.parsed === undefined ? `${b.text}  (not valid JSON)` : JSON.stringify(b.parsed, null, 2);
  } else {
    b.el.querySelector(".body").replaceChildren(markdown(b.redacted && !b.text ? "*encrypted by the provider*" : b.text));
  }
  if (b.kind === "reasoning" && b.signature && !b.el.querySelector(".badge")) {
    b.el.querySelector("summary").appendChild(document.createElement("span")).className = "badge";
    b.el.querySelector(".badge").textContent = "signed";
  }
}

function render() {
  state.scheduled = false;
  state.renders += 1;
  for (const index of state.dirty) renderBlock(blocks.get(index), index);
  state.dirty.clear();
  $("status").textContent = state.status; $("status").dataset.state = state.status;
  $("position").textContent = `seq ${state.lastSeq ?? "–"}`;
  $("connections").textContent = `connections ${state.connections}`;
  const resumed = state.resumes.length ? `resumed after seq ${state.resumes.join(", ")}` : "";
  $("resumed").textContent = resets ? `${resumed}${resumed ? " · " : ""}history reset ${resets}×, shown from its start` : resumed;
  $("drop").disabled = !source || Boolean(state.terminal);
  $("outcome").textContent = outcome();
  $("reason").textContent = state.reason; $("reason").hidden = !state.reason;
  const log = $("log");
  for (let i = log.children.length; i < state.log.length; i += 1) log.appendChild(document.createElement("li")).textContent = state.log[i];
}

function outcome() {
  const u = state.usage;
  const usage = u ? `usage: in ${u.input_tokens ?? "–"} · out ${u.output_tokens ?? "–"} · cached ${u.cached_input_tokens ?? "–"} · reasoning ${u.reasoning_tokens ?? "–"}` : "";
  if (state.error) return `${state.terminal}: ${state.error.category}${state.error.retryable ? " (retryable)" : ""}: ${state.error.message}${usage ? ` · ${usage}` : ""}`;
  if (state.terminal) return `${state.terminal}, finish_reason ${state.finish ?? "–"}${usage ? ` · ${usage}` : ""}`;
  return "";
}

function note(text) { state.log.push(text); scheduleRender(); }

// ---- the stream -------------------------------------------------------------------------------
function apply(ev) {
  const index = ev.block ? ev.block.index : undefined;
  if (ev.type === "block.start") {
    blocks.set(index, { kind: ev.block.kind, text: "", signature: "", open: true, name: ev.tool?.name, callId: ev.tool?.call_id, redacted: Boolean(ev.redacted) });
  } else if (ev.type === "block.delta" && blocks.has(index)) {
    const b = blocks.get(index);
    if (ev.delta.kind === "signature") b.signature += ev.delta.text; else b.text += ev.delta.text;
  } else if (ev.type === "block.stop" && blocks.has(index)) {
    const b = blocks.get(index);
    b.open = false;
    if (b.kind === "tool_call") { try { b.parsed = b.text.trim() ? JSON.parse(b.text) : {}; } catch { b.parsed = undefined; } }
  } else if (ev.type === "stream.start") {
    note(`seq ${ev.seq} stream.start: ${ev.provider} ${ev.model ?? ""}`);
  } else if (ev.type === "stream.done" || ev.type === "stream.error") {
    state.status = ev.status; state.terminal = ev.status; state.usage = ev.usage ?? null;
    state.finish = ev.finish_reason ?? null; state.error = ev.error ?? null;
    for (const b of blocks.values()) if (b.open) { b.open = false; b.cut = true; }   // never closed publicly
    for (const i of blocks.keys()) state.dirty.add(i);
    source.close(); source = null;
    note(`seq ${ev.seq} ${ev.type}: ${ev.status}`);
  }
  scheduleRender(index);
}

function applySnapshot(snap) {
  blocks.clear(); $("blocks").replaceChildren();
  const running = snap.result.status === "running";
  for (const b of snap.result.blocks) {
    const tool = b.kind === "tool_call";
    const entry = { kind: b.kind, text: tool ? b.arguments_text : b.text, signature: b.signature ?? "", redacted: Boolean(b.redacted),
                    open: running && !(tool && b.closed), name: b.name, callId: b.call_id };
    if (tool && b.closed) { try { entry.parsed = entry.text.trim() ? JSON.parse(entry.text) : {}; } catch { entry.parsed = undefined; } }
    if (!running && tool && !b.closed) entry.cut = true;
    blocks.set(b.index, entry); state.dirty.add(b.index);
  }
  note(`seq ${snap.seq} stream.snapshot: ${snap.result.blocks.length} blocks, ${snap.result.status}`);
  if (!running) {
    const r = snap.result;
    state.status = r.status; state.terminal = r.status; state.usage = r.usage ?? null;
    state.finish = r.finish_reason ?? null; state.error = r.error ?? null;
    source.close(); source = null;
  }
  scheduleRender();
}

function eventsUrl() {
  return `/v1/streams/${encodeURIComponent(state.streamId)}/events?token=${encodeURIComponent(state.token)}`;
}

function connect(resumeFrom, snapshot = false) {
  const url = resumeFrom === null ? `${eventsUrl()}${snapshot ? "&snapshot=1" : ""}`
                                  : `${eventsUrl()}&last_event_id=${encodeURIComponent(resumeFrom)}`;
  const src = new EventSource(url);
  source = src;
  pendingResume = resumeFrom === null ? null : state.lastSeq;
  src.onopen = () => {
    if (src !== source) return;
    state.connections += 1;
    if (!state.terminal) state.status = "streaming";
    if (pendingResume !== null) { state.resumes.push(pendingResume); note(`connection ${state.connections} open: resumed after seq ${pendingResume}`); }
    else note(`connection ${state.connections} open`);
    pendingResume = null;
  };
  const onEvent = (msg) => {
    if (src !== source) return;
    const ev = JSON.parse(msg.data);
    if (state.lastSeq !== null && ev.seq <= state.lastSeq) return;   // never apply twice
    state.lastSeq = ev.seq; state.lastId = msg.lastEventId || String(ev.seq);
    state.events += 1;
    apply(ev);
  };
  for (const type of EVENT_TYPES) src.addEventListener(type, onEvent);
  src.addEventListener("stream.snapshot", (msg) => {   // the state up to its seq, replacing what is shown
    if (src !== source) return;
    const snap = JSON.parse(msg.data);
    state.lastSeq = snap.seq; state.lastId = msg.lastEventId || String(snap.seq); state.events = snap.seq;
    applySnapshot(snap);
  });
  src.addEventListener("stream.gap", (msg) => {
    if (src !== source) return;
    src.close(); source = null;
    if (JSON.parse(msg.data).reason === "history-reset") { restart(); return; }
    state.status = "history lost"; note("stream.gap: the history before this point expired");
  });
  src.onerror = () => {
    if (src !== source || state.terminal) return;
    if (src.readyState === EventSource.CONNECTING) {   // the browser retries by itself, with Last-Event-ID
      state.status = "reconnecting"; pendingResume = state.lastSeq ?? 0;
      note(`connection lost after seq ${state.lastSeq ?? 0}; the browser reconnects with Last-Event-ID`);
    } else {
      source = null;
      refused(url);
    }
  };
}

// EventSource gives up on any answer but a 200 event stream without saying which: ask the same URL
// once more for its problem document, and say why (or start again on a history-reset).
async function refused(url) {
  let problem = null, unreachable = false;
  try {
    const resp = await fetch(url.replace(/last_event_id=[^&]*/, `last_event_id=${encodeURIComponent(state.lastId ?? "")}`));
    problem = resp.status === 200 ? null : await resp.json().catch(() => null);
    if (resp.status === 200) resp.body?.cancel();
  } catch { unreachable = true; }
  const kind = (problem?.type ?? "").split("/").pop();
  if (kind === "history-reset") { restart(); return; }
  if (unreachable) cannotFollow("unreachable", "The publisher does not answer: is the demo stack still running?");
  else cannotFollow(...(REFUSALS[kind] ?? ["closed", problem ? `${problem.title}: ${problem.detail}`
                                                               : "the publisher refused the connection and did not say why"]));
  note(problem ? `the publisher refused the connection: ${problem.title} (${problem.detail})`
               : "the publisher refused the connection (expired token or unknown stream?)");
}

// Why the page cannot follow a stream, by the problem type the publisher answered: a short status
// and a sentence saying what to do. The same words appear in the status bar, not only in the log.
const REFUSALS = {
  "not-found": ["unknown stream", "This publisher has no such stream (a mistyped id, or it expired): check the stream_id in the address, or start a stream above."],
  "invalid-token": ["token refused", "The read token in the address was refused (another publisher's, or damaged): open the stream with the token its submission answered, or start one above."],
  "forbidden": ["token refused", "The read token in the address is for another stream: use the token this stream's submission answered."],
  "token-expired": ["token expired", "The read token has expired: mint a new one (fanout token <stream id>) and put it in the address, or start a stream above."],
  "unauthorized": ["no token", "The address has no read token: add &token=<the token the submission answered>, or start a stream above."],
};

function cannotFollow(status, reason) {
  state.status = status; state.reason = reason;
  scheduleRender();
}

// The stream was written again as another generation: what is shown is not its history any more.
function restart() {
  resets += 1;
  blocks.clear(); $("blocks").replaceChildren();
  Object.assign(state, { status: "connecting", lastSeq: null, lastId: null, terminal: null, finish: null, error: null,
                         usage: null });
  note("history reset: the stream was written again as another generation; showing it from its start");
  connect(null, true);
  scheduleRender();
}

function drop() {
  if (!source || state.terminal) return;
  source.close(); source = null;
  const held = state.lastId ?? "0";
  state.status = "reconnecting";
  note(`dropped the connection after seq ${state.lastSeq ?? 0}; resuming from it`);
  reconnectTimer = setTimeout(() => { reconnectTimer = null; connect(held); }, DROP_RECONNECT_MS);
}

function follow(streamId, token, name, snapshot = false) {
  if (source) source.close();
  source = null; clearTimeout(reconnectTimer);
  blocks.clear(); $("blocks").replaceChildren(); $("log").replaceChildren();
  Object.assign(state, { streamId, token, status: "connecting", lastSeq: null, lastId: null, events: 0, connections: 0, terminal: null,
                         finish: null, error: null, usage: null, resumes: [], log: [], reason: "" });
  state.dirty.clear();
  $("stream").hidden = false;
  $("stream-name").textContent = `${name ? `${name} · ` : ""}${streamId}`;
  history.replaceState(null, "", `?stream_id=${encodeURIComponent(streamId)}&token=${encodeURIComponent(token)}`
                                  + (new URLSearchParams(location.search).get("compare") === "1" ? "&compare=1" : ""));
  window.dispatchEvent(new CustomEvent("fanout:follow", { detail: { streamId, token } }));
  if (!token) { cannotFollow(...REFUSALS.unauthorized); return; }
  connect(null, snapshot);
  scheduleRender();
}

// ---- the form ---------------------------------------------------------------------------------
function fillCases() {
  const provider = catalogue.find((p) => p.provider === $("provider").value);
  const select = $("case");
  select.replaceChildren(...(provider?.cases ?? []).map((c) => new Option(c.terminal ? `${c.case}  (${c.terminal})` : c.case, c.case)));
  if (provider?.provider === DEFAULT_CASE.provider && provider.cases.some((c) => c.case === DEFAULT_CASE.case)) select.value = DEFAULT_CASE.case;
  describeCase();
}

function describeCase() {
  const provider = catalogue.find((p) => p.provider === $("provider").value);
  const chosen = provider?.cases.find((c) => c.case === $("case").value);
  $("case-about").replaceChildren(markdown(chosen ? chosen.about || "(no description in INDEX.md)" : "no recorded cases for this provider"));
  $("start-button").disabled = !chosen;
}

function showMessage(text) { $("message").textContent = text; $("message").hidden = !text; }

async function loadCases() {
  try {
    const res = await fetch("/demo/cases");
    if (!res.ok) throw new Error(`GET /demo/cases answered ${res.status}`);
    catalogue = (await res.json()).providers;
  } catch (err) { showMessage(`cannot list the recorded cases: ${err.message}`); return; }
  $("provider").replaceChildren(...catalogue.map((p) => new Option(`${p.provider} (${p.cases.length})`, p.provider)));
  if (catalogue.some((p) => p.provider === DEFAULT_CASE.provider)) $("provider").value = DEFAULT_CASE.provider;
  fillCases();
}

async function start(event) {
  event.preventDefault();
  const body = { provider: $("provider").value, case: $("case").value, slow: $("slow").checked };
  $("start-button").disabled = true; showMessage("");
  try {
    const res = await fetch("/demo/streams", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const answer = await res.json();
    if (!res.ok) throw new Error(answer.detail || `POST /demo/streams answered ${res.status}`);
    follow(answer.stream_id, answer.token, `${body.provider} · ${answer.model}`);
  } catch (err) {
    showMessage(`could not start the stream: ${err.message}`);
  } finally {
    $("start-button").disabled = false;
  }
}

$("provider").addEventListener("change", fillCases);
$("case").addEventListener("change", describeCase);
$("start").addEventListener("submit", start);
$("drop").addEventListener("click", drop);
window.fanoutDemo = { state, blocks, text: () => [...blocks.keys()].sort((a, b) => a - b).map((i) => blocks.get(i).text) };

loadCases();
const params = new URLSearchParams(location.search);
if (params.get("stream_id")) follow(params.get("stream_id"), params.get("token") ?? "", "", true);
