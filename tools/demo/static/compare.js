"use strict";
// The demo page's protocol comparison: the stream the page follows, read at the same time through
// each protocol the publisher may serve for it, one column each, so a person sees the same answer
// arrive through all of them:
//   /events   fanout's contract over SSE             (contract events)
//   /ui       the AI SDK's UI message stream          (text-delta chunks)
//   /agui     AG-UI events over SSE                   (TEXT_MESSAGE_CONTENT)
//   /durable  the Durable Streams read protocol, SSE  (contract events in its data events)
// Each column reads its route with fetch (the token in the query, as for EventSource) and decodes
// the SSE body itself. A route that answers 404 with the publisher's "no such route" problem is not
// served by this server (a protocol not merged or not enabled): its column says so. The column shows
// the answer's text (text and refusal blocks), how many protocol events carried it, and how it ended.

const COMPARE_PROTOCOLS = [
  { name: "events", path: "events", title: "/events · fanout SSE" },
  { name: "ui", path: "ui", title: "/ui · AI SDK UI message stream" },
  { name: "agui", path: "agui", title: "/agui · AG-UI" },
  { name: "durable", path: "durable", title: "/durable · Durable Streams", query: "offset=-1&live=sse" },
];
const NO_ROUTE_PREFIX = "no such route";   // the publisher's 404 detail for a path it does not serve
const ANSWER_KINDS = ["text", "refusal"];

const compare = { open: false, streamId: null, columns: new Map(), controllers: [] };

// ---- SSE decoding (WHATWG HTML "9.2 Server-sent events": lines end in CR, LF or CRLF) -------
function sseDecoder(onFrame) {
  let buffer = "", event = "", data = [], sawCR = false;
  const line = (text) => {
    if (text === "") {
      if (data.length) onFrame(event || "message", data.join("\n"));
      event = ""; data = [];
      return;
    }
    if (text.startsWith(":")) return;
    const colon = text.indexOf(":");
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? "" : text.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value; else if (field === "data") data.push(value);
  };
  return (chunk) => {
    for (const ch of chunk) {
      if (sawCR && ch === "\n") { sawCR = false; continue; }
      sawCR = ch === "\r";
      if (ch === "\r" || ch === "\n") { line(buffer); buffer = ""; } else buffer += ch;
    }
  };
}

// ---- what each protocol's events mean for the answer --------------------------------------
function contractReader(column) {
  const kinds = new Map();
  return (ev) => {
    if (!ev || typeof ev !== "object") return;
    if (ev.type === "block.start") kinds.set(ev.block.index, ev.block.kind);
    else if (ev.type === "block.delta" && ev.delta.kind !== "signature" && ANSWER_KINDS.includes(kinds.get(ev.block.index))) {
      column.parts.set(ev.block.index, (column.parts.get(ev.block.index) ?? "") + ev.delta.text);
    } else if (ev.type === "stream.done" || ev.type === "stream.error") {
      column.end = ev.error ? `${ev.status}: ${ev.error.category}` : `${ev.status}, finish_reason ${ev.finish_reason ?? "–"}`;
    }
    column.events += 1;
  };
}

const READERS = {
  events: (column) => { const apply = contractReader(column); return (_name, data) => apply(JSON.parse(data)); },
  durable: (column) => {
    const apply = contractReader(column);
    return (name, data) => {
      if (name === "control") { column.note = "up to date"; return; }
      const value = JSON.parse(data);
      for (const ev of Array.isArray(value) ? value : [value]) apply(ev);
    };
  },
  ui: (column) => {
    const order = [];
    return (_name, data) => {
      if (data === "[DONE]") { column.end = column.end ?? "[DONE]"; return; }
      const chunk = JSON.parse(data);
      column.events += 1;
      if (chunk.type === "text-start") order.push(chunk.id);
      else if (chunk.type === "text-delta") column.parts.set(order.indexOf(chunk.id), (column.parts.get(order.indexOf(chunk.id)) ?? "") + chunk.delta);
      else if (chunk.type === "finish") column.end = `finish, finishReason ${chunk.finishReason}`;
      else if (chunk.type === "error") column.end = `error: ${chunk.errorText}`;
    };
  },
  agui: (column) => {
    const order = [];
    return (_name, data) => {
      const ev = JSON.parse(data);
      column.events += 1;
      if (ev.type === "TEXT_MESSAGE_START") order.push(ev.messageId);
      else if (ev.type === "TEXT_MESSAGE_CONTENT") {
        if (!order.includes(ev.messageId)) order.push(ev.messageId);
        const at = order.indexOf(ev.messageId);
        column.parts.set(at, (column.parts.get(at) ?? "") + ev.delta);
      } else if (ev.type === "RUN_FINISHED") column.end = "RUN_FINISHED";
      else if (ev.type === "RUN_ERROR") column.end = `RUN_ERROR: ${ev.code ?? ""} ${ev.message ?? ""}`.trim();
    };
  },
};

