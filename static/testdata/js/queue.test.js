import { test } from 'node:test';
import assert from 'node:assert/strict';
import { QueueClient, queueUrls } from '../../site/assets/queue.js';

// Fake timers: run() fires everything due, in time order.
function fakeTimers() {
  let now = 0, seq = 0;
  const pending = new Map();
  return {
    setTimeout: (f, ms) => { const id = ++seq; pending.set(id, { at: now + ms, f }); return id; },
    clearTimeout: (id) => pending.delete(id),
    advance(ms) {
      const end = now + ms;
      for (;;) {
        const due = [...pending.entries()].filter(([, t]) => t.at <= end).sort((a, b) => a[1].at - b[1].at)[0];
        if (!due) break;
        pending.delete(due[0]);
        now = due[1].at;
        due[1].f();
      }
      now = end;
    },
  };
}

// FakeWS records sockets; tests drive open, message and close.
function fakeWS() {
  const sockets = [];
  class WS {
    constructor(url) { this.url = url; this.sent = []; this.readyState = 0; sockets.push(this); }
    send(d) { this.sent.push(JSON.parse(d)); }
    close() { if (this.readyState !== 3) { this.readyState = 3; this.onclose && this.onclose({}); } }
    open() { this.readyState = 1; this.onopen(); }
    recv(m) { this.onmessage({ data: JSON.stringify(m) }); }
    drop() { this.readyState = 3; this.onclose({ code: 1006 }); }
  }
  return { WS, sockets };
}

const loc = { protocol: 'https:', host: 'shop.example' };
const flush = () => new Promise((r) => setImmediate(r));

function client(over = {}) {
  const events = [];
  const timers = fakeTimers();
  const { WS, sockets } = fakeWS();
  const calls = [];
  const c = new QueueClient({
    saleId: '7', token: 'T', location: loc, WebSocketImpl: WS, random: () => 0.5,
    setTimeout: timers.setTimeout, clearTimeout: timers.clearTimeout,
    request: async (method, url, opts) => { calls.push({ method, url, opts }); return (over.respond || (() => ({ ok: true, status: 200, body: { state: 'WAITING', position: 3 } })))(method, url, opts); },
    solvePow: (ch, onProgress) => { onProgress(0.5); return { promise: Promise.resolve(42), cancel() {} }; },
    handlers: {
      onStatus: (s) => events.push(['status', s.state]),
      onAdmitted: (m) => events.push(['admitted', m.admissionToken]),
      onError: (code, _m, fatal) => events.push(['error', code, fatal]),
      onTransport: (n, d) => events.push(['transport', n, d]),
      onPowDone: () => events.push(['powDone']),
      onMessage: (m) => events.push(['message', m.text, m.atMs]),
    },
    ...over,
  });
  return { c, events, timers, sockets, calls };
}

test('urls follow the page scheme', () => {
  assert.deepEqual(queueUrls(loc, 7), { ws: 'wss://shop.example/api/flash-sales/sales/7/queue', http: '/api/flash-sales/sales/7/queue' });
  assert.equal(queueUrls({ protocol: 'http:', host: 'h:8080' }, 1).ws, 'ws://h:8080/api/flash-sales/sales/1/queue');
});

test('joins over WebSocket, handles status and admission', () => {
  const { c, events, sockets } = client();
  c.start();
  sockets[0].open();
  assert.deepEqual(sockets[0].sent, [{ type: 'join', accessToken: 'T' }]);
  sockets[0].recv({ type: 'status', state: 'WAITING', position: 5 });
  sockets[0].recv({ type: 'admitted', admissionToken: 'A', expiresAtMs: 9, items: [] });
  assert.deepEqual(events.filter((e) => e[0] !== 'transport'), [['status', 'WAITING'], ['admitted', 'A']]);
});

