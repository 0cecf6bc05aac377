// Proof of work for the waiting room: a pure-JS SHA-256 tuned for many
// short messages, and the search for the smallest accepted nonce.
//
// The puzzle is defined in defense/POW.md: find the smallest nonce n = 0, 1,
// 2, ... such that SHA-256(UTF-8(salt text + decimal n)), read as a 256-bit
// big-endian number, is below the challenge's threshold (floor(2^256 /
// difficulty), so difficulty is the expected number of hashes). The answer
// is the challenge's fields plus "nonce". Everything that depends on the
// wire format lives in challengeParams and powAnswer below; adapt those two
// if the format changes.
//
// Why not crypto.subtle: it is asynchronous and pays a promise and a copy per
// hash. Measured with node v20 on the 2-core build machine (32-byte salt plus
// decimal nonce, after JIT warm-up):
//   this file (PowSearch.scan)                  ~0.5 µs/hash (~1.8 M hashes/s)
//   crypto.subtle.digest, awaited one by one    ~57 µs/hash  (~18 k/s)
//   crypto.subtle.digest, 1,000 in flight       ~10-13 µs/hash (~90 k/s)
// So a difficulty of 1,000,000 (expected hashes) takes about half a second
// here; POW.md assumes 500,000/s for a mid-range phone.
// (testdata/js/pow_bench.js repeats the measurement.)

const K = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);

const IV = new Int32Array([
  0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
]);

