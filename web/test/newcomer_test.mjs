// SPDX-License-Identifier: Apache-2.0
// The newcomer's first hour (issue 35's acceptance), in a real browser against the README's
// `gpufleet dev` (test/dashboard_browser.sh --newcomer starts it):
//   node web/test/newcomer_test.mjs ADDRESS ADMIN_TOKEN GPUFLEET EXAMPLES_DIR [SCREENSHOT_DIR]
// Submits every examples/*.yaml with the CLI, as the README does: each is accepted, the job
// that no node could ever hold is named at submit, and each ends up running (or done) or waiting
// with a reason that its page shows and explain's evidence bears out. Then, in the dashboard: a
// repeated event shown once with its count and span, a task's log (the CLI's `gpufleet logs`
// too), the Usage page's cost column, and a job cancelled from its page. Exits 0 when every
// check passed.
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';

import { STEP_MS, harness, launchChromium } from './harness.mjs';

const [address, adminToken, gpufleet, examplesDir, shotDir] = process.argv.slice(2);
if (!address || !adminToken || !gpufleet || !examplesDir) {
  console.error('usage: newcomer_test.mjs ADDRESS ADMIN_TOKEN GPUFLEET EXAMPLES_DIR [SCREENSHOT_DIR]');
  process.exit(2);
}
const { check, must, watch, shot, until, errors, count } = harness(address, shotDir);
const STARTED = ['Running', 'Succeeded'];  // placed and started by its node's agent

// The CLI as the README runs it, its output and exit status together.
function cli(...args) {
  const r = spawnSync(gpufleet, args, {
    env: { ...process.env, GPUFLEET_ADDR: address, GPUFLEET_TOKEN: adminToken },
    encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'],
  });
  return { status: r.status, out: r.stdout + r.stderr };
}
const job = (name) => must('GET', `/v1/jobs/${encodeURIComponent(name)}`, adminToken, undefined, 200);

