// The gateway web panel: ES modules (this one and security.js), no build step, no third-party
// hosts. It renders the page for location.pathname from the account, auth, payment and content
// APIs. Every mutation is same-origin (the browser sends Origin) and carries the session's CSRF
// token.

import { securityPage as renderSecurity } from './security.js';

const SVG_NS = 'http://www.w3.org/2000/svg';
const main = document.getElementById('main');
const statusEl = document.getElementById('status');
let csrf = null;
let session = null;

class ApiError extends Error {
  constructor(code, status) {
    super(code);
    this.code = code;
    this.status = status;
  }
}

const MESSAGES = {
  terms_required: 'Please accept the terms first.',
  captcha_required: 'Please complete the captcha.',
  captcha_failed: 'The captcha check failed; try again.',
  invalid_email: 'That email address does not look right.',
  invalid_code: 'That code is not valid.',
  code_expired: 'That code has expired; ask for a new one.',
  too_many_attempts: 'Too many attempts; ask for a new code.',
  rate_limited: 'Too many requests; wait a moment.',
  two_factor_code_required: 'Enter the code from your authenticator app, or a recovery code.',
  invalid_two_factor_code: 'That authenticator code is not valid.',
  private_beta_only: 'The panel is in private beta for now.',
  blocked_domain: 'This email domain cannot sign in.',
  active_key_limit_reached: 'You already have the maximum number of active keys.',
  too_many_pending_payment_orders: 'You have too many unpaid orders; pay or let one expire first.',
  invalid_quantity: 'Enter a valid quantity.',
  order_below_minimum: 'That order is below the smallest amount we accept; order more.',
  invalid_quota_type: 'That cannot be bought here.',
  unauthorized: 'Your session has ended; sign in again.',
};
const explain = (e) => (e instanceof ApiError ? MESSAGES[e.code] || `Error: ${e.code}` : `Error: ${e.message}`);

function say(msg) {
  statusEl.textContent = msg;
  clearTimeout(say.timer);
  if (msg) say.timer = setTimeout(() => { statusEl.textContent = ''; }, 6000);
}

