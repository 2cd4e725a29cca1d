// app.js: the console's pages. One document, hash routes:
//   #/runs                        runs, newest first
//   #/runs/new                    start a run (agent, input, manifest, approvals)
//   #/runs/{id}                   a run: summary, approvals waiting, timeline
//   #/sandboxes                   sandboxes: provider, state, age, TTL; create,
//                                 pause/resume, fork, snapshot, delete; snapshots
//   #/sandboxes/{id}              a sandbox: its buttons, its exposed ports
//   #/sandboxes/{id}/files/{path} a sandbox's files, with download
//   #/sandboxes/{id}/terminal     a live terminal (xterm.js over a WebSocket)
// Everything shown is built with h() below, which puts strings in text
// nodes: no markup is ever parsed from data (agent output is untrusted).
(function () {
  'use strict';

  const api = window.BulkheadAPI;
  const view = document.getElementById('view');
  const alertBox = document.getElementById('alert');
  const statusBox = document.getElementById('status');
  // Functions that stop what the current page started (streams, sockets,
  // timers); run when the page changes.
  let leaving = [];

  // h makes an element. attrs: attributes, with on<event> functions as
  // listeners; kids: nodes, strings (as text), arrays, null (skipped).
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) { continue; }
      if (k.startsWith('on') && typeof v === 'function') {
        el.addEventListener(k.slice(2), v);
      } else {
        el.setAttribute(k, v === true ? '' : String(v));
      }
    }
    append(el, kids);
    return el;
  }
  function append(el, kids) {
    for (const k of kids.flat(Infinity)) {
      if (k === null || k === undefined || k === false) { continue; }
      el.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return el;
  }

  // refusal is why the sign-in page shows: kept until a token is entered
  // or forgotten by hand, so that navigating (or another call refused at
  // the same moment) does not lose it.
  let refusal = '';
  function showError(err) {
    alertBox.textContent = err ? (err.message || String(err)) : '';
    if (err && err.code === 'unauthenticated') {
      api.forgetToken();
      refusal = 'The service refused the token: ' + err.message;
      render();
    }
  }
  function announce(text) { statusBox.textContent = text; }

  // --- formatting ---------------------------------------------------------

  function enumName(v, prefix) {
    return String(v || prefix + 'UNSPECIFIED').replace(prefix, '').toLowerCase().replace(/_/g, ' ');
  }
  function statusBadge(v, prefix, extraClass) {
    const name = enumName(v, prefix);
    return h('span', { class: 'status ' + name.replace(/ /g, '-') + (extraClass || '') }, name);
  }
  function when(ts) { return ts ? new Date(ts) : null; }
  function span(ms) {
    const s = Math.round(Math.abs(ms) / 1000);
    if (s < 60) { return s + 's'; }
    if (s < 3600) { return Math.floor(s / 60) + 'm'; }
    if (s < 86400) { return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm'; }
    return Math.floor(s / 86400) + 'd ' + Math.floor((s % 86400) / 3600) + 'h';
  }
  function age(ts) {
    const d = when(ts);
    return d ? h('time', { datetime: d.toISOString(), title: d.toLocaleString() }, span(Date.now() - d) + ' ago') : '–';
  }
  function ttl(ts) {
    const d = when(ts);
    if (!d) { return h('span', { class: 'muted' }, 'while its run is active'); }
    const left = d - Date.now();
    return h('time', { datetime: d.toISOString(), title: d.toLocaleString() }, left > 0 ? span(left) + ' left' : 'expired');
  }
  function clip(s, n) { s = String(s || ''); return s.length > n ? s.slice(0, n - 1) + '…' : s; }
  function pretty(input) {
    try { return JSON.stringify(JSON.parse(input), null, 2); } catch (e) { return String(input || ''); }
  }
  function size(n) {
    n = Number(n || 0);
    if (n < 1024) { return n + ' B'; }
    if (n < 1048576) { return (n / 1024).toFixed(1) + ' KiB'; }
    return (n / 1048576).toFixed(1) + ' MiB';
  }
  const runLink = (id) => h('a', { href: '#/runs/' + encodeURIComponent(id), class: 'mono' }, id);
  const ACTIVE = ['RUN_STATUS_PENDING', 'RUN_STATUS_RUNNING', 'RUN_STATUS_WAITING_APPROVAL'];

  // --- pages --------------------------------------------------------------

  function tokenPage(message) {
    const input = h('input', { type: 'password', id: 'token', name: 'token', autocomplete: 'off', required: true });
    return [
      h('h1', null, 'Sign in'),
      h('form', {
        class: 'token', id: 'token-form',
        onsubmit: (e) => { e.preventDefault(); api.setToken(input.value); input.value = ''; refusal = ''; render(); },
      },
      message ? h('p', { class: 'muted' }, message) : null,
      h('label', { for: 'token' }, 'Access token'),
      input,
      h('p', { class: 'muted' }, 'The token stays in this browser tab (session storage) and is sent to the service only.'),
      h('button', { type: 'submit' }, 'Use token')),
    ];
  }

  async function runsPage() {
    const filter = h('select', { id: 'status-filter' },
      h('option', { value: '' }, 'all'),
      ['PENDING', 'RUNNING', 'WAITING_APPROVAL', 'SUCCEEDED', 'FAILED', 'CANCELED'].map((s) =>
        h('option', { value: 'RUN_STATUS_' + s }, enumName(s, ''))));
    const body = h('tbody');
    const more = h('button', { type: 'button', id: 'more-runs', hidden: true }, 'More');
    let next = '';
    async function load(reset) {
      const req = { pageSize: 50, pageToken: reset ? '' : next };
      if (filter.value) { req.status = filter.value; }
      const res = await api.call('RunService', 'ListRuns', req);
      if (reset) { body.replaceChildren(); }
      for (const r of res.runs || []) {
        body.append(h('tr', { 'data-run-id': r.runId },
          h('td', null, runLink(r.runId)),
          h('td', null, statusBadge(r.status, 'RUN_STATUS_'),
            (r.pendingApprovals || []).length ? h('span', { class: 'muted' }, ' ' + r.pendingApprovals.length + ' waiting') : null),
          h('td', null, r.agent || ''),
          h('td', null, r.model || ''),
          h('td', { title: r.input || '' }, clip(r.input, 80)),
          h('td', null, age(r.createTime)),
          h('td', { class: 'num' }, r.turns || 0)));
      }
      if (!body.children.length) {
        body.append(h('tr', null, h('td', { colspan: 7, class: 'muted' }, 'No runs.')));
      }
      next = res.nextPageToken || '';
      more.hidden = !next;
    }
    const refresh = () => load(true).catch(showError);
    filter.addEventListener('change', refresh);
    more.addEventListener('click', () => load(false).catch(showError));
    await load(true);
    every(5000, refresh);
    return [
      h('h1', null, 'Runs'),
      h('div', { class: 'toolbar' },
        h('label', { for: 'status-filter' }, 'Status'), filter,
        h('button', { type: 'button', onclick: refresh }, 'Refresh'),
        h('a', { href: '#/runs/new', id: 'new-run-link' }, 'Start a run')),
      h('table', { id: 'runs-table' },
        h('thead', null, h('tr', null, ['Run', 'Status', 'Agent', 'Model', 'Input', 'Created', 'Turns'].map((c) => h('th', { scope: 'col' }, c)))),
        body),
      more,
    ];
  }

  // act runs the call behind a button: the button is disabled meanwhile
  // and a refusal is told to report with the service's words ("" clears
  // it; a refused token goes to the sign-in page instead). It resolves to
  // the call's answer, or undefined when the call failed.
  async function act(btn, report, call) {
    btn.disabled = true;
    report('');
    try {
      return await call();
    } catch (err) {
      if (err.code === 'unauthenticated') { showError(err); } else { report(err.message || String(err)); }
      return undefined;
    } finally {
      btn.disabled = false;
    }
  }

  // into is a report function for act that writes into el.
  const into = (el) => (t) => { el.textContent = t; };

  // confirmButton is a button that asks before doing: a first click shows
  // "Confirm" and "Cancel" in its place; hold(true/false) is told while
  // the question is open so that a timed refresh does not take it away.
  function confirmButton(label, question, ariaLabel, onConfirm, hold) {
    const wrap = h('span', { class: 'confirm' });
    const first = h('button', { type: 'button', class: 'danger', 'aria-label': ariaLabel, 'data-action': 'delete' }, label);
    const ask = () => {
      hold(true);
      const yes = h('button', { type: 'button', class: 'danger', 'data-action': 'confirm' }, 'Confirm');
      const no = h('button', { type: 'button', 'data-action': 'cancel' }, 'Cancel');
      no.addEventListener('click', () => { hold(false); wrap.replaceChildren(first); first.focus(); });
      yes.addEventListener('click', async () => {
        no.disabled = true;
        await onConfirm(yes);
        hold(false);
        wrap.replaceChildren(first);
      });
      wrap.replaceChildren(h('span', null, question + ' '), yes, ' ', no);
      yes.focus();
    };
    first.addEventListener('click', ask);
    wrap.append(first);
    return wrap;
  }

  // sandboxActions are the buttons of one sandbox: Pause or Resume (by its
  // status), Fork and Snapshot (of a running one), all for a sandbox made
  // with CreateSandbox only (the service refuses them for a run's), and
  // Delete (asked first). Refusals go to report; changed(text, action) is
  // called after a call that changed something.
  function sandboxActions(s, report, changed, hold) {
    const sandboxId = s.sandboxId;
    const button = (action, label, f) => {
      const b = h('button', { type: 'button', 'data-action': action, 'aria-label': label + ' sandbox ' + sandboxId }, label);
      b.addEventListener('click', async () => {
        const text = await act(b, report, f);
        if (text !== undefined) { changed(text, action); }
      });
      return b;
    };
    const own = !s.runId;
    const running = own && s.status === 'SANDBOX_STATUS_RUNNING';
    const paused = own && s.status === 'SANDBOX_STATUS_PAUSED';
    const out = [];
    if (paused) {
      out.push(button('resume', 'Resume', async () => {
        const res = await api.call('SandboxService', 'ResumeSandbox', { sandboxId });
        return 'Resumed ' + sandboxId + (res.keepMemory ? ' with its memory' : ' (its workspace)');
      }));
    } else if (running) {
      out.push(button('pause', 'Pause', async () => {
        const res = await api.call('SandboxService', 'PauseSandbox', { sandboxId });
        return 'Paused ' + sandboxId + (res.keepMemory ? ' with its memory' : ' (its workspace only)');
      }));
    }
    if (running) {
      out.push(button('fork', 'Fork', async () => {
        const res = await api.call('SandboxService', 'ForkSandbox', { sandboxId, count: 1 });
        return 'Forked ' + sandboxId + ' into ' + (res.sandboxes || []).map((f) => f.sandboxId).join(', ');
      }));
      out.push(button('snapshot', 'Snapshot', async () => {
        const res = await api.call('SandboxService', 'SnapshotSandbox', { sandboxId });
        return 'Snapshot ' + ((res.snapshot || {}).snapshotId || '') + ' taken of ' + sandboxId;
      }));
    }
    out.push(confirmButton('Delete', 'Delete ' + sandboxId + '?', 'Delete sandbox ' + sandboxId, async (yes) => {
      const done = await act(yes, report, () => api.call('SandboxService', 'DeleteSandbox', { sandboxId }));
      if (done !== undefined) { changed('Deleted ' + sandboxId, 'delete'); }
    }, hold));
    return h('span', { class: 'actions' }, out.flatMap((b) => [b, ' ']));
  }

  async function sandboxesPage() {
    const body = h('tbody');
    const snapBody = h('tbody');
    const snapError = h('div', { class: 'inline-error', id: 'snapshots-error', role: 'alert' });
    const createError = h('div', { class: 'inline-error', id: 'sandboxes-error', role: 'alert' });
    // Refusals by sandbox, kept across the timed refreshes that rebuild
    // the rows; held counts open questions and calls, during which the
    // timed refresh waits.
    const errors = new Map();
    let held = 0;
    const hold = (on) => { held = Math.max(0, held + (on ? 1 : -1)); };
    const changed = (text) => { announce(text); refresh(); };
    async function load() {
      const [res, snaps] = await Promise.all([
        api.call('SandboxService', 'ListSandboxes', {}),
        api.call('SandboxService', 'ListSnapshots', {}).catch((err) => ({ error: err })),
      ]);
      body.replaceChildren();
      for (const s of res.sandboxes || []) {
        const id = encodeURIComponent(s.sandboxId);
        const live = s.status === 'SANDBOX_STATUS_RUNNING';
        const errBox = h('div', { class: 'inline-error', role: 'alert' }, errors.get(s.sandboxId) || '');
        body.append(h('tr', { 'data-sandbox-id': s.sandboxId },
          h('td', null, h('a', { href: '#/sandboxes/' + id, class: 'mono' }, s.sandboxId)),
          h('td', null, s.runId ? runLink(s.runId) : '–'),
          h('td', null, s.provider || ''),
          h('td', null, statusBadge(s.status, 'SANDBOX_STATUS_', live ? ' running-sandbox' : '')),
          h('td', null, age(s.createTime)),
          h('td', null, ttl(s.expireTime)),
          h('td', null, live ? [
            h('a', { href: '#/sandboxes/' + id + '/files/' }, 'Files'), ' · ',
            h('a', { href: '#/sandboxes/' + id + '/terminal' }, 'Terminal'), ' · ',
            h('a', { href: '#/sandboxes/' + id }, 'Ports'),
          ] : h('span', { class: 'muted' }, enumName(s.status, 'SANDBOX_STATUS_'))),
          h('td', null, sandboxActions(s, (msg) => { errBox.textContent = msg; errors.set(s.sandboxId, msg); }, changed, hold), errBox)));
      }
      if (!body.children.length) {
        body.append(h('tr', null, h('td', { colspan: 8, class: 'muted' }, 'No sandboxes.')));
      }
      snapError.textContent = snaps.error ? snaps.error.message || String(snaps.error) : '';
      snapBody.replaceChildren(...(snaps.snapshots || []).map((sn) => h('tr', { 'data-snapshot-id': sn.snapshotId },
        h('td', { class: 'mono' }, sn.snapshotId),
        h('td', { class: 'mono' }, sn.sandboxId || ''),
        h('td', null, age(sn.createTime)),
        h('td', { class: 'num' }, size(sn.sizeBytes)),
        h('td', null, confirmButton('Delete', 'Delete snapshot ' + sn.snapshotId + '?', 'Delete snapshot ' + sn.snapshotId, async (yes) => {
          const done = await act(yes, into(snapError), () => api.call('SandboxService', 'DeleteSnapshot', { snapshotId: sn.snapshotId }));
          if (done !== undefined) { changed('Deleted snapshot ' + sn.snapshotId); }
        }, hold)))));
      if (!snapBody.children.length) {
        snapBody.append(h('tr', null, h('td', { colspan: 5, class: 'muted' }, 'No snapshots.')));
      }
    }
    const refresh = () => load().catch(showError);
    const create = h('button', { type: 'button', id: 'new-sandbox' }, 'New sandbox');
    create.addEventListener('click', async () => {
      const res = await act(create, into(createError), () => api.call('SandboxService', 'CreateSandbox', {}));
      if (res) { changed('Created sandbox ' + ((res.sandbox || {}).sandboxId || '')); }
    });
    await load();
    every(5000, () => { if (!held) { refresh(); } });
    return [
      h('h1', null, 'Sandboxes'),
      h('div', { class: 'toolbar' }, create, h('button', { type: 'button', onclick: refresh }, 'Refresh')),
      createError,
      h('table', { id: 'sandboxes-table' },
        h('thead', null, h('tr', null, ['Sandbox', 'Run', 'Provider', 'State', 'Age', 'TTL', '', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))),
        body),
      h('section', { 'aria-labelledby': 'snapshots-h' }, h('h2', { id: 'snapshots-h' }, 'Snapshots'), snapError,
        h('table', { id: 'snapshots-table' },
          h('thead', null, h('tr', null, ['Snapshot', 'Of sandbox', 'Taken', 'Size', ''].map((c) => h('th', { scope: 'col' }, c)))),
          snapBody)),
    ];
  }

  // previewHref is where a port's preview link goes: an absolute http(s)
  // URL as it is; a path (a preview on the service's own address) below the
  // service's base; anything else is no link at all.
  function previewHref(u) {
    try {
      const s = String(u || '');
      const url = /^[a-z][a-z0-9+.-]*:/i.test(s) ? new URL(s) : new URL(s.replace(/^\/+/, ''), api.base);
      return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : '';
    } catch (e) {
      return '';
    }
  }

  // sandboxPage is one sandbox: its state and buttons, and its exposed
  // ports with their preview links (expose a port, revoke one).
  async function sandboxPage(sandboxId) {
    const sb = encodeURIComponent(sandboxId);
    const summary = h('dl', { class: 'summary', id: 'sandbox-summary' });
    const actions = h('div', { class: 'toolbar', id: 'sandbox-actions' });
    const actError = h('div', { class: 'inline-error', id: 'sandbox-error', role: 'alert' });
    const portBody = h('tbody');
    const portError = h('div', { class: 'inline-error', id: 'ports-error', role: 'alert' });
    const portInput = h('input', { type: 'number', id: 'expose-port', name: 'port', min: 1, max: 65535, required: true, inputmode: 'numeric' });
    const expose = h('button', { type: 'submit', id: 'expose-submit' }, 'Expose port');
    async function load() {
      const [got, ports] = await Promise.all([
        api.call('SandboxService', 'GetSandbox', { sandboxId }),
        api.call('SandboxService', 'ListPorts', { sandboxId }).catch((err) => ({ error: err })),
      ]);
      const s = got.sandbox || {};
      const live = s.status === 'SANDBOX_STATUS_RUNNING';
      summary.replaceChildren(...[
        ['Status', h('span', { id: 'sandbox-status' }, statusBadge(s.status, 'SANDBOX_STATUS_', live ? ' running-sandbox' : ''))],
        ['Run', s.runId ? runLink(s.runId) : '–'], ['Provider', s.provider || ''],
        ['Created', age(s.createTime)], ['TTL', ttl(s.expireTime)],
        ['Open', live ? [h('a', { href: '#/sandboxes/' + sb + '/files/' }, 'Files'), ' · ',
          h('a', { href: '#/sandboxes/' + sb + '/terminal', id: 'sandbox-terminal' }, 'Terminal')] : h('span', { class: 'muted' }, 'not running')],
      ].flatMap(([k, v]) => [h('dt', null, k), h('dd', null, v)]));
      actions.replaceChildren(sandboxActions(s, into(actError), (text, action) => {
        announce(text);
        if (action === 'delete') { location.hash = '#/sandboxes'; } else { load().catch(showError); }
      }, () => {}));
      if (ports.error) { portError.textContent = ports.error.message || String(ports.error); }
      portBody.replaceChildren(...(ports.ports || []).map((p) => {
        const href = previewHref(p.url);
        const revoke = h('button', { type: 'button', class: 'danger', 'data-action': 'revoke', 'aria-label': 'Revoke port ' + p.port }, 'Revoke');
        revoke.addEventListener('click', async () => {
          const done = await act(revoke, into(portError), () => api.call('SandboxService', 'RevokePort', { sandboxId, port: p.port }));
          if (done !== undefined) { announce('Revoked port ' + p.port); load().catch(showError); }
        });
        return h('tr', { 'data-port': p.port },
          h('td', { class: 'num' }, String(p.port)),
          h('td', null, href ? h('a', { href, target: '_blank', rel: 'noopener noreferrer', class: 'preview mono' }, href) : h('span', { class: 'mono' }, p.url || '')),
          h('td', null, age(p.createTime)),
          h('td', null, ttl(p.expireTime)),
          h('td', null, revoke));
      }));
      if (!portBody.children.length) {
        portBody.append(h('tr', null, h('td', { colspan: 5, class: 'muted' }, 'No exposed ports.')));
      }
    }
    const form = h('form', {
      class: 'toolbar', id: 'expose-form',
      onsubmit: async (e) => {
        e.preventDefault();
        const port = Number(portInput.value);
        const res = await act(expose, into(portError), () => api.call('SandboxService', 'ExposePort', { sandboxId, port }));
        if (res) {
          portInput.value = '';
          announce('Exposed port ' + port);
          load().catch(showError);
        }
      },
    }, h('label', { for: 'expose-port' }, 'Port'), portInput, expose);
    await load();
    return [
      h('h1', null, 'Sandbox ', h('span', { class: 'mono' }, sandboxId)),
      summary, actions, actError,
      h('section', { 'aria-labelledby': 'ports-h' }, h('h2', { id: 'ports-h' }, 'Exposed ports'),
        h('p', { class: 'muted' }, 'Anyone holding a preview link reaches the port until it expires or is revoked.'),
        form, portError,
        h('table', { id: 'ports-table' },
          h('thead', null, h('tr', null, ['Port', 'Preview', 'Exposed', 'Expires', ''].map((c) => h('th', { scope: 'col' }, c)))),
          portBody)),
    ];
  }

  async function runPage(runId) {
    const summary = h('dl', { class: 'summary', id: 'run-summary' });
    const approvals = h('div', { id: 'approvals' });
    const cancel = h('button', { type: 'button', class: 'danger', id: 'cancel-run', hidden: true }, 'Cancel run');
    const timeline = new Timeline();
    let run = null;

    function show(r) {
      run = r;
      const sb = r.sandboxId ? encodeURIComponent(r.sandboxId) : '';
      const rows = [
        ['Status', h('span', { id: 'run-status' }, statusBadge(r.status, 'RUN_STATUS_'))],
        ['Agent', r.agent || ''], ['Model', r.model || ''],
        ['Input', h('span', { class: 'text' }, r.input || '')],
        ['Created', age(r.createTime)], ['Updated', age(r.updateTime)],
        ['Turns', String(r.turns || 0)],
        ['Tokens', r.usage ? (r.usage.inputTokens || 0) + ' in, ' + (r.usage.outputTokens || 0) + ' out' : '–'],
        ['Sandbox', r.sandboxId ? [h('span', { class: 'mono' }, r.sandboxId), ' (',
          h('a', { href: '#/sandboxes/' + sb + '/files/' }, 'files'), ', ',
          h('a', { href: '#/sandboxes/' + sb + '/terminal' }, 'terminal'), ')'] : '–'],
      ];
      if (r.finalOutput) { rows.push(['Final output', h('pre', { id: 'final-output' }, r.finalOutput)]); }
      if (r.error) { rows.push(['Error', h('pre', { id: 'run-error' }, r.error)]); }
      summary.replaceChildren(...rows.flatMap(([k, v]) => [h('dt', null, k), h('dd', null, v)]));
      cancel.hidden = !ACTIVE.includes(r.status);
      approvals.replaceChildren(...(r.pendingApprovals || []).map(approvalBox));
      if (!approvals.children.length) { approvals.append(h('p', { class: 'muted' }, 'Nothing waits for approval.')); }
    }

    function approvalBox(p) {
      const reason = h('input', { type: 'text', id: 'reason-' + p.callId, placeholder: 'optional' });
      const decide = (approved) => async (e) => {
        for (const b of e.target.parentNode.querySelectorAll('button')) { b.disabled = true; }
        try {
          const res = await api.call('RunService', 'ApproveToolCall', { runId, callId: p.callId, approved, reason: reason.value });
          announce((approved ? 'Approved ' : 'Rejected ') + p.tool + ' call ' + p.callId);
          show(res.run);
        } catch (err) {
          showError(err);
          for (const b of e.target.parentNode.querySelectorAll('button')) { b.disabled = false; }
        }
      };
      return h('div', { class: 'approval', 'data-call-id': p.callId },
        h('div', null, h('span', { class: 'label' }, 'Tool '), h('code', null, p.tool), ' ',
          h('span', { class: 'muted mono' }, p.callId), p.agent ? h('span', { class: 'muted' }, ' by ' + p.agent) : null),
        h('pre', null, pretty(p.input)),
        h('div', { class: 'actions' },
          h('button', { type: 'button', class: 'approve', 'aria-label': 'Approve ' + p.tool + ' call ' + p.callId, onclick: decide(true) }, 'Approve'),
          h('button', { type: 'button', class: 'reject', 'aria-label': 'Reject ' + p.tool + ' call ' + p.callId, onclick: decide(false) }, 'Reject'),
          h('label', { for: 'reason-' + p.callId }, 'Reason'), reason));
    }

    const reload = () => api.call('RunService', 'GetRun', { runId }).then((res) => show(res.run)).catch(showError);
    cancel.addEventListener('click', async () => {
      try {
        show((await api.call('RunService', 'CancelRun', { runId, reason: 'canceled from the console' })).run);
      } catch (err) { showError(err); }
    });

    show((await api.call('RunService', 'GetRun', { runId })).run);
    follow(runId, timeline, reload);
    return [
      h('h1', null, 'Run ', h('span', { class: 'mono' }, runId)),
      summary,
      h('div', { class: 'toolbar' }, cancel),
      h('section', { 'aria-labelledby': 'approvals-h' }, h('h2', { id: 'approvals-h' }, 'Waiting for approval'), approvals),
      h('section', { 'aria-labelledby': 'timeline-h' }, h('h2', { id: 'timeline-h' }, 'Timeline'), timeline.el),
    ];
  }

  // follow streams a run's events into timeline, reconnecting after the
  // last sequence seen, until the run ends or the page changes. reload
  // refreshes the run's summary when its state changes.
  function follow(runId, timeline, reload) {
    const ctl = new AbortController();
    leaving.push(() => ctl.abort());
    const STATE = ['approvalRequested', 'approvalDecided', 'runFinished', 'runFailed', 'runCanceled', 'runResumed', 'turnStarted'];
    (async () => {
      let delay = 500;
      while (!ctl.signal.aborted && !timeline.ended) {
        try {
          await api.streamEvents(runId, timeline.last, (ev) => {
            if (timeline.add(ev) && STATE.some((k) => k in ev)) { reload(); }
          }, ctl.signal);
          delay = 500;
        } catch (err) {
          if (ctl.signal.aborted) { return; }
          if (err.code === 'unauthenticated' || err.code === 'not_found' || err.code === 'permission_denied') {
            showError(err);
            return;
          }
        }
        if (!timeline.ended) {
          await new Promise((r) => setTimeout(r, delay));
          delay = Math.min(delay * 2, 10000);
        }
      }
    })();
  }

  // patchLines are the lines of an apply_patch call's input: the V4A patch
  // text as the model sent it (the freeform tool), or the file operations
  // of the JSON form ({"operations": [...]}), each under a header line
  // written as the V4A text would.
  function patchLines(input) {
    const raw = String(input || '');
    const t = raw.trim();
    if (t.startsWith('{') || t.startsWith('[')) {
      let v = null;
      try { v = JSON.parse(t); } catch (e) { /* not JSON: shown as text */ }
      if (v && typeof v === 'object') {
        const ops = Array.isArray(v) ? v : v.operations || (v.operation ? [v.operation] : [v]);
        const verbs = { create_file: 'Add File', update_file: 'Update File', delete_file: 'Delete File' };
        return [ops].flat().flatMap((op) => {
          op = op || {};
          const lines = ['*** ' + (verbs[op.type] || String(op.type || '?')) + ': ' + String(op.path || '')];
          if (op.move_to) { lines.push('*** Move to: ' + String(op.move_to)); }
          if (op.diff) { lines.push(...String(op.diff).replace(/\n$/, '').split('\n')); }
          return lines;
        });
      }
    }
    return raw.replace(/\n$/, '').split('\n');
  }

  // diffClass is how a patch line is coloured: file headers, hunk
  // headers, added, removed and context lines.
  function diffClass(line) {
    if (line.startsWith('***')) { return 'diff-file'; }
    if (line.startsWith('@@')) { return 'diff-hunk'; }
    if (line.startsWith('+')) { return 'diff-add'; }
    if (line.startsWith('-')) { return 'diff-del'; }
    return 'diff-ctx';
  }

  // showDiff renders a patch into pre as coloured lines. The patch is the
  // model's (untrusted): every line is a text node.
  function showDiff(pre, input) {
    pre.classList.add('diff');
    pre.replaceChildren(...patchLines(input).map((l) => h('span', { class: diffClass(l) }, l)));
  }

  // Timeline renders run events as an ordered list: turns, model text,
  // tool calls with their output and result, approvals, the end.
  class Timeline {
    constructor() {
      this.el = h('ol', { class: 'timeline', id: 'timeline', 'aria-live': 'polite' });
      this.last = 0;
      this.ended = false;
      this.calls = new Map();
      this.text = null;
    }
    item(ev, kind, cls, ...kids) {
      const li = h('li', { class: cls || '', 'data-kind': kind, 'data-seq': ev.sequence || '' },
        ev.agent ? h('span', { class: 'muted' }, ev.agent + ' · ') : null, kids);
      this.el.append(li);
      return li;
    }
    call(ev, id, tool) {
      let c = this.calls.get(id);
      if (!c) {
        c = { input: h('pre', { class: 'input', hidden: true }), output: h('pre', { class: 'output', hidden: true }), result: h('div', { class: 'result muted' }, 'running'), dec: new TextDecoder() };
        c.li = this.item(ev, 'tool_call', 'tool', h('span', { class: 'label' }, 'Tool call'), h('code', null, tool || '?'), ' ',
          h('span', { class: 'muted mono' }, id), c.input, c.output, c.result);
        c.li.setAttribute('data-call-id', id);
        this.calls.set(id, c);
      }
      return c;
    }
    // add renders one event; it returns false for one already shown.
    add(ev) {
      const seq = Number(ev.sequence || 0);
      if (seq && seq <= this.last) { return false; }
      if (seq) { this.last = seq; }
      if (ev.turnStarted) {
        this.text = null;
        this.item(ev, 'turn_started', 'turn', h('span', { class: 'label' }, 'Turn ' + (ev.turnStarted.turn || '')));
      } else if (ev.modelText) {
        if (!this.text) { this.text = h('span', { class: 'text' }); this.item(ev, 'model_text', 'message', h('span', { class: 'label' }, 'Model'), this.text); }
        this.text.textContent += ev.modelText.text || '';
      } else if (ev.modelReset) {
        if (this.text) { this.text.closest('li').remove(); this.text = null; }
      } else if (ev.toolCall) {
        this.text = null;
        const c = this.call(ev, ev.toolCall.callId, ev.toolCall.tool);
        if (ev.toolCall.tool === 'apply_patch') {
          showDiff(c.input, ev.toolCall.input);
        } else {
          c.input.textContent = pretty(ev.toolCall.input);
        }
        c.input.hidden = false;
      } else if (ev.toolOutput) {
        const c = this.call(ev, ev.toolOutput.callId, '');
        c.output.textContent += c.dec.decode(api.b64bytes(ev.toolOutput.output), { stream: true });
        c.output.hidden = false;
      } else if (ev.toolResult) {
        const r = ev.toolResult;
        const c = this.call(ev, r.callId, r.tool);
        c.output.textContent = r.output || '';
        c.output.hidden = false;
        c.result.textContent = r.isError ? 'error' : 'done';
        c.result.className = 'result ' + (r.isError ? 'status failed' : 'muted');
      } else if (ev.approvalRequested) {
        const p = ev.approvalRequested.call || {};
        this.item(ev, 'approval_requested', 'tool', h('span', { class: 'label' }, 'Waiting for approval'), h('code', null, p.tool || ''), ' ', h('span', { class: 'muted mono' }, p.callId || ''));
      } else if (ev.approvalDecided) {
        const d = ev.approvalDecided;
        this.item(ev, 'approval_decided', d.approved ? 'end' : 'error', h('span', { class: 'label' }, d.approved ? 'Approved' : 'Rejected'),
          h('span', { class: 'muted mono' }, d.callId || ''), d.reason ? ' – ' + d.reason : '');
      } else if (ev.runResumed) {
        this.item(ev, 'run_resumed', '', h('span', { class: 'label' }, 'Resumed'), ev.runResumed.cause || '');
      } else if (ev.runFinished) {
        this.ended = true;
        this.item(ev, 'run_finished', 'end', h('span', { class: 'label' }, 'Finished'), h('pre', null, ev.runFinished.finalOutput || ''));
      } else if (ev.runFailed) {
        this.ended = true;
        this.item(ev, 'run_failed', 'error', h('span', { class: 'label' }, 'Failed'), h('pre', null, ev.runFailed.error || ''));
      } else if (ev.runCanceled) {
        this.ended = true;
        this.item(ev, 'run_canceled', 'error', h('span', { class: 'label' }, 'Canceled'), ev.runCanceled.reason || '');
      }
      return true;
    }
  }

  async function filesPage(sandboxId, path) {
    path = (path || '').split('/').filter((s) => s !== '').join('/');
    const sb = encodeURIComponent(sandboxId);
    const href = (p) => '#/sandboxes/' + sb + '/files/' + p.split('/').map(encodeURIComponent).join('/');
    const res = await api.call('SandboxService', 'ListSandboxDir', { sandboxId, path });
    const crumbs = [h('a', { href: href('') }, 'workspace')];
    const parts = path ? path.split('/') : [];
    parts.forEach((p, i) => crumbs.push(' / ', i === parts.length - 1 ? h('span', { 'aria-current': 'page' }, p) : h('a', { href: href(parts.slice(0, i + 1).join('/')) }, p)));
    const rows = (res.entries || []).map((e) => {
      const rel = e.path || (path ? path + '/' + e.name : e.name);
      const dir = e.type === 'FILE_TYPE_DIRECTORY';
      const file = e.type === 'FILE_TYPE_FILE';
      return h('tr', { 'data-path': rel },
        h('td', null, dir ? h('a', { href: href(rel) }, e.name + '/') : h('span', { class: 'mono' }, e.name)),
        h('td', null, enumName(e.type, 'FILE_TYPE_')),
        h('td', { class: 'num' }, dir ? '' : size(e.size)),
        h('td', { class: 'mono' }, e.mode ? '0' + Number(e.mode).toString(8) : ''),
        h('td', null, age(e.modifyTime)),
        h('td', null, file ? h('button', {
          type: 'button', class: 'download', 'aria-label': 'Download ' + rel,
          onclick: () => api.download(sandboxId, rel).then((n) => announce('Downloaded ' + rel + ' (' + size(n) + ')')).catch(showError),
        }, 'Download') : null));
    });
    if (!rows.length) { rows.push(h('tr', null, h('td', { colspan: 6, class: 'muted' }, 'Empty directory.'))); }
    return [
      h('h1', null, 'Files of sandbox ', h('span', { class: 'mono' }, sandboxId)),
      h('nav', { class: 'crumbs', 'aria-label': 'Path' }, crumbs),
      h('table', { id: 'files-table' },
        h('thead', null, h('tr', null, ['Name', 'Type', 'Size', 'Mode', 'Modified', ''].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', null, rows)),
    ];
  }

  function terminalPage(sandboxId) {
    const state = h('span', { id: 'terminal-state' }, 'connecting');
    const box = h('div', { class: 'term', id: 'terminal', role: 'application', 'aria-label': 'Terminal of sandbox ' + sandboxId });
    const again = h('button', { type: 'button', id: 'terminal-reconnect', hidden: true }, 'Reconnect');
    let ws = null;
    let term = null;
    let exited = '';
    function connect() {
      exited = '';
      again.hidden = true;
      state.textContent = 'connecting';
      if (!term) {
        term = new window.Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, rendererType: 'dom' });
        term.open(box);
        window.Terminal.fitAddon.fit(term);
        term.on('data', (d) => { if (ws && ws.readyState === WebSocket.OPEN) { ws.send(new TextEncoder().encode(d)); } });
        term.on('resize', (sz) => { if (ws && ws.readyState === WebSocket.OPEN) { ws.send(JSON.stringify({ cols: sz.cols, rows: sz.rows })); } });
      }
      const dec = new TextDecoder();
      ws = api.terminalSocket(sandboxId, term.cols, term.rows);
      ws.onopen = () => {
        state.textContent = 'connected';
        term.focus();
      };
      ws.onmessage = (m) => {
        if (typeof m.data === 'string') { // the last message: {"exit_code":N,"signal":"..."}
          let exit = {};
          try { exit = JSON.parse(m.data); } catch (e) { /* not JSON */ }
          exited = 'exited' + (exit.signal ? ' on signal ' + exit.signal : ' with code ' + (exit.exit_code || 0));
          state.textContent = exited;
          return;
        }
        term.write(dec.decode(new Uint8Array(m.data), { stream: true }));
      };
      ws.onclose = (e) => {
        state.textContent = exited || ('closed' + (e.reason ? ': ' + e.reason : e.code !== 1000 ? ' (code ' + e.code + ')' : ''));
        again.hidden = false;
      };
    }
    again.addEventListener('click', connect);
    const onResize = () => { if (term) { window.Terminal.fitAddon.fit(term); } };
    window.addEventListener('resize', onResize);
    leaving.push(() => {
      window.removeEventListener('resize', onResize);
      if (ws) { ws.onclose = null; ws.close(); }
      if (term) { term.dispose(); }
    });
    setTimeout(connect, 0); // after the box is in the document
    return [
      h('h1', null, 'Terminal of sandbox ', h('span', { class: 'mono' }, sandboxId)),
      h('div', { class: 'toolbar' }, h('span', null, 'State: ', state), again,
        h('a', { href: '#/sandboxes/' + encodeURIComponent(sandboxId) + '/files/' }, 'Files')),
      box,
    ];
  }

  // newRunPage is the form that starts a run (StartRun) and then shows it.
  function newRunPage() {
    const field = (id, label, input, hint) => h('div', { class: 'field' },
      h('label', { for: id }, label), input, hint ? h('p', { class: 'muted', id: id + '-hint' }, hint) : null);
    const agent = h('input', { type: 'text', id: 'new-agent', name: 'agent', autocomplete: 'off', placeholder: 'agent' });
    const model = h('input', { type: 'text', id: 'new-model', name: 'model', autocomplete: 'off', placeholder: "the service's default" });
    const instructions = h('textarea', { id: 'new-instructions', name: 'instructions', rows: 4,
      'aria-describedby': 'new-instructions-hint' });
    const input = h('textarea', { id: 'new-input', name: 'input', rows: 4, required: true });
    const manifest = h('textarea', { id: 'new-manifest', name: 'manifest', rows: 8, class: 'mono', spellcheck: 'false',
      'aria-describedby': 'new-manifest-hint' });
    const approve = h('input', { type: 'checkbox', id: 'new-approve-shell', name: 'approve-shell', checked: true });
    const submit = h('button', { type: 'submit', id: 'new-submit' }, 'Start run');
    const form = h('form', {
      class: 'new-run', id: 'new-run-form',
      onsubmit: async (e) => {
        e.preventDefault();
        const req = { input: input.value, agent: {} };
        if (agent.value.trim()) { req.agent.name = agent.value.trim(); }
        if (model.value.trim()) { req.agent.model = model.value.trim(); }
        if (instructions.value.trim()) { req.agent.instructions = instructions.value; }
        if (manifest.value.trim()) { req.manifest = manifest.value; }
        if (approve.checked) { req.approvals = { requireApproval: ['exec_command'] }; }
        submit.disabled = true;
        alertBox.textContent = '';
        try {
          const res = await api.call('RunService', 'StartRun', req);
          announce('Run ' + res.run.runId + ' started');
          location.hash = '#/runs/' + encodeURIComponent(res.run.runId);
        } catch (err) {
          showError(err);
          submit.disabled = false;
        }
      },
    },
    field('new-agent', 'Agent name', agent),
    field('new-instructions', 'Instructions', instructions, "Empty: the service's default instructions."),
    field('new-model', 'Model', model),
    field('new-input', 'Input (the task)', input),
    field('new-manifest', 'Manifest (YAML or JSON)', manifest,
      'The workspace: files, directories, git repositories, users. Host paths and secrets are refused.'),
    h('div', { class: 'field check' }, approve, h('label', { for: 'new-approve-shell' }, 'Require approval for shell commands')),
    submit);
    return [h('h1', null, 'Start a run'), form];
  }

  // --- routing ------------------------------------------------------------

  function every(ms, f) {
    const id = setInterval(() => { if (!document.hidden) { f(); } }, ms);
    leaving.push(() => clearInterval(id));
  }

  const routes = [
    [/^#\/runs\/new$/, () => newRunPage(), 'runs'],
    [/^#\/runs\/([^/]+)$/, (m) => runPage(decodeURIComponent(m[1])), 'runs'],
    [/^#\/runs$/, () => runsPage(), 'runs'],
    [/^#\/sandboxes$/, () => sandboxesPage(), 'sandboxes'],
    [/^#\/sandboxes\/([^/]+)$/, (m) => sandboxPage(decodeURIComponent(m[1])), 'sandboxes'],
    [/^#\/sandboxes\/([^/]+)\/terminal$/, (m) => terminalPage(decodeURIComponent(m[1])), 'sandboxes'],
    [/^#\/sandboxes\/([^/]+)\/files(?:\/(.*))?$/, (m) => filesPage(decodeURIComponent(m[1]),
      (m[2] || '').split('/').map(decodeURIComponent).join('/')), 'sandboxes'],
  ];

  let rendering = 0;
  // render shows the page of location.hash (the sign-in form, with
  // message, when there is no token).
  async function render(message) {
    const mine = ++rendering;
    for (const f of leaving.splice(0)) { f(); }
    alertBox.textContent = '';
    document.getElementById('forget-token').hidden = !api.token();
    if (!api.token()) {
      view.replaceChildren(...tokenPage(typeof message === 'string' && message ? message : refusal));
      document.title = 'Sign in · Bulkhead console';
      return;
    }
    const route = routes.find(([re]) => re.test(location.hash));
    if (!route) { location.replace('#/runs'); return; }
    for (const a of document.querySelectorAll('header nav a')) {
      if (a.id === 'nav-' + route[2]) { a.setAttribute('aria-current', 'page'); } else { a.removeAttribute('aria-current'); }
    }
    view.setAttribute('aria-busy', 'true');
    try {
      const content = await route[1](location.hash.match(route[0]));
      if (mine !== rendering) { return; }
      view.replaceChildren(...[content].flat());
      const h1 = view.querySelector('h1');
      document.title = (h1 ? h1.textContent + ' · ' : '') + 'Bulkhead console';
      view.focus();
    } catch (err) {
      if (mine !== rendering) { return; }
      view.replaceChildren(h('h1', null, 'Error'), h('p', null, err.message || String(err)));
      showError(err);
    } finally {
      if (mine === rendering) { view.removeAttribute('aria-busy'); }
    }
  }

  document.getElementById('forget-token').addEventListener('click', () => { api.forgetToken(); refusal = ''; render(); });
  window.addEventListener('hashchange', () => render());
  render();
})();
