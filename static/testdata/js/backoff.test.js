import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Backoff, backoffDelay, retryAfterMs } from '../../site/assets/backoff.js';

test('delay grows exponentially up to the cap, with jitter inside it', () => {
  const top = (a) => backoffDelay(a, { random: () => 1 });
  assert.deepEqual([0, 1, 2, 3].map(top), [500, 1000, 2000, 4000]);
  assert.equal(top(20), 30000);
  assert.equal(top(2000), 30000);
  assert.equal(backoffDelay(5, { random: () => 0 }), 100);
  for (let a = 0; a < 12; a++) {
    const d = backoffDelay(a);
    assert.ok(d >= 100 && d <= Math.min(30000, 500 * 2 ** a), 'attempt ' + a + ': ' + d);
  }
});

test('jitter spreads clients apart', () => {
  const seen = new Set();
  for (let i = 0; i < 50; i++) seen.add(backoffDelay(6));
  assert.ok(seen.size > 10);
});

test('Backoff counts attempts and resets', () => {
  const b = new Backoff({ random: () => 1 });
  assert.deepEqual([b.next(), b.next(), b.next()], [500, 1000, 2000]);
  b.reset();
  assert.equal(b.next(), 500);
});

test('Retry-After in seconds or as a date', () => {
  assert.equal(retryAfterMs('3', 0), 3000);
  assert.equal(retryAfterMs(null, 1234), 1234);
  assert.equal(retryAfterMs('soon', 7), 7);
  assert.equal(retryAfterMs('Thu, 01 Jan 1970 00:00:10 GMT', 0, 4000), 6000);
});