/** A fetch of the site's own API: JSON in and out, cookies and the CSRF token attached. */
async function api(path, { method = 'GET', body } = {}) {
  const headers = { accept: 'application/json' };
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (method !== 'GET' && csrf) headers['x-csrf-token'] = csrf;
  const resp = await fetch(path, {
    method,
    headers,
    credentials: 'same-origin',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await resp.json(); } catch { data = null; }
  if (!resp.ok || (data && data.ok === false)) {
    const code = (data && data.code) || `http_${resp.status}`;
    if (code === 'unauthorized' && !location.pathname.startsWith('/panel/signin')) {
      location.replace('/panel/signin');
    }
    throw new ApiError(code, resp.status);
  }
  if (data && typeof data.csrfToken === 'string') csrf = data.csrfToken;
  return data;
}

/** `el('p', {class: 'x'}, 'text', child)`: a DOM element, never HTML strings. */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else if (v === true) node.setAttribute(k, '');
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svgEl(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

const fmt = (n) => (typeof n === 'number' ? n.toLocaleString('en-US') : '—');
const short = (n) => {
  if (typeof n !== 'number') return '—';
  const units = [[1e12, 'T'], [1e9, 'B'], [1e6, 'M'], [1e3, 'k']];
  for (const [v, s] of units) if (Math.abs(n) >= v) return `${+(n / v).toFixed(1)}${s}`;
  return String(n);
};
const when = (iso) => (iso ? new Date(iso).toLocaleString('en-GB', { dateStyle: 'medium', timeStyle: 'short' }) : '—');
const vnd = (n) => `${fmt(n)} ₫`;
const badge = (s) => el('span', { class: `badge ${s}` }, s);
const hourLabel = (iso) => new Date(iso).toLocaleTimeString('en-GB', { hour: '2-digit', minute: '2-digit' });

/** Short names of common Vietnamese banks by their NAPAS BIN (the VietQR bank id). */
const BANKS = {
  970436: 'Vietcombank', 970415: 'VietinBank', 970418: 'BIDV', 970405: 'Agribank',
  970422: 'MB Bank', 970407: 'Techcombank', 970416: 'ACB', 970432: 'VPBank', 970423: 'TPBank',
  970403: 'Sacombank', 970437: 'HDBank', 970441: 'VIB', 970443: 'SHB', 970431: 'Eximbank',
  970426: 'MSB', 970448: 'OCB', 970440: 'SeABank', 970449: 'LPBank', 970429: 'SCB',
  970454: 'BVBank', 970425: 'ABBANK', 970428: 'Nam A Bank', 970409: 'Bac A Bank',
  970412: 'PVcomBank', 970419: 'NCB', 970427: 'VietABank', 970433: 'VietBank',
  970452: 'KienlongBank', 970400: 'Saigonbank', 970438: 'BaoViet Bank', 970430: 'PGBank',
  970406: 'DongA Bank', 970424: 'Shinhan Bank', 970458: 'UOB', 970457: 'Woori Bank',
  970439: 'Public Bank', 970442: 'Hong Leong Bank', 970446: 'Co-opBank', 546034: 'CAKE',
  546035: 'Ubank', 963388: 'Timo',
};
/** "VietinBank (BIN 970415)", or the bare BIN when the bank is not in the table. */
const bankLabel = (bin) => (bin ? (BANKS[bin] ? `${BANKS[bin]} (BIN ${bin})` : bin) : '—');

/**
 * Runs `work` with `buttons` disabled (and marked busy), so a second click while the request
 * is in flight does nothing: a double click never sends two orders. Returns undefined without
 * running when one of them is already disabled.
 */
async function busy(buttons, work) {
  const list = [].concat(buttons).filter(Boolean);
  if (list.some((b) => b.disabled)) return undefined;
  for (const b of list) { b.disabled = true; b.setAttribute('aria-busy', 'true'); }
  try {
    return await work();
  } finally {
    for (const b of list) { b.disabled = false; b.removeAttribute('aria-busy'); }
  }
}

/**
 * A modal question; resolves true for the confirm button (`ok`), false for the other one
 * (`keep`, which names what dismissing keeps) or Escape.
 */
function confirmAction({ title, text, ok, keep = 'Cancel', danger = false }) {
  return new Promise((resolve) => {
    const yes = el('button', { type: 'button', id: 'confirm-ok', class: danger ? 'danger-solid' : null }, ok);
    const no = el('button', { type: 'button', id: 'confirm-cancel', class: 'secondary' }, keep);
    const dlg = el('dialog', { id: 'confirm', class: 'confirm', 'aria-labelledby': 'confirm-h', 'aria-describedby': 'confirm-text' },
      el('h2', { id: 'confirm-h' }, title), el('p', { id: 'confirm-text' }, text), el('div', { class: 'row end' }, no, yes));
    const done = (answer) => { dlg.close(); dlg.remove(); resolve(answer); };
    yes.addEventListener('click', () => done(true));
    no.addEventListener('click', () => done(false));
    dlg.addEventListener('cancel', (ev) => { ev.preventDefault(); done(false); });
    document.body.append(dlg);
    dlg.showModal();
    no.focus();
  });
}

/**
 * A button that copies `text` and says so: small and secondary beside a value, or (`primary`)
 * a full-size primary button when copying is the step's main action.
 */
function copyButton(id, text, what, { primary = false } = {}) {
  const b = el('button', { type: 'button', class: primary ? null : 'secondary small-btn', id, 'aria-label': `Copy ${what}` }, 'Copy');
  b.addEventListener('click', async () => {
    const ok = await copy(text);
    b.textContent = ok ? 'Copied' : 'Copy failed';
    say(ok ? `${what[0].toUpperCase()}${what.slice(1)} copied.` : `Copy failed: select the ${what} and copy it by hand.`);
  });
  return b;
}

/** Renders a page: its title and the sections given (absent ones, `null`, are left out). */
function page(title, ...children) {
  document.title = `${title} · Gateway panel`;
  main.replaceChildren(el('h1', {}, title), ...children.filter((c) => c !== null && c !== undefined && c !== false));
}

/**
 * A table that scrolls inside its card when it is wider than the card; on narrow screens each
 * row becomes a stacked block of "label: value" lines (the labels come from `data-label`).
 */
function table(caption, head, rows, numeric = [], id = null) {
  if (!rows.length) return el('p', { class: 'muted' }, `No ${caption.toLowerCase()} yet.`);
  const cls = (i) => [numeric.includes(i) ? 'num' : null, head[i] ? null : 'actions'].filter(Boolean).join(' ') || null;
  return el('div', { class: 'table-wrap' }, el('table', { class: 'stack', id },
    el('caption', { class: 'muted small', hidden: true }, caption),
    el('thead', {}, el('tr', {}, head.map((h, i) => el('th', { scope: 'col', class: cls(i) }, h)))),
    el('tbody', {}, rows.map((r) => el('tr', {}, r.map((c, i) => el('td', { class: cls(i), 'data-label': head[i] || null }, c)))))));
}

/** Asks the gateway for the QR code of `text` and puts the SVG in `box`. */
async function drawQr(box, text, label) {
  box.replaceChildren(el('p', { class: 'muted small' }, 'Drawing QR code…'));
  const resp = await fetch('/panel/qr', {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'content-type': 'application/json', 'x-csrf-token': csrf || '' },
    body: JSON.stringify({ text }),
  });
  if (!resp.ok) {
    box.replaceChildren(el('p', { class: 'error' }, 'The QR code could not be drawn.'));
    return;
  }
  const doc = new DOMParser().parseFromString(await resp.text(), 'image/svg+xml');
  const svg = document.importNode(doc.documentElement, true);
  if (svg.nodeName.toLowerCase() !== 'svg') {
    box.replaceChildren(el('p', { class: 'error' }, 'The QR code could not be drawn.'));
    return;
  }
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', label);
  box.replaceChildren(svg);
}

async function copy(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const area = el('textarea', { readonly: true });
    area.value = text;
    document.body.append(area);
    area.select();
    const ok = document.execCommand('copy');
    area.remove();
    return ok;
  }
}

// ---------------------------------------------------------------------------------------------
// Sign-in

