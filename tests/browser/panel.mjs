// Drives Debian's Chromium (playwright-core, no downloaded browser) through the web panel, once
// on a 1280×800 desktop window and once on a 390×844 phone: sign-in with the emailed code and
// with the emailed magic link (its confirmation page submitted in the browser that asked and in
// a fresh one, and for a two-factor account with the code typed into the page), key creation
// and copy, developer API calls with the new key, the quota left, the usage chart (hourly bars
// for 24h), two-factor enrolment (scan the QR code, confirm with a TOTP code computed here from
// the secret the page shows, save the recovery codes) and signing in again with the second
// factor, billing (bank name, copy buttons, one order for a double click, the
// page turning paid by itself after the bank's webhook, cancelling with a confirmation),
// rotation and revocation behind a confirmation, the `/` redirect and the 404 page. On every
// page it checks that nothing is wider than the window, and it screenshots every page.
//
//   node tests/browser/panel.mjs <site_url> <api_url> <mail_dir> <screenshot_dir>
//
// <mail_dir> holds one `.eml` file per delivered message (the test's SMTP sink writes them).
// WEBHOOK_SECRET in the environment is the gateway's GATEWAY_WEBHOOK_SECRET; GATEWAY_BIN and
// GATEWAY_CONFIG (with the gateway's environment) run operator commands against it.
// Prints `KEY=<secret>` (the desktop run's last key, revoked at the end) and, at the end,
// `PANEL_OK`; exits non-zero on any failure.

import { chromium } from 'playwright-core';
import { createHmac } from 'node:crypto';
import { readdirSync, readFileSync, mkdirSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';

const [site, api, mailDir, shots] = process.argv.slice(2);
if (!site || !api || !mailDir || !shots) {
  console.error('usage: panel.mjs <site_url> <api_url> <mail_dir> <screenshot_dir>');
  process.exit(2);
}
const webhookSecret = process.env.WEBHOOK_SECRET || '';
mkdirSync(shots, { recursive: true });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** An operator command (`gateway --config … args`): its JSON output. */
function operator(...args) {
  const out = execFileSync(process.env.GATEWAY_BIN, ['--config', process.env.GATEWAY_CONFIG, ...args], { encoding: 'utf8' });
  return JSON.parse(out);
}
function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`ok - ${what}`);
}

/** RFC 4648 base32 (no padding) to bytes. */
function base32(text) {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
  let bits = '';
  for (const c of text.replace(/=+$/, '').toUpperCase()) bits += alphabet.indexOf(c).toString(2).padStart(5, '0');
  const bytes = [];
  for (let i = 0; i + 8 <= bits.length; i += 8) bytes.push(parseInt(bits.slice(i, i + 8), 2));
  return Buffer.from(bytes);
}

/** The RFC 6238 code (SHA-1, 6 digits, 30 s) of a base32 `secret` at `atMs`. */
function totp(secret, atMs = Date.now()) {
  const counter = Buffer.alloc(8);
  counter.writeBigUInt64BE(BigInt(Math.floor(atMs / 30000)));
  const mac = createHmac('sha1', base32(secret)).update(counter).digest();
  const at = mac[mac.length - 1] & 15;
  return String((mac.readUInt32BE(at) & 0x7fffffff) % 1000000).padStart(6, '0');
}

/** The sign-in mails to `to`, newest first: `{code, link}` of each. */
function mailsTo(to) {
  let names = [];
  try { names = readdirSync(mailDir).filter((n) => n.endsWith('.eml')).sort().reverse(); } catch { /* not yet */ }
  return names
    .map((n) => readFileSync(join(mailDir, n), 'utf8'))
    .filter((raw) => raw.includes(to))
    .map((raw) => ({
      code: raw.split(/\r?\n/).map((l) => l.trim()).find((l) => /^\d{6}$/.test(l)),
      link: (raw.match(/https?:\/\/\S+\/api\/auth\/verify-link\?token=[A-Za-z0-9_-]+/) || [])[0],
    }));
}

async function mailCode(to, timeoutMs = 15000, notCode = null) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const mail = mailsTo(to).find((m) => m.code);
    if (mail && mail.code !== notCode) return mail;
    await sleep(100);
  }
  throw new Error(`no mail with a code to ${to} in ${mailDir}`);
}

