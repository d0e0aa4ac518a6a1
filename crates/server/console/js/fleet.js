// The fleet: every API registration of this deployment with its fan-out
// status (§4.2 `/status`). Shared by the APIs and Namespaces pages.
//
// Registrations come from their watch stream. A registration's /status is
// asked for its counts alone (`?limit=1`: one subscriber, never the whole
// list, so a fleet of a million subscriptions is a few small documents) and
// streamed (`?watch=true`: the server sends the document again, coalesced,
// whenever it changes) while its fan-out has pending subscribers, and
// polled every 5 s otherwise. A browser holds at most six connections to a
// server, so at most MAX_STREAMS statuses are streamed at once; a fan-out
// beyond that is polled every second until a stream is free. A
// registration event (a SyncID bump) starts its stream at once.

import { seg } from './api.js';
import { el, link, setText, yesNo } from './dom.js';
import { followCollection, followObject, poker } from './live.js';

/** Status streams a page may hold besides its registrations stream. */
const MAX_STREAMS = 3;

/** The §4.2 counts; computed from the subscribers when the server omits them. */
export function counts(status) {
  const subscribers = status?.subscribers ?? [];
  const synced = status?.synced ?? subscribers.filter((s) => s.synced).length;
  const failed = status?.failed ?? subscribers.filter((s) => !s.synced && s.state === 'error').length;
  const total = status?.total ?? subscribers.length;
  const pending = status?.pending ?? total - synced - failed;
  return { total, synced, failed, pending };
}

/** "S/T synced, F failed, P pending". */
export function countsText(c) {
  return `${c.synced}/${c.total} synced, ${c.failed} failed, ${c.pending} pending`;
}

/** A subscriber's category in those counts. */
export function category(subscriber) {
  if (subscriber.synced) return 'synced';
  return subscriber.state === 'error' ? 'failed' : 'pending';
}

/**
 * The columns of a subscription row, the first one labelled `first`; with
 * `wave`, the subscriber's rollout wave (§12) last.
 */
export function subscriptionColumns(first, { wave = false } = {}) {
  return [first, 'Active', 'State', 'Current sync ID', 'Expected sync ID', 'Synced', ...(wave ? ['Wave'] : [])]
    .map((label) => ({ label }));
}

/**
 * Rows of subscriptions, as an API's subscribers and a namespace's
 * subscriptions show them: `{create, update}` for `keyed`. The first cell
 * links to `href(s)` with the text `label(s)`; `expected(s)` is the SyncID
 * the row is measured against. With `wave`, a cell shows the subscriber's
 * wave in the rollout of the current SyncID (`—` outside one).
 */
export function subscriptionRows({ href, label, expected, wave = false }) {
  function update(row, s) {
    const { wave: inWave, active, state, current, want, synced } = row.cells_;
    if (inWave) setText(inWave, s.wave || '—');
    setText(active, yesNo(s.active));
    setText(state, s.state);
    setText(current, s.current_sync_id);
    setText(want, expected(s));
    setText(synced, yesNo(s.synced));
    row.className = category(s);
  }
  function create(s) {
    const cells = {
      first: el('td', {}, link(href(s), label(s))), active: el('td'), state: el('td'),
      current: el('td', { class: 'mono' }), want: el('td', { class: 'mono' }), synced: el('td', { class: 'synced' }),
      wave: wave ? el('td', { class: 'wave' }) : null,
    };
    const row = el('tr', {}, Object.values(cells));
    row.cells_ = cells;
    update(row, s);
    return row;
  }
  return { create, update };
}

/**
 * Follows the fleet until `signal` aborts: `onChange({registrations,
 * statuses, statusErrors, error})`, registrations a Map name →
 * registration, statuses a Map name → /status, statusErrors a Map name →
 * the ApiError of its last /status call (a caller may list APIs without
 * the right to read their status).
 */
export function followFleet(signal, onChange) {
  const statuses = new Map();
  const statusErrors = new Map();
  const followers = new Map(); // name → {controller, wake, syncId, streaming}
  let registrations = new Map();
  let error = null;
  const changed = () => onChange({ registrations, statuses, statusErrors, error });
  const streams = () => [...followers.values()].filter((f) => f.streaming).length;
  const pending = (name) => counts(statuses.get(name)).pending > 0;

  followCollection('/apiregistrations', (r) => r.name, (map, e) => {
    registrations = map;
    error = e;
    for (const [name, registration] of map) {
      const known = followers.get(name);
      if (!known) {
        follow(name, registration.sync_id, streams() < MAX_STREAMS);
      } else if (known.syncId !== registration.sync_id) {
        known.syncId = registration.sync_id;
        if (!known.streaming && streams() < MAX_STREAMS) follow(name, known.syncId, true);
        else known.wake.poke();
      }
    }
    for (const [name, follower] of followers) {
      if (!map.has(name)) {
        follower.controller.abort();
        followers.delete(name);
        statuses.delete(name);
        statusErrors.delete(name);
      }
    }
    changed();
  }, { signal });

  /** (Re)starts following `name`'s status, as a stream or by polling. */
  function follow(name, syncId, streaming) {
    followers.get(name)?.controller.abort();
    const controller = new AbortController();
    signal.addEventListener('abort', () => controller.abort(), { once: true });
    const wake = poker();
    const follower = { controller, wake, syncId, streaming };
    followers.set(name, follower);
    const interval = () => (pending(name) ? 1000 : 5000);
    followObject(`/apiregistrations/${seg(name)}/status?limit=1`, (status, e) => {
      if (controller.signal.aborted) return;
      if (status) statuses.set(name, status);
      if (e) statusErrors.set(name, e);
      else statusErrors.delete(name);
      // A settled fan-out frees its stream; a moving one takes a free one.
      if (follower.streaming && status && !pending(name)) follow(name, follower.syncId, false);
      else if (!follower.streaming && pending(name) && streams() < MAX_STREAMS) follow(name, follower.syncId, true);
      changed();
    }, { signal: controller.signal, stream: streaming, interval, wake });
  }
}