async function signinPage() {
  if (session) return location.replace('/panel/keys');
  const config = await api('/api/auth/config').catch(() => ({}));
  const captchaNeeded = Boolean(config.captchaRequired || config.captchaSiteKey);
  const error = el('p', { class: 'error', role: 'alert' });
  let email = '';

  const emailInput = el('input', { type: 'email', id: 'email', name: 'email', required: true, autocomplete: 'email' });
  const terms = el('input', { type: 'checkbox', id: 'terms', name: 'terms', required: true });
  const captchaInput = el('input', { type: 'text', id: 'captcha', name: 'captcha', autocomplete: 'off' });
  const captcha = captchaNeeded
    ? el('div', { class: 'captcha', 'data-sitekey': config.captchaSiteKey || '' },
      el('label', { for: 'captcha' }, 'Captcha'),
      el('p', { class: 'muted small' }, 'Complete the captcha check (site key ', el('code', {}, config.captchaSiteKey || '—'), ').'),
      captchaInput)
    : null;
  const requestForm = el('form', { id: 'request-form', novalidate: true },
    el('label', { for: 'email' }, 'Email address'), emailInput,
    el('label', { class: 'check' }, terms, el('span', {}, 'I accept the ', el('a', { href: '/panel/terms', target: '_blank' }, 'terms of service'), '.')),
    captcha,
    el('div', { class: 'row' }, el('button', { type: 'submit' }, 'Send me a sign-in code')));

  const codeInput = el('input', { type: 'text', id: 'code', name: 'code', inputmode: 'numeric', autocomplete: 'one-time-code', pattern: '[0-9]{6}', maxlength: 6, required: true });
  const tfaInput = el('input', { type: 'text', id: 'two-factor', name: 'twoFactorCode', autocomplete: 'one-time-code', maxlength: 24 });
  const tfaBox = el('div', { id: 'two-factor-box', hidden: true },
    el('label', { for: 'two-factor' }, 'Authenticator code'), tfaInput,
    el('p', { class: 'muted small' }, 'Lost your authenticator? Type one of your recovery codes instead.'));
  const sentTo = el('strong');
  const codeForm = el('form', { id: 'code-form', hidden: true, novalidate: true },
    el('p', { class: 'notice', id: 'check-mail' }, 'Check your mail: we sent a 6-digit code to ', sentTo,
      '. You can also open the sign-in link in that mail instead of typing the code.'),
    el('label', { for: 'code' }, 'Sign-in code'), codeInput, tfaBox,
    el('div', { class: 'row' },
      el('button', { type: 'submit' }, 'Sign in'),
      el('button', { type: 'button', class: 'secondary', id: 'resend' }, 'Send a new code'),
      el('button', { type: 'button', class: 'link', id: 'change-email' }, 'Use another address')));

  terms.addEventListener('change', () => { error.textContent = ''; });
  requestForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    error.textContent = '';
    email = emailInput.value.trim();
    if (!email) { error.textContent = 'Enter your email address.'; return emailInput.focus(); }
    if (!terms.checked) { error.textContent = MESSAGES.terms_required; return terms.focus(); }
    const body = { email, acceptedTerms: true };
    if (captchaNeeded) body.captchaToken = captchaInput.value.trim();
    try {
      await api('/api/auth/request-code', { method: 'POST', body });
      sentTo.textContent = email;
      requestForm.hidden = true;
      codeForm.hidden = false;
      codeInput.focus();
      say('Code sent.');
    } catch (e) { error.textContent = explain(e); }
  });
  codeForm.querySelector('#resend').addEventListener('click', async () => {
    error.textContent = '';
    const body = captchaNeeded ? { captchaToken: captchaInput.value.trim() } : {};
    try { await api('/api/auth/resend-code', { method: 'POST', body }); say('A new code is on its way.'); } catch (e) { error.textContent = explain(e); }
  });
  codeForm.querySelector('#change-email').addEventListener('click', () => {
    codeForm.hidden = true;
    requestForm.hidden = false;
    emailInput.focus();
  });
  codeForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    error.textContent = '';
    const body = { email, code: codeInput.value.trim() };
    if (!tfaBox.hidden) body.twoFactorCode = tfaInput.value.trim();
    try {
      await api('/api/auth/verify-code', { method: 'POST', body });
      say('Signed in.');
      location.assign('/panel/keys');
    } catch (e) {
      if (e.code === 'two_factor_code_required' && tfaBox.hidden) {
        tfaBox.hidden = false;
        tfaInput.focus();
      }
      error.textContent = explain(e);
    }
  });

  document.title = 'Sign in · Gateway panel';
  main.replaceChildren(el('section', { class: 'card narrow', 'aria-labelledby': 'signin-h' },
    el('h1', { id: 'signin-h' }, 'Sign in'),
    el('p', { class: 'muted' }, 'No password: we email you a one-time code and link.'),
    requestForm, codeForm, error));
  emailInput.focus();
}

// ---------------------------------------------------------------------------------------------
// Overview

/**
 * What the account has used and has left: the weekly allowance of its tier (a rolling week),
 * purchased lots, and the sum of both, for tokens and, when the tier caps them, requests.
 */
function quotaSection(q, lots = []) {
  if (q.unlimited) {
    return el('section', { class: 'card', id: 'quota', 'aria-labelledby': 'quota-h' },
      el('h2', { id: 'quota-h' }, 'Quota'), el('p', {}, el('strong', { id: 'quota-left' }, 'Unlimited'), ' — this account is not metered.'));
  }
  const allowance = q.weeklyTokens || 0;
  const allowanceLeft = q.allowanceTokensRemaining ?? Math.max(0, (q.tokensRemaining || 0) - (q.lotTokensRemaining || 0));
  const tokenLots = lots.filter((l) => l.type === 'token' && l.remaining > 0);
  const requestLots = lots.filter((l) => l.type === 'request' && l.remaining > 0);
  const nextExpiry = (ls) => ls.map((l) => l.expiresAt).sort()[0];
  // The bar shows what is left, as the text beside it does: full at the start of the week.
  const meter = (left, total, label) => el('progress', { id: 'quota-allowance-bar', max: Math.max(1, total), value: Math.min(left, total), 'aria-label': label });
  const requests = q.weeklyRequests
    ? [el('dt', {}, 'Weekly requests'), el('dd', { id: 'quota-requests' }, `${fmt(q.allowanceRequestsRemaining)} of ${fmt(q.weeklyRequests)} left`)]
    : [el('dt', {}, 'Weekly requests'), el('dd', { id: 'quota-requests' }, 'no weekly cap')];
  return el('section', { class: 'card', id: 'quota', 'aria-labelledby': 'quota-h' },
    el('h2', { id: 'quota-h' }, 'Quota'),
    el('div', { class: 'grid tight' },
      el('div', { class: 'stat' }, el('div', { class: 'v', id: 'quota-left' }, short(q.tokensRemaining)), el('div', { class: 'k' }, `tokens left (${fmt(q.tokensRemaining)})`)),
      el('div', { class: 'stat' }, el('div', { class: 'v', id: 'quota-used' }, short(q.weeklyTokensUsed)), el('div', { class: 'k' }, 'tokens used this week'))),
    el('dl', { class: 'kv plain' },
      el('dt', {}, 'Weekly allowance'),
      el('dd', { id: 'quota-allowance' }, `${fmt(allowanceLeft)} of ${fmt(allowance)} tokens left`, el('br'), meter(allowanceLeft, allowance, 'Weekly allowance left')),
      el('dt', {}, 'Purchased lots'),
      el('dd', { id: 'quota-lots' }, tokenLots.length
        ? `${fmt(q.lotTokensRemaining)} tokens left in ${tokenLots.length} lot${tokenLots.length > 1 ? 's' : ''}, next expiry ${when(nextExpiry(tokenLots))}`
        : 'none — buy a package on the billing page'),
      ...requests,
      requestLots.length ? el('dt', {}, 'Request lots') : null,
      requestLots.length ? el('dd', {}, `${fmt(q.lotRequestsRemaining)} requests left`) : null),
    el('p', { class: 'muted small' }, 'The weekly allowance of your tier is spent first, then lots, the one expiring soonest first.'));
}

