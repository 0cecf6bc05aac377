// Reconnect delays: exponential growth with full jitter, so that thousands of
// pages that lost the same gateway do not come back in the same instant.

// backoffDelay is the delay before retry number attempt (0-based): a random
// point between minMs and min(capMs, baseMs * 2^attempt).
export function backoffDelay(attempt, { baseMs = 500, capMs = 30000, minMs = 100, random = Math.random } = {}) {
  const ceil = Math.max(minMs, Math.min(capMs, baseMs * Math.pow(2, Math.max(0, attempt))));
  return Math.round(minMs + random() * (ceil - minMs));
}

export class Backoff {
  constructor(opts = {}) {
    this.opts = opts;
    this.attempt = 0;
  }

  // next returns the next delay and counts the attempt.
  next() {
    return backoffDelay(this.attempt++, this.opts);
  }

  reset() {
    this.attempt = 0;
  }
}

// retryAfterMs parses a Retry-After header (seconds or an HTTP date) into
// milliseconds, or returns fallbackMs when absent or unreadable.
export function retryAfterMs(header, fallbackMs, nowMs = Date.now()) {
  if (header == null || header === '') return fallbackMs;
  const s = String(header).trim();
  if (/^\d+$/.test(s)) return Number(s) * 1000;
  const at = Date.parse(s);
  return Number.isFinite(at) ? Math.max(0, at - nowMs) : fallbackMs;
}
