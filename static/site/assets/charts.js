// Small time series and inline SVG sparklines for the operator console.
// No chart library: a path per series, redrawn once a second.

const SVG = 'http://www.w3.org/2000/svg';

// Series keeps the last capacity points {t, v} (t in ms).
export class Series {
  constructor(capacity = 300) {
    this.capacity = capacity;
    this.points = [];
  }

  push(t, v) {
    if (!Number.isFinite(v)) return;
    this.points.push({ t, v });
    if (this.points.length > this.capacity) this.points.splice(0, this.points.length - this.capacity);
  }

  get last() {
    return this.points.length ? this.points[this.points.length - 1] : null;
  }

  values() {
    return this.points.map((p) => p.v);
  }
}

// ratePerSecond derives a rate from two readings of a counter; null when
// the interval is empty or the counter went backwards (a restart).
export function ratePerSecond(prev, cur) {
  if (!prev || !cur) return null;
  const dt = (cur.t - prev.t) / 1000;
  const dv = cur.v - prev.v;
  if (!(dt > 0) || dv < 0) return null;
  return dv / dt;
}

// sparklinePath scales values into a width × height box (0 at the bottom,
// the maximum at the top) and returns the SVG path data.
export function sparklinePath(values, width, height) {
  if (!values.length) return '';
  const max = Math.max(...values, 0);
  const min = Math.min(...values, 0);
  const span = max - min || 1;
  const step = values.length > 1 ? width / (values.length - 1) : 0;
  let d = '';
  values.forEach((v, i) => {
    const x = (i * step).toFixed(1);
    const y = (height - ((v - min) / span) * height).toFixed(1);
    d += (i === 0 ? 'M' : 'L') + x + ',' + y;
  });
  return d;
}

// chartBox returns the figure of key inside container, creating it once:
// a caption (name, latest) and an SVG of the class and viewBox given,
// followed by what extra() makes (at creation only); created says whether
// it is new.
function chartBox(container, key, svgClass, viewBox, extra = () => []) {
  let box = container.querySelector('[data-chart="' + key + '"]');
  if (box) return { box, created: false };
  box = document.createElement('figure');
  box.dataset.chart = key;
  const cap = document.createElement('figcaption');
  cap.className = 'chart-title';
  const name = document.createElement('span');
  name.className = 'name';
  const now = document.createElement('span');
  now.className = 'latest';
  cap.append(name, now);
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', svgClass);
  svg.setAttribute('viewBox', viewBox);
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.setAttribute('role', 'img');
  box.append(cap, svg, ...extra());
  container.append(box);
  return { box, created: true };
}

// chart returns (creating it inside container once) a titled sparkline and
// draws values into it.
// ariaLabel names the chart for screen readers (the caller words it, in
// the page's language).
export function drawChart(container, key, title, values, latestText, ariaLabel = title) {
  const { box, created } = chartBox(container, key, 'chart', '0 0 300 60');
  if (created) box.querySelector('svg').append(document.createElementNS(SVG, 'path'));
  box.querySelector('.name').textContent = title;
  box.querySelector('svg').setAttribute('aria-label', ariaLabel);
  box.querySelector('.latest').textContent = latestText;
  box.querySelector('path').setAttribute('d', sparklinePath(values, 300, 58));
}

// pivotCounters turns the defense counters into rows of rule × outcome. It
// accepts {rule: {outcome: n}}, {counters: ...} and [{rule, outcome, count}].
export function pivotCounters(body) {
  let src = body;
  if (src && !Array.isArray(src) && typeof src === 'object') {
    for (const k of ['counters', 'rules', 'refusals']) {
      if (src[k] && typeof src[k] === 'object') {
        src = src[k];
        break;
      }
    }
  }
  const rows = new Map();
  const outcomes = new Set();
  const add = (rule, outcome, n) => {
    if (!Number.isFinite(n)) return;
    if (!rows.has(rule)) rows.set(rule, {});
    const r = rows.get(rule);
    r[outcome] = (r[outcome] || 0) + n;
    outcomes.add(outcome);
  };
  if (Array.isArray(src)) {
    for (const c of src) {
      if (c && typeof c === 'object') add(String(c.rule ?? c.name ?? '?'), String(c.outcome ?? c.result ?? 'count'), Number(c.count ?? c.value));
    }
  } else if (src && typeof src === 'object') {
    for (const [rule, v] of Object.entries(src)) {
      if (typeof v === 'number') add(rule, 'count', v);
      else if (v && typeof v === 'object') for (const [o, n] of Object.entries(v)) add(rule, o, Number(n));
    }
  }
  const order = ['limited', 'blocked', 'challenged', 'shadow', 'allowed'];
  const outs = [...outcomes].sort((a, b) => {
    const ia = order.indexOf(a), ib = order.indexOf(b);
    return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || a.localeCompare(b);
  });
  return { outcomes: outs, rows: [...rows.entries()].sort((a, b) => a[0].localeCompare(b[0])).map(([rule, values]) => ({ rule, values })) };
}

