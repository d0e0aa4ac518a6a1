// The fleet: every API registration of this deployment with its fan-out
// status (§4.2 `/status`). Shared by the APIs and Namespaces pages.
//
// Registrations come from their watch stream. Each registration's /status
// is polled rather than streamed: a browser holds at most six connections
// to a server, and a page with many APIs must not spend them all on
// streams. A registration event (a SyncID bump) makes its status poll at
// once, and a fan-out in progress is polled every second.

import { seg } from './api.js';
import { followCollection, followObject, poker } from './live.js';

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
 * Follows the fleet until `signal` aborts: `onChange({registrations,
 * statuses, statusErrors, error})`, registrations a Map name →
 * registration, statuses a Map name → /status, statusErrors a Map name →
 * the ApiError of its last /status call (a caller may list APIs without
 * the right to read their status).
 */
export function followFleet(signal, onChange) {
  const statuses = new Map();
  const statusErrors = new Map();
  const pollers = new Map(); // name → {controller, wake, syncId}
  let registrations = new Map();
  let error = null;
  const changed = () => onChange({ registrations, statuses, statusErrors, error });

  followCollection('/apiregistrations', (r) => r.name, (map, e) => {
    registrations = map;
    error = e;
    for (const [name, registration] of map) {
      const known = pollers.get(name);
      if (!known) {
        startPoller(name, registration.sync_id);
      } else if (known.syncId !== registration.sync_id) {
        known.syncId = registration.sync_id;
        known.wake.poke();
      }
    }
    for (const [name, poller] of pollers) {
      if (!map.has(name)) {
        poller.controller.abort();
        pollers.delete(name);
        statuses.delete(name);
        statusErrors.delete(name);
      }
    }
    changed();
  }, { signal });

  function startPoller(name, syncId) {
    const controller = new AbortController();
    signal.addEventListener('abort', () => controller.abort(), { once: true });
    const wake = poker();
    pollers.set(name, { controller, wake, syncId });
    const interval = () => {
      const c = counts(statuses.get(name));
      return c.pending > 0 ? 1000 : 5000;
    };
    followObject(`/apiregistrations/${seg(name)}/status`, (status, e) => {
      if (status) statuses.set(name, status);
      if (e) statusErrors.set(name, e);
      else statusErrors.delete(name);
      changed();
    }, { signal: controller.signal, stream: false, interval, wake });
  }
}
