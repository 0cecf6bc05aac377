// Web Worker that solves one proof-of-work challenge off the main thread.
// Message in: {challenge}. Messages out: {type: "progress", tried, fraction},
// then {type: "done", nonce} or {type: "failed", message}. The page ends the
// worker with terminate() when it no longer needs the answer.
import { solve } from './pow.js';

self.onmessage = (event) => {
  const { challenge } = event.data || {};
  try {
    const nonce = solve(challenge, {
      chunk: 50000,
      onProgress: (tried, fraction) => self.postMessage({ type: 'progress', tried, fraction }),
    });
    self.postMessage({ type: 'done', nonce });
  } catch (err) {
    self.postMessage({ type: 'failed', message: String((err && err.message) || err) });
  }
};
