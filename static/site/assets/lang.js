// Languages of the pages: one catalogue per language (lang-en.js,
// lang-es.js), the choice of language, and text formatted per locale.
//
// The HTML is the same for every language (a CDN caches one copy): the page
// chooses in the browser, from the shopper's stored choice, then the
// browser's preferred languages (navigator.languages, the same list the
// browser sends as Accept-Language), then English.
import en from './lang-en.js';
import es from './lang-es.js';

export const CATALOGUES = { en, es };
export const DEFAULT_LANG = 'en';

// LANG_KEY is the one localStorage entry the pages write: the language
// choice, which is neither secret nor user-specific on a shared device.
export const LANG_KEY = 'flashsale.lang';

// pickLanguage returns the first supported language of the stored choice
// and the preferred list ("es-MX" matches "es").
export function pickLanguage(stored, preferred = [], available = Object.keys(CATALOGUES)) {
  const cands = [stored, ...(Array.isArray(preferred) ? preferred : [])];
  for (const c of cands) {
    if (typeof c !== 'string' || c === '') continue;
    const base = c.toLowerCase().split(/[-_]/)[0];
    if (available.includes(base)) return base;
  }
  return DEFAULT_LANG;
}

const pad = (n) => String(n).padStart(2, '0');

export class I18n {
  constructor(lang, catalogues = CATALOGUES) {
    this.catalogues = catalogues;
    this.setLang(lang);
  }

  setLang(lang) {
    this.lang = Object.hasOwn(this.catalogues, lang) ? lang : DEFAULT_LANG;
    this.cat = this.catalogues[this.lang];
    this.plurals = new Intl.PluralRules(this.lang);
    this.numbers = new Intl.NumberFormat(this.lang);
  }

  // has reports whether the catalogue holds key.
  has(key) {
    return Object.hasOwn(this.cat, key);
  }

  // t returns the text of key with {name} placeholders filled from params.
  // A value may be {one, other, ...}: the form is chosen by params.n with
  // the language's plural rules. A missing key shows as the key, which the
  // catalogue tests catch.
  t(key, params = {}) {
    let v = Object.hasOwn(this.cat, key) ? this.cat[key] : key;
    if (v && typeof v === 'object') {
      const form = this.plurals.select(Number(params.n));
      v = v[form] ?? v.other ?? key;
    }
    return String(v).replace(/\{(\w+)\}/g, (m, name) => {
      if (!Object.hasOwn(params, name)) return m;
      const p = params[name];
      return typeof p === 'number' ? this.number(p) : String(p);
    });
  }

  // number formats a number with the language's digit grouping.
  number(n) {
    if (!Number.isFinite(n)) return '–';
    return this.numbers.format(n);
  }

  // price formats an amount in minor units (cents) in its ISO 4217
  // currency; the number of minor digits comes from the currency (JPY has
  // none). An unknown code is shown after a plain two-decimal amount.
  price(cents, currency = 'USD') {
    if (!Number.isFinite(cents)) return '';
    try {
      const f = new Intl.NumberFormat(this.lang, { style: 'currency', currency });
      const digits = f.resolvedOptions().maximumFractionDigits;
      return f.format(cents / 10 ** digits);
    } catch {
      return new Intl.NumberFormat(this.lang, { minimumFractionDigits: 2, maximumFractionDigits: 2 }).format(cents / 100) + ' ' + String(currency);
    }
  }

  // dateTime formats a Unix-millisecond instant in the language's style.
  dateTime(ms) {
    if (!Number.isFinite(ms)) return '';
    return new Date(ms).toLocaleString(this.lang, { dateStyle: 'medium', timeStyle: 'short' });
  }

  // time formats the time of day of an instant.
  time(ms) {
    if (!Number.isFinite(ms)) return '';
    return new Date(ms).toLocaleTimeString(this.lang, { timeStyle: 'short' });
  }

