// The shadow queue in the operator console: its knobs (the bot-defense
// settings' shadowQueue) and a sale's shadowed shoppers, each with a
// release button. The functions build DOM from data and callbacks; the
// console (operator.js) reads and writes the API.

// The rules that may shadow rather than refuse (defense/settings.go).
export const SHADOW_QUEUE_RULES = ['blocklist', 'pow', 'perAddress', 'identity'];

// shadowSummary is the line above the list: counts by rule, most first.
export function shadowSummary(q, t, num) {
  if (!q || !(Number(q.shadowed) > 0 || Number(q.released) > 0)) return t('sq.none');
  const rules = Object.entries(q.byRule || {})
    .filter(([, n]) => Number(n) > 0)
    .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
    .map(([rule, n]) => t('sq.ruleCount', { rule: ruleName(rule, t), n: num(n) }));
  return t('sq.summary', { n: num(q.shadowed), released: num(q.released || 0), rules: rules.join(', ') || '–' });
}

// ruleName is a shadow rule's label ("risk" included).
export function ruleName(rule, t) {
  return t('sq.rule.' + rule) === 'sq.rule.' + rule ? rule : t('sq.rule.' + rule);
}

// renderShadowKnobs draws one checkbox per rule and the risk threshold.
// onRule(rule, on) and onRisk(value) write the settings.
export function renderShadowKnobs(doc, box, riskInput, { t, onRule, onRisk, idle }) {
  const rules = (doc && doc.shadowQueue && doc.shadowQueue.rules) || {};
  box.replaceChildren(
    ...SHADOW_QUEUE_RULES.map((rule) => {
      const row = document.createElement('div');
      row.className = 'check';
      const cb = document.createElement('input');
      cb.type = 'checkbox';
      cb.id = 'sq-rule-' + rule;
      cb.dataset.testid = 'sq-rule-' + rule;
      cb.checked = rules[rule] === true;
      cb.addEventListener('change', () => onRule(rule, cb.checked));
      const l = document.createElement('label');
      l.htmlFor = cb.id;
      l.textContent = ' ' + ruleName(rule, t);
      row.append(cb, l);
      return row;
    }),
  );
  if (idle(riskInput)) riskInput.value = String((doc && doc.shadowQueue && doc.shadowQueue.riskAbove) || 0);
  riskInput.form.onsubmit = (ev) => {
    ev.preventDefault();
    onRisk(Number(riskInput.value));
  };
}

// renderShadowed fills the list: user, rule, since, and a release button
// calling onRelease(userId).
export function renderShadowed(q, tbody, summary, { t, num, time, onRelease }) {
  summary.textContent = shadowSummary(q, t, num);
  const rows = ((q && q.shoppers) || []).map((s) => {
    const tr = document.createElement('tr');
    const th = document.createElement('th');
    th.scope = 'row';
    th.textContent = String(s.userId);
    const rule = document.createElement('td');
    rule.textContent = ruleName(s.rule, t);
    const at = document.createElement('td');
    at.textContent = time(Date.parse(s.at));
    const act = document.createElement('td');
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'secondary';
    b.textContent = t('sq.release');
    b.setAttribute('aria-label', t('sq.releaseLabel', { user: String(s.userId) }));
    b.dataset.testid = 'sq-release-' + s.userId;
    b.addEventListener('click', () => onRelease(s.userId));
    act.append(b);
    tr.append(th, rule, at, act);
    return tr;
  });
  tbody.replaceChildren(...rows);
  tbody.closest('table').hidden = rows.length === 0;
}
