import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { CATALOGUES, I18n, pickLanguage } from '../../site/assets/lang.js';
import { conflictChanges } from '../../site/assets/conflict.js';

const site = new URL('../../site/', import.meta.url);
const read = (p) => readFileSync(new URL(p, site), 'utf8');
const PAGES = ['index.html', 'operator.html'];
const SCRIPTS = ['assets/app.js', 'assets/operator.js', 'assets/report.js'];

const placeholders = (v) =>
  [...new Set((typeof v === 'object' ? Object.values(v).join(' ') : v).match(/\{\w+\}/g) || [])].sort().join(',');

test('every catalogue has the same keys, none empty, the same placeholders', () => {
  const langs = Object.keys(CATALOGUES);
  assert.deepEqual(langs.sort(), ['en', 'es']);
  const keys = Object.keys(CATALOGUES.en).sort();
  for (const lang of langs) {
    const cat = CATALOGUES[lang];
    assert.deepEqual(Object.keys(cat).sort(), keys, lang + ' keys differ from en');
    for (const [k, v] of Object.entries(cat)) {
      if (typeof v === 'object') {
        assert.ok(typeof v.other === 'string' && v.other.trim() !== '', `${lang} ${k}: a plural needs "other"`);
      } else {
        assert.ok(typeof v === 'string' && v.trim() !== '', `${lang} ${k} is empty`);
      }
      assert.equal(placeholders(v), placeholders(CATALOGUES.en[k]), `${lang} ${k}: placeholders differ from en`);
    }
  }
});

test('Spanish is translated: values equal to English are only names and formats', () => {
  // Words that are the same in both languages, or not words at all.
  const same = new Set(['lang.en', 'lang.es', 'time.daysAnd', 'common.no', 'conflict.change', 'op.audit.value', 'op.fig.perSecond', 'op.error.generic', 'preset.normal']);
  for (const [k, v] of Object.entries(CATALOGUES.en)) {
    if (same.has(k)) continue;
    assert.notDeepEqual(CATALOGUES.es[k], v, `es ${k} is the English text`);
  }
});