// shadowPaths lists the boolean switches of shadow mode in a settings
// document: every boolean named "shadow" and every boolean inside an object
// named "shadow", as key paths (["rateLimit", "perIp", "shadow"]).
export function shadowPaths(doc) {
  const out = [];
  const walk = (v, path, inShadow) => {
    if (!v || typeof v !== 'object' || Array.isArray(v)) return;
    for (const [k, x] of Object.entries(v)) {
      const p = [...path, k];
      if (typeof x === 'boolean' && (inShadow || /^shadow$/i.test(k))) out.push(p);
      else walk(x, p, inShadow || /^shadow$/i.test(k));
    }
  };
  walk(doc, [], false);
  return out;
}

export function getPath(doc, path) {
  return path.reduce((v, k) => (v && typeof v === 'object' ? v[k] : undefined), doc);
}

// setPath sets a value at a key path, creating objects on the way.
export function setPath(doc, path, value) {
  let v = doc;
  for (const k of path.slice(0, -1)) {
    if (!v[k] || typeof v[k] !== 'object') v[k] = {};
    v = v[k];
  }
  v[path[path.length - 1]] = value;
  return doc;
}

// linePaths scales several series of the same length into one width ×
// height box with a shared scale (0 at the bottom, the largest value at
// the top) and returns one SVG path per series. A series of one point is
// drawn flat across the box, so that it shows.
export function linePaths(lines, width, height) {
  const all = lines.flat().filter(Number.isFinite);
  const max = Math.max(...all, 0) || 1;
  return lines.map((values) => {
    const pts = values.length === 1 ? [values[0], values[0]] : values;
    const step = pts.length > 1 ? width / (pts.length - 1) : 0;
    let d = '';
    pts.forEach((v, i) => {
      const x = (i * step).toFixed(1);
      const y = (height - ((Number.isFinite(v) ? v : 0) / max) * height).toFixed(1);
      d += (i === 0 ? 'M' : 'L') + x + ',' + y;
    });
    return d;
  });
}

// cumulative returns the running totals of values.
export function cumulative(values) {
  let sum = 0;
  return values.map((v) => (sum += Number.isFinite(v) ? v : 0));
}

// drawLines returns (creating it inside container once) a titled chart of
// several series on one scale, with a legend, and draws lines into it:
// [{label, values}]. ariaLabel is the chart's text alternative, with its
// figures, in the page's language (the caller words it).
export function drawLines(container, key, title, lines, latestText, ariaLabel) {
  // A viewBox from -1: a line at the top keeps its whole stroke.
  const { box } = chartBox(container, key, 'chart lines', '0 -1 300 80', () => {
    const legend = document.createElement('ul');
    legend.className = 'legend';
    legend.setAttribute('aria-hidden', 'true');
    return [legend];
  });
  box.querySelector('.name').textContent = title;
  box.querySelector('.latest').textContent = latestText;
  const svg = box.querySelector('svg');
  svg.setAttribute('aria-label', ariaLabel);
  const paths = linePaths(lines.map((l) => l.values), 300, 78);
  const els = paths.map((d, i) => {
    const p = document.createElementNS(SVG, 'path');
    p.setAttribute('class', 'line-' + (i % 6));
    p.setAttribute('d', d);
    return p;
  });
  svg.replaceChildren(...els);
  box.querySelector('.legend').replaceChildren(
    ...lines.map((l, i) => {
      const li = document.createElement('li');
      const sw = document.createElement('span');
      sw.className = 'swatch line-' + (i % 6);
      li.append(sw, document.createTextNode(l.label));
      return li;
    }),
  );
}
