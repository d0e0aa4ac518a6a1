// #/namespaces: every namespace, and the APIs it subscribes to: asked of
// the namespaces on the page shown (one small list each, again every
// REFRESH), never every API's subscribers.

import { getJSON, seg } from '../api.js';
import { el, fill, keyed, link, notice, pager, setText, table, throttle, yesNo } from '../dom.js';
import { followCollection } from '../live.js';

const PAGE = 100;
const REFRESH = 5000;

export function render(view, _params, signal) {
  let namespaces = new Map();
  let error = null;
  const subscribed = new Map(); // namespace → [api]
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

  let shown = [];
  const asked = new Map(); // namespace → when its subscriptions were last asked for
  /** The subscriptions of the namespaces shown, asked for again after REFRESH. */
  async function subscriptions() {
    const due = shown.filter((ns) => !(performance.now() - (asked.get(ns.name) ?? -Infinity) < REFRESH));
    await Promise.all(due.map(async (ns) => {
      asked.set(ns.name, performance.now());
      try {
        const list = await getJSON(`/namespaces/${seg(ns.name)}/subscriptions`, { signal });
        subscribed.set(ns.name, list.items.map((s) => s.api).sort());
      } catch (e) {
        if (!signal.aborted) subscribed.delete(ns.name); // no right to list them: nothing to show
      }
    }));
    if (due.length && !signal.aborted) draw();
  }

  const draw = throttle(() => {
    fill(message, error ? notice(error.message, 'error') : null);
    const items = [...namespaces.values()].sort((a, b) => (a.name < b.name ? -1 : 1));
    shown = pages.slice(items);
    keyed(t.tbody, shown, (ns) => ns.name, create, update);
    if (!items.length && !error) fill(message, notice('No namespaces yet.'));
    subscriptions();
  }, 100);
  const timer = setInterval(() => subscriptions(), REFRESH);
  signal.addEventListener('abort', () => clearInterval(timer), { once: true });

  followCollection('/namespaces', (ns) => ns.name, (map, e) => {
    namespaces = map;
    error = e;
    draw();
  }, { signal });
}
