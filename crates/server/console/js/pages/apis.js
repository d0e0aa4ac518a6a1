// #/apis: every API registration with its fan-out progress, sortable.

import { seg } from '../api.js';
import { el, fill, keyed, link, notice, setText, table, throttle } from '../dom.js';
import { counts, countsText, followFleet } from '../fleet.js';

const COLUMNS = [
  { label: 'Name', key: 'name' },
  { label: 'Short name', key: 'short_name' },
  { label: 'Mode', key: 'mode' },
  { label: 'Sync ID', key: 'sync_id' },
  { label: 'Sync ID set at', key: 'sync_id_updated_at' },
  { label: 'Description', key: 'description' },
  { label: 'Subscribers', key: 'progress' },
];

/** A progress bar and its text for a status; `update` moves them in place. */
export function progress(label) {
  const bar = el('progress', { value: 0, max: 0, 'aria-label': `${label} fan-out` });
  const text = el('span', { class: 'counts' });
  // The pending ones a rollout holds back (§12), shown only while there are any.
  const held = el('span', { class: 'held' });
  held.hidden = true;
  const node = el('span', { class: 'progress' }, bar, text, held);
  return {
    node,
    update(status, error) {
      const c = counts(status);
      node.classList.toggle('refused', !!error);
      held.hidden = !(status?.held > 0) || !!error;
      if (!held.hidden) setText(held, `${status.held} held by the rollout`);
      if (error) {
        setText(text, error.message); // e.g. a 403: where the counts would be
        return;
      }
      if (!status) {
        setText(text, 'loading…');
        return;
      }
      bar.setAttribute('max', c.total);
      bar.setAttribute('value', c.synced);
      const next = countsText(c);
      if (text.textContent !== next && text.textContent !== 'loading…') {
        // Restart the highlight: the eye follows a fan-out as it moves.
        text.classList.remove('changed');
        void text.offsetWidth;
        text.classList.add('changed');
      }
      setText(text, next);
      node.classList.toggle('failed', c.failed > 0);
      node.classList.toggle('done', c.total > 0 && c.synced === c.total);
    },
  };
}

export function render(view, _params, signal) {
  let sort = { key: 'name', direction: 'ascending' };
  let fleet = { registrations: new Map(), statuses: new Map(), statusErrors: new Map(), error: null };
  const message = el('div');
  const t = table({
    caption: 'API registrations',
    columns: COLUMNS,
    id: 'apis',
    onSort(key) {
      sort = { key, direction: sort.key === key && sort.direction === 'ascending' ? 'descending' : 'ascending' };
      draw();
    },
  });
  fill(view, el('h1', {}, 'APIs'), message, t.region);

  const value = (registration, key) => {
    if (key !== 'progress') return registration[key] ?? '';
    const c = counts(fleet.statuses.get(registration.name));
    return c.total ? c.synced / c.total : -1;
  };

  function create(registration) {
    const cells = {
      name: el('td', {}, link(`#/apis/${seg(registration.name)}`, registration.name)),
      short_name: el('td'), mode: el('td'), sync_id: el('td', { class: 'mono' }),
      sync_id_updated_at: el('td', { class: 'mono' }), description: el('td', { class: 'description' }),
    };
    const bar = progress(registration.name);
    const row = el('tr', {}, Object.values(cells), el('td', {}, bar.node));
    row.cells_ = cells;
    row.bar_ = bar;
    update(row, registration);
    return row;
  }

  function update(row, registration) {
    for (const key of ['short_name', 'mode', 'sync_id', 'sync_id_updated_at', 'description']) {
      setText(row.cells_[key], registration[key] ?? '');
    }
    row.bar_.update(fleet.statuses.get(registration.name), fleet.statusErrors.get(registration.name));
  }

  const draw = throttle(() => {
    if (fleet.error) fill(message, notice(fleet.error.message, 'error'));
    else fill(message);
    const items = [...fleet.registrations.values()].sort((a, b) => {
      const x = value(a, sort.key);
      const y = value(b, sort.key);
      const order = x < y ? -1 : x > y ? 1 : a.name < b.name ? -1 : 1;
      return sort.direction === 'ascending' ? order : -order;
    });
    t.setSort(sort.key, sort.direction);
    keyed(t.tbody, items, (r) => r.name, create, update);
    if (!items.length && !fleet.error) fill(message, notice('No API registrations yet.'));
  }, 100);

  followFleet(signal, (next) => {
    fleet = next;
    draw();
  });
}
