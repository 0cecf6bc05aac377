import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Series, cumulative, linePaths, pivotCounters, ratePerSecond, setPath, shadowPaths, sparklinePath } from '../../site/assets/charts.js';

test('admissions per second from successive polls', () => {
  assert.equal(ratePerSecond({ t: 0, v: 100 }, { t: 2000, v: 300 }), 100);
  assert.equal(ratePerSecond(null, { t: 1, v: 1 }), null);
  assert.equal(ratePerSecond({ t: 5, v: 1 }, { t: 5, v: 2 }), null);
  assert.equal(ratePerSecond({ t: 0, v: 10 }, { t: 1000, v: 2 }), null, 'counter reset');
});

test('series keeps the last points', () => {
  const s = new Series(3);
  for (let i = 0; i < 5; i++) s.push(i, i * 10);
  s.push(9, NaN);
  assert.deepEqual(s.values(), [20, 30, 40]);
  assert.deepEqual(s.last, { t: 4, v: 40 });
});

test('sparkline path spans the box', () => {
  assert.equal(sparklinePath([0, 5, 10], 100, 50), 'M0.0,50.0L50.0,25.0L100.0,0.0');
  assert.equal(sparklinePath([], 100, 50), '');
  assert.equal(sparklinePath([0, 0], 10, 10), 'M0.0,10.0L10.0,10.0');
});

test('defense counters in either shape', () => {
  const want = { outcomes: ['limited', 'blocked', 'other'], rows: [{ rule: 'perIp', values: { limited: 3, blocked: 1 } }, { rule: 'pow', values: { other: 2 } }] };
  assert.deepEqual(pivotCounters({ counters: { perIp: { limited: 3, blocked: 1 }, pow: { other: 2 } } }), want);
  assert.deepEqual(pivotCounters([{ rule: 'perIp', outcome: 'limited', count: 3 }, { rule: 'perIp', outcome: 'blocked', count: 1 }, { rule: 'pow', outcome: 'other', count: 2 }]), want);
});

test('shadow switches are found wherever the document keeps them', () => {
  const doc = { rateLimit: { perIp: { rps: 1, shadow: false } }, shadow: { blocklist: true }, pow: { difficulty: 0 } };
  assert.deepEqual(shadowPaths(doc), [['rateLimit', 'perIp', 'shadow'], ['shadow', 'blocklist']]);
  setPath(doc, ['rateLimit', 'perIp', 'shadow'], true);
  setPath(doc, ['a', 'b'], 1);
  assert.equal(doc.rateLimit.perIp.shadow, true);
  assert.deepEqual(doc.a, { b: 1 });
});

test('several lines share one scale', () => {
  assert.deepEqual(linePaths([[0, 10], [5, 5]], 100, 50), ['M0.0,50.0L100.0,0.0', 'M0.0,25.0L100.0,25.0']);
  assert.deepEqual(linePaths([[0, 0]], 10, 10), ['M0.0,10.0L10.0,10.0'], 'all zero: flat at the bottom');
  assert.deepEqual(linePaths([[4]], 100, 50), ['M0.0,0.0L100.0,0.0'], 'one point: flat across the box');
  assert.deepEqual(linePaths([[]], 100, 50), [''], 'no point: nothing');
  assert.deepEqual(cumulative([1, 2, NaN, 3]), [1, 3, 3, 6]);
});
