// Building the page. Every value from the API goes in as a text node or an
// attribute value set through the DOM: no markup is ever parsed from data.

/**
 * An element: `el('a', {href: '#/apis'}, 'APIs')`. Attributes are set with
 * setAttribute (`class`, `for`, `aria-*`…), `null`/`false` ones skipped;
 * children are nodes or strings (as text).
 */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    node.setAttribute(name, value === true ? '' : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces the children of `node`. */
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

export const link = (href, text) => el('a', { href }, text);
export const yesNo = (value) => (value ? 'yes' : 'no');

/** A timestamp as the API gives it (RFC 3339 UTC), or an em dash. */
export function time(value) {
  return value ? el('time', { datetime: value }, value) : '—';
}

/** Milliseconds between two RFC 3339 times, as text. */
export function duration(start, end) {
  const ms = Date.parse(end) - Date.parse(start);
  if (!Number.isFinite(ms) || ms < 0) return '—';
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

/** A message where the data would be (a 403, a 404, "no runs yet"). */
export function notice(text, kind = 'info') {
  return el('p', { class: `notice ${kind}`, role: kind === 'error' ? 'alert' : null }, text);
}

/** `<dl>` of label → value pairs; values are nodes or text. */
export function fields(pairs) {
  return el('dl', { class: 'fields' }, pairs.map(([label, value]) => [el('dt', {}, label), el('dd', {}, value)]));
}

/**
 * A table in a horizontally scrolling region (readable on a phone).
 * `columns`: [{label, key?}] — with `key` and `onSort`, the header is a
 * button that sorts by it. Returns {region, table, tbody, setSort}.
 */
export function table({ caption, columns, onSort, id }) {
  const headers = columns.map((column) => {
    const th = el('th', { scope: 'col' });
    if (column.key && onSort) {
      const button = el('button', { type: 'button', class: 'sort' }, column.label);
      button.addEventListener('click', () => onSort(column.key));
      th.append(button);
    } else {
      th.append(column.label);
    }
    th.dataset.key = column.key ?? '';
    return th;
  });
  const tbody = el('tbody');
  const t = el('table', { id }, el('caption', {}, caption), el('thead', {}, el('tr', {}, headers)), tbody);
  const region = el('div', { class: 'scroll', role: 'region', 'aria-label': caption, tabindex: 0 }, t);
  const setSort = (key, direction) => {
    for (const th of headers) {
      if (th.dataset.key === key) th.setAttribute('aria-sort', direction);
      else th.removeAttribute('aria-sort');
    }
  };
  return { region, table: t, tbody, setSort };
}

/**
 * Keeps `parent`'s children in step with `items`, reusing the node of each
 * key: a row that stays is updated in place (a progress bar moves instead
 * of being replaced, focus and open <details> survive).
 */
export function keyed(parent, items, key, create, update) {
  const old = new Map();
  for (const node of parent.children) old.set(node.dataset.key, node);
  const next = items.map((item) => {
    const k = key(item);
    let node = old.get(k);
    if (node) {
      update?.(node, item);
    } else {
      node = create(item);
      node.dataset.key = k;
    }
    return node;
  });
  // Only touch the DOM when the order or membership changed.
  const same = next.length === parent.children.length && next.every((node, i) => parent.children[i] === node);
  if (!same) parent.replaceChildren(...next);
}

/** Sets a cell's text only when it changed. */
export function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

/** A pager's Previous/Next buttons around its "1–100 of N" text. */
function pagerNav(label, onPrev, onNext) {
  const info = el('span', { class: 'pager-info', 'aria-live': 'polite' });
  const prev = el('button', { type: 'button' }, 'Previous');
  const next = el('button', { type: 'button' }, 'Next');
  prev.addEventListener('click', onPrev);
  next.addEventListener('click', onNext);
  const nav = el('nav', { class: 'pager', 'aria-label': label }, prev, info, next);
  return { nav, info, prev, next };
}

/**
 * Previous/Next paging over pages a server cuts (`?limit=&continue=`):
 * the caller fetches on `onPrev`/`onNext` and then calls
 * `show({from, shown, total, more})` with what the page holds.
 */
export function serverPager(label, onPrev, onNext) {
  const { nav, info, prev, next } = pagerNav(label, onPrev, onNext);
  return {
    nav,
    show({ from, shown, total, more }) {
      info.textContent = shown ? `${from + 1}–${from + shown} of ${total}` : '0 of 0';
      prev.disabled = from === 0;
      next.disabled = !more;
      nav.hidden = from === 0 && !more;
    },
  };
}

/**
 * Previous/Next paging over an in-memory array. Returns {nav, slice(items)};
 * `onChange` re-renders.
 */
export function pager(label, size, onChange) {
  let page = 0;
  const { nav, info, prev, next } = pagerNav(
    label, () => { page -= 1; onChange(); }, () => { page += 1; onChange(); });
  return {
    nav,
    reset() { page = 0; },
    slice(items) {
      const pages = Math.max(1, Math.ceil(items.length / size));
      page = Math.min(Math.max(page, 0), pages - 1);
      const from = page * size;
      const shown = items.slice(from, from + size);
      info.textContent = items.length
        ? `${from + 1}–${from + shown.length} of ${items.length}`
        : '0 of 0';
      prev.disabled = page === 0;
      next.disabled = page >= pages - 1;
      nav.hidden = items.length <= size;
      return shown;
    },
  };
}

/**
 * Calls `fn` at most every `ms`, always once after the last call;
 * `.now()` calls it at once (a page's first data should not wait).
 */
export function throttle(fn, ms) {
  let timer = null;
  let last = 0;
  const run = () => {
    clearTimeout(timer);
    timer = null;
    last = performance.now();
    fn();
  };
  const throttled = () => {
    if (timer) return;
    timer = setTimeout(run, Math.max(0, last + ms - performance.now()));
  };
  throttled.now = run;
  return throttled;
}
