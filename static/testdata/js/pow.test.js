import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { PowSearch, challengeParams, expectedAttempts, powAnswer, progressFraction, saltBytes, sha256, solve, thresholdWords } from '../../site/assets/pow.js';

const hex = (b) => Buffer.from(b).toString('hex');

test('sha256 matches node:crypto for every length up to 300 bytes', () => {
  for (let n = 0; n <= 300; n++) {
    const msg = new Uint8Array(n).map((_, i) => (i * 31 + n) & 0xff);
    assert.equal(hex(sha256(msg)), createHash('sha256').update(msg).digest('hex'), 'length ' + n);
  }
});

test('PowSearch hashes salt || decimal nonce, for short and long salts', () => {
  for (const saltLen of [0, 1, 16, 32, 55, 63, 64, 65, 100, 128]) {
    const salt = new Uint8Array(saltLen).map((_, i) => i ^ 0x5a);
    // threshold = hash of nonce 7 itself: nonce 7 is not below it, a nonce
    // is accepted exactly when its hash is smaller.
    const h7 = createHash('sha256').update(Buffer.concat([salt, Buffer.from('7')])).digest('hex');
    const s = new PowSearch(salt, thresholdWords(h7));
    assert.equal(s.test(7), false);
    for (let n = 0; n < 50; n++) {
      const h = createHash('sha256').update(Buffer.concat([salt, Buffer.from(String(n))])).digest('hex');
      assert.equal(s.test(n), h < h7, 'salt ' + saltLen + ' nonce ' + n);
    }
  }
});

test('solve returns the smallest accepted nonce over the salt text (POW.md)', () => {
  const challenge = { type: 'challenge', algorithm: 'SHA-256', salt: '9f86d081884c7d659a2feaa0c55ad015', difficulty: 5000, threshold: thresholdHex(5000), expiresAtMs: 1, signature: 'sig' };
  const nonce = solve(challenge, { chunk: 1000 });
  // POW.md: the digest's hex is lexicographically below the threshold.
  const below = (n) => createHash('sha256').update(challenge.salt + n, 'utf8').digest('hex') < challenge.threshold;
  assert.ok(below(nonce));
  for (let n = 0; n < nonce; n++) assert.ok(!below(n), 'nonce ' + n + ' was already accepted');
});

// thresholdHex is floor(2^256 / d) in 64 hex digits, as the server sends it.
function thresholdHex(d) {
  return ((1n << 256n) / BigInt(d)).toString(16).padStart(64, '0');
}

test('threshold from the difficulty (expected hashes) when none is given', () => {
  for (const d of [2, 3, 1000, 500000, 123456789]) {
    const want = thresholdHex(d);
    const got = [...thresholdWords(undefined, d)].map((w) => w.toString(16).padStart(8, '0')).join('');
    assert.equal(got, want, 'difficulty ' + d);
    assert.deepEqual(thresholdWords(want), thresholdWords(undefined, d));
    assert.ok(Math.abs(expectedAttempts(thresholdWords(want)) / d - 1) < 1e-9);
  }
  assert.deepEqual([...thresholdWords(undefined, 1)], Array(8).fill(0xffffffff));
  assert.deepEqual([...thresholdWords(undefined, 0)], Array(8).fill(0xffffffff));
});

test('progress is the chance of having found it', () => {
  assert.equal(progressFraction(0, 1000), 0);
  assert.ok(Math.abs(progressFraction(1000, 1000) - (1 - Math.exp(-1))) < 1e-12);
  assert.equal(progressFraction(10, Infinity), 0);
});

test('the salt is hashed as text', () => {
  assert.deepEqual([...saltBytes('ab01')], [0x61, 0x62, 0x30, 0x31]);
  assert.deepEqual([...challengeParams({ salt: 'ab', threshold: 'f'.repeat(64) }).salt], [0x61, 0x62]);
});

test('the answer carries the challenge fields and the nonce, not the type', () => {
  const c = { type: 'challenge', algorithm: 'SHA-256', salt: 'aa', difficulty: 4, threshold: 'f'.repeat(64), expiresAtMs: 5, signature: 's' };
  assert.deepEqual(powAnswer(c, 12), { algorithm: 'SHA-256', salt: 'aa', difficulty: 4, threshold: 'f'.repeat(64), expiresAtMs: 5, signature: 's', nonce: 12 });
  assert.throws(() => challengeParams({ salt: 'aa', algorithm: 'scrypt' }));
});
