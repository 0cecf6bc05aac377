import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fetchKey, keyBytes, pushSupported, subscribe } from '../../site/assets/notify.js';

// A VAPID public key (65 bytes, 0x04 first), base64url without padding.
const KEY = 'BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM';

test('keyBytes decodes base64url without padding', () => {
  const b = keyBytes(KEY);
  assert.equal(b.length, 65);
  assert.equal(b[0], 4);
  assert.deepEqual([...keyBytes('-_8')], [0xfb, 0xff]);
});

test('pushSupported needs a worker, the Push API, notifications and a secure context', () => {
  const full = { navigator: { serviceWorker: {} }, PushManager: function () {}, Notification: function () {}, isSecureContext: true };
  assert.equal(pushSupported(full), true);
  assert.equal(pushSupported({ ...full, isSecureContext: false }), false);
  assert.equal(pushSupported({ navigator: { serviceWorker: {} }, Notification: full.Notification, isSecureContext: true }), false);
  assert.equal(pushSupported({ navigator: {}, isSecureContext: true }), false);
  assert.equal(pushSupported(undefined), false);
});

test('fetchKey is empty when notifications are off', async () => {
  assert.equal(await fetchKey(async () => ({ ok: true, body: { publicKey: KEY } }), '/api'), KEY);
  assert.equal(await fetchKey(async () => ({ ok: false, status: 404, body: { error: 'NOT_FOUND' } }), '/api'), '');
  assert.equal(await fetchKey(async () => ({ ok: false, networkError: true, body: null }), '/api'), '');
});

// browser is a window whose worker registers at once and whose push
// manager answers sub (or throws).
function browser({ permission = 'granted', sub, registerFails = false } = {}) {
  const seen = { subscribeWith: null, registered: null };
  const reg = {
    active: { state: 'activated' },
    pushManager: {
      subscribe: async (opts) => {
        seen.subscribeWith = opts;
        if (!sub) throw new Error('AbortError: push service not available');
        return { toJSON: () => sub };
      },
    },
  };
  const win = {
    Notification: { requestPermission: async () => permission },
    navigator: {
      serviceWorker: {
        register: async (url, opts) => {
          if (registerFails) throw new Error('SecurityError');
          seen.registered = { url: String(url), scope: opts.scope };
          return reg;
        },
      },
    },
  };
  return { win, seen };
}

test('subscribe hands the browser subscription to the API', async () => {
  const sub = { endpoint: 'https://push.example/x', expirationTime: null, keys: { p256dh: 'a', auth: 'b' } };
  const { win, seen } = browser({ sub });
  const calls = [];
  const request = async (method, url, opts) => {
    calls.push({ method, url, opts });
    return { ok: true, status: 204 };
  };
  const r = await subscribe({ win, request, api: '/api/flash-sales', saleId: '7', token: 'tok', key: KEY });
  assert.deepEqual(r, { ok: true });
  assert.ok(seen.registered.url.endsWith('/sw.js'), seen.registered.url);
  assert.equal(seen.subscribeWith.userVisibleOnly, true);
  assert.deepEqual([...seen.subscribeWith.applicationServerKey], [...keyBytes(KEY)]);
  assert.deepEqual(calls, [{ method: 'PUT', url: '/api/flash-sales/sales/7/push', opts: { token: 'tok', body: sub } }]);
});

test('subscribe says why it could not', async () => {
  const request = async () => ({ ok: false, status: 400, error: 'INVALID' });
  const denied = browser({ permission: 'denied', sub: {} });
  assert.deepEqual(await subscribe({ win: denied.win, request, api: '', saleId: '1', token: 't', key: KEY }), { ok: false, code: 'DENIED' });
  const noService = browser({});
  assert.deepEqual(await subscribe({ win: noService.win, request, api: '', saleId: '1', token: 't', key: KEY }), { ok: false, code: 'UNSUPPORTED' });
  const noWorker = browser({ registerFails: true, sub: {} });
  assert.deepEqual(await subscribe({ win: noWorker.win, request, api: '', saleId: '1', token: 't', key: KEY }), { ok: false, code: 'UNSUPPORTED' });
  const refused = browser({ sub: { endpoint: 'http://x' } });
  assert.deepEqual(await subscribe({ win: refused.win, request, api: '', saleId: '1', token: 't', key: KEY }), { ok: false, code: 'INVALID' });
});
