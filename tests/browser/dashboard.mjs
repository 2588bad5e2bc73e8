// Drives varuna-manager's dashboard in the system Chromium and checks what it shows for a job.
//
//   node tests/browser/dashboard.mjs --url http://127.0.0.1:PORT/ --job JOBID --steps N \
//       --ranks R --screenshot OUT.png [--morph] [--token T] [--timeout_s 120]
//       [--node_modules DIR]
//
// Checks (polled until --timeout_s, the page updates live):
//   - with --token: the page (loaded without one) asks for it (#auth-form), and shows the
//     job once it is typed in; HTTPS certificates are not checked (the test's own CA);
//   - the job is in the job list (#jobs tr[data-job-id=JOBID]) and clicking it selects it
//     (#job-detail[data-job-id=JOBID]);
//   - its loss chart plotted exactly N points (#chart-loss[data-points=N][data-job=JOBID]),
//     and with --evals K exactly K validation-loss points (data-eval-points), the newest a
//     positive number (data-last-eval);
//   - the stage map, from /stages (#stage-map[data-source=stages]), has one cell per rank
//     0..R-1 ([data-rank]);
//   - with --morph: the morph timeline has at least one entry (#morphs [data-morph]);
//   - the allocation chart (#chart-alloc) has a line for the job with its start, its end (or
//     now) and, with --morph, the morph between: at least 2 (3) time points; the line passes
//     through R slots, and with --morph through another width too;
//   - the page never reloaded (a marker set on window at the start is still there) and threw
//     no uncaught error.
// Exit: 0 all passed, 1 a check failed (or the browser could not run), 2 bad usage,
// 77 no /usr/bin/chromium (skip). The full-page screenshot is saved in every case it can be.
// playwright-core comes from --node_modules DIR, else NODE_PATH, else tests/browser/node_modules.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const CHROMIUM = '/usr/bin/chromium';
const here = path.dirname(fileURLToPath(import.meta.url));

function usage(msg) {
  if (msg) console.error(`dashboard.mjs: ${msg}`);
  console.error('usage: node tests/browser/dashboard.mjs --url URL --job ID --steps N --ranks R ' +
                '--screenshot OUT.png [--morph] [--timeout_s 120] [--node_modules DIR]');
  process.exit(2);
}

const opts = { morph: false, timeout_s: 120 };
{
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i++) {
    let k = a[i];
    if (!k.startsWith('--')) usage(`unexpected argument ${k}`);
    k = k.slice(2);
    let v;
    const eq = k.indexOf('=');
    if (eq >= 0) { v = k.slice(eq + 1); k = k.slice(0, eq); }
    if (k === 'morph') { opts.morph = true; continue; }
    if (!['url', 'job', 'steps', 'ranks', 'screenshot', 'timeout_s', 'node_modules', 'token', 'evals'].includes(k)) usage(`unknown flag --${k}`);
    if (v === undefined) {
      if (i + 1 >= a.length) usage(`--${k} needs a value`);
      v = a[++i];
    }
    opts[k] = v;
  }
}
for (const k of ['url', 'job', 'steps', 'ranks', 'screenshot']) if (opts[k] === undefined) usage(`--${k} is required`);
const STEPS = Number(opts.steps), RANKS = Number(opts.ranks), TIMEOUT_S = Number(opts.timeout_s);
if (!Number.isInteger(STEPS) || STEPS < 0) usage('--steps must be a non-negative integer');
if (!Number.isInteger(RANKS) || RANKS < 1) usage('--ranks must be a positive integer');
if (!(TIMEOUT_S > 0)) usage('--timeout_s must be positive');
const EVALS = opts.evals === undefined ? null : Number(opts.evals);
if (EVALS !== null && !(Number.isInteger(EVALS) && EVALS >= 0)) usage('--evals must be a non-negative integer');
const evalsOk = (s) => EVALS === null || (s.evalPoints === EVALS && (EVALS === 0 || s.lastEval > 0));
const JOB = String(opts.job);

if (!fs.existsSync(CHROMIUM)) {
  console.log('SKIP: no chromium');
  process.exit(77);
}