// keysUsed collects the catalogue keys the pages and scripts name
// literally.
function keysUsed() {
  const used = new Set();
  for (const p of PAGES) {
    const html = read(p);
    for (const m of html.matchAll(/data-i18n="([^"]+)"/g)) used.add(m[1]);
    for (const m of html.matchAll(/data-i18n-attr="([^"]+)"/g)) for (const pair of m[1].split(';')) used.add(pair.split(':')[1]);
  }
  for (const s of SCRIPTS) {
    const js = read(s);
    for (const m of js.matchAll(/\bt\('([a-zA-Z.\-_]*[a-zA-Z])'/g)) used.add(m[1]);
    for (const m of js.matchAll(/'((?:result|error|orderHelp|op|knobs|items|help|announce|pow|conflict|field)\.[a-zA-Z.\-_]+[a-zA-Z])'/g)) used.add(m[1]);
  }
  return used;
}

test('every key the pages name is in the catalogues', () => {
  const used = keysUsed();
  assert.ok(used.size > 100, 'found only ' + used.size + ' keys');
  for (const k of used) assert.ok(Object.hasOwn(CATALOGUES.en, k), 'missing key ' + k);
});

test('keys built from states and codes exist', () => {
  const need = [];
  for (const st of ['PREQUEUE', 'WAITING', 'ADMITTED', 'SOLD_OUT', 'ENDED', 'PAUSED', 'SCHEDULED', 'OPEN']) need.push('state.' + st);
  for (const st of ['PREQUEUE', 'WAITING', 'ADMITTED', 'PAUSED', 'SOLD_OUT', 'ENDED']) need.push('help.' + st, 'announce.' + st);
  for (const st of ['SOLD_OUT', 'ENDED', 'PAUSED', 'OPEN']) need.push('countdown.' + st);
  for (const st of ['SOLD_OUT', 'ENDED', 'PAUSED']) need.push('banner.' + st);
  for (const st of ['PENDING', 'PAID', 'EXPIRED', 'CANCELLED', 'REJECTED']) need.push('orderStatus.' + st);
  for (const st of ['PENDING', 'confirming', 'PAID', 'EXPIRED', 'CANCELLED', 'REJECTED']) need.push('orderHelp.' + st);
  // Every error code of the contract has the shopper's words.
  for (const code of ['INVALID', 'UNAUTHENTICATED', 'FORBIDDEN', 'NOT_ADMITTED', 'BLOCKED', 'NOT_FOUND', 'TOO_LARGE', 'RATE_LIMITED', 'UNAVAILABLE', 'SOLD_OUT', 'SALE_PAUSED',
    'ALREADY_PURCHASED', 'ORDER_EXPIRED', 'ORDER_CANCELLED', 'ORDER_PAID', 'NOT_PAYABLE_YET', 'INTERNAL', 'NETWORK']) need.push('error.' + code);
  for (const r of ['blocklist', 'perIp', 'perPrefix', 'perUser', 'pow']) need.push('rule.' + r);
  for (const o of ['allowed', 'limited', 'blocked', 'challenged', 'shadow']) need.push('outcome.' + o);
  for (const p of ['normal', 'drop', 'under-attack']) need.push('preset.' + p);
  for (const a of ['sale.create', 'sale.update', 'sale.pause', 'sale.resume', 'sale.end', 'sale.stock', 'sale.message', 'settings.put', 'settings.preset']) need.push('audit.action.' + a);
  for (const k of need) assert.ok(Object.hasOwn(CATALOGUES.en, k), 'missing key ' + k);
});

test('the pages hold no text outside the catalogues', () => {
  for (const p of PAGES) {
    // Drop what is not shown text: the head's non-title parts, code
    // samples (commands are not translated), comments, tags.
    let html = read(p).replace(/<!--[\s\S]*?-->/g, '');
    html = html.replace(/<code>[\s\S]*?<\/code>/g, '').replace(/<(script|style)[\s\S]*?<\/\1>/g, '');
    const texts = [];
    for (const m of html.matchAll(/>([^<]+)</g)) {
      const txt = m[1].replace(/&[a-z]+;/g, '').trim();
      if (txt && /\p{L}/u.test(txt)) texts.push(txt);
    }
    assert.deepEqual(texts, [], p + ' has text not taken from a catalogue');
    for (const m of html.matchAll(/\s(aria-label|title|alt|placeholder)="([^"]*)"/g)) {
      assert.ok(!/\p{L}{2,}/u.test(m[2]) || /^[0-9./]+$/.test(m[2]), `${p}: ${m[1]}="${m[2]}" is not translated (use data-i18n-attr)`);
    }
    // Every element marked for translation is empty in the HTML.
    for (const m of html.matchAll(/<(\w+)[^>]*data-i18n="[^"]+"[^>]*>([^<]*)</g)) assert.equal(m[2].trim(), '', `${p}: <${m[1]}> with data-i18n holds text`);
  }
});

test('the scripts write no text literal into the page', () => {
  for (const s of SCRIPTS) {
    const js = read(s);
    for (const m of js.matchAll(/\.(textContent|ariaLabel|title|alt|placeholder)\s*=\s*'([^']*)'/g)) {
      assert.ok(!/\p{L}{2,}/u.test(m[2]), `${s}: .${m[1]} = '${m[2]}' is not from a catalogue`);
    }
    for (const m of js.matchAll(/setAttribute\('(aria-label|title|alt)',\s*'([^']*)'/g)) assert.fail(`${s}: ${m[1]} '${m[2]}' is not from a catalogue`);
    for (const m of js.matchAll(/set(?:Note|Result|OrderHelp|Change)\([^)]*?'([A-Z][a-z]+ [^']*)'/g)) assert.fail(`${s}: '${m[1]}' is not from a catalogue`);
  }
});

test('language choice: stored, then preferred, then English', () => {
  assert.equal(pickLanguage('', ['es-MX', 'en']), 'es');
  assert.equal(pickLanguage('', ['fr-FR', 'es']), 'es');
  assert.equal(pickLanguage('en', ['es-ES']), 'en');
  assert.equal(pickLanguage('de', ['de-DE']), 'en');
  assert.equal(pickLanguage('', []), 'en');
  assert.equal(pickLanguage(null, undefined), 'en');
  assert.equal(pickLanguage('ES', []), 'es');
  assert.equal(pickLanguage('', ['es_AR']), 'es');
});

test('text, plurals and placeholders', () => {
  const en = new I18n('en');
  const es = new I18n('es');
  assert.equal(en.t('announce.ahead', { n: 1, eta: 'now' }), '1 person ahead of you, now.');
  assert.equal(en.t('announce.ahead', { n: 1200, eta: 'x' }), '1,200 people ahead of you, x.');
  assert.equal(es.t('announce.ahead', { n: 1200, eta: 'x' }), '1200 personas delante de ti, x.');
  assert.equal(es.t('items.buyLabel', { name: 'Zapatilla' }), 'Comprar Zapatilla');
  assert.equal(en.t('no.such.key'), 'no.such.key');
  assert.equal(new I18n('fr').lang, 'en');
});

test('prices in the item currency, per locale', () => {
  const en = new I18n('en');
  const es = new I18n('es');
  assert.equal(en.price(1999, 'USD'), '$19.99');
  assert.equal(en.price(1999, 'EUR'), '€19.99');
  assert.equal(es.price(1999, 'EUR'), '19,99\u00a0€');
  assert.equal(es.price(123456, 'EUR'), '1234,56\u00a0€');
  assert.equal(en.price(500, 'JPY'), '¥500');
  assert.equal(en.price(1999, 'XYZ1'), '19.99 XYZ1');
  assert.equal(en.price(NaN, 'USD'), '');
});

test('countdowns and waits, per locale', () => {
  const en = new I18n('en');
  const es = new I18n('es');
  assert.equal(en.countdown(0), '00:00:00');
  assert.equal(en.countdown(-5), '00:00:00');
  assert.equal(en.countdown(1), '00:00:01');
  assert.equal(en.countdown(3_661_000), '01:01:01');
  assert.equal(en.countdown(90_061_000), '1 day 01:01:01');
  assert.equal(es.countdown(90_061_000), '1 d 01:01:01');
  assert.equal(en.countdown(NaN), '--:--:--');
  assert.equal(en.eta(2), 'a few seconds');
  assert.equal(en.eta(42), 'about 42 sec');
  assert.equal(en.eta(125), 'about 2 min 5 sec');
  assert.equal(es.eta(125), 'unos 2 min 5 s');
  assert.equal(en.eta(NaN), 'unknown');
  assert.equal(es.eta(NaN), 'desconocida');
  assert.equal(en.seconds(1500), '2 sec');
});

test('conflict changes leave out live figures', () => {
  const mine = { id: 7, version: 3, state: 'OPEN', admissionRatePerSecond: 50, queue: { waiting: 10 }, items: [{ id: 1, quantity: 5, remaining: 2 }] };
  const now = { id: 7, version: 4, state: 'PAUSED', admissionRatePerSecond: 50, queue: { waiting: 12 }, items: [{ id: 1, quantity: 15, remaining: 12 }], message: { text: 'hi' } };
  assert.deepEqual(conflictChanges(mine, now), [
    { path: 'version', was: 3, now: 4 },
    { path: 'state', was: 'OPEN', now: 'PAUSED' },
    { path: 'items.0.quantity', was: 5, now: 15 },
    { path: 'message.text', was: undefined, now: 'hi' },
  ]);
  assert.deepEqual(conflictChanges({ a: 1 }, {}), [{ path: 'a', was: 1, now: undefined }]);
});
