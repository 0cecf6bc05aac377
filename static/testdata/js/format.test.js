import { test } from 'node:test';
import assert from 'node:assert/strict';
import { formatCents, formatCountdown, formatEta } from '../../site/assets/format.js';

test('countdown', () => {
  assert.equal(formatCountdown(0), '00:00:00');
  assert.equal(formatCountdown(-5), '00:00:00');
  assert.equal(formatCountdown(1), '00:00:01');
  assert.equal(formatCountdown(3_661_000), '01:01:01');
  assert.equal(formatCountdown(90_061_000), '1d 01:01:01');
  assert.equal(formatCountdown(NaN), '--:--:--');
});

test('eta and money', () => {
  assert.equal(formatEta(2), 'a few seconds');
  assert.equal(formatEta(42), 'about 42 s');
  assert.equal(formatEta(125), 'about 2 min 5 s');
  assert.equal(formatEta(NaN), 'unknown');
  assert.equal(formatCents(1999), '19.99');
  assert.equal(formatCents(5), '0.05');
  assert.equal(formatCents(-250), '-2.50');
});
