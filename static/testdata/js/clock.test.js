import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ServerClock, estimateOffset } from '../../site/assets/clock.js';

test('offset corrects half the round trip', () => {
  // Sent at local 1000, answered at local 1200; the server read 5100 at
  // the middle of the trip, so at receipt it is 5200: offset 4000.
  assert.equal(estimateOffset(5100, 1000, 1200), 4000);
});

test('clock follows the monotonic timer from the best sample', () => {
  let perf = 0;
  const c = new ServerClock({ perfNow: () => perf });
  assert.equal(c.synced, false);
  assert.ok(Number.isNaN(c.now()));
  c.addSample(1_000_000, 0, 400); // rtt 400: server now at 400 ≈ 1_000_200
  perf = 400;
  assert.equal(c.now(), 1_000_200);
  c.addSample(1_000_450, 500, 520); // rtt 20: at 520 ≈ 1_000_460 (better)
  perf = 520;
  assert.equal(c.now(), 1_000_460);
  c.addSample(2_000_000, 600, 1600); // rtt 1000: ignored, 20 is still best
  perf = 1520;
  assert.equal(c.now(), 1_001_460);
  assert.equal(c.uncertaintyMs, 10);
  assert.equal(c.until(1_001_500), 40);
});

test('device clock changes do not matter and bad samples are ignored', () => {
  let perf = 100;
  const c = new ServerClock({ perfNow: () => perf });
  c.addSample(NaN, 0, 10);
  c.addSample(500, 20, 10); // received before sent
  assert.equal(c.synced, false);
  c.addSample(10_000, 90, 100);
  perf = 1100;
  assert.equal(c.now(), 11_005);
});

test('a cached answer is corrected by its Age', () => {
  const c = new ServerClock({ perfNow: () => 100 });
  c.addSample(10_000, 100, 100, 3);
  assert.equal(c.now(), 13_000);
});

test('only the last samples are kept', () => {
  const c = new ServerClock({ perfNow: () => 0, keep: 2 });
  c.addSample(0, 0, 1); // best, then pushed out
  c.addSample(100, 0, 50);
  c.addSample(200, 0, 60);
  assert.equal(c.uncertaintyMs, 25);
});
