// fanout's GET /v1/streams/{id}/durable read by the real Durable Streams client, at the version
// pinned in package.json.
//
// Started by tests/publisher/test_durable_node.py, which runs a real publisher on a real Redis,
// stores every golden transcript's events as a worker would, and writes a manifest
// (FANOUT_DURABLE_MANIFEST):
//   {base_url, continue_url,
//    catch_up: [{name, stream_id, token, expected}],        whole stream stored (ended)
//    live: [{name, mode, stream_id, token, expected}],       only stream.start stored: the rest
//                                                            comes after POST continue_url?stream=
//    resume: [{mode, stream_id, token, expected}],           three events stored, then continued
//    errors: {unknown, expired, reset: {stream_id, token, offset}}}
// `expected` is the list of event objects the reader may see, in order.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { stream } from "@durable-streams/client";

const manifest = JSON.parse(readFileSync(process.env.FANOUT_DURABLE_MANIFEST, "utf8"));

function durableUrl(item) {
  return `${manifest.base_url}/v1/streams/${item.stream_id}/durable`;
}

// Every request the client makes, so a test can check which read mode it used.
function recordingFetch(urls) {
  return (input, init) => {
    urls.push(new URL(String(input)));
    return fetch(input, init);
  };
}

function open(item, options = {}) {
  return stream({
    url: durableUrl(item),
    headers: { Authorization: `Bearer ${item.token}` },
    backoffOptions: { initialDelay: 10, maxDelay: 100, multiplier: 1.3, maxRetries: 0 },
    ...options,
  });
}

// Read to the end (the stream's closure), collecting items; `onItem` may act on each.
async function readToEnd(response, onItem = async () => {}) {
  const items = [];
  for await (const item of response.jsonStream()) {
    items.push(item);
    await onItem(item);
  }
  return { items, closed: response.streamClosed };
}

async function continueStream(item) {
  const done = await fetch(`${manifest.continue_url}?stream=${item.stream_id}`, { method: "POST" });
  assert.equal(done.status, 204);
}

// Catch-up reads to the end: @durable-streams/client 0.2.7 with `live: false` makes one request
// (its pull loop stops when live is false, whether or not that answer was up to date), so the
// reader follows `offset` itself, one catch-up read per server chunk, until Stream-Closed.
async function catchUp(item, urls) {
  const items = [];
  let offset = "-1";
  for (let reads = 1; ; reads++) {
    const response = await open(item, { offset, live: false, fetch: recordingFetch(urls) });
    assert.equal(response.contentType, "application/json");
    items.push(...(await response.json()));
    if (response.streamClosed) return { items, reads };
    assert.notEqual(response.offset, offset, "a chunk that is not the end moves the offset");
    offset = response.offset;
  }
}

test("every golden stream reads to its end by catch-up reads", async (t) => {
  assert.ok(manifest.catch_up.length > 0);
  let chunked = 0;
  for (const item of manifest.catch_up) {
    await t.test(item.name, async () => {
      const urls = [];
      const { items, reads } = await catchUp(item, urls);
      assert.deepEqual(items.map((event) => event.seq), item.expected.map((event) => event.seq));
      assert.deepEqual(items, item.expected);
      assert.ok(urls.every((url) => !url.searchParams.has("live")), "catch-up reads only");
      chunked += reads > 1 ? 1 : 0;
    });
  }
  assert.ok(chunked > 0, "some goldens are longer than the server's page: read in several chunks");
});

for (const mode of ["long-poll", "sse"]) {
  test(`every golden stream reads to its end live by ${mode}`, async (t) => {
    const items = manifest.live.filter((item) => item.mode === mode);
    assert.equal(items.length, manifest.catch_up.length);
    for (const item of items) {
      await t.test(item.name, async () => {
        const urls = [];
        const response = await open(item, { offset: "-1", live: mode, fetch: recordingFetch(urls) });
        let continued = false;
        const { items: got, closed } = await readToEnd(response, async (event) => {
          if (!continued && event.seq === 1) {
            continued = true; // the rest is written only now: it can only come by the live mode
            await continueStream(item);
          }
        });
        assert.deepEqual(got, item.expected);
        assert.equal(closed, true, "the terminal event closes the stream");
        assert.ok(urls.some((url) => url.searchParams.get("live") === mode), `a ${mode} request was made`);
      });
    }
  });
}