// compress runs the SHA-256 compression function on the 64-byte block at
// buf[off..off+64], updating st (8 words) in place; w is 64 words of scratch.
function compress(st, w, buf, off) {
  for (let i = 0; i < 16; i++) {
    const j = off + 4 * i;
    w[i] = (buf[j] << 24) | (buf[j + 1] << 16) | (buf[j + 2] << 8) | buf[j + 3];
  }
  for (let i = 16; i < 64; i++) {
    const x = w[i - 15];
    const y = w[i - 2];
    const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
    const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
    w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0;
  }
  let a = st[0], b = st[1], c = st[2], d = st[3], e = st[4], f = st[5], g = st[6], h = st[7];
  for (let i = 0; i < 64; i++) {
    const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
    const t1 = (h + S1 + ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0;
    const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
    const t2 = (S0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
    h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
  }
  st[0] = (st[0] + a) | 0; st[1] = (st[1] + b) | 0; st[2] = (st[2] + c) | 0; st[3] = (st[3] + d) | 0;
  st[4] = (st[4] + e) | 0; st[5] = (st[5] + f) | 0; st[6] = (st[6] + g) | 0; st[7] = (st[7] + h) | 0;
}

// finish pads the message tail tail[0..n) (total message length total bytes)
// and compresses it into st.
function finish(st, w, tail, n, total) {
  tail[n] = 0x80;
  let end = n + 1;
  const blocks = end + 8 <= 64 ? 1 : 2;
  const padTo = blocks * 64;
  tail.fill(0, end, padTo);
  const bits = total * 8;
  const hi = Math.floor(bits / 0x100000000);
  tail[padTo - 8] = hi >>> 24; tail[padTo - 7] = hi >>> 16; tail[padTo - 6] = hi >>> 8; tail[padTo - 5] = hi;
  tail[padTo - 4] = bits >>> 24; tail[padTo - 3] = bits >>> 16; tail[padTo - 2] = bits >>> 8; tail[padTo - 1] = bits;
  compress(st, w, tail, 0);
  if (blocks === 2) compress(st, w, tail, 64);
}

// sha256 hashes bytes (a Uint8Array) and returns the 32-byte digest.
export function sha256(bytes) {
  const st = new Int32Array(IV);
  const w = new Int32Array(64);
  const full = bytes.length - (bytes.length % 64);
  for (let off = 0; off < full; off += 64) compress(st, w, bytes, off);
  const tail = new Uint8Array(128);
  tail.set(bytes.subarray(full));
  finish(st, w, tail, bytes.length - full, bytes.length);
  const out = new Uint8Array(32);
  for (let i = 0; i < 8; i++) {
    out[4 * i] = st[i] >>> 24; out[4 * i + 1] = st[i] >>> 16; out[4 * i + 2] = st[i] >>> 8; out[4 * i + 3] = st[i];
  }
  return out;
}

// PowSearch tests nonces for one salt and threshold. The salt's whole
// 64-byte blocks are hashed once (the midstate); each nonce then costs one or
// two compressions.
export class PowSearch {
  constructor(salt, threshold) {
    this.threshold = threshold; // Uint32Array(8), most significant word first
    this.w = new Int32Array(64);
    this.mid = new Int32Array(IV);
    const full = salt.length - (salt.length % 64);
    for (let off = 0; off < full; off += 64) compress(this.mid, this.w, salt, off);
    this.prefix = salt.subarray(full);
    this.saltLen = salt.length;
    this.tail = new Uint8Array(192);
    this.tail.set(this.prefix);
    this.st = new Int32Array(8);
  }

  // test reports whether nonce n (a non-negative safe integer) is accepted.
  test(n) {
    const tail = this.tail;
    let len = this.prefix.length;
    const digits = String(n);
    for (let i = 0; i < digits.length; i++) tail[len++] = digits.charCodeAt(i);
    const st = this.st;
    st.set(this.mid);
    finish(st, this.w, tail, len, this.saltLen + digits.length);
    const t = this.threshold;
    for (let i = 0; i < 8; i++) {
      const h = st[i] >>> 0;
      if (h !== t[i]) return h < t[i];
    }
    return false; // equal is not below
  }

  // scan tests nonces from start, count of them, and returns the first
  // accepted one or -1.
  scan(start, count) {
    const end = start + count;
    for (let n = start; n < end; n++) if (this.test(n)) return n;
    return -1;
  }
}

// saltBytes is what is hashed before the nonce: the salt text itself, as
// UTF-8 (POW.md: the 32 hex characters as ASCII, not the decoded bytes).
export function saltBytes(text) {
  return new TextEncoder().encode(String(text));
}

// thresholdWords parses a 64-hex-digit threshold, or derives
// floor(2^256 / difficulty) when none is given (difficulty = expected hashes).
export function thresholdWords(hex, difficulty) {
  const t = new Uint32Array(8);
  if (typeof hex === 'string' && /^[0-9a-fA-F]{64}$/.test(hex)) {
    for (let i = 0; i < 8; i++) t[i] = parseInt(hex.substr(8 * i, 8), 16) >>> 0;
    return t;
  }
  const d = Math.floor(Number(difficulty) || 0);
  if (d <= 1) return t.fill(0xffffffff);
  let v = (1n << 256n) / BigInt(d);
  for (let i = 7; i >= 0; i--) {
    t[i] = Number(v & 0xffffffffn);
    v >>= 32n;
  }
  return t;
}

// expectedAttempts is the mean number of hashes to find an accepted nonce:
// 2^256 / threshold.
export function expectedAttempts(threshold) {
  let v = 0;
  for (let i = 0; i < 8; i++) v = v * 4294967296 + threshold[i];
  return v > 0 ? Math.pow(2, 256) / v : Infinity;
}

// progressFraction is the chance of having found an answer after tried
// hashes: an honest progress bar for a memoryless search.
export function progressFraction(tried, expected) {
  if (!(expected > 0) || !Number.isFinite(expected)) return 0;
  return 1 - Math.exp(-tried / expected);
}

// challengeParams extracts what the search needs from a challenge message.
export function challengeParams(challenge) {
  if (!challenge || typeof challenge.salt !== 'string') throw new Error('challenge without salt');
  if (challenge.algorithm && String(challenge.algorithm).toUpperCase() !== 'SHA-256') {
    throw new Error('unsupported proof-of-work algorithm ' + challenge.algorithm);
  }
  return {
    salt: saltBytes(challenge.salt),
    threshold: thresholdWords(challenge.threshold, challenge.difficulty),
  };
}

// powAnswer is the "pow" object sent back in the next join: the challenge's
// own fields (signature included, so the server needs no state) plus nonce.
export function powAnswer(challenge, nonce) {
  const answer = {};
  for (const [k, v] of Object.entries(challenge)) if (k !== 'type') answer[k] = v;
  answer.nonce = nonce;
  return answer;
}

// solve searches synchronously in chunks, calling onProgress(tried, fraction)
// between chunks, and returns the smallest accepted nonce.
export function solve(challenge, { chunk = 50000, onProgress } = {}) {
  const { salt, threshold } = challengeParams(challenge);
  const search = new PowSearch(salt, threshold);
  const expected = expectedAttempts(threshold);
  for (let start = 0; start < Number.MAX_SAFE_INTEGER; start += chunk) {
    const n = search.scan(start, chunk);
    if (n >= 0) return n;
    if (onProgress) onProgress(start + chunk, progressFraction(start + chunk, expected));
  }
  throw new Error('no nonce found');
}

// solveAsync is the main-thread fallback when no Worker can be started: the
// same search, yielding to the event loop between chunks. signal aborts it.
export async function solveAsync(challenge, { chunk = 20000, onProgress, signal } = {}) {
  const { salt, threshold } = challengeParams(challenge);
  const search = new PowSearch(salt, threshold);
  const expected = expectedAttempts(threshold);
  for (let start = 0; ; start += chunk) {
    if (signal && signal.aborted) throw new Error('aborted');
    const n = search.scan(start, chunk);
    if (n >= 0) return n;
    if (onProgress) onProgress(start + chunk, progressFraction(start + chunk, expected));
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
}
