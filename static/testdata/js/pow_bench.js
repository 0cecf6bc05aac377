// Compares the pure-JS SHA-256 search with crypto.subtle (run: node pow_bench.js).
import { PowSearch, thresholdWords } from '../../site/assets/pow.js';

const N = 200000;
const salt = new Uint8Array(32).map((_, i) => i * 7);
const s = new PowSearch(salt, thresholdWords(undefined, 256));
s.scan(0, N); // warm up the JIT
let t = performance.now();
s.scan(N, 5 * N);
const js = (performance.now() - t) / (5 * N);

const subtle = globalThis.crypto.subtle;
const msg = (n) => { const d = new TextEncoder().encode(String(n)); const m = new Uint8Array(salt.length + d.length); m.set(salt); m.set(d, salt.length); return m; };
t = performance.now();
for (let n = 0; n < N; n++) await subtle.digest('SHA-256', msg(n));
const serial = (performance.now() - t) / N;
t = performance.now();
for (let n = 0; n < N; n += 1000) { const p = []; for (let i = n; i < n + 1000; i++) p.push(subtle.digest('SHA-256', msg(i))); await Promise.all(p); }
const batched = (performance.now() - t) / N;
console.log(`pure JS ${(js * 1000).toFixed(2)} µs/hash; subtle serial ${(serial * 1000).toFixed(2)} µs/hash; subtle 1000 in flight ${(batched * 1000).toFixed(2)} µs/hash`);
