// The kayra console: a read-only view of the fleet (platform §11).
//
// Hash routes, so deep links work and nothing about the route reaches the
// server: #/apis, #/apis/NAME, #/namespaces, #/namespaces/NS,
// #/namespaces/NS/subscriptions/API. Each page is a module exporting
// `render(view, params, signal)`; leaving the page aborts `signal`, which
// closes its streams and pollers.

import { getJSON, onUnauthorized, token } from './api.js';
import { el, fill } from './dom.js';
import { onMode } from './live.js';
import * as apis from './pages/apis.js';
import * as api from './pages/api.js';
import * as namespaces from './pages/namespaces.js';
import * as namespace from './pages/namespace.js';
import * as subscription from './pages/subscription.js';
import { hideSignIn, setUpSignIn, showSignIn } from './signin.js';

const view = document.getElementById('view');
let current = null; // the AbortController of the page on screen

/** The page and its parameters for a hash, or null for an unknown route. */
function match(hash) {
  const parts = hash.replace(/^#\/?/, '').split('/').map((p) => {
    try { return decodeURIComponent(p); } catch { return null; }
  });
  if (parts.includes(null)) return null;
  const [a, b, c, d, ...rest] = parts;
  if (rest.length) return null;
  if (a === 'apis' && b === undefined) return { page: apis, params: {} };
  if (a === 'apis' && b && c === undefined) return { page: api, params: { name: b } };
  if (a === 'namespaces' && b === undefined) return { page: namespaces, params: {} };
  if (a === 'namespaces' && b && c === undefined) return { page: namespace, params: { namespace: b } };
  if (a === 'namespaces' && b && c === 'subscriptions' && d) {
    return { page: subscription, params: { namespace: b, api: d } };
  }
  return null;
}

function leave() {
  current?.abort();
  current = null;
  fill(view);
}

function route() {
  leave();
  if (!token.get()) {
    showSignIn();
    return;
  }
  hideSignIn();
  const found = match(location.hash);
  if (!found) {
    if (location.hash === '' || location.hash === '#' || location.hash === '#/') {
      location.replace('#/apis');
    } else {
      fill(view, el('h1', {}, 'Not found'), el('p', {}, 'No such page. '), el('a', { href: '#/apis' }, 'APIs'));
    }
    return;
  }
  current = new AbortController();
  found.page.render(view, found.params, current.signal);
  document.getElementById('main').focus({ preventScroll: true });
}

function signedIn(who) {
  const whoami = document.getElementById('whoami');
  whoami.textContent = who?.user ? `signed in as ${who.user}` : '';
  document.getElementById('signout').hidden = false;
}

function signOut(message = '') {
  leave();
  token.clear();
  document.getElementById('whoami').textContent = '';
  document.getElementById('signout').hidden = true;
  document.getElementById('live').textContent = '';
  showSignIn(message);
}

onUnauthorized((message) => signOut(message));
onMode((mode) => {
  document.getElementById('live').textContent = mode;
  document.getElementById('live').dataset.mode = mode;
});
setUpSignIn((who) => {
  signedIn(who);
  if (match(location.hash)) route();
  else location.replace('#/apis'); // the hashchange routes
});
document.getElementById('signout').addEventListener('click', () => signOut());
window.addEventListener('hashchange', route);

if (token.get()) {
  getJSON('/whoami').then(signedIn, () => {});
}
route();