test('a challenge is solved and join is sent again with pow', async () => {
  const { c, events, sockets } = client();
  c.start();
  sockets[0].open();
  sockets[0].recv({ type: 'challenge', algorithm: 'SHA-256', salt: 'ab', difficulty: 1, threshold: 'f'.repeat(64), expiresAtMs: 10, signature: 's' });
  await flush();
  assert.deepEqual(sockets[0].sent[1], { type: 'join', accessToken: 'T', pow: { algorithm: 'SHA-256', salt: 'ab', difficulty: 1, threshold: 'f'.repeat(64), expiresAtMs: 10, signature: 's', nonce: 42 } });
  assert.ok(events.some((e) => e[0] === 'powDone'));
});

test('a challenge followed by close reconnects with the answer', async () => {
  const { c, sockets } = client();
  c.start();
  sockets[0].open();
  sockets[0].recv({ type: 'challenge', salt: 'ab', difficulty: 1 });
  sockets[0].drop();
  await flush();
  assert.equal(sockets.length, 2);
  sockets[1].open();
  assert.equal(sockets[1].sent[0].pow.nonce, 42);
});

test('reconnects with backoff after a drop', () => {
  const { c, sockets, timers } = client();
  c.start();
  sockets[0].open();
  sockets[0].drop();
  assert.equal(sockets.length, 1);
  timers.advance(299); // random 0.5: 100 + 0.5 * (500 - 100) = 300 ms
  assert.equal(sockets.length, 1);
  timers.advance(1);
  assert.equal(sockets.length, 2);
});

test('two failed connects switch to polling', async () => {
  const { c, events, sockets, timers, calls } = client();
  c.start();
  sockets[0].drop();
  timers.advance(1000);
  assert.equal(sockets.length, 2);
  sockets[1].drop();
  await flush();
  assert.ok(events.some((e) => e[0] === 'transport' && e[1] === 'polling'));
  assert.equal(calls[0].method, 'POST');
  assert.equal(calls[0].url, '/api/flash-sales/sales/7/queue');
  assert.equal(calls[0].opts.token, 'T');
  timers.advance(2000);
  await flush();
  assert.equal(calls[1].method, 'GET');
  c.stop();
});

test('forced polling picks up admission from the status object', async () => {
  const bodies = [{ state: 'WAITING', position: 2 }, { state: 'ADMITTED', position: 0, admissionToken: 'A', expiresAtMs: 5, items: [{ id: 1, purchaseUrl: '/x' }] }, { state: 'ADMITTED', admissionToken: 'A' }];
  const { c, events, timers, sockets } = client({ transport: 'polling', respond: () => ({ ok: true, status: 200, body: bodies.shift() }) });
  c.start();
  await flush();
  for (let i = 0; i < 2; i++) {
    timers.advance(2000);
    await flush();
  }
  assert.equal(sockets.length, 0);
  assert.deepEqual(events.filter((e) => e[0] === 'admitted'), [['admitted', 'A']], 'admitted once per token');
  c.stop();
});

test('fatal errors stop the client', () => {
  const { c, events, sockets, timers } = client();
  c.start();
  sockets[0].open();
  sockets[0].recv({ type: 'error', error: 'BLOCKED', message: 'no' });
  sockets[0].drop();
  timers.advance(60000);
  assert.equal(sockets.length, 1);
  assert.deepEqual(events.filter((e) => e[0] === 'error'), [['error', 'BLOCKED', true]]);
});

test('polling honours Retry-After and reports 401 as fatal', async () => {
  const answers = [{ ok: false, status: 503, error: 'UNAVAILABLE', retryAfterMs: 5000 }, { ok: false, status: 401, error: 'UNAUTHENTICATED' }];
  const { c, events, timers, calls } = client({ transport: 'polling', respond: () => answers.shift() });
  c.start();
  await flush();
  timers.advance(4999);
  await flush();
  assert.equal(calls.length, 1);
  timers.advance(1);
  await flush();
  assert.equal(calls.length, 2);
  assert.deepEqual(events.filter((e) => e[0] === 'error'), [['error', 'UNAUTHENTICATED', true]]);
});

