// SPDX-License-Identifier: Apache-2.0
// What the browser tests (dashboard_test.mjs, newcomer_test.mjs) share: numbered checks, the
// API with a token, console errors but for the HTTP answers a test provokes, screenshots and
// Debian's chromium driven by playwright-core.
import { chromium } from 'playwright-core';

export const STEP_MS = 12000;  // the longest any one wait may take (the page polls every 3 s)

export function harness(address, shotDir) {
  let checks = 0;
  // Console errors, but for the HTTP answers a test provokes on purpose (a wrong token, a
  // revoked one, hidden or absent routes): those the page handles and shows.
  const errors = [];
  const allowed = [/\/v1\/jobs\/[^?]*\/explain$/, /\/v1\/jobs\/[^?]*\/logs$/, /\/v1\/usage\?/];
  const h = {
    errors,
    allowed,
    count: () => checks,
    check(ok, what) {
      if (!ok) throw new Error('check failed: ' + what);
      checks += 1;
      console.log('ok', checks, what);
    },
    async api(method, path, token, body) {
      const res = await fetch(address + path, {
        method,
        headers: { Authorization: 'Bearer ' + token, 'Content-Type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.text();
      let json = null;
      try { json = JSON.parse(text); } catch (e) { json = null; }
      return { status: res.status, json, text };
    },
    async must(method, path, token, body, want) {
      const r = await h.api(method, path, token, body);
      if (r.status !== want) throw new Error(`${method} ${path}: ${r.status} ${r.text}`);
      return r.json;
    },
    watch(page, who) {
      page.on('pageerror', (e) => errors.push(`${who}: page error: ${e.message}`));
      page.on('console', (m) => {
        if (m.type() !== 'error') return;
        const url = (m.location() || {}).url || '';
        if (m.text().startsWith('Failed to load resource') && allowed.some((re) => re.test(url))) return;
        errors.push(`${who}: console: ${m.text()} ${url}`);
      });
    },
    async shot(page, name) {
      if (!shotDir) return;
      await page.waitForTimeout(300);
      await page.screenshot({ path: `${shotDir}/${name}.png` });
    },
    // `probe()` (async) every 250 ms until it answers truthy, for at most 10 s: its last answer.
    async until(probe) {
      let answer;
      for (let i = 0; i < 40; i++) {
        answer = await probe();
        if (answer) return answer;
        await new Promise((resolve) => setTimeout(resolve, 250));
      }
      return answer;
    },
    async logIn(page, token) {
      await page.goto(address + '/');
      await page.waitForSelector('#token', { timeout: STEP_MS });
      await page.fill('#token', token);
      await page.click('button[type=submit]');
    },
  };
  return h;
}

export function launchChromium() {
  return chromium.launch({
    executablePath: process.env.GPUFLEET_CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
}
