// The panels' pure parts (scales, windows, labels, codes), without a browser:
// `node --test tests/widgets/js/` (tests/widgets/test_js_units.py runs it in the suite).
import assert from "node:assert/strict";
import { test } from "node:test";

import vm from "node:vm";

import { loadPanel } from "./load_panel.mjs";

const timeline = loadPanel("timeline.js");
const pool = loadPanel("block_pool.js");

test("the step window is the whole run when it fits, else the latest steps or a window around the shown one", () => {
  const steps = Array.from({ length: 100 }, (_, i) => i + 1);
  assert.deepEqual({ ...timeline.stepSpan(steps, 100, 200) }, { startIdx: 0, endIdx: 99, curIdx: 99 });
  assert.deepEqual({ ...timeline.stepSpan(steps, 100, 40) }, { startIdx: 60, endIdx: 99, curIdx: 99 });
  // Scrubbed back before the latest window: centred on the shown step.
  assert.deepEqual({ ...timeline.stepSpan(steps, 10, 40) }, { startIdx: 0, endIdx: 39, curIdx: 9 });
  assert.deepEqual({ ...timeline.stepSpan(steps, 50, 40) }, { startIdx: 29, endIdx: 68, curIdx: 49 });
  // A step not in the run: the latest.
  assert.equal(timeline.stepSpan(steps, 1000, 40).curIdx, 99);
});

test("the token axis is a square root, and a non-empty bar is never thinner than the minimum", () => {
  const s = timeline.tokenScale(256, 100);
  assert.equal(s.y(256), 100);
  assert.equal(s.y(64), 50); // a quarter of the budget: half the height
  assert.equal(s.height(0), 0);
  assert.equal(s.y(1000), 100); // clamped at the top
  // One decode token under an 8192-token budget: 1.1 px by the scale, drawn at the minimum.
  const minimum = vm.runInContext("MIN_BAR_PX", timeline);
  const wide = timeline.tokenScale(8192, 100);
  assert.ok(wide.y(1) < minimum);
  assert.equal(wide.height(1), minimum);
});

test("the ms axis is cut at a high percentile only when one step is far slower", () => {
  const even = Array.from({ length: 50 }, (_, i) => 10 + (i % 5));
  assert.deepEqual({ ...timeline.kvsCutScale(even) }, { cap: 14, cut: false });
  const spike = [...even, 900]; // one slow step (a first compile, a preemption)
  const s = timeline.kvsCutScale(spike);
  assert.equal(s.cut, true);
  assert.ok(s.cap < 100 && s.cap >= 14, `${s.cap}`);
  assert.deepEqual({ ...timeline.kvsCutScale([5, 900]) }, { cap: 900, cut: false }); // too few steps to cut
  const gaps = Array.from({ length: 200_000 }, (_, i) => 60 + (i % 17)); // a long run's ITL: no spread limit
  assert.equal(timeline.kvsCutScale([...gaps, 5929]).cut, true);
});

test("long request ids are cut in the middle, keeping both ends", () => {
  assert.equal(timeline.rowLabel("7"), "#7");
  const long = timeline.rowLabel("cmpl-a437342f78b3043e-0-be60a647");
  assert.ok(long.startsWith("#cmpl") && long.endsWith("a647") && long.includes("\u2026"), long);
  assert.ok(long.length < "#cmpl-a437342f78b3043e-0-be60a647".length);
});

test("pool cells shrink with the pool and say how much of a label fits", () => {
  assert.equal(pool.cellSizeFor(40), 26);
  assert.equal(pool.cellSizeFor(1024), 15);
  assert.equal(pool.cellSizeFor(60000), 10);
  assert.deepEqual(
    [26, 15, 10].map((c) => pool.labelKind(c)),
    ["full", "ids", "hover"],
  );
});

test("block events are bit codes from the record schema, named by it (no magic numbers)", () => {
  const events = vm.runInContext("KVS_EVENTS", pool); // [bit, key, label, ...looks, tip]
  const schema = vm.runInContext("KVS_SCHEMA.block_events", pool);
  assert.deepEqual(
    events.map((e) => e[1]),
    schema.map((e) => e.key),
  );
  const bits = events.map((e) => e[0]);
  assert.equal(new Set(bits).size, bits.length);
  for (const b of bits) assert.equal(b & (b - 1), 0, `${b} is one bit`);
  // A block with two events this step names both, in the schema's order.
  const [first, second] = events;
  assert.deepEqual([...vm.runInContext("eventNames", pool)(first[0] | second[0])], [first[2], second[2]]);
  assert.deepEqual([...vm.runInContext("eventNames", pool)(0)], []);
});

test("tokens show their whitespace; chunks count from 1 on screen", () => {
  assert.equal(timeline.kvsTok(" a\n\tb"), "\u00b7a\u21b5\u21e5b");
  assert.equal(timeline.kvsTok(null), "");
  assert.equal(timeline.kvsChunkNumber(0), 1);
  assert.equal(timeline.kvsChunkNumber(undefined), 1);
});

test("a focus lights a block, a request, or the very token", () => {
  const f = { blocks: [3], requests: ["a"], tokens: [["a", 17]] };
  assert.equal(timeline.kvsMatch(f, 3, "a", 17), 2);
  assert.equal(timeline.kvsMatch(f, 3, "a", 16), 1);
  assert.equal(timeline.kvsMatch(f, 4, "a", 16), 0);
  assert.equal(timeline.kvsMatch(f, 3, "b", 16), 0);
  assert.equal(timeline.kvsMatch(null, 3, "a"), 0);
});