  // unit formats n of a duration unit ("5 s", "5 min") in the language.
  unit(n, unit) {
    return new Intl.NumberFormat(this.lang, { style: 'unit', unit, unitDisplay: 'short' }).format(n);
  }

  // seconds formats a whole number of seconds, rounding up.
  seconds(ms) {
    return this.unit(Math.max(0, Math.ceil(ms / 1000)), 'second');
  }

  // countdown shows a duration as [D days ]HH:MM:SS, rounding up so that
  // 00:00:00 appears only when the moment has come.
  countdown(ms) {
    if (!Number.isFinite(ms)) return '--:--:--';
    const total = Math.max(0, Math.ceil(ms / 1000));
    const d = Math.floor(total / 86400);
    const h = Math.floor((total % 86400) / 3600);
    const m = Math.floor((total % 3600) / 60);
    const s = total % 60;
    const hms = pad(h) + ':' + pad(m) + ':' + pad(s);
    return d > 0 ? this.t('time.daysAnd', { days: this.unit(d, 'day'), hms }) : hms;
  }

  // eta shows a waiting estimate in words.
  eta(seconds) {
    if (!Number.isFinite(seconds) || seconds < 0) return this.t('eta.unknown');
    if (seconds < 5) return this.t('eta.fewSeconds');
    let d;
    if (seconds < 60) d = this.unit(Math.round(seconds), 'second');
    else if (seconds < 3600) {
      const m = Math.floor(seconds / 60);
      const s = Math.round(seconds % 60);
      d = this.unit(m, 'minute') + (s ? ' ' + this.unit(s, 'second') : '');
    } else {
      d = this.unit(Math.floor(seconds / 3600), 'hour') + ' ' + this.unit(Math.round((seconds % 3600) / 60), 'minute');
    }
    return this.t('eta.about', { d });
  }
}

// translateDom fills every element of root marked for translation:
// data-i18n="key" sets the text, data-i18n-attr="attr:key;attr:key" sets
// attributes (aria-label, title, placeholder, alt), and <html lang> and the
// switch follow the language.
export function translateDom(root, i18n) {
  for (const el of root.querySelectorAll('[data-i18n]')) el.textContent = i18n.t(el.dataset.i18n);
  for (const el of root.querySelectorAll('[data-i18n-attr]')) {
    for (const pair of el.dataset.i18nAttr.split(';')) {
      const [attr, key] = pair.split(':').map((x) => x.trim());
      if (attr && key) el.setAttribute(attr, i18n.t(key));
    }
  }
  const html = root.documentElement || root.ownerDocument?.documentElement;
  if (html) html.lang = i18n.lang;
}

// storedLanguage reads the stored choice; storage may be unavailable
// (private mode, blocked): the choice then lasts for the page only.
export function storedLanguage(storage) {
  try {
    return storage ? storage.getItem(LANG_KEY) || '' : '';
  } catch {
    return '';
  }
}

export function storeLanguage(storage, lang) {
  try {
    if (storage) storage.setItem(LANG_KEY, lang);
  } catch {
    // Not stored: the choice lasts for this page.
  }
}

// setupLanguage picks the language, translates the page, and wires the
// language switch (a <select id="lang-switch">): a change is stored, the
// page translated again and onChange called so that the script re-renders
// what it wrote itself.
export function setupLanguage(doc, win, onChange = () => {}) {
  const storage = (() => {
    try {
      return win.localStorage;
    } catch {
      return null;
    }
  })();
  const nav = win.navigator || {};
  const i18n = new I18n(pickLanguage(storedLanguage(storage), nav.languages || [nav.language]));
  translateDom(doc, i18n);
  const sw = doc.getElementById('lang-switch');
  if (sw) {
    sw.value = i18n.lang;
    sw.addEventListener('change', () => {
      i18n.setLang(sw.value);
      storeLanguage(storage, i18n.lang);
      translateDom(doc, i18n);
      sw.value = i18n.lang;
      onChange(i18n);
    });
  }
  return i18n;
}
