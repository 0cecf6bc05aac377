// fetch wrapper: JSON in and out, bearer token, a timeout, and the timing
// that the server clock needs. It never throws: a network failure is
// reported as {networkError: true}.
import { retryAfterMs } from './backoff.js';

export async function request(method, url, { token, headers = {}, body, timeoutMs = 10000 } = {}) {
  const h = { Accept: 'application/json', ...headers };
  if (token) h.Authorization = 'Bearer ' + token;
  let payload;
  if (body !== undefined) {
    h['Content-Type'] = 'application/json';
    payload = JSON.stringify(body);
  }
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), timeoutMs);
  const sentAt = performance.now();
  try {
    const res = await fetch(url, { method, headers: h, body: payload, cache: 'no-store', signal: ctrl.signal });
    const receivedAt = performance.now();
    const text = await res.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = null;
      }
    }
    return {
      ok: res.ok,
      status: res.status,
      body: data,
      error: data && typeof data.error === 'string' ? data.error : '',
      message: data && typeof data.message === 'string' ? data.message : '',
      retryAfterMs: retryAfterMs(res.headers.get('Retry-After'), 0),
      ageSeconds: Number(res.headers.get('Age')) || 0,
      etag: res.headers.get('ETag') || '',
      sentAt,
      receivedAt,
      networkError: false,
    };
  } catch (err) {
    return { ok: false, status: 0, body: null, error: 'NETWORK', message: String((err && err.message) || err), retryAfterMs: 0, etag: '', sentAt, receivedAt: performance.now(), networkError: true };
  } finally {
    clearTimeout(timer);
  }
}
