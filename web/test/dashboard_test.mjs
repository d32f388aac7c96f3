// SPDX-License-Identifier: Apache-2.0
// The dashboard in a real browser (Debian's chromium, driven by playwright-core) against a
// running `gpufleet dev` (test/dashboard_browser.sh starts it):
//   node web/test/dashboard_test.mjs http://127.0.0.1:PORT ADMIN_TOKEN [SCREENSHOT_DIR]
// Logs in (a wrong token first), sees every node, watches a job submitted through the API
// appear and run, opens its page (its timeline with times and its task's log) and its node, where
// it cordons, drains, quarantines a GPU with a reason and releases it; a member logs in with
// the `#token=` link (which leaves the address bar, and no request carries a Referer) and sees
// only its team's jobs, another team's job URL is "not found", names with HTML in them render as
// text, a hidden tab stops polling, and a token revoked mid-session sends the page back to the
// login. The Content-Security-Policy is served and enforced (an inline script is refused), and
// no console error (a CSP violation is one) but the HTTP answers the test provokes. Exits 0 when
// every check passed.
import { STEP_MS, harness, launchChromium } from './harness.mjs';

const [address, adminToken, shotDir] = process.argv.slice(2);
if (!address || !adminToken) {
  console.error('usage: dashboard_test.mjs ADDRESS ADMIN_TOKEN [SCREENSHOT_DIR]');
  process.exit(2);
}
const HTML = '<img src=x onerror="window.__injected=1">';
const { check, api, must, watch, shot, until, logIn, errors, allowed, count } = harness(address, shotDir);

function oneGpuJob(name, labels) {
  return {
    apiVersion: 'gpufleet.io/v1', kind: 'Job', metadata: { name, labels: labels || {} },
    spec: { tasks: [{ name: 'main', command: ['sleep', '600'],
      env: { GPUFLEET_SIM_DURATION_MS: '600000' },
      resources: { cpu: '1', memory: '1Gi', gpus: { count: 1 } } }] },
  };
}