/** The magic link of the newest mail to `to`, once more than `seen` mails were sent there. */
async function mailLink(to, seen, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const mails = mailsTo(to);
    if (mails.length > seen && mails[0].link) return mails[0].link;
    await sleep(100);
  }
  throw new Error(`no new mail with a magic link to ${to} in ${mailDir}`);
}

/** Asks for a sign-in mail for `email` as the panel's sign-in page does; returns how many
 * mails were sent there before. */
async function requestSignIn(email) {
  const seen = mailsTo(email).length;
  const r = await fetch(`${site}/api/auth/request-code`, {
    method: 'POST',
    headers: { origin: new URL(site).origin, 'content-type': 'application/json' },
    body: JSON.stringify({ email, acceptedTerms: true }),
  });
  const body = await r.text();
  check(r.status === 200, `a sign-in mail is requested for ${email} (${r.status} ${body})`);
  return seen;
}

/** The bank's notifier reporting a transfer with `description`. */
async function bankPays(description, amount) {
  const r = await fetch(`${site}/api/payment/sepay/callback`, {
    method: 'POST',
    headers: { authorization: `Apikey ${webhookSecret}`, 'content-type': 'application/json' },
    body: JSON.stringify({
      status: true,
      data: [{ transactionID: `FT${Date.now()}${Math.floor(Math.random() * 1e6)}`, type: 'IN', amount, description: `CT ${description} chuyen tien`, date: '2026-11-25 10:00:00', bank: 'VietinBank' }],
    }),
  });
  const body = await r.json();
  check(r.status === 200, `the webhook answers 200 (${JSON.stringify(body)})`);
  return body.processed[0];
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});