let nodeModules = opts.node_modules ||
  (process.env.NODE_PATH || '').split(path.delimiter).find((p) => p && fs.existsSync(path.join(p, 'playwright-core'))) ||
  path.join(here, 'node_modules');
let chromium;
try {
  ({ chromium } = createRequire(path.join(path.resolve(nodeModules), '_varuna_test_.cjs'))('playwright-core'));
} catch (e) {
  console.error(`FAIL: cannot load playwright-core from ${nodeModules} (npm ci --prefix tests/browser): ${e.message}`);
  process.exit(1);
}

const t0 = Date.now();
const elapsed = () => ((Date.now() - t0) / 1000).toFixed(1) + 's';
const results = [];
function report(name, ok, detail) {
  results.push({ name, ok });
  console.log(`${ok ? 'PASS' : 'FAIL'} ${name}: ${detail} [${elapsed()}]`);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// What the page shows now, read from the DOM.
async function snapshot(page) {
  return page.evaluate((job) => {
    const q = (s) => document.querySelector(s);
    const row = [...document.querySelectorAll('#jobs tr[data-job-id]')].find((r) => r.dataset.jobId === job);
    const detail = q('#job-detail');
    const chart = q('#chart-loss');
    const map = q('#stage-map');
    const banner = q('#banner');
    const alloc = q('#chart-alloc');
    return {
      marker: window.__varunaMarker,
      listed: !!row,
      selectedRow: !!row && row.classList.contains('selected'),
      detailJob: detail ? detail.dataset.jobId : null,
      state: detail ? detail.dataset.state : null,
      generation: detail ? detail.dataset.generation : null,
      points: chart ? Number(chart.dataset.points) : NaN,
      chartJob: chart ? chart.dataset.job : null,
      evalPoints: chart ? Number(chart.dataset.evalPoints) : NaN,
      lastEval: chart ? Number(chart.dataset.lastEval) : NaN,
      stageSource: map ? map.dataset.source : null,
      ranks: [...document.querySelectorAll('#stage-map [data-rank]')].map((e) => Number(e.dataset.rank)),
      morphs: document.querySelectorAll('#morphs [data-morph]').length,
      allocJobs: alloc ? alloc.dataset.jobs.split(',').filter(Boolean) : [],
      allocPoints: alloc ? Number(alloc.dataset.points) : NaN,
      allocSlots: alloc ? alloc.dataset.slots : '',
      allocValues: alloc ? ((alloc.dataset.values || '').split(';').find((v) => v.startsWith(job + ':')) || '')
        .slice(job.length + 1).split('>').filter(Boolean).map(Number) : [],
      banner: banner && !banner.hidden ? banner.textContent : '',
      hash: location.hash,
    };
  }, JOB);
}

// Polls until pred(snapshot) holds or the deadline passes; returns the last snapshot.
async function waitFor(page, deadline, pred) {
  let s;
  for (;;) {
    s = await snapshot(page);
    if (pred(s) || Date.now() > deadline) return s;
    await sleep(250);
  }
}

const allocOk = (s) => s.allocJobs.includes(JOB) && s.allocPoints >= (opts.morph ? 3 : 2) &&
  s.allocValues.includes(RANKS) && (!opts.morph || s.allocValues.some((v) => v > 0 && v !== RANKS));
const ranksOk = (s) => s.stageSource === 'stages' && s.ranks.length === RANKS &&
  [...Array(RANKS).keys()].every((r) => s.ranks.includes(r));

let browser;
let page;
let failed = false;
const pageErrors = [];
let failedResources = 0;
try {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
    timeout: 60000,
  });
  page = await browser.newPage({ viewport: { width: 1280, height: 800 }, ignoreHTTPSErrors: true });
  page.on('pageerror', (e) => { pageErrors.push(String(e && e.message || e)); console.log(`page error: ${e}`); });
  // HTTP errors the page rides out (logs while workers restart) are counted, not printed.
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    if (m.text().startsWith('Failed to load resource')) failedResources++;
    else console.log(`console error: ${m.text()}`);
  });
  const deadline = t0 + TIMEOUT_S * 1000;

  const resp = await page.goto(opts.url, { waitUntil: 'load', timeout: TIMEOUT_S * 1000 });
  report('page loads', !!resp && resp.ok(), `${opts.url} -> HTTP ${resp ? resp.status() : 'none'}`);
  await page.evaluate(() => { window.__varunaMarker = 1; });

  if (opts.token !== undefined) {
    let asked = false;
    try {
      await page.locator('#auth-form:not([hidden]) #auth-token').waitFor({ timeout: 15000 });
      asked = true;
    } catch (e) { /* reported below */ }
    report('token prompt', asked, asked ? 'the page asked for a token' : 'no #auth-form appeared');
    if (asked) {
      await page.fill('#auth-token', opts.token);
      await page.click('#auth-form button[type=submit]');
    }
  }

  let s = await waitFor(page, deadline, (x) => x.listed);
  report('job listed', s.listed, s.listed ? `job ${JOB} is in the job list` : `job ${JOB} never appeared in #jobs`);
  if (s.listed) {
    await page.locator(`#jobs tr[data-job-id="${JOB.replace(/["\\]/g, '\\$&')}"]`).click({ timeout: 10000 });
  }
  s = await waitFor(page, deadline, (x) => x.detailJob === JOB && x.selectedRow);
  report('job selected', s.detailJob === JOB && s.selectedRow,
         `#job-detail shows job ${s.detailJob || '(none)'}, url hash ${s.hash || '(none)'}`);

  // Everything at once, then report each one from the same final snapshot.
  s = await waitFor(page, deadline, (x) =>
    x.detailJob === JOB && x.chartJob === JOB && x.points === STEPS && ranksOk(x) && (!opts.morph || x.morphs >= 1) &&
    allocOk(x) && evalsOk(x));
  report('loss chart points', s.chartJob === JOB && s.points === STEPS,
         `${s.points} points plotted for job ${s.chartJob || '(none)'}, want ${STEPS}`);
  if (EVALS !== null) {
    report('validation loss points', evalsOk(s),
           `${s.evalPoints} validation-loss points, newest ${s.lastEval}, want ${EVALS}`);
  }
  report('stage map ranks', ranksOk(s),
         `source ${s.stageSource}, ranks [${[...s.ranks].sort((a, b) => a - b).join(',')}], want 0..${RANKS - 1}`);
  report('allocation chart', allocOk(s),
         `jobs [${s.allocJobs.join(',')}], ${s.allocPoints} time points, job ${JOB} slots ` +
         `${s.allocValues.join(' > ')}, want ${RANKS} and (with --morph) another width`);
  if (opts.morph) report('morph timeline', s.morphs >= 1, `${s.morphs} morph entries (generation ${s.generation})`);
  if (s.banner) console.log(`note: error banner at the end: ${s.banner}`);
  if (failedResources) console.log(`note: ${failedResources} API requests failed along the way (the page retried)`);

  const marker = await page.evaluate(() => window.__varunaMarker);
  report('no reload', marker === 1, marker === 1 ? 'window marker survived the whole run' : 'the page reloaded (marker gone)');
  report('no page errors', pageErrors.length === 0,
         pageErrors.length ? pageErrors.slice(0, 3).join(' | ') : 'no uncaught exceptions');
  console.log(`page shows job ${s.detailJob || '(none)'}: state ${s.state || '?'}, generation ${s.generation || '?'}`);
} catch (e) {
  failed = true;
  console.log(`FAIL browser: ${e && e.message ? e.message.split('\n')[0] : e}`);
} finally {
  if (page) {
    try {
      fs.mkdirSync(path.dirname(path.resolve(opts.screenshot)), { recursive: true });
      await page.screenshot({ path: opts.screenshot, fullPage: true, timeout: 30000 });
      console.log(`screenshot: ${opts.screenshot}`);
    } catch (e) {
      console.log(`screenshot failed: ${e && e.message ? e.message.split('\n')[0] : e}`);
    }
  }
  if (browser) await browser.close().catch(() => {});
}

const bad = results.filter((r) => !r.ok);
if (failed || bad.length) {
  console.log(`FAILED: ${bad.map((r) => r.name).join(', ') || 'browser error'}`);
  process.exit(1);
}
console.log(`OK: ${results.length} checks passed in ${elapsed()}`);
process.exit(0);
