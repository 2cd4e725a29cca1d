// api.js: the console's client of the harness service. Unary calls are
// Connect's JSON over HTTP (POST /bulkhead.harness.v1.<Service>/<Method>);
// run events are Server-Sent Events read through fetch, because
// EventSource cannot send the Authorization header and the token must not
// travel in URLs. The bearer token lives in this tab's sessionStorage only.
(function () {
  'use strict';

  const TOKEN_KEY = 'bulkhead.token';
  const PKG = 'bulkhead.harness.v1.';
  // The console is served at <service>/console/; the API is one level up.
  const base = new URL('../', document.baseURI);

  function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }
  function setToken(t) { sessionStorage.setItem(TOKEN_KEY, t.trim()); }
  function forgetToken() { sessionStorage.removeItem(TOKEN_KEY); }
  function authHeaders(extra) {
    return Object.assign({ Authorization: 'Bearer ' + token() }, extra || {});
  }

  // APIError is a failed call: code is Connect's code ("not_found",
  // "unauthenticated", ...), message the service's words.
  class APIError extends Error {
    constructor(code, message, status) {
      super(message || code);
      this.code = code;
      this.status = status;
    }
  }

  // Connect's codes for HTTP statuses, for answers with no JSON error body.
  function codeOf(status) {
    return ({ 400: 'invalid_argument', 401: 'unauthenticated', 403: 'permission_denied', 404: 'not_found',
      409: 'aborted', 412: 'failed_precondition', 429: 'resource_exhausted', 501: 'unimplemented',
      503: 'unavailable', 504: 'deadline_exceeded' })[status] || 'unknown';
  }

  async function errorOf(res) {
    let body = {};
    try { body = JSON.parse(await res.text()); } catch (e) { /* not JSON */ }
    return new APIError(body.code || codeOf(res.status), body.message || res.statusText || ('HTTP ' + res.status), res.status);
  }

  // camel turns snake_case keys into lowerCamelCase, so the pages read one
  // spelling whichever JSON names the service emits.
  function camel(v) {
    if (Array.isArray(v)) { return v.map(camel); }
    if (v === null || typeof v !== 'object') { return v; }
    const out = {};
    for (const k of Object.keys(v)) {
      out[k.replace(/_([a-z0-9])/g, (m, c) => c.toUpperCase())] = camel(v[k]);
    }
    return out;
  }

  // call makes one unary call and returns the response message.
  async function call(service, method, body) {
    const res = await fetch(new URL(PKG + service + '/' + method, base), {
      method: 'POST',
      headers: authHeaders({ 'Content-Type': 'application/json' }),
      body: JSON.stringify(body || {}),
      cache: 'no-store',
    });
    if (!res.ok) { throw await errorOf(res); }
    const text = await res.text();
    return camel(text ? JSON.parse(text) : {});
  }

  // streamEvents reads a run's events after sequence `after`, calling
  // onEvent(event) for each, until the service ends the stream (resolves)
  // or it fails (rejects). signal aborts it.
  async function streamEvents(runId, after, onEvent, signal) {
    const url = new URL('v1/runs/' + encodeURIComponent(runId) + '/events', base);
    const headers = authHeaders({ Accept: 'text/event-stream' });
    if (after) {
      url.searchParams.set('after', String(after));
      headers['Last-Event-ID'] = String(after);
    }
    const res = await fetch(url, { headers, signal, cache: 'no-store' });
    if (!res.ok) { throw await errorOf(res); }
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    let type = '';
    let data = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) { return; }
      buf += value;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, '');
        buf = buf.slice(nl + 1);
        if (line === '') {
          if (data.length) { dispatch(type, data.join('\n'), onEvent); }
          type = '';
          data = [];
        } else if (line[0] !== ':') {
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          const val = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
          if (field === 'data') { data.push(val); } else if (field === 'event') { type = val; }
        }
      }
    }
  }

  // dispatch handles one SSE message: an event (named by its kind, data
  // the RunEvent), "end" (the run ended; the stream closes) or "error".
  function dispatch(type, text, onEvent) {
    const msg = camel(JSON.parse(text));
    if (type === 'end') { return; }
    if (type === 'error') { throw new APIError(msg.code || 'unknown', msg.message || text); }
    onEvent(msg.event || msg);
  }

  // pathURL encodes a workspace path segment by segment.
  function pathURL(path) {
    return path.split('/').filter((s) => s !== '').map(encodeURIComponent).join('/');
  }

  // download fetches a sandbox file (with the token) and saves it.
  async function download(sandboxId, path) {
    const url = new URL('v1/sandboxes/' + encodeURIComponent(sandboxId) + '/files/' + pathURL(path), base);
    const res = await fetch(url, { headers: authHeaders(), cache: 'no-store' });
    if (!res.ok) { throw await errorOf(res); }
    const blob = await res.blob();
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = path.split('/').pop() || 'download';
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 60000);
    return blob.size;
  }

  // terminalSocket opens the sandbox's terminal WebSocket. Browsers cannot
  // set headers on a WebSocket, so the token goes as a subprotocol
  // ("bearer.<token>") next to the terminal's own ("bulkhead.terminal.v1").
  function terminalSocket(sandboxId, cols, rows) {
    const url = new URL('v1/sandboxes/' + encodeURIComponent(sandboxId) + '/terminal', base);
    url.searchParams.set('cols', String(cols));
    url.searchParams.set('rows', String(rows));
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    const ws = new WebSocket(url, ['bulkhead.terminal.v1', 'bearer.' + token()]);
    ws.binaryType = 'arraybuffer';
    return ws;
  }

  // b64bytes decodes a base64 bytes field (proto JSON).
  function b64bytes(s) {
    const bin = atob(s || '');
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) { out[i] = bin.charCodeAt(i); }
    return out;
  }

  window.BulkheadAPI = { token, setToken, forgetToken, call, streamEvents, download, terminalSocket, b64bytes, APIError, base };
})();
