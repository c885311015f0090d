// fanout's GET /v1/streams/{id}/ui read by the real AI SDK, at the version pinned in package.json.
//
// Started by tests/publisher/test_ui_node.py, which runs a real publisher on a real Redis, stores
// every golden transcript's events as a worker would, and writes a manifest (FANOUT_UI_MANIFEST):
//   {base_url, streams: [{name, stream_id, token, expected: {status, parts}}],
//    resume: {stream_id, token, continue_url, expected}}
// Each stream is read through the SDK's own DefaultChatTransport (its reconnect request, which
// validates every chunk with uiMessageChunkSchema) and assembled with readUIMessageStream; the
// final UIMessage parts must equal the assembled result the Python reducer gives for the same
// stored events.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { DefaultChatTransport, readUIMessageStream, uiMessageChunkSchema, UI_MESSAGE_STREAM_HEADERS } from "ai";

const manifest = JSON.parse(readFileSync(process.env.FANOUT_UI_MANIFEST, "utf8"));

function transportFor(url) {
  return new DefaultChatTransport({
    api: "/unused",
    prepareReconnectToStreamRequest: () => ({ api: url, headers: {} }),
  });
}

function uiUrl(stream, query = "") {
  return `${manifest.base_url}/v1/streams/${stream.stream_id}/ui?token=${encodeURIComponent(stream.token)}${query}`;
}

async function finalMessage(chunks) {
  const errors = [];
  let last;
  for await (const message of readUIMessageStream({ stream: chunks, onError: (e) => errors.push(e.message) })) {
    last = message;
  }
  return { message: last, errors };
}

// The UIMessage parts in the compact shape the Python side computes from the reducer.
function compactParts(message) {
  const out = [];
  for (const part of message.parts) {
    if (part.type === "text" || part.type === "reasoning") {
      out.push({ type: part.type, text: part.text });
    } else if (part.type.startsWith("tool-")) {
      const usable = part.state === "input-available";
      const item = { type: "tool", toolCallId: part.toolCallId, toolName: part.type.slice(5), usable };
      const providerCallId = part.callProviderMetadata?.fanout?.call_id;
      if (providerCallId !== undefined) item.providerCallId = providerCallId;
      if (usable) item.input = part.input;
      out.push(item);
    }
  }
  return out;
}

function rawChunks(text) {
  const lines = text.split("\n\n").filter((block) => block.length > 0 && !block.startsWith(":"));
  return lines.map((block) => {
    assert.ok(block.startsWith("data: "), `every message is one data line: ${block}`);
    return block.slice(6);
  });
}

test("every golden transcript reads through the AI SDK into the assembled result", async (t) => {
  assert.ok(manifest.streams.length > 0);
  for (const stream of manifest.streams) {
    await t.test(stream.name, async () => {
      const chunks = await transportFor(uiUrl(stream)).reconnectToStream({ chatId: stream.stream_id });
      assert.ok(chunks, "a stream was served (not 204)");
      const { message, errors } = await finalMessage(chunks);
      assert.equal(message.id, stream.stream_id);
      assert.deepEqual(compactParts(message), stream.expected.parts);
      assert.equal(message.metadata.fanout.status, stream.expected.status);
      const failed = ["failed", "interrupted"].includes(stream.expected.status); // a cancelled one is an abort
      assert.equal(errors.length, failed ? 1 : 0, `error chunks: ${errors}`);
    });
  }
});

test("the raw body is the UI message stream protocol: headers, schema-valid chunks, [DONE] last", async () => {
  const stream = manifest.streams[0];
  const response = await fetch(uiUrl(stream));
  assert.equal(response.status, 200);
  for (const [name, value] of Object.entries(UI_MESSAGE_STREAM_HEADERS)) {
    if (name === "connection") continue; // hop-by-hop: the server's keep-alive handling owns it
    if (name === "cache-control") {  // fanout's own: a finished stream may be kept until its TTL
      assert.match(response.headers.get(name), /^private, max-age=\d+, no-transform$/);
      continue;
    }
    assert.ok(response.headers.get(name).startsWith(value), `${name}: ${response.headers.get(name)}`);
  }
  const data = rawChunks(await response.text());
  assert.equal(data.at(-1), "[DONE]");
  const chunks = data.slice(0, -1).map((text) => JSON.parse(text));
  assert.equal(chunks[0].type, "start");
  const schema = uiMessageChunkSchema();
  for (const chunk of chunks) {
    const result = await schema.validate(chunk);
    assert.ok(result.success, `${JSON.stringify(chunk)}: ${result.error}`);
  }
});

test("a stream dropped mid-way is resumed by the SDK's reconnect and replays whole", async () => {
  const resume = manifest.resume;
  const controller = new AbortController();
  const first = await transportFor(uiUrl(resume)).reconnectToStream({ chatId: resume.stream_id, abortSignal: controller.signal });
  const reader = first.getReader();
  const seen = [];
  while (!seen.some((chunk) => chunk.type === "text-delta")) {
    const { value, done } = await reader.read();
    assert.ok(!done, "the running stream must not end before the drop");
    seen.push(value);
  }
  controller.abort(); // the connection drops mid-stream
  await reader.cancel().catch(() => {});
  assert.equal(seen[0].type, "start");

  const continued = await fetch(resume.continue_url, { method: "POST" }); // the worker goes on
  assert.equal(continued.status, 204);

  const again = await transportFor(uiUrl(resume, "&resume=1")).reconnectToStream({ chatId: resume.stream_id });
  assert.ok(again, "a running stream is resumed, not answered 204");
  const { message } = await finalMessage(again);
  assert.deepEqual(compactParts(message), resume.expected.parts);
  assert.equal(message.metadata.fanout.status, "completed");

  const after = await transportFor(uiUrl(resume, "&resume=1")).reconnectToStream({ chatId: resume.stream_id });
  assert.equal(after, null, "once the stream ended, the reconnect request gets 204: nothing to resume");
});

test("two parallel calls a provider gave one id stay two tool parts, the provider's id kept", async () => {
  const shared = manifest.streams.filter((stream) => stream.name.endsWith("_share_one_id"));
  assert.equal(shared.length, 2, "the Anthropic-compatible and the OpenAI relay goldens");
  for (const stream of shared) {
    const chunks = await transportFor(uiUrl(stream)).reconnectToStream({ chatId: stream.stream_id });
    const { message } = await finalMessage(chunks);
    const tools = message.parts.filter((part) => part.type.startsWith("tool-"));
    assert.equal(tools.length, 2, stream.name);
    assert.notEqual(tools[0].toolCallId, tools[1].toolCallId);
    assert.equal(tools[1].callProviderMetadata.fanout.call_id, tools[0].toolCallId);
    assert.deepEqual(tools.map((part) => part.state), ["input-available", "input-available"]);
    assert.notDeepEqual(tools[0].input, tools[1].input);
  }
});