async function overviewPage() {
  const [p, u] = await Promise.all([api('/api/account/profile'), api('/api/account/usage?period=1h').catch(() => ({}))]);
  const q = p.quota || {};
  page('Account',
    el('section', { class: 'card' },
      el('h2', {}, 'Your plan'),
      el('dl', { class: 'kv' },
        el('dt', {}, 'Email'), el('dd', {}, session.user.email),
        el('dt', {}, 'Tier'), el('dd', {}, q.effectiveTier || p.user.quotaTier || '—'),
        el('dt', {}, 'Weekly tokens'), el('dd', {}, q.unlimited ? 'unlimited' : fmt(q.weeklyTokens)),
        el('dt', {}, 'Two-factor'), el('dd', {}, p.user.twoFactorEnabled ? 'on' : 'off'),
        el('dt', {}, 'Member since'), el('dd', {}, when(p.user.createdAt)))),
    quotaSection(q, u.quotaLots || []),
    el('nav', { class: 'card', 'aria-label': 'Sections' },
      el('div', { class: 'row' },
        el('a', { href: '/panel/keys' }, 'API keys →'), el('a', { href: '/panel/usage' }, 'Usage →'),
        el('a', { href: '/panel/billing' }, 'Buy quota →'), el('a', { href: '/panel/security' }, 'Security →'))));
}

// ---------------------------------------------------------------------------------------------
// Keys

async function keysPage() {
  const data = await api('/api/account/keys');
  const keys = data.keys || [];
  const error = el('p', { class: 'error', role: 'alert' });
  const active = keys.filter((k) => k.status === 'active');
  const revoked = keys.filter((k) => k.status !== 'active');
  const global = active.find((k) => k.global);
  const others = active.filter((k) => !k.global);
  const label = (k) => `${k.name} (${k.keyPrefix}…${k.keySuffix})`;

  const rotate = el('button', { type: 'button', id: 'rotate' }, global ? 'Rotate global key' : 'Create global key');
  rotate.addEventListener('click', async () => {
    error.textContent = '';
    if (global && !await confirmAction({
      title: 'Rotate the global key?',
      text: `A new global key is created and ${label(global)} stops working at once: every program that uses it needs the new key.${others.length ? ` Your ${others.length === 1 ? 'other key stays' : `${others.length} other keys stay`} active.` : ''}`,
      ok: 'Rotate key',
      keep: 'Keep current key',
      danger: true,
    })) return;
    await busy(rotate, async () => {
      try {
        const r = await api('/api/account/keys', { method: 'POST', body: { rotate: true } });
        await keysPage();
        showSecret(r.secret);
        say('New key created. Copy it now: it is shown only once.');
      } catch (e) { error.textContent = explain(e); }
    });
  });

  const rows = active.map((k) => {
    const revoke = el('button', { type: 'button', class: 'danger', 'data-revoke': k.id, 'aria-label': `Revoke ${label(k)}` }, 'Revoke');
    revoke.addEventListener('click', async () => {
      error.textContent = '';
      if (!await confirmAction({
        title: 'Revoke this key?',
        text: `${label(k)} stops working at once and cannot be turned back on.`,
        ok: 'Revoke key',
        keep: 'Keep key',
        danger: true,
      })) return;
      await busy([revoke, rotate], async () => {
        try {
          await api(`/api/account/keys/${encodeURIComponent(k.id)}`, { method: 'DELETE' });
          say('Key revoked.');
          await keysPage();
        } catch (e) { error.textContent = explain(e); }
      });
    });
    return [
      el('span', {}, k.name, k.global ? [' ', el('span', { class: 'badge global' }, 'global')] : null, el('br'), el('span', { class: 'muted small mono' }, k.id)),
      el('code', {}, `${k.keyPrefix}…${k.keySuffix}`),
      (k.scopes || []).join(', '),
      when(k.createdAt),
      when(k.lastUsedAt),
      revoke,
    ];
  });
  const revokedRows = revoked.map((k) => [
    el('span', {}, k.name, el('br'), el('span', { class: 'muted small mono' }, k.id)),
    el('code', {}, `${k.keyPrefix}…${k.keySuffix}`),
    when(k.createdAt),
    when(k.revokedAt),
  ]);

  page('API keys',
    el('section', { class: 'card', 'aria-labelledby': 'active-h' },
      el('h2', { id: 'active-h' }, `Active keys (${active.length})`),
      el('p', { class: 'muted', id: 'rotation-note' },
        'Every key draws on your account quota. ',
        el('strong', {}, 'Rotating replaces the global key'),
        ': a new global key is created and shown once, and the previous global key stops working at once. ',
        'Other keys (an operator may create some for your programs) are not touched: they stay active until you revoke them.'),
      table('Active keys', ['Name', 'Key', 'Scopes', 'Created', 'Last used', ''], rows, [], 'active-keys'),
      el('div', { class: 'row' }, rotate),
      el('div', { id: 'secret-box', 'aria-live': 'polite' }), error),
    revokedRows.length
      ? el('section', { class: 'card', 'aria-labelledby': 'revoked-h' },
        el('h2', { id: 'revoked-h' }, `Revoked keys (${revokedRows.length})`),
        table('Revoked keys', ['Name', 'Key', 'Created', 'Revoked'], revokedRows, [], 'revoked-keys'))
      : null);

  function showSecret(secret) {
    const box = document.getElementById('secret-box');
    if (!box || !secret) return;
    const copyBtn = el('button', { type: 'button', class: 'secondary', id: 'copy-secret' }, 'Copy');
    copyBtn.addEventListener('click', async () => {
      const ok = await copy(secret);
      copyBtn.textContent = ok ? 'Copied' : 'Copy failed';
      say(ok ? 'Key copied to the clipboard.' : 'Copy failed: select the key and copy it by hand.');
    });
    box.replaceChildren(el('div', { class: 'notice row' },
      el('p', {}, el('strong', {}, 'Your new key. '), 'It is shown only this once: store it somewhere safe.'),
      el('div', { class: 'secret' }, el('code', { id: 'new-secret' }, secret), copyBtn)));
    box.scrollIntoView({ block: 'center' });
  }
}

