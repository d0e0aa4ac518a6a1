// The sign-in: one password input labelled "Token". A candidate token is
// checked against /whoami before it is kept; a refused one is never stored.

import { ApiError, getJSON, token } from './api.js';

const section = () => document.getElementById('signin');

/** Shows the sign-in, with `message` (the server's, after a 401) if any. */
export function showSignIn(message = '') {
  section().hidden = false;
  document.getElementById('signin-error').textContent = message;
  document.getElementById('token').focus();
}

export function hideSignIn() {
  section().hidden = true;
  document.getElementById('signin-error').textContent = '';
}

/** Wires the form: `onSignedIn(whoami)` after a token is accepted. */
export function setUpSignIn(onSignedIn) {
  const form = document.getElementById('signin-form');
  const input = document.getElementById('token');
  const error = document.getElementById('signin-error');
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const candidate = input.value.trim();
    if (!candidate) return;
    error.textContent = '';
    try {
      const who = await getJSON('/whoami', { token: candidate });
      token.set(candidate);
      input.value = '';
      onSignedIn(who);
    } catch (e) {
      error.textContent = e instanceof ApiError ? e.message : `cannot reach the server: ${e.message}`;
      input.select();
    }
  });
}
