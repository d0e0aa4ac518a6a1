// Calls to the catalog API. The token lives in this tab's sessionStorage
// only, and travels only in the Authorization header: never in a URL, a
// cookie, persistent storage or a request body.

export const BASE = '/apis/catalog.example.com/v1';
const KEY = 'kayra.token';

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

/** An error answer of the API: its status and the server's message. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

let unauthorized = () => {};

/** Who handles a 401 (the app: back to the sign-in with the message). */
export function onUnauthorized(handler) {
  unauthorized = handler;
}

/** A path segment: names are DNS labels or subdomains, but never trust that. */
export const seg = (name) => encodeURIComponent(name);

/** `path` with `param` (`k=v`) added to its query. */
export function withParam(path, param) {
  return path + (path.includes('?') ? '&' : '?') + param;
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && typeof body.message === 'string') message = body.message;
  } catch {
    // Not the contract's error shape (a proxy?): keep the status line.
  }
  return new ApiError(response.status, message);
}

/**
 * GET `path` (relative to the catalog API) with the tab's token, or with
 * `options.token` (the sign-in's candidate). Resolves to the Response;
 * rejects with an ApiError for an error status. A 401 is also reported to
 * the app unless it is the sign-in's own check.
 *
 * Only the first 401 for the tab's token is reported: a page's calls are
 * often refused together (its streams reconnect at once after a
 * revocation), and the first report signs out, which aborts the others
 * mid-body. Their fallback text ("401 Unauthorized") must not replace the
 * server's message, nor may a late 401 for an old token sign out a newer
 * session.
 */
export async function request(path, { signal, accept = 'application/json', token: candidate } = {}) {
  const sent = candidate === undefined ? token.get() : null; // the tab's token, if this call uses it
  const bearer = candidate ?? sent ?? '';
  const response = await fetch(BASE + path, {
    headers: { Authorization: `Bearer ${bearer}`, Accept: accept },
    signal,
    cache: 'no-store',
    credentials: 'omit',
    referrerPolicy: 'no-referrer',
  });
  if (!response.ok) {
    const error = await errorOf(response);
    if (error.status === 401 && sent !== null && token.get() === sent && !signal?.aborted) {
      unauthorized(error.message);
    }
    throw error;
  }
  return response;
}

/** GET `path` as JSON. */
export async function getJSON(path, options) {
  const response = await request(path, options);
  return response.json();
}