const browser = await launchChromium();
const deadline = setTimeout(() => { console.error('newcomer test: over its time bound'); process.exit(1); }, 140000);
try {
  // ---- every example, with the CLI ---------------------------------------------------------
  const examples = readdirSync(examplesDir).filter((f) => f.endsWith('.yaml')).sort();
  check(examples.length >= 7, `the examples: ${examples.join(', ')}`);
  const submitted = {};  // job name -> what `gpufleet submit` printed
  for (const file of examples) {
    const name = /^metadata:\n(?:[ ].*\n)*?  name: (\S+)/m.exec(readFileSync(`${examplesDir}/${file}`, 'utf8'))[1];
    const r = cli('submit', '-f', `${examplesDir}/${file}`);
    check(r.status === 0, `gpufleet submit -f ${file} is accepted (${name})`);
    submitted[name] = r.out;
  }
  check(/^warning: .*never fits: /m.test(submitted['bert-pretrain']),
    `the 128-node gang is named at submit: ${submitted['bert-pretrain'].trim().replace('\n', ' | ')}`);
  check(!/never fits/.test(submitted['llm-serving'] + submitted['mig-eval']),
    'the MIG examples fit the demo, which has MIG nodes');

  // Each runs (or has run), or waits with a reason: never-fits ones were warned of at submit,
  // and explain's evidence bears the others out. (A job the demo's bad GPU failed is requeued
  // and starts again elsewhere: it is waited for as one that starts.)
  const waiting = {};
  for (const name of Object.keys(submitted)) {
    const j = await until(async () => {
      const now = await job(name);
      return (STARTED.includes(now.state) || (now.reason || '').startsWith('never fits')) && now;
    }) || await job(name);
    if (STARTED.includes(j.state)) {
      check(true, `${name} is ${j.state}`);
      continue;
    }
    check(j.state === 'Pending' && j.reason, `${name} waits with a reason: ${j.reason}`);
    const why = await must('GET', `/v1/jobs/${encodeURIComponent(name)}/explain`, adminToken, undefined, 200);
    const ev = why.evidence || {};
    if (j.reason.startsWith('never fits')) {
      check(why.reason === 'never' && submitted[name].includes('never fits'),
        `${name} never fits, and its submit said so: ${why.message}`);
      // Nothing running jobs could free would help it: no domain "lacks" GPUs, and no what-if
      // is offered that could never start either (the gang halved to 128 GPUs still fits no
      // leaf of 64; the fleet has no other model it takes).
      check(!ev.bestDomain && (why.whatIf || []).length === 0,
        `${name}'s explain offers no GPUs to free and no what-if that cannot help (${(why.whatIf || []).map((w) => w.change).join(', ')})`);
    } else {
      check(why.reason !== 'none' && why.reason !== 'never' && why.message,
        `explain says why ${name} waits (${why.reason}): ${why.message}`);
      if (why.reason === 'capacity') {
        check(ev.freeGpus < ev.neededGpus || /cannot join/.test(why.message),
          `${name}: fewer GPUs are free (${ev.freeGpus}) than it needs (${ev.neededGpus})`);
      }
    }
    waiting[name] = j.reason;
  }

  // llm-serving's four replicas spread over the racks: one MIG node in each.
  const serving = await job('llm-serving');
  const servingNodes = new Set((serving.placements || []).map((p) => p.node));
  check(STARTED.includes(serving.state) && servingNodes.size === 4,
    `llm-serving runs spread over four racks' MIG nodes: ${[...servingNodes].join(', ')}`);

  // ---- the dashboard ---------------------------------------------------------------------
  const page = await (await browser.newContext({ viewport: { width: 1440, height: 1000 } })).newPage();
  watch(page, 'admin');
  await page.goto(`${address}/#token=${encodeURIComponent(adminToken)}`);
  await page.waitForSelector('.node', { timeout: STEP_MS });
  for (const [name, reason] of Object.entries(waiting)) {
    await page.goto(`${address}/#/jobs/${encodeURIComponent(name)}`);
    await page.waitForSelector('#job-reason', { timeout: STEP_MS });
    await page.waitForSelector('#explain :is(dl, p.na)', { timeout: STEP_MS });
    const shown = await page.locator('#job-reason').textContent();
    // The reason's figures may have moved since; never-fits stays as it was.
    check(shown.length > 0 && shown.startsWith('never fits') === reason.startsWith('never fits'),
      `${name}'s page says why it waits: ${shown}`);
    if (name === 'bert-pretrain') await shot(page, 'newcomer_never_fits');
  }

  // A repeated event is stored and shown once, with its count and span: a gang of 28 nodes
  // waits on the busy fleet, and its reason's figures change as trace jobs come and go.
  await must('POST', '/v1/jobs', adminToken, {
    apiVersion: 'gpufleet.io/v1', kind: 'Job', metadata: { name: 'wide-train' },
    spec: { runtimeEstimate: '10m', tasks: [{ name: 'workers', replicas: 28, command: ['train'],
      env: { GPUFLEET_SIM_DURATION_MS: '600000' },
      resources: { cpu: '8', memory: '64Gi', gpus: { count: 8 } } }] },
  }, 201);
  const repeated = await until(async () => {
    const events = (await must('GET', '/v1/jobs/wide-train/events', adminToken, undefined, 200)).items;
    return events.find((e) => e.count > 1);
  });
  check(repeated, `the waiting gang's repeated event is stored once: ${repeated && repeated.message} x${repeated && repeated.count}`);
  await page.goto(`${address}/#/jobs/wide-train`);
  const repeats = page.locator('.timeline .repeats').first();
  await repeats.waitFor({ timeout: STEP_MS });
  check(/^ \(x\d+, \d\d:\d\d-\d\d:\d\d\)$/.test(await repeats.textContent()),
    `its timeline shows it once: ${await repeats.locator('xpath=..').textContent()}`);
  await repeats.scrollIntoViewIfNeeded();
  await shot(page, 'newcomer_grouped_events');

  // Logs: the simulated task's own lines, in the CLI and on the job page.
  const logs = await until(async () => {
    const r = cli('logs', 'single-gpu');
    return r.out.includes('simulated task') && r;
  }) || cli('logs', 'single-gpu');
  check(logs.status === 0 && /simulated task .* started on GPUs GPU-/.test(logs.out),
    `gpufleet logs single-gpu shows its task's log: ${logs.out.trim().split('\n').find((l) => l.includes('started'))}`);
  await page.goto(`${address}/#/jobs/single-gpu`);
  await page.waitForSelector('#job-logs pre:has-text("simulated task")', { timeout: STEP_MS });
  check(true, 'its page shows the same log');
  await page.locator('#job-logs').scrollIntoViewIfNeeded();
  await shot(page, 'newcomer_job_logs');

  // The Usage page's cost column (`gpufleet dev --prices`).
  await page.click('nav a:has-text("Usage")');
  await page.waitForSelector('main .panel th:has-text("cost")', { timeout: STEP_MS });
  check(true, 'the Usage page has a cost column');
  await shot(page, 'newcomer_usage');

  // An action from the UI: the waiting gang, cancelled from its page.
  await page.goto(`${address}/#/jobs/wide-train`);
  await page.click('#job-cancel');
  check(await until(async () => ['Stopping', 'Cancelled'].includes((await job('wide-train')).state)),
    'the waiting gang is cancelled from its page');

  // The demo's bad GPU (the banner's "faults" line: dev-node-001 GPU 4 on this fleet) has failed
  // the jobs it ran by now, and the failure report names it.
  let report = '';
  for (let i = 0; i < 4 && !report.includes('dev-node-001/gpu4'); i++) {
    report = (await until(async () => {
      const r = cli('report', 'failures');
      return r.out.includes('dev-node-001/gpu4') && r.out;
    })) || '';
  }
  check(report.includes('dev-node-001/gpu4'),
    `gpufleet report failures names the demo's bad GPU: ${report.split('\n').find((l) => l.includes('dev-node-001/gpu4'))}`);

  check(errors.length === 0, 'no console errors' + (errors.length ? ':\n' + errors.join('\n') : ''));
  console.log(`newcomer test: ${count()} checks passed`);
} catch (e) {
  console.error(e.message);
  if (errors.length) console.error(errors.join('\n'));
  process.exitCode = 1;
} finally {
  clearTimeout(deadline);
  await browser.close();
}
