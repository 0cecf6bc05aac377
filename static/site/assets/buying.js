// Buying when the shop is failing over. A purchase whose answer was lost
// (the connection dropped, a 5xx, 503 UNAVAILABLE) may or may not have
// reserved a unit: the page waits as long as the server asked
// (Retry-After, else a jittered backoff), asks for its order in the sale,
// and buys again only when the shop says it holds none. So a lost 202 is
// found again, never doubled, and a refusal for a passing reason is
// retried without a click. Everything is injected, so node can test it.
import { Backoff } from './backoff.js';

// Purchases sent for one click before the page gives up and asks the
// shopper to try again.
export const PURCHASE_ATTEMPTS = 4;

// Order lookups, per lost answer, before the page says it cannot tell.
export const LOOKUP_ATTEMPTS = 6;

// answerLost is whether a purchase answer leaves the outcome open: no
// answer at all, or a server or proxy failure (a 503 UNAVAILABLE may carry
// the id of a reservation whose record is still on its way).
export function answerLost(r) {
  return !!r.networkError || r.status >= 500;
}

// findOrder asks for the caller's order in the sale until the shop
// answers. It resolves to {kind: 'order', order}, {kind: 'none'} (404: the
// caller holds none) or {kind: 'unknown', r} (no answer after every try,
// or a refusal such as 401).
export async function findOrder({ request, orderUrl, token, sleep, random, attempts = LOOKUP_ATTEMPTS }) {
  const backoff = new Backoff({ baseMs: 1000, capMs: 8000, random });
  let r = null;
  for (let i = 0; i < attempts; i++) {
    r = await request('GET', orderUrl, { token });
    if (r.ok && r.body && r.body.orderId) return { kind: 'order', order: r.body };
    if (r.status === 404) return { kind: 'none' };
    if (r.status === 401 || r.status === 403) return { kind: 'unknown', r };
    if (i + 1 < attempts) await sleep(r.retryAfterMs || backoff.next());
  }
  return { kind: 'unknown', r };
}

// buyWithRecovery sends the purchase and recovers a lost answer. It
// resolves to {kind: 'answer', r} (a definite answer to show: 202, 409,
// 410, 403, ..., or the last failure when the shop still holds no order
// after every attempt), {kind: 'order', order} (the order found after a
// lost answer) or {kind: 'unknown', r} (the shop could not say whether an
// order was made). onRetry(r, waitMs, attempt) reports each lost answer.
export async function buyWithRecovery({ request, url, token, admissionToken, orderUrl, sleep, random, attempts = PURCHASE_ATTEMPTS, onRetry = () => {} }) {
  const backoff = new Backoff({ baseMs: 1000, capMs: 8000, random });
  for (let attempt = 1; ; attempt++) {
    const r = await request('POST', url, { token, headers: { 'X-Admission-Token': admissionToken } });
    if (!answerLost(r)) return { kind: 'answer', r };
    const wait = r.retryAfterMs || backoff.next();
    onRetry(r, wait, attempt);
    await sleep(wait);
    const found = await findOrder({ request, orderUrl, token, sleep, random });
    if (found.kind === 'order') return found;
    if (found.kind === 'unknown') return { kind: 'unknown', r: found.r || r };
    if (attempt >= attempts) return { kind: 'answer', r };
    // The shop holds no order for the caller: nothing was reserved, buy again.
  }
}
