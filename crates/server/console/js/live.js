// Following the catalog API live (platform §4.5).
//
// A watch stream is `GET <path>?watch=true` read with fetch — the browser's
// EventSource cannot send an Authorization header — as NDJSON: one
// {"type": "ADDED"|"MODIFIED"|"DELETED", "object": {...}} a line, first an
// ADDED for everything that exists, then every change. A stream that drops
// is opened again with exponential back-off; what it sends first replaces
// what was known, so nothing is lost or kept stale across the gap.
//
// Where a route has no stream (the server answers the plain GET), or the
// caller may read but not watch (403 on the stream), the same data is
// polled, and the page renders it with the same code.

import { ApiError, getJSON, request, withParam } from './api.js';

const MIN_BACKOFF = 250;
const MAX_BACKOFF = 10_000;
/** How often an object that does not exist yet is asked for again. */
const ABSENT_RETRY = 3000;

let showMode = () => {};
const modes = new Map(); // follower → its mode
let followers = 0;

/**
 * Who shows how the page is kept current: "reconnecting" while any of its
 * followers is, else "live" while any reads a stream, else "polling".
 */
export function onMode(handler) {
  showMode = handler;
}

function publish() {
  const all = [...modes.values()];
  showMode(['reconnecting', 'live', 'polling'].find((m) => all.includes(m)) ?? '');
}

/** A follower's way to report its mode; forgotten when `signal` aborts. */
function reporter(signal) {
  const id = followers++;
  signal.addEventListener('abort', () => { modes.delete(id); publish(); }, { once: true });
  return (mode) => {
    if (signal.aborted || modes.get(id) === mode) return;
    modes.set(id, mode);
    publish();
  };
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });

/** Reads `body` line by line; `onLine` per line, `onBatch` after each chunk. */
async function readLines(body, onLine, onBatch) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    const lines = buffer.split('\n');
    buffer = lines.pop();
    for (const line of lines) if (line.trim()) onLine(JSON.parse(line));
    onBatch();
  }
}

/** A wake-up call for a poller: `poke()` makes it fetch now. */
export function poker() {
  let wake = () => {};
  return {
    poke: () => wake(),
    wait(ms, signal) {
      return new Promise((resolve) => {
        const timer = setTimeout(resolve, ms);
        wake = () => { clearTimeout(timer); resolve(); };
        signal.addEventListener('abort', wake, { once: true });
      });
    },
  };
}

/**
 * Follows `path`, feeding `sink`: {reset(), event(e), snapshot(json),
 * changed(), error(e)}. Options: `signal` stops it; `stream: false` polls
 * without trying a stream; `interval(sink)` is the polling period in ms;
 * `wake` (a poker) makes a poller fetch at once; `absent: true` takes a 404
 * as an object that does not exist yet (a rollout before the first one):
 * reported to the sink, asked for again every ABSENT_RETRY ms, and not a
 * dropped stream (the page is not "reconnecting").
 */
async function follow(path, sink, { signal, stream = true, interval = () => 2000, wake = poker(), absent = false }) {
  const reportMode = reporter(signal);
  let backoff = MIN_BACKOFF;
  while (stream && !signal.aborted) {
    const opened = performance.now();
    try {
      const response = await request(withParam(path, 'watch=true'), { signal, accept: 'application/x-ndjson' });
      const type = response.headers.get('content-type') ?? '';
      if (!type.startsWith('application/x-ndjson')) {
        // The route answered the plain GET: it has no stream. Poll,
        // starting from this answer.
        sink.snapshot(await response.json());
        sink.changed();
        reportMode('polling');
        await wake.wait(interval(sink), signal);
        break;
      }
      reportMode('live');
      let fresh = true;
      const first = () => {
        if (fresh) { fresh = false; sink.reset(); }
      };
      // An empty collection sends nothing: after a quiet moment the
      // (re)connected stream has told all there is.
      const quiet = setTimeout(() => { first(); sink.changed(); }, 300);
      try {
        await readLines(response.body, (e) => { first(); sink.event(e); }, () => sink.changed());
      } finally {
        clearTimeout(quiet); // a stream that drops at once must not empty the page
      }
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof ApiError) {
        if (error.status === 401) return; // the app is back at the sign-in
        // The caller may not watch (403), or the route takes no watch
        // (400/405): try reading it plainly instead.
        if ([400, 403, 405].includes(error.status)) break;
        sink.error(error); // 404 and friends: shown where the data would be
        if (absent && error.status === 404) {
          reportMode('absent'); // neither live nor reconnecting
          backoff = MIN_BACKOFF;
          await sleep(ABSENT_RETRY, signal);
          continue;
        }
      }
    }
    if (signal.aborted) return;
    reportMode('reconnecting');
    if (performance.now() - opened > 10_000) backoff = MIN_BACKOFF;
    await sleep(backoff + Math.random() * backoff * 0.2, signal);
    backoff = Math.min(backoff * 2, MAX_BACKOFF);
  }
  await poll(path, sink, { signal, interval, wake, reportMode });
}

async function poll(path, sink, { signal, interval, wake, reportMode }) {
  let backoff = MIN_BACKOFF;
  while (!signal.aborted) {
    let wait;
    try {
      sink.snapshot(await getJSON(path, { signal }));
      sink.changed();
      reportMode('polling');
      backoff = MIN_BACKOFF;
      wait = interval(sink);
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof ApiError) {
        if (error.status === 401) return;
        sink.error(error);
        wait = Math.max(interval(sink), 5000);
      } else {
        reportMode('reconnecting');
        wait = backoff;
        backoff = Math.min(backoff * 2, MAX_BACKOFF);
      }
    }
    await wake.wait(wait, signal);
  }
}

/**
 * Follows a collection: `onChange(map, error)` with a Map key → object,
 * `error` an ApiError when the last attempt failed (e.g. 403).
 */
export function followCollection(path, key, onChange, options) {
  let map = new Map();
  let error = null;
  const sink = {
    reset() { map = new Map(); },
    event(e) {
      if (!e || !e.object) return;
      if (e.type === 'DELETED') map.delete(key(e.object));
      else map.set(key(e.object), e.object);
      error = null;
    },
    snapshot(json) {
      map = new Map((json.items ?? []).map((item) => [key(item), item]));
      error = null;
    },
    changed() { onChange(map, error); },
    error(e) { error = e; onChange(map, error); },
  };
  follow(path, sink, options);
}

/** Follows one object: `onChange(object | null, error)`. */
export function followObject(path, onChange, options) {
  let object = null;
  let error = null;
  const sink = {
    reset() {},
    event(e) {
      if (!e) return;
      if (e.type === 'DELETED') {
        object = null;
        error = new ApiError(404, 'deleted');
      } else {
        object = e.object;
        error = null;
      }
    },
    snapshot(json) { object = json; error = null; },
    changed() { onChange(object, error); },
    error(e) { error = e; onChange(object, error); },
  };
  follow(path, sink, options);
}
