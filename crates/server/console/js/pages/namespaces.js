// #/namespaces: every namespace, and the APIs it subscribes to (taken from
// the fleet's /status documents: one request per API, not per namespace).

import { seg } from '../api.js';
import { el, fill, keyed, link, notice, pager, setText, table, throttle, yesNo } from '../dom.js';
import { followFleet } from '../fleet.js';
import { followCollection } from '../live.js';

const PAGE = 100;

export function render(view, _params, signal) {
  let namespaces = new Map();
  let error = null;
  let subscribed = new Map(); // namespace → [api]
  const message = el('div');
  const pages = pager('Namespace pages', PAGE, () => draw());
  const t = table({
    caption: 'Namespaces',
    id: 'namespaces',
    columns: ['Name', 'Description', 'Active', 'Subscribes to'].map((label) => ({ label })),
  });
  fill(view, el('h1', {}, 'Namespaces'), message, pages.nav, t.region);

  function create(ns) {
    const cells = [el('td', {}, link(`#/namespaces/${seg(ns.name)}`, ns.name)), el('td', { class: 'description' }),
      el('td'), el('td')];
    const row = el('tr', {}, cells);
    row.cells_ = cells;
    update(row, ns);
    return row;
  }

  function update(row, ns) {
    const [, description, active, apis] = row.cells_;
    setText(description, ns.description);
    setText(active, yesNo(ns.active));
    const names = subscribed.get(ns.name) ?? [];
    if (apis.dataset.apis !== names.join(' ')) {
      apis.dataset.apis = names.join(' ');
      fill(apis, el('ul', { class: 'inline' }, names.map((api) =>
        el('li', {}, link(`#/namespaces/${seg(ns.name)}/subscriptions/${seg(api)}`, api)))));
    }
  }

  const draw = throttle(() => {
    fill(message, error ? notice(error.message, 'error') : null);
    const items = [...namespaces.values()].sort((a, b) => (a.name < b.name ? -1 : 1));
    keyed(t.tbody, pages.slice(items), (ns) => ns.name, create, update);
    if (!items.length && !error) fill(message, notice('No namespaces yet.'));
  }, 100);

  followCollection('/namespaces', (ns) => ns.name, (map, e) => {
    namespaces = map;
    error = e;
    draw();
  }, { signal });
  followFleet(signal, ({ statuses }) => {
    const next = new Map();
    for (const [api, status] of [...statuses].sort(([a], [b]) => (a < b ? -1 : 1))) {
      for (const s of status.subscribers ?? []) {
        if (!next.has(s.namespace)) next.set(s.namespace, []);
        next.get(s.namespace).push(api);
      }
    }
    subscribed = next;
    draw();
  });
}