async function scenario(tag, contextOptions) {
  const problems = [];
  const email = `panel-${tag}-${Date.now()}@example.com`;
  const context = await browser.newContext(contextOptions);
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: site });
  const page = await context.newPage();
  // Answers the scenario provokes on purpose (a wrong two-factor code, a sign-in that needs the
  // second factor), which Chromium logs as console errors: each step allows one.
  let expectedRefusals = 0;
  /** Collects what goes wrong on `p`: console errors, page errors, requests to other hosts. */
  const watch = (p) => {
    p.on('console', (m) => {
      if (m.type() !== 'error' || /status of 404/.test(m.text())) return;
      if (expectedRefusals > 0 && /status of 40[01]/.test(m.text())) { expectedRefusals -= 1; return; }
      problems.push(`console: ${m.text()}`);
    });
    p.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    p.on('request', (r) => {
      const u = new URL(r.url());
      if (u.origin !== new URL(site).origin) problems.push(`third-party request: ${r.url()}`);
    });
  };
  watch(page);
  const ready = (path, p = page) => p.waitForSelector(`body[data-ready="${path}"]`, { timeout: 15000 });
  const shot = (name, p = page) => p.screenshot({ path: join(shots, `${tag}-${name}.png`), fullPage: true });
  /** Nothing on the page is wider than the window: no sideways scrolling. */
  const fits = async (what, p = page) => {
    const m = await p.evaluate(() => {
      const root = document.documentElement;
      const wide = [...document.querySelectorAll('body *')]
        .filter((e) => e.getBoundingClientRect().right > root.clientWidth + 1 && !e.closest('.table-wrap, header nav'))
        .slice(0, 5)
        .map((e) => `${e.tagName.toLowerCase()}${e.id ? `#${e.id}` : ''}.${e.className}`);
      return { scroll: root.scrollWidth, client: root.clientWidth, inner: window.innerWidth, wide };
    });
    check(m.scroll <= m.inner && m.scroll <= m.client,
      `${tag}: ${what} has no horizontal scroll (scrollWidth ${m.scroll}, innerWidth ${m.inner}, clientWidth ${m.client}${m.wide.length ? `, too wide: ${m.wide.join(', ')}` : ''})`);
  };
  /** Whether the toast (when shown) covers the element `selector`. */
  const toastCovers = (selector) => page.evaluate((sel) => {
    const t = document.getElementById('status');
    const e = document.querySelector(sel);
    if (!t || !e || !t.textContent) return false;
    const a = t.getBoundingClientRect(); const b = e.getBoundingClientRect();
    return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  }, selector);
  /** Whether the element `selector` is wholly inside the window. */
  const inView = (selector) => page.evaluate((sel) => {
    const r = document.querySelector(sel).getBoundingClientRect();
    return r.top >= 0 && r.bottom <= window.innerHeight;
  }, selector);
  /** Opens the confirmation a click raises, checks it names `words`, and answers it. */
  const confirmWith = async (selector, words, answer) => {
    await page.click(selector);
    await page.waitForSelector('dialog#confirm[open]');
    check((await page.textContent('dialog#confirm')).includes(words), `${tag}: clicking ${selector} asks first ("${words}")`);
    await page.click(answer ? '#confirm-ok' : '#confirm-cancel');
    await page.waitForSelector('dialog#confirm', { state: 'detached' });
  };

  // `/` opens the panel; signed out, the panel sends us to sign-in.
  const root = await page.goto(`${site}/`);
  await ready('/panel/signin');
  check(root.request().redirectedFrom()?.url() === `${site}/`, `${tag}: / redirects to the panel`);
  check(root.headers()['content-security-policy']?.includes("script-src 'self'"), `${tag}: panel page carries the CSP`);
  check(page.url().endsWith('/panel/signin'), `${tag}: signed-out visit lands on /panel/signin`);
  await page.fill('#email', email);
  await page.click('#request-form button[type=submit]');
  check((await page.textContent('[role=alert]')).includes('terms'), `${tag}: the terms checkbox is required`);
  await page.check('#terms');
  await fits('sign-in');
  await shot('01-signin');
  await page.click('#request-form button[type=submit]');
  await page.waitForSelector('#code-form:not([hidden])');
  check((await page.textContent('#check-mail')).includes(email), `${tag}: "check your mail" names the address`);
  await fits('sign-in code');
  await shot('02-code');
  const mail = await mailCode(email);
  check(mail.link, `${tag}: the mail carries the magic link too`);
  await page.fill('#code', mail.code);
  await page.click('#code-form button[type=submit]');
  await page.waitForURL(`${site}/panel/keys`);
  await ready('/panel/keys');
  check((await page.textContent('#who')) === email, `${tag}: signed in as the address`);

  /**
   * Signs `p` in with the magic `link` as a person does: opens it, checks the confirmation page
   * (which fits the window and posts with the site's origin, never `Origin: null`), types
   * `second` into its two-factor field when given, presses the button, and lands on the panel.
   */
  const signInByLink = async (p, link, what, name, second = null) => {
    const origins = [];
    const onRequest = (r) => {
      if (r.method() === 'POST' && new URL(r.url()).pathname === '/api/auth/verify-link') {
        origins.push(r.allHeaders().then((h) => h.origin));
      }
    };
    p.on('request', onRequest);
    const opened = await p.goto(link);
    check(opened.status() === 200, `${tag}: ${what}: the link opens the confirmation page (${opened.status()})`);
    await p.waitForSelector('form[action="/api/auth/verify-link"] button[type=submit]');
    check((await p.textContent('h1')) === 'Confirm sign-in', `${tag}: ${what}: the page asks to confirm`);
    if (second) {
      check((await p.textContent('label[for=tfa]')).includes('Two-factor'), `${tag}: ${what}: the page asks for the second factor`);
      await p.fill('#tfa', second);
    }
    await fits(`${what}: the confirmation page`, p);
    await shot(`${name}-confirm`, p);
    await p.click('form[action="/api/auth/verify-link"] button[type=submit]');
    await p.waitForURL((u) => !u.search.includes('token='));
    p.off('request', onRequest);
    const sent = await Promise.all(origins);
    check(sent.length === 1 && sent[0] === new URL(site).origin,
      `${tag}: ${what}: the form is posted with the site's origin (${JSON.stringify(sent)})`);
    if (new URL(p.url()).pathname !== '/panel/keys') {
      throw new Error(`${tag}: ${what}: the form's POST did not sign in: ${p.url()} ${await p.textContent('body')}`);
    }
    await ready('/panel/keys', p);
    check((await p.textContent('#who')) === email, `${tag}: ${what}: signed in by the link`);
    await fits(`${what}: the panel after the link`, p);
    await shot(`${name}-signed-in`, p);
  };

  // The magic link opened in a fresh browser (the mail read on another device) signs that
  // browser in; this one stays signed in.
  const freshLink = await mailLink(email, await requestSignIn(email));
  const fresh = await browser.newContext(contextOptions);
  const freshPage = await fresh.newPage();
  watch(freshPage);
  await signInByLink(freshPage, freshLink, 'a fresh browser', '15-link-fresh');
  await fresh.close();
  await page.reload();
  await ready('/panel/keys');
  check((await page.textContent('#who')) === email, `${tag}: the first browser is still signed in`);

  // The magic link in the browser that asked for it, after signing out.
  await page.click('#signout');
  await page.waitForURL(`${site}/panel/signin`);
  await ready('/panel/signin');
  await page.fill('#email', email);
  await page.check('#terms');
  const seen = mailsTo(email).length;
  await page.click('#request-form button[type=submit]');
  await page.waitForSelector('#code-form:not([hidden])');
  const sameLink = await mailLink(email, seen);
  await signInByLink(page, sameLink, 'the same browser', '16-link-same');

  // The first key needs no confirmation; the secret is shown once and copies exactly.
  await page.click('#rotate');
  await page.waitForSelector('#new-secret');
  const first = (await page.textContent('#new-secret')).trim();
  check(/^sk-[A-Za-z0-9_-]{16,}$/.test(first), `${tag}: the first key shows an sk- secret`);
  await page.click('#copy-secret');
  // (waitForFunction evaluates strings, which the panel's CSP forbids: wait on selectors.)
  await page.waitForSelector('#copy-secret:text-is("Copied")');
  check(await page.evaluate(() => navigator.clipboard.readText()) === first, `${tag}: the copied text is the secret`);
  check(await page.locator('#active-keys tbody tr').count() === 1, `${tag}: the key list shows the key`);
  check(await inView('#new-secret'), `${tag}: the new secret is scrolled into view`);
  check(!(await toastCovers('#rotate')), `${tag}: the toast does not cover the Rotate button`);
  check(!(await toastCovers('#copy-secret')), `${tag}: the toast does not cover the Copy button`);
  // An operator's key beside the global one: both are listed, each with its Revoke button, and
  // the page says rotation replaces only the global key.
  const ci = operator('key', 'create', '--email', email, '--name', 'ci');
  await page.reload();
  await ready('/panel/keys');
  check(await page.locator('#active-keys tbody tr').count() === 2, `${tag}: both active keys are listed`);
  check(await page.locator(`[data-revoke="${ci.id}"]`).count() === 1 && await page.locator('button[data-revoke]').count() === 2,
    `${tag}: each active key has its own Revoke button`);
  check((await page.textContent('#rotation-note')).includes('Rotating replaces the global key')
    && (await page.textContent('#rotation-note')).includes('stay active until you revoke them'), `${tag}: the page says what rotation replaces`);
  check((await page.textContent('#active-keys')).includes('global'), `${tag}: the global key is marked`);
  await fits('keys');
  await shot('03-keys');

  // Developer API calls with the new key.
  for (const [i, content] of ['hello from the panel test', 'a second, somewhat longer request to count'].entries()) {
    const r = await fetch(`${api}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${first}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'mock-gpt', messages: [{ role: 'user', content }], max_tokens: 32 }),
    });
    check(r.status === 200, `${tag}: developer request ${i + 1} answers 200`);
    await r.text();
  }

  // Usage: numbers, quota left, hourly bars for 24h, daily bars for 7d.
  let requests = 0;
  for (let i = 0; i < 40 && requests < 2; i += 1) {
    await page.goto(`${site}/panel/usage?period=24h`);
    await ready('/panel/usage');
    requests = Number((await page.textContent('#sum-requests')).replace(/[^0-9]/g, ''));
    if (requests < 2) await sleep(250);
  }
  check(requests >= 2, `${tag}: usage summary counts the requests (${requests})`);
  check(await page.getAttribute('button[data-period="24h"]', 'aria-pressed') === 'true', `${tag}: the 24h period is selected`);
  check(/\d/.test(await page.textContent('#quota-left')), `${tag}: the usage page shows the tokens left`);
  check((await page.textContent('#quota-allowance')).includes('left'), `${tag}: the usage page shows the allowance left`);
  check(Number((await page.textContent('#sum-charged')).replace(/[^0-9]/g, '')) > 0, `${tag}: the usage page shows the quota charged`);
  check((await page.textContent('#model-weights')).includes('mock-gpt'), `${tag}: the usage page lists the models' quota weights`);
  check((await page.textContent('#weights-h')) === 'Model weights', `${tag}: the weights are called weights`);
  // Six summary cards: rows of equal length, never five and an orphan.
  const rowsOfCards = await page.$$eval('#summary .stat', (cards) => {
    const tops = new Map();
    for (const c of cards) { const t = Math.round(c.getBoundingClientRect().top); tops.set(t, (tops.get(t) || 0) + 1); }
    return [...tops.values()];
  });
  check(rowsOfCards.every((n) => n === rowsOfCards[0]), `${tag}: the summary cards fill their rows evenly (${rowsOfCards})`);
  // The allowance bar shows what is left, as its text does.
  const bar = await page.$eval('#quota-allowance-bar', (b) => ({ value: b.value, max: b.max }));
  const leftText = Number((await page.textContent('#quota-allowance')).split(' of ')[0].replace(/[^0-9]/g, ''));
  check(bar.value === Math.min(leftText, bar.max) && bar.value > bar.max / 2, `${tag}: the allowance bar shows what is left (${bar.value} of ${bar.max})`);
  check(await page.getAttribute('#usage-chart', 'data-unit') === 'hour', `${tag}: the 24h chart is per hour`);
  const hours = await page.$$eval('#usage-chart rect.bar.in', (rs) => rs.map((r) => Number(r.dataset.value)));
  // (The last two hours: the requests may sit in the previous hour when one just began.)
  check(hours.length === 25 && hours.slice(-2).some((v) => v > 0),
    `${tag}: the 24h chart has 25 hourly bars, the newest filled (${hours.length}, last two ${hours.slice(-2)})`);
  check((await page.textContent('main')).includes('mock-gpt'), `${tag}: by-model and recent tables name the model`);
  await fits('usage 24h');
  await shot('04-usage-24h');
  await page.click('button[data-period="1h"]');
  await page.waitForSelector('main[data-shown-period="1h"]');
  check(await page.getAttribute('#usage-chart', 'data-unit') === 'hour', `${tag}: the 1h chart is per hour`);
  check(await page.$$eval('#usage-chart rect.bar.in', (rs) => rs.length) === 2, `${tag}: the 1h chart has the two hours it touches`);
  await fits('usage 1h');
  await page.click('button[data-period="7d"]');
  await page.waitForSelector('main[data-shown-period="7d"]');
  check(await page.getAttribute('#usage-chart', 'data-unit') === 'day', `${tag}: the 7d chart is per day`);
  check(await page.$$eval('#usage-chart rect.bar.in', (rs) => rs.length) >= 7, `${tag}: the 7d chart has a bar per day`);
  await fits('usage 7d');
  await shot('04-usage-7d');

  // Security: two-factor enrolment walks through scan, confirm, save the recovery codes.
  await page.goto(`${site}/panel/security`);
  await ready('/panel/security');
  check((await page.textContent('#tfa-state')) === 'off', `${tag}: two-factor starts off`);
  await fits('security');
  await page.click('#enable-2fa');
  await page.waitForSelector('#totp-qr svg path');
  const seed = (await page.textContent('#totp-secret')).trim();
  check(/^[A-Z2-7]{16,}$/.test(seed), `${tag}: the TOTP secret is shown`);
  check((await page.textContent('#tfa-state')) === 'off', `${tag}: two-factor stays off until a code confirms it`);
  await fits('security with the QR code');
  await shot('05-security-scan');
  const valid = [-30000, 0, 30000].map((d) => totp(seed, Date.now() + d));
  const wrongCode = ['000000', '111111', '222222', '333333'].find((c) => !valid.includes(c));
  await page.fill('#confirm-code', wrongCode);
  expectedRefusals = 1;
  await page.click('#confirm-2fa');
  await page.waitForSelector('#tfa-error:not(:empty)');
  check((await page.textContent('#tfa-error')).includes('not valid'), `${tag}: a wrong code does not turn it on`);
  await page.fill('#confirm-code', totp(seed));
  await page.click('#confirm-2fa');
  await page.waitForSelector('#recovery-codes li');
  const recovery = await page.$$eval('#recovery-codes li', (lis) => lis.map((li) => li.textContent.trim()));
  check(recovery.length === 10 && new Set(recovery).size === 10 && recovery.every((c) => /^[a-z2-9]{5}-[a-z2-9]{5}$/.test(c)),
    `${tag}: ten distinct recovery codes are shown (${recovery.length})`);
  check((await page.textContent('#tfa-state')) === 'on', `${tag}: a right code turns two-factor on`);
  await page.click('#copy-recovery');
  await page.waitForSelector('#copy-recovery:text-is("Copied")');
  check(await page.evaluate(() => navigator.clipboard.readText()) === recovery.join('\n'), `${tag}: copy puts the recovery codes on the clipboard`);
  await fits('security with the recovery codes');
  await shot('05-security-recovery');
  await page.click('#recovery-done');
  await page.waitForSelector('#disable-form');
  check((await page.textContent('#recovery-left')).includes('10'), `${tag}: ten recovery codes are left`);
  check(!(await page.$('#recovery-codes')), `${tag}: the recovery codes are not shown again`);
  await fits('security with two-factor on');
  await shot('05-security-on');
  // New recovery codes for a code (an unused recovery code here), without turning it off.
  await page.fill('#regenerate-code', recovery[9]);
  await page.click('#regenerate-recovery');
  await page.waitForSelector('#recovery-codes li');
  const renewed = await page.$$eval('#recovery-codes li', (lis) => lis.map((li) => li.textContent.trim()));
  check(renewed.length === 10 && renewed.every((c) => !recovery.includes(c)), `${tag}: new recovery codes replace the old ones`);
  check((await page.textContent('#tfa-state')) === 'on', `${tag}: two-factor stays on`);
  const style = (sel) => page.$eval(sel, (b) => { const s = getComputedStyle(b); return [s.backgroundColor, s.color, s.fontSize, s.paddingTop].join(' '); });
  const primary = await page.evaluate(() => {
    const b = document.createElement('button'); document.body.append(b);
    const s = getComputedStyle(b); const v = [s.backgroundColor, s.color, s.fontSize, s.paddingTop].join(' ');
    b.remove(); return v;
  });
  check(await style('#copy-recovery') === primary, `${tag}: the recovery codes' Copy button is a primary button`);
  await fits('security with new recovery codes');
  await shot('05-security-regenerated');
  await page.click('#recovery-done');
  await page.waitForSelector('#disable-form');

  // Signing in again asks for the second factor.
  const used = (await mailCode(email)).code;
  await page.click('#signout');
  await page.waitForURL(`${site}/panel/signin`);
  await ready('/panel/signin');
  await page.fill('#email', email);
  await page.check('#terms');
  await page.click('#request-form button[type=submit]');
  await page.waitForSelector('#code-form:not([hidden])');
  await page.fill('#code', (await mailCode(email, 15000, used)).code);
  expectedRefusals = 1;
  await page.click('#code-form button[type=submit]');
  await page.waitForSelector('#two-factor-box:not([hidden])');
  check((await page.textContent('[role=alert]')).includes('authenticator'), `${tag}: sign-in asks for the authenticator code`);
  await fits('sign-in second factor');
  await shot('02-two-factor');
  // The confirming code was this step's and is accepted once: the next step's signs in.
  await page.fill('#two-factor', totp(seed, Date.now() + 30000));
  await page.click('#code-form button[type=submit]');
  await page.waitForURL(`${site}/panel/keys`);
  await ready('/panel/keys');
  check((await page.textContent('#who')) === email, `${tag}: signed in again with the second factor`);

  // The magic link of a two-factor account: the page takes the second factor (a recovery code:
  // the TOTP steps around now are spent) in a fresh browser.
  const tfaLink = await mailLink(email, await requestSignIn(email));
  const tfaContext = await browser.newContext(contextOptions);
  const tfaPage = await tfaContext.newPage();
  watch(tfaPage);
  await signInByLink(tfaPage, tfaLink, 'two-factor by link', '17-link-two-factor', renewed[0]);
  await tfaContext.close();

  // Billing: a double click on Buy creates one order; bank name and copy buttons.
  await page.goto(`${site}/panel/billing`);
  await ready('/panel/billing');
  await fits('billing');
  await shot('06-billing');
  await page.dblclick('[data-package="steady-100m"]');
  await page.waitForSelector('#transfer-qr svg path');
  await sleep(300);
  const listed = await (await page.request.get(`${site}/api/payment/orders`)).json();
  check(listed.orders.length === 1, `${tag}: a double click on Buy created one order (${listed.orders.length})`);
  check(await page.locator('#orders tbody tr').count() === 1, `${tag}: the history shows one order`);
  const paidOrder = listed.orders[0];
  check((await page.textContent('#transfer-amount')).includes('85,000'), `${tag}: the transfer shows the package amount`);
  check((await page.textContent('#transfer-bank')).includes('VietinBank'), `${tag}: the bank is named beside its BIN`);
  check((await page.textContent('#transfer-bank')).includes('970415'), `${tag}: the BIN is still shown`);
  const code = (await page.textContent('#transfer-code')).trim();
  check(code === paidOrder.paymentCode, `${tag}: the transfer shows the payment code`);
  await page.click('#copy-description');
  await page.waitForSelector('#copy-description:text-is("Copied")');
  check(await page.evaluate(() => navigator.clipboard.readText()) === code, `${tag}: copy puts the description on the clipboard`);
  await page.click('#copy-amount');
  await page.waitForSelector('#copy-amount:text-is("Copied")');
  check(await page.evaluate(() => navigator.clipboard.readText()) === '85000', `${tag}: copy puts the bare amount on the clipboard`);
  await page.click('#copy-account');
  await page.waitForSelector('#copy-account:text-is("Copied")');
  check(await page.evaluate(() => navigator.clipboard.readText()) === '0123456789', `${tag}: copy puts the account number on the clipboard`);
  check(await page.getAttribute('main', 'data-polling') === 'on', `${tag}: the page polls while an order is pending`);
  const oneLine = await page.$$eval('#orders code', (codes) => codes.every((c) => c.getClientRects().length === 1
    && c.getBoundingClientRect().height < 1.6 * parseFloat(getComputedStyle(c).lineHeight || '16') + 2));
  check(oneLine, `${tag}: order ids and payment codes are not broken across lines`);
  check(!(await toastCovers('#transfer dl dd:last-of-type')), `${tag}: the toast does not cover the Expires row`);
  await fits('billing with an order');
  await shot('07-order');

  // The bank reports the transfer: the page turns paid by itself and stops polling.
  const item = await bankPays(code, 85000);
  check(item.status === 'matched', `${tag}: the transfer matches the order`);
  await page.waitForSelector('#order-state.paid', { timeout: 12000 });
  check((await page.textContent('#orders')).includes('paid'), `${tag}: the history shows the order paid without a reload`);
  check(await page.getAttribute('main', 'data-polling') === 'off', `${tag}: polling stops when nothing is pending`);
  let polls = 0;
  const countPolls = (r) => { if (r.url().endsWith('/api/payment/orders')) polls += 1; };
  page.on('request', countPolls);
  await sleep(5000);
  page.off('request', countPolls);
  check(polls === 0, `${tag}: no more order polls once nothing is pending (${polls})`);
  await shot('08-paid');

  // Cancel a pending order: asked first; "Cancel" in the dialog keeps it.
  await page.click('[data-package="persistent-1b"]');
  await page.waitForSelector('#transfer-qr svg path');
  const pendingId = (await page.textContent('#transfer-h')).split(' ').pop();
  await page.click(`[data-cancel="${pendingId}"]`);
  await page.waitForSelector('dialog#confirm[open]');
  check(await page.textContent('#confirm-cancel') === 'Keep order' && await page.textContent('#confirm-ok') === 'Cancel order',
    `${tag}: the cancel dialog's buttons read Keep order / Cancel order`);
  await page.click('#confirm-cancel');
  await page.waitForSelector('dialog#confirm', { state: 'detached' });
  check((await page.textContent('#orders')).includes('pending'), `${tag}: dismissing the dialog keeps the order pending`);
  await confirmWith(`[data-cancel="${pendingId}"]`, pendingId, true);
  await page.waitForSelector('#order-state.cancelled');
  check((await page.textContent('#orders')).includes('cancelled'), `${tag}: the order is cancelled`);
  const cancelled = (await (await page.request.get(`${site}/api/payment/orders`)).json()).orders
    .find((o) => o.id === pendingId);
  check(cancelled.paymentStatus === 'cancelled' && !cancelled.transfer, `${tag}: the API lists the order cancelled, without transfer instructions`);
  const late = await bankPays(cancelled.paymentCode, 240000);
  check(late.status === 'unmatched' && late.orderId === pendingId, `${tag}: a transfer for the cancelled order is unmatched and names it`);
  await fits('billing after cancelling');
  await shot('09-cancelled');

  // Overview: the quota left includes the paid lot.
  await page.goto(`${site}/panel`);
  await ready('/panel');
  check(await page.getAttribute('#nav a[href="/panel"]', 'aria-current') === 'page', `${tag}: the navigation has the overview, marked current`);
  check((await page.textContent('#quota-lots')).includes('100,000,000'), `${tag}: the overview shows the lot's tokens left`);
  check(/\d/.test(await page.textContent('#quota-left')), `${tag}: the overview shows the tokens left`);
  await fits('overview');
  await shot('10-overview');

  // Terms page renders.
  await page.goto(`${site}/panel/terms`);
  await ready('/panel/terms');
  await fits('terms');
  await shot('11-terms');

  // Unknown panel pages: the panel's own 404 page.
  const missing = await page.goto(`${site}/panel/no-such-page`);
  check(missing.status() === 404, `${tag}: an unknown panel page answers 404`);
  check(missing.headers()['content-type'].startsWith('text/html'), `${tag}: the 404 page is HTML`);
  await ready('/panel/no-such-page');
  check((await page.textContent('#not-found h1')) === 'Page not found', `${tag}: the 404 page says so`);
  check(await page.isVisible('#nav'), `${tag}: the 404 page keeps the navigation`);
  await fits('404');
  await shot('12-not-found');

  // Rotate: asked first; dismissing keeps the key, confirming replaces it.
  await page.goto(`${site}/panel/keys`);
  await ready('/panel/keys');
  await confirmWith('#rotate', 'stops working', false);
  check(!(await page.$('#new-secret')), `${tag}: dismissing the rotation creates no key`);
  const still = await fetch(`${api}/v1/models`, { headers: { authorization: `Bearer ${first}` } });
  check(still.status === 200, `${tag}: the key still works after a dismissed rotation (${still.status})`);
  await confirmWith('#rotate', 'other key stays active', true);
  await page.waitForSelector('#new-secret');
  const second = (await page.textContent('#new-secret')).trim();
  check(second !== first, `${tag}: the rotation shows a new secret`);
  check(await inView('#new-secret'), `${tag}: the rotated secret is scrolled into view`);
  const old = await fetch(`${api}/v1/models`, { headers: { authorization: `Bearer ${first}` } });
  check(old.status === 401, `${tag}: the rotated-out key is refused (${old.status})`);
  const ciStill = await fetch(`${api}/v1/models`, { headers: { authorization: `Bearer ${ci.secret}` } });
  check(ciStill.status === 200, `${tag}: the operator's key survives the rotation (${ciStill.status})`);
  check(await page.locator('#active-keys tbody tr').count() === 2, `${tag}: after rotation the page lists both active keys`);
  check(await page.locator('#revoked-keys tbody tr').count() === 1, `${tag}: the rotated-out key is listed as revoked`);

  // Revoke each: asked first, then the key stops working.
  const globalId = (await (await page.request.get(`${site}/api/account/keys`)).json()).keys.find((k) => k.global && k.status === 'active').id;
  await confirmWith(`[data-revoke="${globalId}"]`, 'stops working', false);
  const kept = await fetch(`${api}/v1/models`, { headers: { authorization: `Bearer ${second}` } });
  check(kept.status === 200, `${tag}: dismissing the revocation keeps the key (${kept.status})`);
  await page.click(`[data-revoke="${ci.id}"]`);
  await page.waitForSelector('dialog#confirm[open]');
  await shot('13-confirm');
  await page.click('#confirm-ok');
  await page.waitForSelector(`[data-revoke="${ci.id}"]`, { state: 'detached' });
  const ciAfter = await fetch(`${api}/v1/models`, { headers: { authorization: `Bearer ${ci.secret}` } });
  check(ciAfter.status === 401, `${tag}: the operator's key is revoked from the panel (${ciAfter.status})`);
  await confirmWith(`[data-revoke="${globalId}"]`, 'stops working', true);
  await page.waitForSelector('button[data-revoke]', { state: 'detached' });
  const after = await fetch(`${api}/v1/models`, { headers: { authorization: `Bearer ${second}` } });
  check(after.status === 401, `${tag}: the revoked key is refused (${after.status})`);
  check(await page.locator('#revoked-keys tbody tr').count() === 3, `${tag}: the revoked keys are listed apart`);
  await fits('keys after revoking');
  await shot('14-revoked');

  // Sign out.
  await page.click('#signout');
  await page.waitForURL(`${site}/panel/signin`);
  await ready('/panel/signin');

  const bad = problems.filter((p) => !/favicon/.test(p));
  if (bad.length) throw new Error(`browser problems (${tag}):\n${bad.join('\n')}`);
  await context.close();
  return second;
}

let exitCode = 0;
try {
  const key = await scenario('desktop', { viewport: { width: 1280, height: 800 }, deviceScaleFactor: 1 });
  console.log(`KEY=${key}`);
  await scenario('mobile', { viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  console.log('PANEL_OK');
} catch (e) {
  console.error(e && e.stack ? e.stack : String(e));
  exitCode = 1;
} finally {
  await browser.close();
}
process.exit(exitCode);
