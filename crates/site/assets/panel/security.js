// The panel's security page (/panel/security): two-factor enrolment in three visible steps —
// scan the secret (QR code or typed), confirm it with a code from the app, save the recovery
// codes (shown once) — new recovery codes for a code, and turning two-factor off with a code. The app module hands in its
// helpers, so this module imports nothing and nothing imports it but the app.

export async function securityPage(ui) {
  const { api, el, page, say, explain, busy, drawQr, copyButton } = ui;
  const data = await api('/api/account/security');
  const sec = data.security || {};
  const error = el('p', { class: 'error', role: 'alert', id: 'tfa-error' });
  const area = el('div', { id: 'two-factor-setup' });
  const show = (...children) => { error.textContent = ''; area.replaceChildren(...children); };
  const state = (on) => el('p', {}, 'Two-factor is ', el('strong', { id: 'tfa-state' }, on ? 'on' : 'off'), '.');

  /** Step 3 (or a regeneration): the recovery codes, shown this once. */
  function recoveryStep(codes, replaced = false) {
    const done = el('button', { type: 'button', class: 'secondary', id: 'recovery-done' }, 'I have saved them');
    done.addEventListener('click', () => securityPage(ui));
    show(state(true), el('div', { class: 'notice', id: 'recovery-box' },
      el('h3', {}, replaced ? 'Your new recovery codes' : 'Step 3 of 3: save your recovery codes'),
      el('p', {}, 'Each code signs you in once if you lose your authenticator. ',
        replaced ? 'Your previous codes no longer work. ' : '', el('strong', {}, 'They are shown only now.')),
      el('ol', { class: 'recovery', id: 'recovery-codes' }, codes.map((c) => el('li', {}, el('code', {}, c)))),
      el('div', { class: 'row' }, copyButton('copy-recovery', codes.join('\n'), 'recovery codes', { primary: true }), done)));
    done.focus();
  }

  /** Steps 1 and 2: scan the new secret, then confirm it with a code. */
  async function scanStep(pending) {
    const box = el('div', { class: 'code', id: 'totp-qr' });
    const input = el('input', { type: 'text', id: 'confirm-code', name: 'twoFactorCode', inputmode: 'numeric', autocomplete: 'one-time-code', pattern: '[0-9]{6}', maxlength: 6, required: true });
    const submit = el('button', { type: 'submit', id: 'confirm-2fa' }, 'Turn on');
    const cancel = el('button', { type: 'button', class: 'secondary', id: 'cancel-2fa' }, 'Cancel');
    const form = el('form', { id: 'confirm-form', novalidate: true },
      el('h3', {}, 'Step 2 of 3: confirm'),
      el('label', { for: 'confirm-code' }, 'The 6-digit code your app shows now'), input,
      el('div', { class: 'row' }, submit, cancel));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      error.textContent = '';
      busy([submit, cancel], async () => {
        try {
          const r = await api('/api/account/security', { method: 'POST', body: { twoFactorEnabled: true, twoFactorCode: input.value.trim() } });
          say('Two-factor is on.');
          recoveryStep(r.recoveryCodes || []);
        } catch (e) { error.textContent = explain(e); input.select(); }
      });
    });
    cancel.addEventListener('click', () => busy([submit, cancel], async () => {
      try {
        await api('/api/account/security', { method: 'POST', body: { twoFactorEnabled: false } });
        await securityPage(ui);
      } catch (e) { error.textContent = explain(e); }
    }));
    show(state(false), el('div', { class: 'notice' },
      el('h3', {}, 'Step 1 of 3: scan'),
      el('p', {}, 'Scan this code with your authenticator app, or type the secret in. It is shown only once.'),
      el('div', { class: 'qr' }, box,
        el('dl', { class: 'kv' }, el('dt', {}, 'Secret'), el('dd', {}, el('code', { id: 'totp-secret' }, pending.totpSecret || '')),
          el('dt', {}, 'Type'), el('dd', {}, 'TOTP, 6 digits, 30 s')))), form);
    if (pending.otpauthUrl) await drawQr(box, pending.otpauthUrl, 'Two-factor QR code');
    input.focus();
  }

  function offState(pending) {
    const enable = el('button', { type: 'button', id: 'enable-2fa' }, pending ? 'Start again' : 'Turn on two-factor');
    enable.addEventListener('click', () => busy(enable, async () => {
      error.textContent = '';
      try {
        const r = await api('/api/account/security', { method: 'POST', body: { twoFactorEnabled: true } });
        await scanStep(r.security || {});
      } catch (e) { error.textContent = explain(e); }
    }));
    show(state(false),
      pending
        ? el('p', { class: 'notice', id: 'tfa-pending' }, 'You started turning it on but did not confirm a code. Start again to get a new secret.')
        : el('p', {}, 'Turn it on to ask for a code from an authenticator app at every sign-in.'),
      el('div', { class: 'row' }, enable));
  }

  function onState(left) {
    const input = el('input', { type: 'text', id: 'disable-code', name: 'twoFactorCode', autocomplete: 'one-time-code', maxlength: 24, required: true });
    const submit = el('button', { type: 'submit', class: 'danger' }, 'Turn off two-factor');
    const form = el('form', { id: 'disable-form', novalidate: true },
      el('label', { for: 'disable-code' }, 'Authenticator code or recovery code'), input,
      el('div', { class: 'row' }, submit));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      error.textContent = '';
      busy(submit, async () => {
        try {
          await api('/api/account/security', { method: 'POST', body: { twoFactorEnabled: false, twoFactorCode: input.value.trim() } });
          say('Two-factor is off.');
          await securityPage(ui);
        } catch (e) { error.textContent = explain(e); }
      });
    });
    const regenInput = el('input', { type: 'text', id: 'regenerate-code', name: 'twoFactorCode', autocomplete: 'one-time-code', maxlength: 24, required: true });
    const regenSubmit = el('button', { type: 'submit', class: 'secondary', id: 'regenerate-recovery' }, 'Get new recovery codes');
    const regenForm = el('form', { id: 'regenerate-form', novalidate: true },
      el('h3', {}, 'Recovery codes'),
      el('p', { id: 'recovery-left' }, `${left ?? 0} unused recovery code${left === 1 ? '' : 's'} left. New codes replace all of them.`),
      el('label', { for: 'regenerate-code' }, 'Authenticator code or recovery code'), regenInput,
      el('div', { class: 'row' }, regenSubmit));
    regenForm.addEventListener('submit', (ev) => {
      ev.preventDefault();
      error.textContent = '';
      busy(regenSubmit, async () => {
        try {
          const r = await api('/api/account/security', { method: 'POST', body: { regenerateRecoveryCodes: true, twoFactorCode: regenInput.value.trim() } });
          say('New recovery codes made; the old ones no longer work.');
          recoveryStep(r.recoveryCodes || [], true);
        } catch (e) { error.textContent = explain(e); regenInput.select(); }
      });
    });
    show(state(true), regenForm, el('h3', {}, 'Turn off'), form);
  }

  if (sec.twoFactorEnabled) onState(sec.recoveryCodesLeft);
  else offState(Boolean(sec.twoFactorPending));
  page('Security', el('section', { class: 'card', 'aria-labelledby': 'tfa-h' },
    el('h2', { id: 'tfa-h' }, 'Two-factor authentication'), area, error));
}