// ---- the columns --------------------------------------------------------------------------
function columnElement(protocol) {
  const el = document.createElement("section");
  el.className = "protocol"; el.dataset.protocol = protocol.name;
  el.appendChild(document.createElement("h3")).textContent = protocol.title;
  el.appendChild(document.createElement("div")).className = "meta protocol-state";
  const answer = el.appendChild(document.createElement("div"));
  answer.className = "protocol-answer"; answer.dir = "auto";
  return el;
}

function drawColumn(column) {
  const text = [...column.parts.keys()].sort((a, b) => a - b).map((k) => column.parts.get(k)).join("\n\n");
  column.el.dataset.state = column.state;
  column.el.querySelector(".protocol-state").textContent = column.state === "unavailable"
    ? "not available on this server"
    : `${column.state} · ${column.events} events${column.end ? ` · ${column.end}` : ""}${column.note ? ` · ${column.note}` : ""}`;
  column.el.querySelector(".protocol-answer").textContent = text;
  column.text = text;
}

async function readColumn(column, protocol, streamId, token, signal) {
  const query = `token=${encodeURIComponent(token)}${protocol.query ? `&${protocol.query}` : ""}`;
  const url = `/v1/streams/${encodeURIComponent(streamId)}/${protocol.path}?${query}`;
  let resp;
  try { resp = await fetch(url, { signal, headers: { Accept: "text/event-stream" } }); }
  catch (err) { if (!signal.aborted) { column.state = `cannot connect: ${err.message}`; drawColumn(column); } return; }
  if (!resp.ok) {
    const problem = await resp.json().catch(() => null);
    const missing = resp.status === 404 && String(problem?.detail ?? "").startsWith(NO_ROUTE_PREFIX);
    column.state = missing ? "unavailable" : `refused ${resp.status}: ${problem?.title ?? resp.statusText}`;
    drawColumn(column);
    return;
  }
  column.state = "streaming"; drawColumn(column);
  const onFrame = READERS[protocol.name](column);
  const feed = sseDecoder((name, data) => {
    try { onFrame(name, data); } catch { column.note = "an event this page cannot read"; }
    drawColumn(column);
  });
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      feed(value);
    }
    column.state = "ended";
  } catch { column.state = signal.aborted ? "closed" : "connection lost"; }
  drawColumn(column);
}

function closeCompare() {
  for (const controller of compare.controllers) controller.abort();
  compare.controllers = []; compare.columns.clear();
  $("protocols").replaceChildren();
}

function openCompare(streamId, token) {
  closeCompare();
  compare.open = true; compare.streamId = streamId;
  $("compare").hidden = false;
  $("compare-button").textContent = "Hide protocols";
  for (const protocol of COMPARE_PROTOCOLS) {
    const column = { el: columnElement(protocol), state: "connecting", events: 0, parts: new Map(), end: null, note: "", text: "" };
    $("protocols").appendChild(column.el);
    compare.columns.set(protocol.name, column);
    drawColumn(column);
    const controller = new AbortController();
    compare.controllers.push(controller);
    readColumn(column, protocol, streamId, token, controller.signal);
  }
}

function toggleCompare() {
  const state = window.fanoutDemo.state;
  if (compare.open) {
    closeCompare(); compare.open = false;
    $("compare").hidden = true; $("compare-button").textContent = "Compare protocols";
  } else if (state.streamId && state.token) {
    openCompare(state.streamId, state.token);
  }
}

function followed(streamId, token) {   // the page follows a stream: offer it, or compare it at once
  $("compare-button").disabled = !token;
  if (token && (compare.open || new URLSearchParams(location.search).get("compare") === "1")) openCompare(streamId, token);
}

$("compare-button").addEventListener("click", toggleCompare);
window.addEventListener("fanout:follow", (event) => followed(event.detail.streamId, event.detail.token));
if (window.fanoutDemo.state.streamId) followed(window.fanoutDemo.state.streamId, window.fanoutDemo.state.token);   // opened by link
window.fanoutCompare = {
  columns: () => Object.fromEntries([...compare.columns].map(([name, c]) => [name, { state: c.state, text: c.text, events: c.events, end: c.end }])),
};
