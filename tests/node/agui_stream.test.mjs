// fanout's GET /v1/streams/{id}/agui read by the real AG-UI client, at the versions pinned in package.json.
//
// Started by tests/publisher/test_agui_node.py, which runs a real publisher on a real Redis, stores
// every golden transcript's events as a worker would, and writes a manifest (FANOUT_AGUI_MANIFEST):
//   {base_url, streams: [{name, stream_id, token, expected: {messages, ended, outcome, usage}}],
//    resume: {stream_id, token, continue_url, expected}, snapshot and snapshot_text: {stream_id, token, continue_url, expected}}
// Each stream is read by an HttpAgent (GET, through its requestInit), whose runAgent pipeline checks
// every event against @ag-ui/core's schemas and with verifyEvents, and assembles the messages with
// defaultApplyEvents. The messages it holds, the tool calls it saw end and the run's outcome must
// equal what the Python reducer's assembled result says for the same stored events.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { HttpAgent } from "@ag-ui/client";
import { EventSchema } from "@ag-ui/core/schemas";
import { EventEncoder } from "@ag-ui/encoder";

const manifest = JSON.parse(readFileSync(process.env.FANOUT_AGUI_MANIFEST, "utf8"));

// An HttpAgent that joins an existing stream: GET instead of POSTing a RunAgentInput.
class StreamAgent extends HttpAgent {
  requestInit() {
    return { method: "GET", headers: { ...this.headers, Accept: "text/event-stream" }, signal: this.abortController.signal };
  }
}

function aguiUrl(stream) {
  return `${manifest.base_url}/v1/streams/${stream.stream_id}/agui`;
}

function agentFor(stream, fetchFn) {
  return new StreamAgent({
    url: aguiUrl(stream),
    headers: { Authorization: `Bearer ${stream.token}` },
    threadId: stream.stream_id,
    ...(fetchFn ? { fetch: fetchFn } : {}),
  });
}

// Everything the client tells its subscribers that the comparison needs, and every warning it prints.
function observer() {
  const seen = { types: [], ended: [], outcome: null, usage: null, warnings: [] };
  const subscriber = {
    onEvent: ({ event }) => { seen.types.push(event.type); },
    onToolCallEndEvent: ({ event }) => { seen.ended.push(event.toolCallId); },
    onRunFinishedEvent: ({ event }) => { seen.outcome = "finished"; seen.usage = event.usage ?? null; },
    onRunErrorEvent: ({ event }) => { seen.outcome = event.code; seen.usage = event.usage ?? null; },
  };
  return { seen, subscriber };
}

async function withWarnings(seen, body) {
  const original = console.warn;
  console.warn = (...args) => seen.warnings.push(args.join(" "));
  try {
    return await body();
  } finally {
    console.warn = original;
  }
}

// The agent's messages in the compact shape the Python side derives from the reducer.
function compact(messages) {
  return messages.map((m) => ({
    id: m.id,
    role: m.role,
    content: m.content ?? null,
    toolCalls: (m.toolCalls ?? []).map((call) => ({
      id: call.id, name: call.function.name, arguments: call.function.arguments, encryptedValue: call.encryptedValue ?? null,
    })),
    encryptedValue: m.encryptedValue ?? null,
  }));
}

test("every golden transcript reads through an HttpAgent into the assembled result", async (t) => {
  assert.ok(manifest.streams.length > 0);
  for (const stream of manifest.streams) {
    await t.test(stream.name, async () => {
      const agent = agentFor(stream);
      const { seen, subscriber } = observer();
      await withWarnings(seen, () => agent.runAgent({ runId: stream.stream_id }, subscriber));
      assert.deepEqual(seen.warnings, [], "the client stripped or translated nothing");
      assert.equal(seen.types[0], "RUN_STARTED");
      assert.deepEqual(compact(agent.messages), stream.expected.messages);
      assert.deepEqual(seen.ended, stream.expected.ended, "only a completed stream's calls end");
      assert.equal(seen.outcome, stream.expected.outcome);
      assert.deepEqual(seen.usage, stream.expected.usage);
    });
  }
});

test("the raw body is what @ag-ui/encoder writes, every event valid against @ag-ui/core's schema", async () => {
  const encoder = new EventEncoder();
  let checked = 0;
  for (const stream of manifest.streams) {
    const response = await fetch(aguiUrl(stream), { headers: { Authorization: `Bearer ${stream.token}` } });
    assert.equal(response.status, 200);
    assert.equal(response.headers.get("content-type"), encoder.getContentType());
    for (const message of (await response.text()).split("\n\n").filter((m) => m && !m.startsWith(":"))) {
      const data = message.split("\n").filter((line) => line.startsWith("data: "));
      assert.equal(data.length, 1, message);
      const event = JSON.parse(data[0].slice(6));
      assert.equal(`${data[0]}\n\n`, encoder.encodeSSE(event));
      EventSchema.parse(event);
      checked += 1;
    }
  }
  assert.ok(checked > manifest.streams.length);
});

