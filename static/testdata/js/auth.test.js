import { test } from 'node:test';
import assert from 'node:assert/strict';
import { acquireToken, decodeClaims, expiresInMs, parseFragment } from '../../site/assets/auth.js';

const b64u = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
const jwt = (claims) => b64u({ alg: 'HS256', typ: 'JWT' }) + '.' + b64u(claims) + '.c2ln';

test('fragment parsing keeps other parameters', () => {
  assert.deepEqual(parseFragment('#token=a.b.c'), { token: 'a.b.c', rest: '' });
  assert.deepEqual(parseFragment('#x=1&token=a.b.c'), { token: 'a.b.c', rest: '#x=1' });
  assert.deepEqual(parseFragment(''), { token: '', rest: '' });
});

test('claims are read for display', () => {
  const c = decodeClaims(jwt({ sub: '42', exp: 100, role: 'operator' }));
  assert.deepEqual(c, { sub: '42', exp: 100, role: 'operator' });
  assert.equal(decodeClaims('nope'), null);
  assert.equal(decodeClaims('a.!!.c'), null);
  assert.equal(expiresInMs(c, 40_000), 60_000);
  assert.equal(expiresInMs({}, 0), Infinity);
});

function fakeWindow(hash) {
  const store = new Map();
  const win = {
    location: { hash, pathname: '/sales/7', search: '?transport=polling' },
    history: { state: null, replaced: null, replaceState(_s, _t, url) { this.replaced = url; } },
    sessionStorage: { getItem: (k) => store.get(k) ?? null, setItem: (k, v) => store.set(k, v), removeItem: (k) => store.delete(k) },
  };
  return { win, store };
}

test('token from the fragment is stored and removed from the address bar', () => {
  const t = jwt({ sub: '1' });
  const { win, store } = fakeWindow('#token=' + t);
  assert.equal(acquireToken('k', win), t);
  assert.equal(store.get('k'), t);
  assert.equal(win.history.replaced, '/sales/7?transport=polling');
  win.location.hash = '';
  assert.equal(acquireToken('k', win), t, 'read back from sessionStorage');
});

test('a shop-provided window.FLASHSALE_TOKEN is used', () => {
  const t = jwt({ sub: '2' });
  const { win } = fakeWindow('');
  win.FLASHSALE_TOKEN = t;
  assert.equal(acquireToken('k', win), t);
});