// ---------------------------------------------------------------------------------------------
// Usage

/**
 * Input and output tokens per bucket as an SVG bar chart. `buckets` are the usage API's
 * `daily` (key `day`) or `hourly` (key `hour`) items. The drawing is as wide as the space it
 * gets, so labels stay readable on a phone.
 */
function usageChart(buckets, hourly) {
  const W = Math.round(Math.max(300, Math.min(760, main.clientWidth - 48)));
  const H = W < 500 ? 220 : 260; const L = 44; const B = 28; const T = 12; const R = 20;
  const peak = Math.max(1, ...buckets.map((d) => Math.max(d.inputTokens || 0, d.outputTokens || 0)));
  // A round axis top that splits into four whole ticks.
  const mag = 10 ** Math.floor(Math.log10(peak));
  const max = [0.4, 0.8, 1, 2, 4, 8, 10].map((m) => Math.round(m * mag))
    .find((m) => m >= Math.max(peak, 4) && Number.isInteger(m / 4)) || 10 * mag;
  const plotW = W - L - R; const plotH = H - T - B;
  const slot = plotW / Math.max(1, buckets.length);
  const barW = Math.max(2, Math.min(28, (slot - 4) / 2));
  const unit = hourly ? 'hour' : 'day';
  const label = (d) => (hourly ? hourLabel(d.hour) : d.day.slice(5));
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': 'chart-title', id: 'usage-chart', 'data-unit': unit });
  svg.append(svgEl('title', { id: 'chart-title' }, `Input and output tokens per ${unit}`));
  for (let i = 0; i <= 4; i += 1) {
    const y = T + plotH - (plotH * i) / 4;
    svg.append(svgEl('line', { x1: L, x2: W - R, y1: y, y2: y, class: 'axis' }));
    svg.append(svgEl('text', { x: L - 6, y: y + 4, 'text-anchor': 'end' }, short(Math.round((max * i) / 4))));
  }
  const labels = Math.max(2, Math.floor(plotW / (hourly ? 52 : 48)));
  const every = Math.ceil(buckets.length / labels);
  buckets.forEach((d, i) => {
    const x0 = L + i * slot + (slot - 2 * barW) / 2;
    for (const [j, key, cls] of [[0, 'inputTokens', 'in'], [1, 'outputTokens', 'out']]) {
      const v = d[key] || 0;
      const h = (plotH * v) / max;
      const rect = svgEl('rect', { x: x0 + j * barW, y: T + plotH - h, width: Math.max(1, barW - 1), height: Math.max(v ? 1 : 0, h), class: `bar ${cls}`, [`data-${unit}`]: d[unit], 'data-value': v });
      rect.append(svgEl('title', {}, `${hourly ? `${when(d.hour)}` : d.day} ${cls === 'in' ? 'input' : 'output'}: ${fmt(v)} tokens`));
      svg.append(rect);
    }
    if ((buckets.length - 1 - i) % every === 0) {
      svg.append(svgEl('text', { x: L + i * slot + slot / 2, y: H - 8, 'text-anchor': 'middle' }, label(d)));
    }
  });
  return el('figure', { class: 'chart' }, svg,
    el('figcaption', { class: 'legend' }, el('span', { class: 'in' }, 'Input tokens'), el('span', { class: 'out' }, 'Output tokens')));
}

/** A quota weight as `×1.5`: up to six decimals, no trailing zeros. */
function weight(w) {
  return typeof w === 'number' ? `×${Number(w.toFixed(6))}` : '—';
}

