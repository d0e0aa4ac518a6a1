// #/namespaces/NS: one namespace and its subscriptions.

import { seg } from '../api.js';
import { el, fields, fill, keyed, notice, table, throttle, yesNo } from '../dom.js';
import { subscriptionColumns, subscriptionRows } from '../fleet.js';
import { followCollection, followObject } from '../live.js';

export function render(view, { namespace }, signal) {
  let ns = null;
  let subscriptions = new Map();
  let errorOf = { namespace: null, subscriptions: null };
  const head = el('div');
  let lastHead = '';
  const errors = el('div');
  const empty = el('div');
  const t = table({
    caption: 'Subscriptions',
    id: 'subscriptions',
    columns: subscriptionColumns('API'),
  });
  fill(view, el('h1', {}, namespace), errors, head, el('h2', {}, 'Subscriptions'), empty, t.region);

  const { create, update } = subscriptionRows({
    href: (s) => `#/namespaces/${seg(namespace)}/subscriptions/${seg(s.api)}`,
    label: (s) => s.api,
    expected: (s) => s.expected_sync_id,
  });

  const draw = throttle(() => {
    const messages = new Set(Object.values(errorOf).filter(Boolean).map((e) => e.message));
    fill(errors, [...messages].map((m) => notice(m, 'error')));
    const shown = JSON.stringify(ns);
    if (ns && shown !== lastHead) {
      lastHead = shown; // rebuild the fields only when they changed
      fill(head, fields([['Name', ns.name], ['Description', ns.description], ['Active', yesNo(ns.active)]]));
    }
    const items = [...subscriptions.values()].sort((a, b) => (a.api < b.api ? -1 : 1));
    keyed(t.tbody, items, (s) => s.api, create, update);
    fill(empty, ns && !items.length && !errorOf.subscriptions ? notice('No subscriptions.') : null);
  }, 100);

  followObject(`/namespaces/${seg(namespace)}`, (n, error) => {
    ns = n;
    errorOf = { ...errorOf, namespace: error };
    draw();
  }, { signal });
  followCollection(`/namespaces/${seg(namespace)}/subscriptions`, (s) => s.api, (map, error) => {
    subscriptions = map;
    errorOf = { ...errorOf, subscriptions: error };
    draw();
  }, { signal });
}