const browser = await launchChromium();
const deadline = setTimeout(() => { console.error('dashboard test: over its time bound'); process.exit(1); }, 120000);
try {
  // The fleet and two teams, through the API.
  const nodes = (await must('GET', '/v1/nodes', adminToken, undefined, 200)).items;
  check(nodes.length > 0, `the fleet has ${nodes.length} nodes`);
  for (const team of ['team-a', 'team-b']) await must('POST', '/v1/teams', adminToken, { name: team }, 201);
  // A token name is free text: it is shown as "submitted by" and in the header.
  const alice = await must('POST', '/v1/tokens', adminToken,
    { role: 'member', team: 'team-a', name: 'alice' + HTML }, 201);
  const bob = await must('POST', '/v1/tokens', adminToken, { role: 'member', team: 'team-b', name: 'bob' }, 201);
  await must('POST', '/v1/jobs', bob.token, oneGpuJob('secret-b'), 201);
  const htmlName = await api('POST', '/v1/jobs', alice.token, oneGpuJob(HTML));
  check(htmlName.status === 400, 'a job named with HTML is refused by the API');

  // ---- the admin -------------------------------------------------------------------------
  const context = await browser.newContext({ viewport: { width: 1440, height: 1000 } });
  const page = await context.newPage();
  watch(page, 'admin');
  allowed.push(/\/v1\/whoami$/);  // the wrong token's 401
  const served = await page.goto(address + '/');
  const csp = served.headers()['content-security-policy'] || '';
  check(csp.includes("default-src 'self'") && csp.includes("frame-ancestors 'none'") &&
    !csp.includes('unsafe-inline') && served.headers()['x-content-type-options'] === 'nosniff' &&
    served.headers()['referrer-policy'] === 'no-referrer', `the page is served with its CSP (${csp})`);
  // The policy is enforced: a script put in the page inline does not run (a page of its own,
  // so its violation report is not one of the checked pages' console errors).
  const probe = await context.newPage();
  await probe.goto(address + '/');
  check(await probe.evaluate(() => new Promise((resolve) => {
    setTimeout(() => resolve(false), 2000);  // no violation reported: no policy
    document.addEventListener('securitypolicyviolation', (e) => resolve(e.violatedDirective.startsWith('script-src') && window.__inline === undefined));
    const s = document.createElement('script');
    s.textContent = 'window.__inline = 1';
    document.head.append(s);
  })), 'an inline script is refused by the CSP');
  await probe.close();
  await logIn(page, 'not-a-token');
  await page.waitForSelector('#login-error:has-text("That token was refused")', { timeout: STEP_MS });
  check(true, 'a wrong token is refused on the login page');
  allowed.pop();
  await page.fill('#token', adminToken);
  await page.click('button[type=submit]');
  await page.waitForSelector('.node', { timeout: STEP_MS });
  await page.waitForFunction((n) => document.querySelectorAll('.node').length === n, nodes.length,
    { timeout: STEP_MS });
  for (const n of nodes) {
    check(await page.locator(`.node[data-node="${n.name}"]`).count() === 1, `node ${n.name} is shown`);
  }
  check(await page.locator('.node .gpu').count() === nodes.reduce((s, n) => s + n.gpus.length, 0),
    'every GPU is shown');
  await page.waitForSelector('.uplot', { timeout: STEP_MS });
  // At a glance: idle GPUs, fragmentation, busy and allocated in %, nodes by idle whole GPUs.
  const gpuCount = nodes.reduce((s, n) => s + n.gpus.length, 0);
  const idleShown = Number(await page.locator('#gpus-idle').textContent());
  check(Number.isInteger(idleShown) && idleShown >= 0 && idleShown <= gpuCount,
    `the Fleet page shows the idle GPUs (${idleShown} of ${gpuCount})`);
  const fragmentation = await page.locator('#fragmentation').textContent();
  check(/^(\d+%|–)$/.test(fragmentation) &&
    await page.locator('.card:has-text("fragmentation: idle GPUs outside blocks of")').count() === 1,
    `and the fragmentation, with the block size it is counted for (${fragmentation})`);
  await page.waitForFunction(() => /^\d+%$/.test(document.getElementById('busy-pct').textContent),
    null, { timeout: STEP_MS });
  check(await page.locator('.card:has-text("peak")').count() === 2,
    `and GPUs busy and allocated in %, mean and peak (${await page.locator('#busy-pct').textContent()})`);
  const perSize = (await page.locator('#fleet-blocks td.num').allTextContents()).map(Number);
  check(perSize.length >= 1 && perSize.reduce((a, b) => a + b, 0) <= nodes.length,
    `and how many nodes have 8+, 4-7, 2-3, 1 idle GPUs (${perSize.join(', ')})`);
  await shot(page, 'dashboard_fleet');

  await must('POST', '/v1/jobs', adminToken, oneGpuJob('browser-job'), 201);
  await page.click('nav a:has-text("Jobs")');
  await page.fill('input[name=q]', 'browser-job');
  const row = page.locator('tr', { has: page.locator('a.job-link', { hasText: /^browser-job$/ }) });
  await row.waitFor({ timeout: STEP_MS });
  check(true, 'a job submitted through the API appears');
  await row.locator('.badge:has-text("Running")').waitFor({ timeout: STEP_MS });
  check(true, 'and runs');
  await page.fill('input[name=q]', '');
  await shot(page, 'dashboard_jobs');
  await page.fill('input[name=q]', 'browser-job');
  await row.locator('a.job-link').click();
  await page.waitForSelector('.timeline li:has-text("submitted by")', { timeout: STEP_MS });
  const times = await page.locator('.timeline time').allTextContents();
  check(times.length >= 2 && times.every((t) => /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$/.test(t)),
    `the timeline shows when each event happened (${times[0]})`);
  check(await page.locator('#explain').count() === 1, 'the job page has its explain panel');
  await page.waitForSelector('#job-elapsed', { timeout: STEP_MS });
  check(/^\d+(s|m)/.test(await page.locator('#job-elapsed').textContent()) &&
    await page.locator('#job-busy').count() === 1,
    `a running job's page says how long it has run and how busy its GPUs were (${await page.locator('#job-elapsed').textContent()})`);
  // The demo's simulated tasks log their start as a program would (its GPUs and its script).
  await page.waitForSelector('#job-logs pre:has-text("simulated task")', { timeout: STEP_MS });
  check(/started on GPUs GPU-/.test(await page.locator('#job-logs pre').textContent()),
    'the job page shows its task\'s log');
  const nodeLink = page.locator('table a[href^="#/nodes/"]').first();
  await nodeLink.waitFor({ timeout: STEP_MS });
  const placedOn = await nodeLink.textContent();
  check(placedOn.startsWith('dev-node-'), `the job page shows where it runs (${placedOn})`);
  await shot(page, 'dashboard_job');
  await nodeLink.click();
  await page.waitForSelector(`h1:has-text("Node ${placedOn}")`, { timeout: STEP_MS });
  await page.waitForSelector('a:has-text("browser-job")', { timeout: STEP_MS });
  check(true, 'the node page lists the job on its GPU');
  // Actions behind the CLI's roles: an admin cordons the node from its page, and uncordons it.
  const nodeNow = () => must('GET', `/v1/nodes/${encodeURIComponent(placedOn)}`, adminToken, undefined, 200);
  const nodeStateBecomes = (state) => until(async () => (await nodeNow()).state === state);
  await page.click('#node-cordon:has-text("Cordon")');
  check(await nodeStateBecomes('Cordoned'), 'an admin cordons a node from its page');
  await page.waitForSelector('#node-cordon:has-text("Uncordon")', { timeout: STEP_MS });
  await page.click('#node-cordon:has-text("Uncordon")');
  check(await nodeStateBecomes('Ready'), 'and uncordons it');
  // Drained as `gpufleet drain` drains it: a draining node offers Uncordon and no second drain.
  await page.click('#node-drain');
  check(await nodeStateBecomes('Draining'), 'an admin drains a node from its page');
  await page.waitForSelector('#node-cordon:has-text("Uncordon")', { timeout: STEP_MS });
  check(await page.locator('#node-drain').count() === 0, 'a draining node offers Uncordon, not Drain');
  await page.click('#node-cordon:has-text("Uncordon")');
  check(await nodeStateBecomes('Ready'), 'and Uncordon puts it back in service');
  // One GPU quarantined with a reason from the node's page, then released from its row.
  const gpuBecomes = (index, health, reason) => until(async () => {
    const gpu = (await nodeNow()).gpus.find((g) => g.index === index);
    return gpu.health === health && (gpu.quarantine_reason || '') === reason;
  });
  const lastGpu = nodes.find((n) => n.name === placedOn).gpus.length - 1;
  const uiReason = 'ECC errors <b>rising</b>, ticket 7';
  await page.selectOption('#quarantine-gpu', String(lastGpu));
  await page.fill('#quarantine-reason', uiReason);
  await page.click('#node-quarantine');
  check(await gpuBecomes(lastGpu, 'Quarantined', uiReason), `an admin quarantines GPU ${lastGpu} with a reason from its node's page`);
  const release = page.locator(`#gpu-release-${lastGpu}`);
  await release.waitFor({ timeout: STEP_MS });
  check(await page.locator('main b').count() === 0 &&
    await page.locator(`tr:has(#gpu-release-${lastGpu}) td:has-text("${uiReason}")`).count() === 1,
    'its row shows the reason, as text, beside a Release button');
  await shot(page, 'dashboard_node');
  await release.click();
  check(await gpuBecomes(lastGpu, 'Healthy', ''), 'and Release puts the GPU back in service');
  // A gang larger than the fleet waits: its page says why (it never fits: the fleet has too few
  // GPUs in all), with the explain panel (the explain route's answer, or "not available" on a
  // server without it).
  const gang = oneGpuJob('waiting-job');
  gang.spec.tasks[0].replicas = nodes.length + 1;
  gang.spec.tasks[0].resources.gpus.count = nodes[0].gpus.length;
  await must('POST', '/v1/jobs', adminToken, gang, 201);
  await page.goto(address + '/#/jobs/waiting-job');
  await page.waitForSelector('#job-reason:has-text("never fits")', { timeout: STEP_MS });
  await page.waitForSelector('#explain :is(dl, p.na)', { timeout: STEP_MS });
  check(await page.locator('.badge:has-text("Pending")').count() === 1,
    'a pending job\'s page shows why it waits and its explain panel');
  await shot(page, 'dashboard_pending_job');
  // Cancelled from its page, as `gpufleet cancel` would.
  await page.click('#job-cancel');
  check(await until(async () => (await must('GET', '/v1/jobs/waiting-job', adminToken, undefined, 200)).state === 'Cancelled'),
    'a job is cancelled from its page');
  await page.click('nav a:has-text("Queues")');
  await page.waitForSelector('td:has-text("default")', { timeout: STEP_MS });
  check(true, 'the queue tree shows the default queue');
  await shot(page, 'dashboard_queues');
  await page.click('nav a:has-text("History")');
  await page.waitForSelector('#history-note:has-text("samples")', { timeout: STEP_MS });
  check(true, 'the history page shows the server\'s samples');
  await shot(page, 'dashboard_history');
  await page.click('nav a:has-text("Failures")');
  await page.waitForSelector('.card:has-text("runs (30 days)")', { timeout: STEP_MS });
  check(true, 'the failure report is shown to an admin');
  // A quarantine with a reason: the Fleet and Failures pages say the same at once.
  const reason = 'fans loud, ticket 42';
  await must('POST', `/v1/nodes/${encodeURIComponent(placedOn)}/quarantine`, adminToken,
    { gpu: 0, reason }, 200);
  await page.click('nav a:has-text("Fleet")');
  await page.waitForSelector(`#fleet-quarantines td:has-text("${reason}")`, { timeout: STEP_MS });
  check(true, 'the Fleet page lists a quarantined GPU with its reason');
  await page.click('nav a:has-text("Failures")');
  await page.waitForSelector(`td:has-text("${reason}")`, { timeout: STEP_MS });
  check(true, 'the Failures page shows the same quarantine and reason at once');
  await must('POST', `/v1/nodes/${encodeURIComponent(placedOn)}/release`, adminToken, { gpu: 0 }, 200);
  await page.click('nav a:has-text("Usage")');
  await page.waitForSelector('main .panel', { timeout: STEP_MS });
  await page.waitForSelector('main .panel th:has-text("cost")', { timeout: STEP_MS });
  check(true, 'the Usage page has a cost column from the server\'s prices');

  // ---- a member ----------------------------------------------------------------------------
  const member = await (await browser.newContext({ viewport: { width: 1440, height: 1000 } })).newPage();
  watch(member, 'member');
  const referers = [];
  const v1Requests = [];
  member.on('request', (r) => {
    r.allHeaders().then((h) => { if (h.referer) referers.push(r.url()); }, () => {});
    if (r.url().includes('/v1/')) v1Requests.push(Date.now());
  });
  // The link `gpufleet dev` prints: the token leaves the address bar and is never sent as a
  // Referer (Referrer-Policy: no-referrer), not even for the page's own assets.
  await member.goto(`${address}/#token=${encodeURIComponent(alice.token)}`);
  await member.waitForSelector('.node', { timeout: STEP_MS });
  check(!member.url().includes(alice.token) && referers.length === 0,
    'the #token= link logs in, leaves the address bar and no request carries a Referer');
  check(await member.locator('#who img').count() === 0 &&
    (await member.locator('#who').textContent()).includes(`alice${HTML} (team team-a)`), 'a token name with HTML shows as text');
  await must('POST', '/v1/jobs', alice.token, oneGpuJob('alice-job'), 201);
  await member.goto(address + '/#/jobs');
  await member.waitForSelector('a.job-link:has-text("alice-job")', { timeout: STEP_MS });
  const names = await member.locator('a.job-link').allTextContents();
  check(names.length === 1 && names[0] === 'alice-job',
    `a member sees only its team's jobs (${names.length} shown)`);
  await member.click('a.job-link:has-text("alice-job")');
  await member.waitForSelector('.timeline li:has-text("submitted by alice")', { timeout: STEP_MS });
  check(await member.locator('main img').count() === 0, 'the submitter\'s HTML name is text on the job page');
  check(await member.locator('#job-cancel').count() === 1, 'a member is offered the cancel of its own team\'s job');
  allowed.push(/\/v1\/jobs\/team-b\/secret-b$/, /\/v1\/jobs\/secret-b$/, /\/v1\/jobs\/%3Cimg/);
  for (const hidden of ['team-b/secret-b', 'secret-b']) {
    await member.goto(`${address}/#/jobs/${hidden}`);
    await member.waitForSelector('#not-found', { timeout: STEP_MS });
    check(true, `a member opening another team's job ${hidden} sees "not found"`);
  }
  // A member is offered no admin action: a node page has no cordon.
  await member.goto(`${address}/#/nodes/${encodeURIComponent(placedOn)}`);
  await member.waitForSelector('h2:has-text("GPUs")', { timeout: STEP_MS });
  check(await member.locator('#node-cordon, #node-drain, #node-quarantine, [id^="gpu-release-"]').count() === 0,
    'a member is offered no cordon, drain, quarantine or release (an admin\'s actions)');
  await member.goto(`${address}/#/jobs/${encodeURIComponent(HTML)}`);
  await member.waitForSelector('#not-found', { timeout: STEP_MS });
  check(await member.locator('main img').count() === 0 &&
    (await member.locator('#job-name').textContent()) === HTML, 'an HTML job name in the URL renders as text');
  check(await member.evaluate(() => window.__injected === undefined), 'no injected script ran');
  await member.click('nav a:has-text("Failures")');
  await member.waitForSelector('p.na:has-text("for admins")', { timeout: STEP_MS });
  check(true, 'the failure report tells a member it is for admins');

  // A hidden tab asks the server nothing until it is shown again.
  await member.click('nav a:has-text("Fleet")');
  await member.waitForSelector('.node', { timeout: STEP_MS });
  const visibility = (hidden) => member.evaluate((h) => {
    Object.defineProperty(document, 'hidden', { value: h, configurable: true });
    Object.defineProperty(document, 'visibilityState', { value: h ? 'hidden' : 'visible', configurable: true });
    document.dispatchEvent(new Event('visibilitychange'));
  }, hidden);
  await visibility(true);
  await member.waitForTimeout(500);  // an answer in flight lands
  const hiddenSince = Date.now();
  await member.waitForTimeout(4000);  // more than one polling interval (3 s)
  check(v1Requests.filter((t) => t > hiddenSince).length === 0, 'a hidden tab stops polling');
  const shownAt = Date.now();
  await visibility(false);
  await member.waitForTimeout(300);
  check(v1Requests.some((t) => t >= shownAt), 'and refreshes at once when shown again');

  check(referers.length === 0, `no request of the member's session carried a Referer (${referers.length})`);

  // Revoked mid-session: the next poll is refused and the page asks for a token again.
  allowed.push(/\/v1\//);  // every poll in flight when the revocation lands answers 401
  await must('POST', `/v1/tokens/${alice.id}/revoke`, adminToken, undefined, 200);
  await member.waitForSelector('#login-error:has-text("expired or revoked")', { timeout: STEP_MS });
  check(await member.evaluate(() => sessionStorage.getItem('gpufleet.token')) === null,
    'a token revoked mid-session sends the page back to the login and forgets the token');

  check(errors.length === 0, 'no console errors' + (errors.length ? ':\n' + errors.join('\n') : ''));
  console.log(`dashboard test: ${count()} checks passed`);
} catch (e) {
  console.error(e.message);
  const job = await api('GET', '/v1/jobs/browser-job', adminToken);
  if (job.status === 200) console.error(`browser-job: ${job.json.state} ${job.json.reason || ''}`);
  const events = await api('GET', '/v1/jobs/browser-job/events', adminToken);
  if (events.status === 200) console.error(events.json.items.map((x) => x.message).join('\n'));
  if (errors.length) console.error(errors.join('\n'));
  process.exitCode = 1;
} finally {
  clearTimeout(deadline);
  await browser.close();
}