test("two parallel calls a provider gave one id stay two tool calls, the provider's id kept", async () => {
  const shared = manifest.streams.filter((stream) => stream.name.endsWith("_share_one_id"));
  assert.equal(shared.length, 2, "the Anthropic-compatible and the OpenAI relay goldens");
  for (const stream of shared) {
    const agent = agentFor(stream);
    await agent.runAgent({ runId: stream.stream_id });
    const calls = agent.messages.flatMap((message) => message.toolCalls ?? []);
    assert.equal(calls.length, 2, stream.name);
    assert.notEqual(calls[0].id, calls[1].id);
    assert.equal(calls[1].metadata.fanout.call_id, calls[0].id);
    assert.notEqual(calls[0].function.arguments, calls[1].function.arguments);
  }
});

test("HttpAgent 1.0's connectAgent reads nothing: joining a stream goes through requestInit", async () => {
  const stream = manifest.streams[0];
  let requests = 0;
  const agent = new HttpAgent({ url: aguiUrl(stream), fetch: (...args) => { requests += 1; return fetch(...args); } });
  const result = await agent.connectAgent({ runId: stream.stream_id });
  assert.equal(requests, 0);
  assert.deepEqual(result.newMessages, []);
});

// The network, for the resume test: passes the body on one SSE message at a time and ends it (as a
// cut connection does) right after the first message `cut(message)` matches.
function cuttingFetch(state) {
  return async (url, init) => {
    const response = await fetch(url, init);
    if (!response.ok || !response.body) return response;
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const encoder = new TextEncoder();
    let buffer = "";
    const body = new ReadableStream({
      async pull(controller) {
        if (state.cutNow) {
          state.cutNow = false;
          await reader.cancel();
          controller.close();
          return;
        }
        const { value, done } = await reader.read();
        if (done) {
          controller.close();
          return;
        }
        buffer += decoder.decode(value, { stream: true });
        for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
          const message = buffer.slice(0, end + 2);
          buffer = buffer.slice(end + 2);
          controller.enqueue(encoder.encode(message));
          if (state.cut?.(message)) {
            state.cut = null;
            state.cutNow = true;
            return;
          }
        }
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
}

// docs/agui.md's recording fetch, as written there (over `underlying` instead of the global fetch).
function recordingFetch(underlying, state) {
  return async (url, init) => {
    const response = await underlying(url, init);
    if (!response.ok || !response.body) return response;
    const decoder = new TextDecoder();
    let pending = "";
    const ids = new TransformStream({
      transform(chunk, controller) {
        pending += decoder.decode(chunk, { stream: true });
        const end = pending.lastIndexOf("\n\n"); // only messages received whole count
        if (end >= 0) {
          for (const m of pending.slice(0, end).matchAll(/^id: (.+)$/gm)) state.lastEventId = m[1];
          pending = pending.slice(end + 2);
        }
        controller.enqueue(chunk);
      },
    });
    return new Response(response.body.pipeThrough(ids), { status: response.status, headers: response.headers });
  };
}

test("a stream cut mid-way resumes exactly with Last-Event-ID on the same agent", async () => {
  const resume = manifest.resume;
  const state = { lastEventId: null, cut: (message) => message.includes("TEXT_MESSAGE_CONTENT") };
  const agent = agentFor(resume, recordingFetch(cuttingFetch(state), state));
  const first = observer();
  await withWarnings(first.seen, () => agent.runAgent({ runId: resume.stream_id }, first.subscriber));
  assert.equal(first.seen.outcome, null, "the cut run did not end");
  assert.equal(state.lastEventId, "3.e1");
  assert.equal(agent.messages[0].content, "Hello, ");

  const continued = await fetch(resume.continue_url, { method: "POST" }); // the worker goes on
  assert.equal(continued.status, 204);

  agent.headers = { ...agent.headers, "Last-Event-ID": state.lastEventId };
  const second = observer();
  await withWarnings(second.seen, () => agent.runAgent({ runId: resume.stream_id }, second.subscriber));
  assert.deepEqual(second.seen.warnings, []);
  assert.deepEqual(second.seen.types.slice(0, 3), ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"]);
  assert.deepEqual(compact(agent.messages), resume.expected.messages, "nothing lost, nothing twice");
  assert.equal(second.seen.outcome, "finished");
  assert.equal(state.lastEventId, "7.e1");

  const after = await fetch(aguiUrl(resume), {
    headers: { Authorization: `Bearer ${resume.token}`, "Last-Event-ID": state.lastEventId },
  });
  assert.equal(after.status, 204, "a client holding the terminal event gets 204");
});

test("every golden transcript, cut half-way and resumed with Last-Event-ID, assembles the same", async (t) => {
  for (const stream of manifest.streams) {
    await t.test(stream.name, async () => {
      const raw = await (await fetch(aguiUrl(stream), { headers: { Authorization: `Bearer ${stream.token}` } })).text();
      const total = raw.split("\n\n").filter((m) => m.startsWith("id: ") || m.startsWith("data: ")).length;
      let passed = 0;
      const half = Math.max(1, Math.floor(total / 2));
      const state = { lastEventId: null, cut: () => ++passed === half };
      const agent = agentFor(stream, recordingFetch(cuttingFetch(state), state));
      const first = observer();
      const second = observer();
      await withWarnings(first.seen, () => agent.runAgent({ runId: stream.stream_id }, first.subscriber));
      assert.ok(state.lastEventId, "the first part carried an id");
      agent.headers = { ...agent.headers, "Last-Event-ID": state.lastEventId };
      await withWarnings(second.seen, () => agent.runAgent({ runId: stream.stream_id }, second.subscriber));
      assert.deepEqual([...first.seen.warnings, ...second.seen.warnings], []);
      assert.deepEqual(compact(agent.messages), stream.expected.messages, `cut after message ${half} of ${total}`);
      assert.deepEqual([...new Set([...first.seen.ended, ...second.seen.ended])], stream.expected.ended);
      assert.equal(second.seen.outcome ?? first.seen.outcome, stream.expected.outcome);
    });
  }
});

// ?snapshot=1: RUN_STARTED, one MESSAGES_SNAPSHOT of the messages so far, then what is open and the rest.
function snapshotAgent(stream) {
  const agent = agentFor(stream);
  agent.url = `${aguiUrl(stream)}?snapshot=1`;
  return agent;
}

test("a snapshot=1 read of every finished golden assembles the same messages as the full replay", async (t) => {
  for (const stream of manifest.streams) {
    await t.test(stream.name, async () => {
      const agent = snapshotAgent(stream);
      const { seen, subscriber } = observer();
      await withWarnings(seen, () => agent.runAgent({ runId: stream.stream_id }, subscriber));
      assert.deepEqual(seen.warnings, [], "the client stripped or translated nothing");
      assert.deepEqual(seen.types.slice(0, 2), ["RUN_STARTED", "MESSAGES_SNAPSHOT"]);
      assert.equal(seen.types.filter((type) => type === "MESSAGES_SNAPSHOT").length, 1);
      assert.deepEqual(compact(agent.messages), stream.expected.messages);
      assert.deepEqual(seen.ended, [], "a finished stream's complete calls are in the snapshot, none started");
      assert.equal(seen.outcome, stream.expected.outcome);
      assert.deepEqual(seen.usage, stream.expected.usage);
    });
  }
});

test("a snapshot=1 read mid-stream continues the half-written tool call and ends it once the stream completes", async () => {
  const stream = manifest.snapshot;
  const agent = snapshotAgent(stream);
  const { seen, subscriber } = observer();
  let atSnapshot = null;
  subscriber.onMessagesSnapshotEvent = async ({ event }) => {
    atSnapshot = structuredClone(event.messages); // the client goes on to change the objects it was given
    const continued = await fetch(stream.continue_url, { method: "POST" }); // the worker goes on
    assert.equal(continued.status, 204);
  };
  await withWarnings(seen, () => agent.runAgent({ runId: stream.stream_id }, subscriber));
  assert.deepEqual(seen.warnings, []);
  assert.deepEqual(atSnapshot.map((m) => [m.role, m.content, m.toolCalls ?? null]),
    [["assistant", "Let me check.", null]], "the call being built is not in the snapshot");
  assert.deepEqual(seen.types.slice(0, 4), ["RUN_STARTED", "MESSAGES_SNAPSHOT", "TOOL_CALL_START", "TOOL_CALL_ARGS"]);
  assert.deepEqual(compact(agent.messages), stream.expected.messages);
  assert.deepEqual(seen.ended, stream.expected.ended);
  assert.equal(seen.outcome, "finished");
});

test("a snapshot=1 read mid-message appends the deltas that follow to the message the snapshot gave", async () => {
  const stream = manifest.snapshot_text;
  const agent = snapshotAgent(stream);
  const { seen, subscriber } = observer();
  let atSnapshot = null;
  subscriber.onMessagesSnapshotEvent = async ({ event }) => {
    atSnapshot = structuredClone(event.messages);
    assert.equal((await fetch(stream.continue_url, { method: "POST" })).status, 204);
  };
  await withWarnings(seen, () => agent.runAgent({ runId: stream.stream_id }, subscriber));
  assert.deepEqual(seen.warnings, []);
  assert.deepEqual(atSnapshot.map((m) => m.content), ["Hel"]);
  assert.deepEqual(seen.types.slice(0, 4), ["RUN_STARTED", "MESSAGES_SNAPSHOT", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"]);
  assert.deepEqual(compact(agent.messages), stream.expected.messages);
  assert.equal(agent.messages.length, 1, "the reopened message is the snapshot's, not a second one");
  assert.equal(seen.outcome, "finished");
});
