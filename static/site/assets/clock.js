// Server clock: the countdown and every deadline on the page are measured in
// server time, never by the device clock alone.
//
// Each sample is a serverTimeMs read by the server between our request and
// its answer. The server's time at receipt is estimated as serverTimeMs plus
// half the round trip; the sample with the shortest round trip among the
// last few is the most precise and is the one used. Time between samples is
// measured with the monotonic performance.now(), so changing the device clock
// while the page is open changes nothing.

// estimateOffset is server time minus local time at receipt, with half the
// round trip corrected: all arguments in milliseconds.
export function estimateOffset(serverTimeMs, sentLocalMs, receivedLocalMs) {
  return serverTimeMs + (receivedLocalMs - sentLocalMs) / 2 - receivedLocalMs;
}

export class ServerClock {
  // perfNow: monotonic milliseconds (performance.now); keep: samples kept.
  constructor({ perfNow = () => performance.now(), keep = 5 } = {}) {
    this.perfNow = perfNow;
    this.keep = keep;
    this.samples = [];
    this.best = null;
  }

  // addSample records serverTimeMs read while a request was in flight from
  // sentAt to receivedAt (both perfNow readings). ageSeconds is the HTTP Age
  // header of a cached answer, if any.
  addSample(serverTimeMs, sentAt, receivedAt, ageSeconds = 0) {
    if (!Number.isFinite(serverTimeMs) || !(receivedAt >= sentAt)) return;
    const rtt = receivedAt - sentAt;
    const server = serverTimeMs + (Number(ageSeconds) || 0) * 1000;
    this.samples.push({ rtt, base: estimateOffset(server, sentAt, receivedAt) });
    if (this.samples.length > this.keep) this.samples.shift();
    this.best = this.samples.reduce((a, b) => (b.rtt < a.rtt ? b : a));
  }

  get synced() {
    return this.best !== null;
  }

  // now is the estimated server time in Unix milliseconds, NaN before the
  // first sample.
  now() {
    return this.best ? this.perfNow() + this.best.base : NaN;
  }

  // until is the number of milliseconds from server now to a server
  // timestamp (negative once passed), NaN before the first sample.
  until(serverMs) {
    return serverMs - this.now();
  }

  // uncertaintyMs is half the best round trip: the most the estimate can be off.
  get uncertaintyMs() {
    return this.best ? this.best.rtt / 2 : Infinity;
  }
}