for (const mode of ["long-poll", "sse"]) {
  test(`a ${mode} read cut mid-stream resumes from its last offset with nothing lost or repeated`, async () => {
    const item = manifest.resume.find((entry) => entry.mode === mode);
    const first = await open(item, { offset: "-1", live: mode });
    const before = [];
    let offset;
    await new Promise((resolve, reject) => {
      first.subscribeJson((batch) => {
        before.push(...batch.items);
        offset = batch.offset;
        if (before.length >= 3) resolve();
      });
      first.closed.catch(reject);
    });
    first.cancel(); // the connection is cut while the stream runs
    assert.deepEqual(before, item.expected.slice(0, 3));

    await continueStream(item); // the worker goes on while nobody reads
    const again = await open(item, { offset, live: mode });
    const { items: after, closed } = await readToEnd(again);
    assert.deepEqual([...before, ...after], item.expected);
    assert.equal(closed, true);
  });
}

test("an unknown stream is 404", async () => {
  await assert.rejects(open(manifest.errors.unknown, { offset: "-1", live: false }), (error) => {
    assert.equal(error.status, 404);
    return true;
  });
});

test("a malformed offset is 400", async () => {
  for (const offset of ["bogus", "0,1", "17"]) {
    await assert.rejects(open(manifest.catch_up[0], { offset, live: false }), (error) => {
      assert.equal(error.status, 400, offset);
      return true;
    });
  }
});

test("an offset no longer retained is 410: expired history, another generation", async () => {
  for (const key of ["expired", "reset"]) {
    const item = manifest.errors[key];
    for (const live of [false, "long-poll", "sse"]) {
      await assert.rejects(open(item, { offset: item.offset, live }), (error) => {
        assert.equal(error.status, 410, `${key} ${live}`);
        return true;
      });
    }
  }
});

test("the read answers carry the headers the protocol asks for, chunk by chunk", async () => {
  const item = manifest.catch_up.reduce((a, b) => (b.expected.length > a.expected.length ? b : a));
  const headers = { Authorization: `Bearer ${item.token}`, Origin: "https://app.example" };
  const answers = [];
  let offset = "-1";
  for (;;) {
    const response = await fetch(`${durableUrl(item)}?offset=${offset}`, { headers });
    assert.equal(response.status, 200);
    assert.equal(response.headers.get("content-type"), "application/json");
    assert.equal(response.headers.get("x-content-type-options"), "nosniff");
    assert.ok(response.headers.get("etag"));
    const exposed = response.headers.get("access-control-expose-headers").toLowerCase();
    for (const name of ["stream-next-offset", "stream-cursor", "stream-up-to-date", "stream-closed", "etag"]) {
      assert.ok(exposed.includes(name), `${name} is exposed to browsers`);
    }
    answers.push({ cache: response.headers.get("cache-control"), upToDate: response.headers.get("stream-up-to-date"),
                   closed: response.headers.get("stream-closed"), items: (await response.json()).length });
    offset = response.headers.get("stream-next-offset");
    if (answers.at(-1).closed === "true") break;
  }
  assert.ok(answers.length > 1, "the server's page size splits the longest golden");
  assert.equal(answers[0].cache, "no-store"); // from -1: a stream's start can be written again
  assert.ok(answers.slice(1).every((answer) => answer.cache.startsWith("private")), JSON.stringify(answers));
  assert.ok(answers.slice(0, -1).every((answer) => answer.closed === null && answer.upToDate === null));
  assert.equal(answers.at(-1).upToDate, "true");
  assert.equal(answers.reduce((sum, answer) => sum + answer.items, 0), item.expected.length);
});
