import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ruleRows, sellOutLines, soldOutAfter } from '../../site/assets/report.js';

const rep = {
  startsAt: '2026-12-05T18:00:00Z',
  items: [{ id: 1, quantity: 3 }, { id: 2, quantity: 5 }],
  orders: {
    items: [{ itemId: 1, sold: 3, paid: 1, lastSoldAt: '2026-12-05T18:00:01.100Z' }, { itemId: 2, sold: 2, paid: 0, lastSoldAt: '2026-12-05T18:00:00.400Z' }],
    sellOut: {
      stepMs: 100,
      points: [
        { at: '2026-12-05T18:00:00.100Z', items: [{ itemId: 1, sold: 1 }, { itemId: 2, sold: 1 }] },
        { at: '2026-12-05T18:00:00.400Z', items: [{ itemId: 2, sold: 1 }] },
        { at: '2026-12-05T18:00:00.500Z', items: [{ itemId: 1, sold: 2 }] },
      ],
    },
  },
};

test('the sell-out curve fills every step between its points, per item', () => {
  const c = sellOutLines(rep, rep.items);
  assert.equal(c.stepMs, 100);
  assert.deepEqual(c.lines, [[1, 1, 1, 1, 3], [1, 1, 1, 2, 2]]);
});

test('an empty sell-out curve has no lines', () => {
  assert.deepEqual(sellOutLines({ orders: { sellOut: { stepMs: 100, points: [] } } }, rep.items), { stepMs: 0, lines: [[], []] });
  assert.deepEqual(sellOutLines({}, []), { stepMs: 0, lines: [] });
});

test('sold out after the opening: only the items sold out', () => {
  assert.deepEqual([...soldOutAfter(rep)], [[1, 1100]]);
  assert.equal(soldOutAfter({ ...rep, startsAt: 'not a time' }).size, 0);
});

test('refusals and shadowing by rule: every rule with either, the most first', () => {
  const room = { refusals: { blocklist: 2, identity: 1 }, shadowed: { risk: 5, blocklist: 1 } };
  assert.deepEqual(ruleRows(room), [['risk', 0, 5], ['blocklist', 2, 1], ['identity', 1, 0]]);
  assert.deepEqual(ruleRows({}), []);
});

test('the shadow queue summary: counts by rule, the most first', async () => {
  const { shadowSummary } = await import('../../site/assets/shadowq.js');
  const t = (k, p = {}) => k + JSON.stringify(p);
  const num = (n) => String(n);
  assert.equal(shadowSummary({ shadowed: 0, released: 0, byRule: {} }, t, num), 'sq.none{}');
  assert.equal(shadowSummary({ shadowed: 3, released: 1, byRule: { pow: 1, risk: 2 } }, t, num),
    'sq.summary' + JSON.stringify({ n: '3', released: '1', rules: 'sq.ruleCount' + JSON.stringify({ rule: 'sq.rule.risk{}', n: '2' }) + ', sq.ruleCount' + JSON.stringify({ rule: 'sq.rule.pow{}', n: '1' }) }));
});
