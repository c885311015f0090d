// Runs @durable-streams/server-conformance-tests (its test file ships inside the package) with
// vitest; tests/publisher/test_durable_node.py selects the read-only tests by name and points
// CONFORMANCE_TEST_URL at a proxy in front of fanout.
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["node_modules/@durable-streams/server-conformance-tests/dist/test-runner.js"],
    exclude: [],
    testTimeout: 30000,
  },
});
