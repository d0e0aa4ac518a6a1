// #/apis/NAME: one registration, its fan-out progress, and its subscribers,
// filterable by count and paged by the server (§4.2 `?limit&continue`,
// `?category=`): the page never holds more than the 100 rows it shows,
// whatever the number of subscribers. The counts are streamed
// (`/status?limit=1&watch=true`, coalesced by the server), and polled only
// where the server or the caller's rights allow no stream; the page shown
// is asked for again, at most every second, while they move. The rollout
// of the latest SyncID change (§12) is followed beside it
// (`../rollout.js`), with each subscriber's wave in the list.

import { getJSON, seg } from '../api.js';
import { el, fields, fill, keyed, notice, serverPager, table, throttle, time } from '../dom.js';
import { subscriptionColumns, subscriptionRows } from '../fleet.js';
import { followObject, poker } from '../live.js';
import { rolloutSection } from '../rollout.js';
import { progress } from './apis.js';

const PAGE = 100;

/**
 * Who last changed the registration's SyncID and why (platform §13), from
 * the audit trail: the newest `/sync` record, or a newer PUT/PATCH that
 * moved `sync_id`. `null` when none is kept or the caller may not read the
 * trail.
 */
async function lastSyncChange(name, signal) {
  const query = (resource, limit) =>
    `/audit?resource=${encodeURIComponent(resource)}&name=${encodeURIComponent(name)}&limit=${limit}`;
  const [bumps, writes] = await Promise.all([
    getJSON(query('apiregistrations/sync', 1), { signal }),
    getJSON(query('apiregistrations', 20), { signal }),
  ]);
  const moved = writes.items.filter((r) => r.after && r.after.sync_id !== (r.before?.sync_id ?? null));
  const candidates = [...bumps.items, ...moved].sort((a, b) => (a.id < b.id ? 1 : -1));
  return candidates[0] ?? null;
}
/** The filters: every subscriber, or those one count counts (`?category=`). */
const FILTERS = [
  ['all', 'all'], ['synced', 'synced'], ['pending', 'pending (not synced, not failed)'],
  ['failed', 'failed (not synced, state error)'],
];

