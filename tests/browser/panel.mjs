// Drives Debian's Chromium (playwright-core, no downloaded browser) through the web panel:
// sign-in with the emailed code, key rotation and copy, developer API calls with the new key,
// the usage chart, two-factor QR, a billing order with its VietQR code, and revocation.
//
//   node tests/browser/panel.mjs <site_url> <api_url> <mail_dir> <screenshot_dir>
//
// <mail_dir> holds one `.eml` file per delivered message (the test's SMTP sink writes them).
// Prints `KEY=<secret>` and, at the end, `PANEL_OK`; exits non-zero on any failure.

import { chromium } from 'playwright-core';
import { readdirSync, readFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';

const [site, api, mailDir, shots] = process.argv.slice(2);
if (!site || !api || !mailDir || !shots) {
  console.error('usage: panel.mjs <site_url> <api_url> <mail_dir> <screenshot_dir>');
  process.exit(2);
}
mkdirSync(shots, { recursive: true });

const email = `panel-${Date.now()}@example.com`;
const problems = [];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`ok - ${what}`);
}

async function mailCode(to, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    let names = [];
    try { names = readdirSync(mailDir).filter((n) => n.endsWith('.eml')).sort().reverse(); } catch { /* not yet */ }
    for (const n of names) {
      const raw = readFileSync(join(mailDir, n), 'utf8');
      if (!raw.includes(to)) continue;
      const code = raw.split(/\r?\n/).map((l) => l.trim()).find((l) => /^\d{6}$/.test(l));
      const link = /verify-link\?token=/.test(raw);
      if (code) return { code, link };
    }
    await sleep(100);
  }
  throw new Error(`no mail with a code to ${to} in ${mailDir}`);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
