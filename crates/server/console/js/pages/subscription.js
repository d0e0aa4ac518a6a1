// #/namespaces/NS/subscriptions/API: every field of the subscription
// (§4.3), then its runs (§4.4) newest first, each with its steps.

import { seg } from '../api.js';
import { duration, el, fields, fill, link, notice, table, throttle, time, yesNo } from '../dom.js';
import { followCollection, followObject } from '../live.js';

const RUN_COLUMNS = ['ID', 'Trigger', 'Sync ID', 'Result', 'Started', 'Duration', 'Error'];
const STEP_COLUMNS = ['Index', 'Method', 'Endpoint', 'Async', 'Status', 'Attempts', 'Duration (ms)', 'Outputs', 'Error'];

function outputs(map) {
  const entries = Object.entries(map ?? {});
  if (!entries.length) return '';
  return el('dl', { class: 'outputs' }, entries.map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
}

function steps(run) {
  if (!run.steps?.length) return el('p', { class: 'muted' }, 'No steps (placeholder run).');
  const t = table({ caption: `Steps of run ${run.id}`, columns: STEP_COLUMNS.map((label) => ({ label })) });
  t.table.classList.add('steps');
  for (const s of run.steps) {
    t.tbody.append(el('tr', { class: s.error ? 'failed' : null },
      el('td', {}, s.index), el('td', {}, s.method), el('td', { class: 'mono endpoint' }, s.endpoint),
      el('td', {}, yesNo(s.async)), el('td', {}, s.status), el('td', {}, s.attempts), el('td', {}, s.duration_ms),
      el('td', {}, outputs(s.outputs)), el('td', { class: 'error-text' }, s.error)));
  }
  return t.region;
}

/** A run as a <tbody> of two rows: its fields, then its steps in a <details>. */
function runBody(run) {
  const n = run.steps?.length ?? 0;
  const details = el('details', { class: 'run-steps' },
    el('summary', {}, `${n} step${n === 1 ? '' : 's'}`), steps(run));
  return el('tbody', { class: `run ${run.result}` },
    el('tr', {},
      el('td', { class: 'mono' }, run.id), el('td', {}, run.trigger), el('td', { class: 'mono' }, run.sync_id),
      el('td', { class: 'result' }, run.result), el('td', {}, time(run.started_at)),
      el('td', {}, duration(run.started_at, run.finished_at)), el('td', { class: 'error-text' }, run.error)),
    el('tr', { class: 'details-row' }, el('td', { colspan: RUN_COLUMNS.length }, details)));
}

export function render(view, { namespace, api }, signal) {
  let sub = null;
  let runs = new Map();
  let errorOf = { subscription: null, runs: null };
  const path = `/namespaces/${seg(namespace)}/subscriptions/${seg(api)}`;
  const head = el('div');
  let lastHead = '';
  const errors = el('div');
  const runErrors = el('div');
  const t = table({ caption: 'Runs, newest first', id: 'runs', columns: RUN_COLUMNS.map((label) => ({ label })) });
  t.tbody.remove(); // one <tbody> per run instead
  fill(view,
    el('h1', {}, `${namespace} / ${api}`),
    el('p', {}, 'Namespace ', link(`#/namespaces/${seg(namespace)}`, namespace), ', API ',
      link(`#/apis/${seg(api)}`, api)),
    errors, head, el('h2', {}, 'Runs'), runErrors, t.region);

  const draw = throttle(() => {
    const messages = new Set(Object.values(errorOf).filter(Boolean).map((e) => e.message));
    fill(errors, errorOf.subscription ? notice(errorOf.subscription.message, 'error') : null);
    const shown = JSON.stringify(sub);
    if (sub && shown !== lastHead) {
      lastHead = shown; // rebuild the fields only when they changed
      fill(head, fields([
        ['Namespace', link(`#/namespaces/${seg(sub.namespace)}`, sub.namespace)],
        ['API', link(`#/apis/${seg(sub.api)}`, sub.api)],
        ['Active', yesNo(sub.active)], ['State', sub.state],
        ['Current sync ID', sub.current_sync_id], ['Expected sync ID', sub.expected_sync_id],
        ['Synced', yesNo(sub.synced)],
      ]));
    }
    const items = [...runs.values()].sort((a, b) =>
      a.started_at === b.started_at ? (a.id < b.id ? 1 : -1) : a.started_at < b.started_at ? 1 : -1);
    // Runs never change once recorded: keep each one's <tbody> (and
    // whether its <details> is open), add the new ones on top.
    const old = new Map([...t.table.tBodies].map((body) => [body.dataset.key, body]));
    const next = items.map((run) => old.get(run.id) ?? runBody(run));
    next.forEach((body, i) => { body.dataset.key = items[i].id; });
    const current = [...t.table.tBodies];
    if (next.length !== current.length || next.some((body, i) => current[i] !== body)) {
      for (const body of current) body.remove();
      t.table.append(...next);
    }
    const runError = errorOf.runs && !messages.has(errorOf.runs.message) ? errorOf.runs : null;
    fill(runErrors, runError ? notice(runError.message, 'error')
      : !items.length && !errorOf.runs ? notice('No runs recorded yet.') : null);
  }, 100);

  followObject(path, (s, error) => {
    sub = s;
    errorOf = { ...errorOf, subscription: error };
    draw();
  }, { signal });
  followCollection(`${path}/runs`, (r) => r.id, (map, error) => {
    runs = map;
    errorOf = { ...errorOf, runs: error };
    draw();
  }, { signal });
}
