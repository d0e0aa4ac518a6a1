// An API's rollout (platform §12) on its page: the rollout's state and
// reason, its current wave, and a table of its waves, followed live from
// `GET /apiregistrations/NAME/rollout?watch=true`.
//
// Before any rollout the GET and its stream answer 404; the section then
// says so, and the stream is asked for again every few seconds. A rollout
// starts when the SyncID moves, so the page also hands every /status it
// receives to `status()`: a SyncID that the shown rollout is not for
// re-opens the stream at once, so a new rollout appears without a reload.

import { seg } from './api.js';
import { el, fields, fill, keyed, notice, setText, table, time } from './dom.js';
import { countsText } from './fleet.js';
import { followObject } from './live.js';

const COLUMNS = ['Wave', 'State', 'Subscribers', 'Started', 'Finished', 'Gate'].map((label) => ({ label }));

/** A wave's gate result as text: "—" before (or without) a gate. */
export function gateText(gate) {
  if (!gate) return '—';
  let text = gate.result || 'unknown';
  if (gate.status) text += ` (HTTP ${gate.status})`;
  if (gate.error) text += `: ${gate.error}`;
  return text;
}

/**
 * The rollout section of API `name`'s page until `signal` aborts: returns
 * {node, status(s)}; call `status` with every /status the page receives.
 */
export function rolloutSection(name, signal) {
  let rollout = null;
  let error = null;
  let loaded = false;
  let follower = null; // the AbortController of the current stream
  let lastSyncId = null;

  const state = el('span', { id: 'rollout-state', class: 'rollout-state' });
  const reason = el('span', { id: 'rollout-reason' });
  const current = el('span', { id: 'rollout-wave' });
  const syncId = el('span', { id: 'rollout-sync-id', class: 'mono' });
  const started = el('span');
  const updated = el('span');
  const head = fields([
    ['Sync ID', syncId], ['State', state], ['Reason', reason], ['Current wave', current],
    ['Started', started], ['Updated', updated],
  ]);
  const t = table({ caption: 'Waves', id: 'waves', columns: COLUMNS });
  const details = el('div', { id: 'rollout-details' }, head, t.region);
  const message = el('div', { id: 'rollout-message' });
  const node = el('section', { id: 'rollout', 'aria-labelledby': 'rollout-title' },
    el('h2', { id: 'rollout-title' }, 'Rollout'), message, details);
  details.hidden = true;

  function createWave(wave) {
    const bar = el('progress', { value: 0, max: 0, 'aria-label': `wave ${wave.name}` });
    const cells = {
      name: el('td', {}, wave.name), state: el('td', { class: 'wave-state' }),
      counts: el('td', {}, el('span', { class: 'progress' }, bar, el('span', { class: 'counts' }))),
      started: el('td', { class: 'mono' }), finished: el('td', { class: 'mono' }), gate: el('td', { class: 'gate' }),
    };
    const row = el('tr', {}, Object.values(cells));
    row.cells_ = cells;
    row.bar_ = bar;
    updateWave(row, wave);
    return row;
  }

  function updateWave(row, wave) {
    const { state: s, counts, started: from, finished, gate } = row.cells_;
    setText(s, wave.state);
    row.bar_.setAttribute('max', wave.total);
    row.bar_.setAttribute('value', wave.synced);
    setText(counts.querySelector('.counts'), countsText(wave));
    const shown = counts.firstChild;
    shown.classList.toggle('done', wave.total > 0 && wave.synced === wave.total);
    shown.classList.toggle('failed', wave.failed > 0);
    if (from.textContent !== (wave.started_at || '—')) fill(from, time(wave.started_at));
    if (finished.textContent !== (wave.finished_at || '—')) fill(finished, time(wave.finished_at));
    setText(gate, gateText(wave.gate));
    row.className = `wave ${wave.state}`;
    const isCurrent = rollout && rollout.waves[rollout.wave] === wave;
    row.classList.toggle('current', isCurrent);
    if (isCurrent) row.setAttribute('aria-current', 'step');
    else row.removeAttribute('aria-current');
  }

  function draw() {
    const missing = !rollout && (!error || error.status === 404);
    if (error && error.status !== 404) fill(message, notice(error.message, 'error'));
    else if (missing && loaded) fill(message, notice('No rollout has started.'));
    else if (missing) fill(message, notice('loading…'));
    else fill(message);
    details.hidden = !rollout;
    if (!rollout) return;
    setText(syncId, rollout.sync_id);
    setText(state, rollout.state);
    state.className = `rollout-state ${rollout.state}`;
    setText(reason, rollout.reason || '—');
    const wave = rollout.waves[rollout.wave];
    setText(current, wave ? `${wave.name} (${rollout.wave + 1} of ${rollout.waves.length})` : '—');
    if (started.textContent !== (rollout.started_at || '—')) fill(started, time(rollout.started_at));
    if (updated.textContent !== (rollout.updated_at || '—')) fill(updated, time(rollout.updated_at));
    keyed(t.tbody, rollout.waves, (w) => w.name, createWave, updateWave);
  }

  /** (Re)opens the rollout's stream; what it sends first replaces what was shown. */
  function follow() {
    follower?.abort();
    follower = new AbortController();
    const mine = follower;
    signal.addEventListener('abort', () => mine.abort(), { once: true });
    followObject(`/apiregistrations/${seg(name)}/rollout`, (r, e) => {
      if (mine.signal.aborted) return;
      loaded = true;
      // A 404 (none started, or deleted) is "no rollout", not stale data.
      rollout = e && e.status === 404 ? null : r;
      error = e;
      draw();
    }, { signal: mine.signal, absent: true });
  }

  draw();
  follow();
  return {
    node,
    /** A /status document: a SyncID no shown rollout is for re-opens the stream. */
    status(s) {
      if (!s || s.sync_id === lastSyncId) return;
      const first = lastSyncId === null;
      lastSyncId = s.sync_id;
      if (!first && (!rollout || rollout.sync_id !== s.sync_id)) follow();
    },
  };
}