export function render(view, { name }, signal) {
  let registration = null;
  let status = null;
  let filter = 'all';
  let marked = false;
  const head = el('div');
  const changedBy = el('p', { id: 'sync-changed-by' });
  let lastHead = '';
  const bar = progress(name);
  const errors = el('div');
  const empty = el('div');
  let errorOf = { registration: null, status: null, page: null };
  // The page shown: its rows, the continue token of each page up to it.
  let rows = null;
  let rowsOf = { at: 0, filter: 'all' }; // the page and filter `rows` are of
  let tokens = [''];
  let at = 0;
  let more = false;
  let loading = 0;
  const load = async () => {
    const ticket = ++loading;
    const asked = { at, filter };
    const query = new URLSearchParams({ limit: String(PAGE) });
    if (tokens[at]) query.set('continue', tokens[at]);
    if (filter !== 'all') query.set('category', filter);
    try {
      const page = await getJSON(`/apiregistrations/${seg(name)}/status?${query}`, { signal });
      if (ticket !== loading) return; // a newer page was asked for
      const first = rows === null;
      rows = page.subscribers;
      rowsOf = asked;
      more = !!page.continue;
      tokens[at + 1] = page.continue ?? '';
      errorOf = { ...errorOf, page: null };
      if (first) return draw.now(); // the first rows at once
    } catch (error) {
      if (signal.aborted || ticket !== loading) return;
      errorOf = { ...errorOf, page: error };
    }
    draw();
  };
  const refresh = throttle(load, 1000);
  const pages = serverPager('Subscriber pages',
    () => { if (at > 0) { at -= 1; load(); } },
    () => { if (more) { at += 1; load(); } });
  const select = el('select', { id: 'state-filter' }, FILTERS.map(([v, label]) => el('option', { value: v }, label)));
  select.addEventListener('change', () => {
    filter = select.value;
    tokens = [''];
    at = 0;
    load();
  });
  const t = table({
    caption: 'Subscribers',
    id: 'subscribers',
    columns: subscriptionColumns('Namespace', { wave: true }),
  });
  const rollout = rolloutSection(name, signal);
  fill(view,
    el('h1', {}, name), head, changedBy,
    el('p', { id: 'fan-out' }, bar.node),
    rollout.node,
    el('h2', {}, 'Subscribers'),
    el('p', { class: 'filter' }, el('label', { for: 'state-filter' }, 'State'), ' ', select),
    errors, empty, pages.nav, t.region);

  const { create, update } = subscriptionRows({
    href: (s) => `#/namespaces/${seg(s.namespace)}/subscriptions/${seg(name)}`,
    label: (s) => s.namespace,
    expected: () => status?.sync_id ?? registration?.sync_id ?? '',
    wave: true,
  });

  const draw = throttle(() => {
    const shown = JSON.stringify(registration);
    if (registration && shown !== lastHead) {
      lastHead = shown; // rebuild the fields only when they changed
      fill(head, fields([
        ['Name', registration.name], ['Short name', registration.short_name], ['Mode', registration.mode],
        ['Sync ID', registration.sync_id], ['Sync ID set at', time(registration.sync_id_updated_at)],
        ['Endpoint', registration.endpoint], ['Description', registration.description],
        ['Platform', registration.platform], ['Region', registration.region],
      ]));
    }
    bar.update(status, errorOf.status);
    const subscribers = rows ?? [];
    keyed(t.tbody, subscribers, (s) => s.namespace, create, update);
    // The pager tells of the rows shown, not of a page still on its way.
    const from = rowsOf.at * PAGE;
    const total = status ? (rowsOf.filter === 'all' ? status.total : status[rowsOf.filter]) : subscribers.length;
    pages.show({ from, shown: subscribers.length, total: Math.max(total, from + subscribers.length), more });
    if (rows && status && !marked) {
      marked = true;
      performance.mark('kayra:data'); // the first render with data (timed by the tests)
    }
    const messages = new Set(Object.values(errorOf).filter(Boolean).map((e) => e.message));
    fill(errors, [...messages].map((m) => notice(m, 'error')));
    const none = filter === 'all' ? 'No subscribers yet.' : 'No subscriber in this state.';
    fill(empty, rows && !subscribers.length ? notice(none) : null);
  }, 100);

  let asked = null;
  const who = async (syncId) => {
    if (asked === syncId) return;
    asked = syncId;
    try {
      const record = await lastSyncChange(name, signal);
      if (asked !== syncId) return;
      fill(changedBy, record
        ? ['Sync ID last changed by ', el('strong', { class: 'user' }, record.user), ' at ', time(record.time),
            ': ', el('q', { class: 'reason' }, record.reason || 'no reason given')]
        : null);
    } catch (error) {
      if (asked === syncId) fill(changedBy, null); // no right to read the audit trail: nothing to show
    }
  };

  const wake = poker();
  followObject(`/apiregistrations/${seg(name)}`, (r, error) => {
    if (r && registration && r.sync_id !== registration.sync_id) wake.poke();
    if (r) who(r.sync_id);
    registration = r;
    errorOf = { ...errorOf, registration: error };
    draw();
  }, { signal });
  load();
  followObject(`/apiregistrations/${seg(name)}/status?limit=1`, (s, error) => {
    const first = s && !status;
    const counted = (d) => JSON.stringify([d.sync_id, d.total, d.synced, d.failed, d.pending, d.held]);
    const moved = s && status && counted(s) !== counted(status);
    status = s;
    rollout.status(s);
    errorOf = { ...errorOf, status: error };
    if (moved) refresh(); // the rows shown may have moved with the counts
    if (first) draw.now(); // the counts at once, then throttled
    else draw();
  }, {
    signal,
    wake, // polling only: a SyncID bump fetches at once
    interval: () => (status && status.pending > 0 ? 1000 : 3000),
  });
}