let exitCode = 0;
try {
  const context = await browser.newContext({ viewport: { width: 1200, height: 900 }, deviceScaleFactor: 1 });
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: site });
  const page = await context.newPage();
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.origin !== new URL(site).origin) problems.push(`third-party request: ${r.url()}`);
  });
  const ready = (path) => page.waitForSelector(`body[data-ready="${path}"]`, { timeout: 15000 });
  const shot = (name) => page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });

  // Signed out: the panel sends us to sign-in.
  const first = await page.goto(`${site}/panel/keys`);
  check(first.headers()['content-security-policy']?.includes("script-src 'self'"), 'panel page carries the CSP');
  await ready('/panel/signin');
  check(page.url().endsWith('/panel/signin'), 'signed-out visit redirects to /panel/signin');
  await page.fill('#email', email);
  await page.click('#request-form button[type=submit]');
  check((await page.textContent('[role=alert]')).includes('terms'), 'the terms checkbox is required');
  await page.check('#terms');
  await shot('01-signin');
  await page.click('#request-form button[type=submit]');
  await page.waitForSelector('#code-form:not([hidden])');
  check((await page.textContent('#check-mail')).includes(email), '"check your mail" names the address');
  await shot('02-code');
  const mail = await mailCode(email);
  check(mail.link, 'the mail carries the magic link too');
  await page.fill('#code', mail.code);
  await page.click('#code-form button[type=submit]');
  await page.waitForURL(`${site}/panel/keys`);
  await ready('/panel/keys');
  check((await page.textContent('#who')) === email, 'signed in as the address');

  // Rotate: the secret is shown once, and the copy button copies exactly it.
  await page.click('#rotate');
  await page.waitForSelector('#new-secret');
  const secret = (await page.textContent('#new-secret')).trim();
  check(/^sk-[A-Za-z0-9_-]{16,}$/.test(secret), 'rotation shows an sk- secret');
  await page.click('#copy-secret');
  // (waitForFunction evaluates strings, which the panel's CSP forbids: wait on selectors.)
  await page.waitForSelector('#copy-secret:text-is("Copied")');
  const copied = await page.evaluate(() => navigator.clipboard.readText());
  check(copied === secret, 'the copied text is the secret');
  check(await page.locator('tbody tr').count() >= 1, 'the key list shows the key');
  await shot('03-keys');
  console.log(`KEY=${secret}`);

  // Developer API calls with the new key.
  for (const [i, content] of ['hello from the panel test', 'a second, somewhat longer request to count'].entries()) {
    const r = await fetch(`${api}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'mock-gpt', messages: [{ role: 'user', content }], max_tokens: 32 }),
    });
    check(r.status === 200, `developer request ${i + 1} with the rotated key answers 200`);
    await r.text();
  }

  // Usage: chart bars and the numbers.
  let requests = 0;
  for (let i = 0; i < 40 && requests < 2; i += 1) {
    await page.goto(`${site}/panel/usage?period=24h`);
    await ready('/panel/usage');
    requests = Number((await page.textContent('#sum-requests')).replace(/[^0-9]/g, ''));
    if (requests < 2) await sleep(250);
  }
  check(requests >= 2, `usage summary counts the requests (${requests})`);
  check(await page.getAttribute('button[data-period="24h"]', 'aria-pressed') === 'true', 'the 24h period is selected');
  const bars = await page.$$eval('#usage-chart rect.bar', (rs) => rs.map((r) => Number(r.dataset.value)));
  check(bars.length >= 2 && bars.some((v) => v > 0), `the chart is an SVG with bars (${bars.length}, max ${Math.max(...bars)})`);
  check((await page.textContent('main')).includes('mock-gpt'), 'by-model and recent tables name the model');
  await page.click('button[data-period="7d"]');
  await page.waitForSelector('main[data-shown-period="7d"]');
  check(await page.$$eval('#usage-chart rect.bar.in', (rs) => rs.length) >= 7, 'the 7d chart has a bar per day');
  await shot('04-usage');

  // Security: two-factor on, its QR code drawn as SVG.
  await page.goto(`${site}/panel/security`);
  await ready('/panel/security');
  await page.click('#enable-2fa');
  await page.waitForSelector('#totp-qr svg path');
  check((await page.textContent('#totp-secret')).trim().length >= 16, 'the TOTP secret is shown');
  check((await page.textContent('#tfa-state')) === 'on', 'two-factor reads as on');
  await shot('05-security');

  // Billing: a package order, its transfer instructions and VietQR code.
  await page.goto(`${site}/panel/billing`);
  await ready('/panel/billing');
  await shot('06-billing');
  await page.click('[data-package="steady-100m"]');
  await page.waitForSelector('#transfer-qr svg path');
  check((await page.textContent('#transfer-amount')).includes('85,000'), 'the transfer shows the package amount');
  check(/\S/.test(await page.textContent('#transfer-code')), 'the transfer shows the payment code');
  check((await page.textContent('#orders-h + table')).includes('pending'), 'the order is in the history as pending');
  await shot('07-order');
  // A custom token order as well.
  if (await page.$('#custom-order')) {
    await page.fill('#quantity', '2000000');
    await page.click('#custom-order button[type=submit]');
    await page.locator('#orders-h + table tbody tr').nth(1).waitFor();
    await page.waitForSelector('#transfer-qr svg path');
    check(true, 'a custom token order is created');
  }

  // Terms page renders.
  await page.goto(`${site}/panel/terms`);
  await ready('/panel/terms');
  await shot('08-terms');

  // Revoke: the key stops working.
  await page.goto(`${site}/panel/keys`);
  await ready('/panel/keys');
  await page.click('button[data-revoke]');
  await page.waitForSelector('.badge.revoked');
  const after = await fetch(`${api}/v1/models`, { headers: { authorization: `Bearer ${secret}` } });
  check(after.status === 401, `the revoked key is refused (${after.status})`);
  await shot('09-revoked');

  // Sign out.
  await page.click('#signout');
  await page.waitForURL(`${site}/panel/signin`);
  await ready('/panel/signin');

  const bad = problems.filter((p) => !/favicon/.test(p));
  if (bad.length) throw new Error(`browser problems:\n${bad.join('\n')}`);
  console.log('PANEL_OK');
} catch (e) {
  console.error(e && e.stack ? e.stack : String(e));
  if (problems.length) console.error(problems.join('\n'));
  exitCode = 1;
} finally {
  await browser.close();
}
process.exit(exitCode);