async function usagePage() {
  const params = new URLSearchParams(location.search);
  const period = ['1h', '24h', '7d', '30d'].includes(params.get('period')) ? params.get('period') : '7d';
  const u = await api(`/api/account/usage?period=${encodeURIComponent(period)}`);
  const s = u.summary || {};
  const seg = el('div', { class: 'seg', role: 'group', 'aria-label': 'Period' },
    ['1h', '24h', '7d', '30d'].map((p) => {
      const b = el('button', { type: 'button', 'aria-pressed': String(p === u.period), 'data-period': p }, p);
      b.addEventListener('click', () => {
        history.replaceState(null, '', `/panel/usage?period=${p}`);
        usagePage().catch(fail);
      });
      return b;
    }));
  const stat = (k, v, id, cls = 'v') => el('div', { class: 'stat' }, el('div', { class: cls, id }, v), el('div', { class: 'k' }, k));
  const hourly = Array.isArray(u.hourly);
  page('Usage', seg,
    el('section', { class: 'grid summary', id: 'summary', 'aria-label': 'Summary' },
      stat('Quota charged', fmt(s.quotaCharged), 'sum-charged'),
      stat('Requests', fmt(s.requests), 'sum-requests'),
      stat('Input tokens', fmt(s.inputTokens), 'sum-input'),
      stat('Output tokens', fmt(s.outputTokens), 'sum-output'),
      stat('Total tokens', fmt(s.totalTokens), 'sum-total'),
      stat('Last API call', when(s.lastApiCall), 'sum-last', 'v date')),
    quotaSection(u.quota || {}, u.quotaLots || []),
    el('section', { class: 'card', 'aria-labelledby': 'chart-h' }, el('h2', { id: 'chart-h' }, hourly ? 'Tokens per hour' : 'Tokens per day'),
      el('div', { id: 'chart-box' })),
    el('section', { class: 'card', 'aria-labelledby': 'model-h' }, el('h2', { id: 'model-h' }, 'By model'),
      table('Models', ['Model', 'Quota', 'Requests', 'Input', 'Cached', 'Output', 'Total'],
        (u.byModel || []).map((m) => [el('code', {}, m.model), fmt(m.quotaCharged), fmt(m.requests), fmt(m.inputTokens), fmt(m.cachedTokens), fmt(m.outputTokens), fmt(m.totalTokens)]), [1, 2, 3, 4, 5, 6], 'by-model')),
    el('section', { class: 'card', 'aria-labelledby': 'recent-h' }, el('h2', { id: 'recent-h' }, 'Recent requests'),
      table('Requests', ['Time', 'Model', 'Effort', 'Quota', 'Input', 'Cached', 'Output', 'Total'],
        (u.recentRequests || []).map((r) => [when(r.createdAt), el('code', {}, r.model), r.reasoningEffort || '—', fmt(r.quotaCharged), fmt(r.inputTokens), fmt(r.cachedTokens), fmt(r.outputTokens), fmt(r.totalTokens)]), [3, 4, 5, 6, 7])),
    el('section', { class: 'card', 'aria-labelledby': 'weights-h' }, el('h2', { id: 'weights-h' }, 'Model weights'),
      el('p', { class: 'muted small' }, 'Quota tokens charged per token of each model. A request costs its uncached input, cached input and output tokens at these weights, rounded up once.'),
      table('Model weights', ['Model', 'Input', 'Cached input', 'Output'],
        (u.models || []).map((m) => [el('code', {}, m.id), weight(m.inputWeight), weight(m.cachedInputWeight), weight(m.outputWeight)]), [1, 2, 3], 'model-weights')));
  // Drawn once the page is in place, so the chart takes the width it really has.
  document.getElementById('chart-box').replaceChildren(usageChart(hourly ? u.hourly : (u.daily || []), hourly));
  main.dataset.shownPeriod = u.period;
}

// ---------------------------------------------------------------------------------------------
// Security (its own module; it gets the helpers it needs from here)

const securityPage = () => renderSecurity({ api, el, page, say, explain, busy, drawQr, copyButton });

// ---------------------------------------------------------------------------------------------
// Billing

/** How often the billing page asks whether a pending order was paid. */
const BILLING_POLL_MS = 4000;
let billingPoll = null;
/** Bumped by every billing render, so a poll from an earlier render never redraws. */
let billingRender = 0;

/** Asks to cancel `order`, then cancels it; true when it was cancelled. */
async function cancelOrder(order, button, error) {
  error.textContent = '';
  if (!await confirmAction({
    title: `Cancel order ${order.id}?`,
    text: 'Do not transfer money for it after cancelling: a late transfer is not matched to the order and has to be refunded or credited by hand.',
    ok: 'Cancel order',
    keep: 'Keep order',
    danger: true,
  })) return false;
  return busy(button, async () => {
    try {
      await api(`/api/payment/orders/${encodeURIComponent(order.id)}/cancel`, { method: 'POST', body: {} });
      say(`Order ${order.id} cancelled.`);
      return true;
    } catch (e) {
      error.textContent = e instanceof ApiError && e.code === 'order_not_pending'
        ? 'That order is no longer pending (it was paid or has expired).'
        : explain(e);
      return false;
    }
  });
}

function transferBox(order, onCancel) {
  const t = order.transfer;
  if (!t) {
    const paid = order.paymentStatus === 'paid';
    return el('section', { class: `card notice-card ${order.paymentStatus}`, id: 'order-state', role: 'status' },
      el('h2', {}, paid ? `Order ${order.id} is paid` : `Order ${order.id} is ${order.paymentStatus}`),
      el('p', {}, paid
        ? `Thank you: ${order.packageName ? `${order.packageName} is` : `${fmt(order.quantity)} ${order.quotaType}s are`} added to your quota.`
        : 'Nothing more to do for this order.'));
  }
  const qr = el('div', { class: 'code', id: 'transfer-qr' });
  const amountDigits = String(t.amount);
  const description = t.description || order.paymentCode;
  const cancel = el('button', { type: 'button', class: 'danger', id: 'cancel-shown' }, 'Cancel order');
  cancel.addEventListener('click', () => onCancel(order, cancel));
  const box = el('section', { class: 'card', id: 'transfer', tabindex: '-1', 'aria-labelledby': 'transfer-h' },
    el('h2', { id: 'transfer-h' }, `Pay order ${order.id}`),
    el('div', { class: 'qr' }, qr,
      el('div', { class: 'transfer-text' },
        el('p', {}, 'Transfer exactly this amount with this description; the order is marked paid as soon as the bank reports it, and this page updates by itself.'),
        el('dl', { class: 'kv' },
          el('dt', {}, 'Bank'), el('dd', { id: 'transfer-bank' }, bankLabel(t.bankBin || t.bank)),
          el('dt', {}, 'Account'), el('dd', { class: 'copyable' }, el('span', { id: 'transfer-account', class: 'mono' }, t.accountNumber || '—'), t.accountNumber ? copyButton('copy-account', t.accountNumber, 'account number') : null),
          el('dt', {}, 'Name'), el('dd', {}, t.accountName || '—'),
          el('dt', {}, 'Amount'), el('dd', { class: 'copyable' }, el('span', { id: 'transfer-amount' }, vnd(t.amount)), copyButton('copy-amount', amountDigits, 'amount')),
          el('dt', {}, 'Description'), el('dd', { class: 'copyable' }, el('code', { id: 'transfer-code' }, description), copyButton('copy-description', description, 'description')),
          el('dt', {}, 'Expires'), el('dd', {}, when(order.expiresAt))),
        el('div', { class: 'row' }, cancel))));
  const payload = t.qrPayload || null;
  if (payload) drawQr(qr, payload, 'VietQR transfer code').catch(fail);
  else qr.replaceChildren(el('p', { class: 'muted small' }, 'No QR code: the bank account is not configured.'));
  return box;
}

