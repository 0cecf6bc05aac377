import { test } from 'node:test';
import assert from 'node:assert/strict';
import { answerLost, buyWithRecovery, findOrder } from '../../site/assets/buying.js';

// shop answers each call with the next scripted answer for its method and
// records the calls and the waits.
function shop(script) {
  const calls = [];
  const waits = [];
  const queues = { POST: [...(script.POST || [])], GET: [...(script.GET || [])] };
  return {
    calls,
    waits,
    request: async (method, url, opts) => {
      calls.push({ method, url, opts });
      const next = queues[method].shift();
      if (!next) throw new Error('unexpected ' + method + ' ' + url);
      return { ok: next.status >= 200 && next.status < 300, retryAfterMs: 0, networkError: false, body: null, ...next };
    },
    sleep: async (ms) => { waits.push(ms); },
  };
}

const lost = { status: 0, networkError: true, error: 'NETWORK' };
const unavailable = { status: 503, error: 'UNAVAILABLE', retryAfterMs: 3000, body: { error: 'UNAVAILABLE' } };
const order = { orderId: 'o-1', status: 'PENDING', payable: false };
const base = { url: '/api/flash-sales/items/9/purchase', token: 'T', admissionToken: 'A', orderUrl: '/api/flash-sales/sales/7/order', random: () => 1 };

test('lost answers: network errors and every 5xx, not 4xx', () => {
  assert.equal(answerLost(lost), true);
  assert.equal(answerLost({ status: 500 }), true);
  assert.equal(answerLost(unavailable), true);
  assert.equal(answerLost({ status: 502 }), true);
  for (const status of [202, 409, 410, 403, 429]) assert.equal(answerLost({ status }), false, String(status));
});

test('a 202 is the answer, with the admission token sent', async () => {
  const s = shop({ POST: [{ status: 202, body: { orderId: 'o-1', status: 'PENDING' } }] });
  const res = await buyWithRecovery({ ...base, request: s.request, sleep: s.sleep });
  assert.equal(res.kind, 'answer');
  assert.equal(res.r.status, 202);
  assert.equal(s.calls[0].opts.headers['X-Admission-Token'], 'A');
  assert.equal(s.calls.length, 1);
});

test('a lost 202 is found again, not bought twice', async () => {
  const s = shop({ POST: [lost], GET: [{ status: 200, body: order }] });
  const res = await buyWithRecovery({ ...base, request: s.request, sleep: s.sleep });
  assert.deepEqual(res, { kind: 'order', order });
  assert.deepEqual(s.calls.map((c) => c.method + ' ' + c.url), ['POST ' + base.url, 'GET ' + base.orderUrl]);
});

test('503 UNAVAILABLE: waits Retry-After, finds no order, buys again', async () => {
  const s = shop({ POST: [unavailable, { status: 202, body: { orderId: 'o-2' } }], GET: [{ status: 404, error: 'NOT_FOUND' }] });
  const retries = [];
  const res = await buyWithRecovery({ ...base, request: s.request, sleep: s.sleep, onRetry: (r, ms, n) => retries.push([r.status, ms, n]) });
  assert.equal(res.kind, 'answer');
  assert.equal(res.r.status, 202);
  assert.deepEqual(retries, [[503, 3000, 1]]);
  assert.deepEqual(s.waits, [3000]);
  assert.deepEqual(s.calls.map((c) => c.method), ['POST', 'GET', 'POST']);
});

test('the lookup waits per Retry-After while the shop cannot answer it', async () => {
  const s = shop({ GET: [unavailable, { status: 500 }, { status: 200, body: order }] });
  const res = await findOrder({ ...base, request: s.request, sleep: s.sleep });
  assert.deepEqual(res, { kind: 'order', order });
  assert.equal(s.waits[0], 3000);
  assert.ok(s.waits[1] >= 100 && s.waits[1] <= 2000, 'backoff without Retry-After: ' + s.waits[1]);
});

test('gives up after the attempts, with the last answer', async () => {
  const s = shop({ POST: [unavailable, unavailable], GET: [{ status: 404 }, { status: 404 }] });
  const res = await buyWithRecovery({ ...base, request: s.request, sleep: s.sleep, attempts: 2 });
  assert.equal(res.kind, 'answer');
  assert.equal(res.r.status, 503);
  assert.equal(s.calls.filter((c) => c.method === 'POST').length, 2);
});

test('unknown when the lookup never gets an answer: no second purchase', async () => {
  const s = shop({ POST: [lost], GET: Array(6).fill(lost) });
  const res = await buyWithRecovery({ ...base, request: s.request, sleep: s.sleep });
  assert.equal(res.kind, 'unknown');
  assert.equal(s.calls.filter((c) => c.method === 'POST').length, 1);
  assert.equal(s.waits.length, 1 + 5, 'one wait after the purchase, then between lookups');
  for (const w of s.waits) assert.ok(w <= 8000, 'capped: ' + w);
});