test('the operator\'s message reaches the page over WebSocket and polling; PAUSED is a status', async () => {
  const ws = client();
  ws.c.start();
  ws.sockets[0].open();
  ws.sockets[0].recv({ type: 'status', state: 'PAUSED', position: 4 });
  ws.sockets[0].recv({ type: 'message', text: 'Back soon', atMs: 5 });
  ws.sockets[0].recv({ type: 'message', text: '', atMs: 6 });
  assert.deepEqual(ws.events.filter((e) => e[0] !== 'transport'), [['status', 'PAUSED'], ['message', 'Back soon', 5], ['message', '', 6]]);
  assert.equal(ws.sockets.length, 1, 'PAUSED keeps the connection');

  const poll = client({ transport: 'polling', respond: () => ({ ok: true, status: 200, body: { state: 'PAUSED', position: 4, message: { text: 'Back soon', atMs: 5 } } }) });
  poll.c.start();
  await flush();
  assert.deepEqual(poll.events.filter((e) => e[0] !== 'transport'), [['status', 'PAUSED'], ['message', 'Back soon', 5]]);
});

test('a choice goes over the WebSocket only after the join is answered; a refusal is reported', () => {
  const refused = [];
  const { c, sockets } = client({ handlers: { onChoiceRefused: (code) => refused.push(code) } });
  c.start();
  sockets[0].open();
  c.choose(12); // before the join's first status: kept
  assert.deepEqual(sockets[0].sent, [{ type: 'join', accessToken: 'T' }]);
  sockets[0].recv({ type: 'status', state: 'WAITING', position: 5 });
  assert.deepEqual(sockets[0].sent[1], { type: 'choose', itemId: 12 });
  c.choose('13');
  assert.deepEqual(sockets[0].sent[2], { type: 'choose', itemId: 13 });
  sockets[0].recv({ type: 'choiceRefused', error: 'CHOICE_CLOSED', message: 'x', itemId: 13 });
  assert.deepEqual(refused, ['CHOICE_CLOSED']);
  assert.equal(sockets.length, 1, 'a refused choice keeps the connection');
});

test('polling sends a choice with the next status call, once', async () => {
  const refused = [];
  const answers = [{ ok: true, status: 200, body: { state: 'WAITING', position: 2 } }, { ok: true, status: 200, body: { state: 'WAITING', position: 1, chosenItemId: 12 } },
    { ok: false, status: 409, error: 'CHOICE_CLOSED' }, { ok: true, status: 200, body: { state: 'WAITING', position: 1 } }];
  const { c, timers, calls } = client({ transport: 'polling', respond: () => answers.shift(), handlers: { onChoiceRefused: (code) => refused.push(code) } });
  c.start();
  await flush();
  c.choose(12);
  timers.advance(2000);
  await flush();
  assert.equal(calls[1].url, '/api/flash-sales/sales/7/queue?itemId=12');
  c.choose(13);
  timers.advance(2000);
  await flush();
  assert.equal(calls[2].url, '/api/flash-sales/sales/7/queue?itemId=13');
  assert.deepEqual(refused, ['CHOICE_CLOSED']);
  timers.advance(2000);
  await flush();
  assert.equal(calls[3].url, '/api/flash-sales/sales/7/queue', 'a refused choice is not sent again');
  c.stop();
});

test('an invitation code goes with the join on both transports; a refusal is fatal', async () => {
  const ws = client({ code: ' vip2026 ' });
  ws.c.start();
  ws.sockets[0].open();
  assert.deepEqual(ws.sockets[0].sent, [{ type: 'join', accessToken: 'T', code: 'vip2026' }]);
  ws.sockets[0].recv({ type: 'error', error: 'CODE_USED', message: 'used' });
  ws.sockets[0].drop();
  ws.timers.advance(60000);
  assert.equal(ws.sockets.length, 1, 'no reconnect after CODE_USED');
  assert.deepEqual(ws.events.filter((e) => e[0] === 'error'), [['error', 'CODE_USED', true]]);

  const poll = client({ transport: 'polling', code: 'VIP2026' });
  poll.c.start();
  await flush();
  assert.deepEqual(poll.calls[0].opts.body, { code: 'VIP2026' });
  poll.c.stop();

  const none = client({ transport: 'polling' });
  none.c.start();
  await flush();
  assert.equal(none.calls[0].opts.body, undefined, 'no code, no body');
  none.c.stop();
});
