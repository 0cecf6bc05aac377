import { test } from 'node:test';
import assert from 'node:assert/strict';
import { changeLines } from '../../site/assets/conflict.js';

const more = (n) => `+${n}`;

test('a before/after change lists what changed, not the document', () => {
  const body = {
    before: { version: 2, rateLimit: { perIp: { rps: 20, burst: 40 } }, blocklist: { users: [] } },
    after: { version: 3, rateLimit: { perIp: { rps: 100, burst: 40 } }, blocklist: { users: ['666', '7'] } },
  };
  assert.deepEqual(changeLines(body, 12, more), ['version: 2 → 3', 'rateLimit.perIp.rps: 20 → 100', 'blocklist.users: – → 666, 7']);
});

test('each line is worded by the caller', () => {
  const body = { before: { pow: { difficulty: 0 } }, after: { pow: { difficulty: 8 } } };
  assert.deepEqual(changeLines(body, 12, more, (c) => `${c.path}=${c.was}>${c.now}`), ['pow.difficulty=0>8']);
  assert.deepEqual(changeLines({ text: 'hi' }, 12, more, (c) => `${c.path}=${c.value}`), ['text=hi']);
});

test('another body lists its values', () => {
  assert.deepEqual(changeLines({ saleId: 1, text: 'Back soon' }, 12, more), ['saleId: 1', 'text: Back soon']);
  assert.deepEqual(changeLines(null, 12, more), []);
  assert.deepEqual(changeLines('paused', 12, more), ['paused']);
});

test('long bodies are cut, saying how much more there was', () => {
  const body = {};
  for (let i = 0; i < 20; i++) body['k' + i] = i;
  const lines = changeLines(body, 5, more);
  assert.equal(lines.length, 5);
  assert.equal(lines[4], '+16');
  assert.equal(changeLines({ k: 'x'.repeat(300) }, 5, more)[0].length, 201);
});