/**
 * The billing page. `shownId` is the order whose transfer instructions (or, once it is no
 * longer pending, its outcome) are shown at the top. While any order is pending the page asks
 * again every few seconds and redraws when an order changed, so a payment shows up without a
 * reload; it stops asking when none is pending or the page is left.
 */
async function billingPage(shownId = null) {
  clearTimeout(billingPoll);
  const data = await api('/api/payment/orders');
  renderBilling(data, shownId);
}

function renderBilling(data, shownId) {
  clearTimeout(billingPoll);
  const generation = ++billingRender;
  const error = el('p', { class: 'error', role: 'alert', id: 'billing-error' });
  const orderButtons = [];
  const order = (body, button) => {
    error.textContent = '';
    return busy(orderButtons, async () => {
      try {
        const r = await api('/api/payment/orders', { method: 'POST', body });
        say(`Order ${r.order.id} created.`);
        await billingPage(r.order.id);
        document.getElementById('transfer')?.focus();
      } catch (e) { error.textContent = explain(e); }
    }).finally(() => button?.blur?.());
  };
  const onCancel = async (o, button) => {
    if (await cancelOrder(o, button, error)) await billingPage(o.id);
  };
  const packages = (data.packages || []).map((p) => {
    const buy = el('button', { type: 'button', 'data-package': p.id }, `Buy ${p.name}`);
    buy.addEventListener('click', () => order({ packageId: p.id }, buy));
    orderButtons.push(buy);
    return el('div', { class: 'package' },
      el('h3', {}, p.name), el('div', { class: 'muted' }, `${short(p.tokens)} tokens · ${p.tier} tier · ${p.lotDays} days`),
      el('div', { class: 'price' }, vnd(p.amount)), buy);
  });

  const pr = data.pricing || {};
  const kind = el('select', { id: 'quota-type' },
    pr.tokenPricePerMillion ? el('option', { value: 'token' }, `Tokens (${vnd(pr.tokenPricePerMillion)} per million)`) : null,
    pr.requestPricePerThousand ? el('option', { value: 'request' }, `Requests (${vnd(pr.requestPricePerThousand)} per thousand)`) : null);
  const minimum = pr.minOrderAmount || 0;
  // The price of `n` of the selected kind, as the server computes it (rounded up to whole VND).
  const priceOf = (n) => (kind.value === 'request'
    ? Math.ceil((n * (pr.requestPricePerThousand || 0)) / 1000)
    : Math.ceil((n * (pr.tokenPricePerMillion || 0)) / 1e6));
  const smallest = () => {
    const per = kind.value === 'request' ? (pr.requestPricePerThousand || 0) / 1000 : (pr.tokenPricePerMillion || 0) / 1e6;
    return per > 0 ? Math.ceil(minimum / per) : 1;
  };
  const qty = el('input', { type: 'number', id: 'quantity', min: 1, step: 1, required: true, value: Math.max(1000000, smallest()), 'aria-describedby': 'custom-price' });
  const priceLine = el('p', { class: 'muted small', id: 'custom-price', 'aria-live': 'polite' });
  const showPrice = () => {
    const n = Number(qty.value);
    const what = kind.value === 'request' ? 'requests' : 'tokens';
    const min = minimum ? ` The smallest order is ${vnd(minimum)} (${fmt(smallest())} ${what}).` : '';
    priceLine.textContent = Number.isInteger(n) && n > 0 ? `Costs ${vnd(priceOf(n))}.${min}` : min.trim();
  };
  kind.addEventListener('change', showPrice);
  qty.addEventListener('input', showPrice);
  showPrice();
  const submit = el('button', { type: 'submit' }, 'Create order');
  orderButtons.push(submit);
  const custom = el('form', { id: 'custom-order', novalidate: true },
    el('label', { for: 'quota-type' }, 'What to buy'), kind,
    el('label', { for: 'quantity' }, 'Quantity'), qty, priceLine,
    el('div', { class: 'row' }, submit));
  custom.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const n = Number(qty.value);
    if (!Number.isInteger(n) || n < 1) { error.textContent = MESSAGES.invalid_quantity; return; }
    if (priceOf(n) < minimum) { error.textContent = `The smallest order is ${vnd(minimum)}: buy at least ${fmt(smallest())}.`; return; }
    order({ quotaType: kind.value, quantity: n }, submit);
  });

  const orders = data.orders || [];
  const shown = shownId ? orders.find((o) => o.id === shownId) : null;
  const orderRows = orders.map((o) => {
    const actions = o.transfer ? el('span', { class: 'row tight' }) : '';
    if (o.transfer) {
      const details = el('button', { type: 'button', class: 'link', 'data-details': o.id }, 'Payment details');
      details.addEventListener('click', () => {
        renderBilling(data, o.id);
        document.getElementById('transfer')?.scrollIntoView();
      });
      const cancel = el('button', { type: 'button', class: 'danger', 'data-cancel': o.id, 'aria-label': `Cancel order ${o.id}` }, 'Cancel');
      cancel.addEventListener('click', () => onCancel(o, cancel));
      actions.append(details, cancel);
    }
    return [el('code', { class: 'nowrap' }, o.id), o.packageName || `${fmt(o.quantity)} ${o.quotaType}s`, el('span', { class: 'nowrap' }, vnd(o.amount)), el('code', { class: 'nowrap' }, o.paymentCode || '—'), badge(o.paymentStatus), when(o.createdAt), actions];
  });
  const lots = (data.quotaLots || []).map((l) => [l.type, l.tier || '—', fmt(l.amount), fmt(l.remaining), l.source || '—', when(l.expiresAt)]);

  page('Billing',
    el('div', { id: 'transfer-slot' }, shown ? transferBox(shown, onCancel) : null),
    el('section', { class: 'card', 'aria-labelledby': 'pk-h' }, el('h2', { id: 'pk-h' }, 'Token packages'), el('div', { class: 'packages' }, packages)),
    (pr.tokenPricePerMillion || pr.requestPricePerThousand)
      ? el('section', { class: 'card', 'aria-labelledby': 'custom-h' }, el('h2', { id: 'custom-h' }, 'Custom order'), custom)
      : null,
    error,
    el('section', { class: 'card', 'aria-labelledby': 'orders-h' }, el('h2', { id: 'orders-h' }, 'Order history'),
      table('Orders', ['Order', 'What', 'Amount', 'Code', 'Status', 'Created', ''], orderRows, [2], 'orders')),
    el('section', { class: 'card', 'aria-labelledby': 'lots-h' }, el('h2', { id: 'lots-h' }, 'Quota lots'),
      table('Lots', ['Type', 'Tier', 'Amount', 'Remaining', 'Source', 'Expires'], lots, [2, 3], 'lots')),
    data.paymentCode ? el('p', { class: 'muted small' }, 'Top up at any time: transfer any amount with your personal code ', el('code', {}, data.paymentCode), ' in the description.') : null);

  const pending = orders.filter((o) => o.paymentStatus === 'pending');
  main.dataset.polling = pending.length ? 'on' : 'off';
  if (!pending.length) return;
  const before = JSON.stringify(orders.map((o) => [o.id, o.paymentStatus]));
  billingPoll = setTimeout(async function poll() {
    if (location.pathname !== '/panel/billing' || generation !== billingRender) return;
    // A tab in the background asks again when it is looked at, not every few seconds.
    if (document.hidden) {
      document.addEventListener('visibilitychange', poll, { once: true });
      return;
    }
    try {
      const next = await api('/api/payment/orders');
      if (generation !== billingRender) return;
      const now = JSON.stringify((next.orders || []).map((o) => [o.id, o.paymentStatus]));
      if (now !== before) {
        const shownNow = (next.orders || []).find((o) => o.id === shownId);
        if (shownNow && shownNow.paymentStatus === 'paid') say(`Order ${shownId} is paid.`);
        renderBilling(next, shownId);
        return;
      }
    } catch (e) {
      if (e instanceof ApiError && e.code === 'unauthorized') return;
    }
    billingPoll = setTimeout(poll, BILLING_POLL_MS);
  }, BILLING_POLL_MS);
}

