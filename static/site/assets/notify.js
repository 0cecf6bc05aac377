// The turn notification (CONTRACT.md section 4, "Turn notifications"):
// while a shopper waits, the page offers to be told by Web Push when
// their turn comes. It registers the service worker (sw.js), asks the
// browser for a push subscription under the operator's VAPID key and
// hands it to PUT /api/flash-sales/sales/{saleId}/push. The sale's leader
// sends the notification; the service worker shows it and opens the sale
// page on a click.

// pushSupported reports whether the browser can take a push
// subscription at all (a service worker, the Push API, notifications).
export function pushSupported(win) {
  return !!(win && win.navigator && 'serviceWorker' in win.navigator && 'PushManager' in win && 'Notification' in win && win.isSecureContext);
}

// keyBytes decodes a base64url VAPID key into the bytes
// pushManager.subscribe takes as applicationServerKey.
export function keyBytes(s) {
  const b64 = (s + '='.repeat((4 - (s.length % 4)) % 4)).replace(/-/g, '+').replace(/_/g, '/');
  const raw = atob(b64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

// fetchKey returns the VAPID public key, or '' when notifications are off
// (404) or the server cannot be reached.
export async function fetchKey(request, api) {
  const r = await request('GET', api + '/push');
  return r.ok && r.body && typeof r.body.publicKey === 'string' ? r.body.publicKey : '';
}

// activeWorker resolves once the registration has an active worker. The
// worker's scope is /assets/, which does not cover the sale page, so
// navigator.serviceWorker.ready (which waits for a worker of the page's
// scope) would never resolve.
function activeWorker(reg) {
  if (reg.active) return Promise.resolve(reg.active);
  const w = reg.installing || reg.waiting;
  return new Promise((resolve, reject) => {
    if (!w) {
      reject(new Error('no service worker'));
      return;
    }
    w.addEventListener('statechange', () => {
      if (w.state === 'activated') resolve(w);
      if (w.state === 'redundant') reject(new Error('service worker redundant'));
    });
  });
}

// subscribe turns the notification on for the sale. It answers
// {ok: true}, or {ok: false, code} with code 'DENIED' (the shopper or the
// browser refused notifications), 'UNSUPPORTED' (no push service), or the
// API's error code.
export async function subscribe({ win, request, api, saleId, token, key }) {
  const perm = await win.Notification.requestPermission();
  if (perm !== 'granted') return { ok: false, code: 'DENIED' };
  let sub;
  try {
    const reg = await win.navigator.serviceWorker.register(new URL('./sw.js', import.meta.url), { scope: new URL('./', import.meta.url).pathname });
    await activeWorker(reg);
    sub = await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: keyBytes(key) });
  } catch {
    return { ok: false, code: 'UNSUPPORTED' };
  }
  const r = await request('PUT', api + '/sales/' + encodeURIComponent(saleId) + '/push', { token, body: sub.toJSON() });
  return r.ok ? { ok: true } : { ok: false, code: r.error || 'NETWORK' };
}