// ---------------------------------------------------------------------------------------------
// Terms

async function termsPage() {
  const data = await api('/api/content/tos');
  const doc = el('article', { class: 'card tos', id: 'tos' });
  if (data.html) {
    // Sanitized by the server (ammonia); parsed inertly and adopted, never run.
    const parsed = new DOMParser().parseFromString(data.html, 'text/html');
    doc.append(...[...parsed.body.childNodes].map((n) => document.importNode(n, true)));
  } else doc.append(el('p', { class: 'muted' }, 'The terms of service have not been published yet.'));
  page('Terms of service', doc, data.updatedAt ? el('p', { class: 'muted small' }, `Updated ${when(data.updatedAt)}`) : null);
}

// ---------------------------------------------------------------------------------------------
// Router

const ROUTES = {
  '/panel': overviewPage,
  '/panel/': overviewPage,
  '/panel/account': overviewPage,
  '/panel/keys': keysPage,
  '/panel/usage': usagePage,
  '/panel/security': securityPage,
  '/panel/billing': billingPage,
  '/panel/terms': termsPage,
};
const PUBLIC = new Set(['/panel/signin', '/panel/terms']);

/** Paths the panel does not know: the server already sent the "page not found" page. */
function notFoundPage() {
  document.title = 'Page not found · Gateway panel';
  if (document.getElementById('not-found')) return;
  main.replaceChildren(el('section', { class: 'card', id: 'not-found' }, el('h1', {}, 'Page not found'),
    el('p', {}, 'There is no panel page at this address.'), el('p', {}, el('a', { href: '/panel' }, 'Go to the panel'))));
}

function fail(e) {
  if (e instanceof ApiError && e.code === 'unauthorized') return;
  main.replaceChildren(el('div', { class: 'card' }, el('h1', {}, 'Something went wrong'), el('p', { class: 'error', role: 'alert' }, explain(e))));
}

async function start() {
  const path = location.pathname;
  session = await api('/api/auth/session').catch(() => null);
  if (session && session.csrfToken) csrf = session.csrfToken;
  const render = path === '/panel/signin' ? signinPage : ROUTES[path] || notFoundPage;
  if (!session && !PUBLIC.has(path) && render !== notFoundPage) return location.replace('/panel/signin');
  const nav = document.getElementById('nav');
  if (session) {
    nav.hidden = false;
    document.getElementById('account').hidden = false;
    document.getElementById('who').textContent = session.user.email;
    // The overview answers at three paths; its link is the first.
    const current = ['/panel/', '/panel/account'].includes(path) ? '/panel' : path;
    for (const a of nav.querySelectorAll('a')) if (a.getAttribute('href') === current) a.setAttribute('aria-current', 'page');
    document.getElementById('signout').addEventListener('click', async () => {
      try { await api('/api/auth/signout', { method: 'POST', body: {} }); } catch (e) { say(explain(e)); }
      location.assign('/panel/signin');
    });
  }
  await render();
  document.body.dataset.ready = path;
}

start().catch(fail);
