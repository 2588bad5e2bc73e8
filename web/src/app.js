// The varuna-manager dashboard: polls /api/v1/ and updates the page in place (never reloads).
// API: nodes, jobs, jobs/{id}, jobs/{id}/metrics?after_step=K, jobs/{id}/stages,
// jobs/{id}/events, jobs/{id}/logs?tail=N. JSON is protobuf's mapping: enums by name, int64
// as strings, defaults printed.
//
// With a tokens file the API answers 401 without a bearer token: the page then shows
// #auth-form, keeps the token the user enters in sessionStorage (this tab only) and sends it
// as "Authorization: Bearer" from then on; a token refused later asks again.
//
// DOM hooks the browser test reads (tests/browser/dashboard.mjs):
//   #auth-form:not([hidden]) #auth-token    the token prompt
//   #jobs tr[data-job-id]                  one row per job
//   #job-detail[data-job-id][data-generation][data-state]
//   #chart-loss[data-points][data-job]     points actually plotted
//     data-eval-points, data-last-eval      validation-loss points plotted, the newest one
//   #stage-map[data-source="stages"] [data-rank]  one cell per rank
//   #morphs [data-morph]                   one entry per morph
//   #chart-alloc[data-jobs][data-points]   jobs and time points of the allocation chart;
//     data-slots="ID:SLOTS,..." each plotted job's newest value, data-values="ID:4>2>0;..."
//     each job's successive values
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import './style.css';

const API = 'api/v1';
const FAST_MS = 1000;     // nodes, jobs, the selected job, its metrics and stages
const SLOW_EVERY = 3;     // events and logs every 3rd tick
const FETCH_TIMEOUT_MS = 5000;
const LOG_TAIL = 20;
const MAX_EVENTS = 200;
const RESYNC_MS = 10 * 60 * 1000;  // metrics: a full fetch this often (see refreshSelected)
const PHASES = ['detect', 'save', 'stop', 'coalesce', 'plan', 'launch', 'rendezvous', 'regroup', 'agree', 'transfer', 'first_step'];
const RUNNING_STATES = new Set(['RUNNING', 'RECONFIGURING', 'STARTING']);
const TERMINAL_STATES = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED']);

// ---- small helpers ---------------------------------------------------------------------

const $ = (sel, root = document) => root.querySelector(sel);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'style' && typeof v === 'object') Object.assign(e.style, v);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const num = (v) => (v === undefined || v === null || v === '' ? NaN : Number(v));

function fmt(v, digits = 3) {
  const x = num(v);
  if (!Number.isFinite(x)) return '–';
  const a = Math.abs(x);
  if (a >= 1e9) return (x / 1e9).toFixed(2) + 'G';
  if (a >= 1e6) return (x / 1e6).toFixed(2) + 'M';
  if (a >= 1e4) return (x / 1e3).toFixed(1) + 'k';
  if (a >= 100) return x.toFixed(0);
  if (a === 0) return '0';
  if (a < 1e-3) return x.toExponential(2);
  return Number(x.toPrecision(digits)).toString();
}

const pct = (v) => (Number.isFinite(num(v)) ? (num(v) * 100).toFixed(1) + '%' : '–');

function bytes(v) {
  const x = num(v);
  if (!Number.isFinite(x)) return '–';
  if (x >= 1 << 30) return (x / (1 << 30)).toFixed(2) + ' GiB';
  if (x >= 1 << 20) return (x / (1 << 20)).toFixed(1) + ' MiB';
  if (x >= 1 << 10) return (x / (1 << 10)).toFixed(0) + ' KiB';
  return x.toFixed(0) + ' B';
}

function secs(v) {
  const x = num(v);
  if (!Number.isFinite(x)) return '–';
  if (x < 1) return (x * 1000).toFixed(0) + ' ms';
  if (x < 60) return x.toFixed(x < 10 ? 2 : 1) + ' s';
  return dur(x);
}

function dur(s) {
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
  if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
  return Math.floor(s / 86400) + 'd ' + Math.floor((s % 86400) / 3600) + 'h';
}

// "2024-05-01T12:00:00Z" (or any Date-parsable text) → "12:00:00 (3m ago)"; else as is.
function when(text) {
  if (!text) return '–';
  const t = Date.parse(text);
  if (!Number.isFinite(t)) return text;
  const d = new Date(t);
  const ago = (Date.now() - t) / 1000;
  const sameDay = new Date().toDateString() === d.toDateString();
  const clock = sameDay ? d.toLocaleTimeString([], { hour12: false })
                        : d.toLocaleString([], { hour12: false });
  return ago >= 0 ? `${clock} (${dur(ago)} ago)` : clock;
}

function stateBadge(state) {
  const s = state || 'UNKNOWN';
  return el('span', { class: `badge st-${s.toLowerCase()}` }, s);
}

// Pipeline depths from the Topology text "b0,..,bS:samples;..." (empty when uniform).
function depthsFromPipelines(text) {
  if (!text) return [];
  return text.split(';').map((p) => p.trim()).filter(Boolean)
    .map((p) => p.split(':')[0].split(',').length - 1);
}

function depthsText(depths) {
  const parts = [];
  for (let i = 0; i < depths.length;) {
    let j = i;
    while (j < depths.length && depths[j] === depths[i]) j++;
    parts.push(j - i > 1 ? `${depths[i]}*${j - i}` : `${depths[i]}`);
    i = j;
  }
  return parts.join('+');
}

// "2x2 mb2" for stages x replicas; "3+2 mb2 (het)" for heterogeneous pipelines.
function shapeText(s) {
  if (!s) return '–';
  const depths = s.depths && s.depths.length ? s.depths.map(Number) : [];
  const mb = num(s.micro_batch) > 0 ? ` mb${s.micro_batch}` : '';
  if (depths.length) return `${depthsText(depths)}${mb} (het)`;
  return `${s.stages ?? 0}x${s.replicas ?? 0}${mb}`;
}

function jobShape(j) {
  return shapeText({ stages: j.stages, replicas: j.replicas, micro_batch: j.micro_batch,
                     depths: depthsFromPipelines(j.pipelines) });
}

// ---- fetching --------------------------------------------------------------------------

class HttpError extends Error {}
class AuthError extends HttpError {}

const TOKEN_KEY = 'varuna-token';
const auth = {
  token: sessionStorage.getItem(TOKEN_KEY) || '',
  needed: false,  // the last request was refused with 401: wait for the form
};

function askForToken(message) {
  auth.needed = true;
  const form = $('#auth-form');
  form.hidden = false;
  $('#auth-error').textContent = message || '';
  $('#auth-token').focus();
}

$('#auth-form').addEventListener('submit', (e) => {
  e.preventDefault();
  auth.token = $('#auth-token').value.trim();
  $('#auth-token').value = '';
  if (auth.token) sessionStorage.setItem(TOKEN_KEY, auth.token);
  else sessionStorage.removeItem(TOKEN_KEY);
  auth.needed = false;
  $('#auth-form').hidden = true;
  state.errors.clear();
});

async function getJSON(path) {
  if (auth.needed) throw new AuthError('waiting for a token');
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
  const headers = { Accept: 'application/json' };
  if (auth.token) headers.Authorization = `Bearer ${auth.token}`;
  let resp;
  try {
    resp = await fetch(`${API}/${path}`, { cache: 'no-store', signal: ctl.signal, headers });
  } catch (e) {
    throw new HttpError(`GET /${API}/${path}: ${e.name === 'AbortError' ? 'timed out' : 'unreachable'}`);
  } finally {
    clearTimeout(timer);
  }
  let body = null;
  try { body = await resp.json(); } catch (e) { /* not JSON */ }
  if (resp.status === 401) {
    const msg = body && body.error ? body.error : 'a token is needed';
    if (!auth.needed) askForToken(auth.token ? `refused: ${msg}` : '');
    throw new AuthError(`GET /${API}/${path}: ${msg}`);
  }
  if (!resp.ok) {
    const msg = body && body.error ? body.error : resp.statusText;
    throw new HttpError(`GET /${API}/${path}: HTTP ${resp.status}${msg ? ' ' + msg : ''}`);
  }
  if (body === null) throw new HttpError(`GET /${API}/${path}: not JSON`);
  return body;
}

// Every page of the job list (the manager pages it; retention keeps it bounded).
async function getAllJobs() {
  let jobs = [];
  let token = '';
  for (let page = 0; page < 50; page++) {
    const r = await getJSON(`jobs${token ? `?page_token=${encodeURIComponent(token)}` : ''}`);
    jobs = jobs.concat(r.jobs || []);
    if (!r.next_page_token || r.next_page_token === token) break;
    token = r.next_page_token;
  }
  return jobs;
}

// ---- state -----------------------------------------------------------------------------

const state = {
  nodes: [],
  jobs: [],
  selected: null,        // job id shown
  pinned: false,         // chosen by click or #job=ID (else: follows the newest running job)
  job: null,             // per selected job: see newJobState
  tick: 0,
  errors: new Map(),     // endpoint → message, for the banner
};

function newJobState(id) {
  return {
    id,
    info: null,
    steps: new Map(),    // step → StepRecord (newest generation wins)
    cursor: 0,           // after_step for the next metrics poll
    resyncAt: Date.now() + RESYNC_MS,
    generation: null,
    dirty: true,
    stages: null,
    stagesError: null,
    events: new Map(),   // seq → Event
    lastSeq: 0,
    logs: null,
    logsError: null,
    openLogs: new Set(),
  };
}

function selectJob(id, pinned) {
  id = id ? String(id) : null;
  if (pinned) state.pinned = true;
  if (state.selected === id) return;
  state.selected = id;
  state.job = id ? newJobState(id) : null;
  clearCharts();
  renderJobs();
  renderJob();
  if (id) refreshSelected(true).catch(() => {});
}

function jobFromHash() {
  const m = /(?:^#|&)job=([^&]+)/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}

window.addEventListener('hashchange', () => {
  const id = jobFromHash();
  if (id) selectJob(id, true);
});

// ---- polling ---------------------------------------------------------------------------

function noteError(key, err) {
  if (err) state.errors.set(key, err.message || String(err));
  else state.errors.delete(key);
}

async function guarded(key, fn) {
  try {
    const r = await fn();
    noteError(key, null);
    return r;
  } catch (e) {
    noteError(key, e);
    return undefined;
  }
}

async function refreshSelected(slow) {
  const js = state.job;
  if (!js) return;
  const id = encodeURIComponent(js.id);
  const tasks = [
    guarded('job', async () => {
      const info = await getJSON(`jobs/${id}`);
      if (state.job !== js) return;
      const gen = num(info.generation);
      if (js.generation !== null && gen !== js.generation) {
        // A morph: the new generation may re-run steps; fetch again from where it resumed.
        const last = (info.morphs || [])[(info.morphs || []).length - 1];
        const from = last ? num(last.resumed_from) : NaN;
        js.cursor = Number.isFinite(from) && from >= 0 ? Math.min(js.cursor, from) : 0;
      }
      js.generation = gen;
      js.info = info;
    }),
    guarded('metrics', async () => {
      // Now and then everything again: the manager downsamples old steps (merged records),
      // so a tab left open for days does not keep every raw step.
      const full = Date.now() >= js.resyncAt;
      const r = await getJSON(`jobs/${id}/metrics?after_step=${full ? 0 : js.cursor}`);
      if (state.job !== js) return;
      if (full) {
        js.steps = new Map();
        js.cursor = 0;
        js.dirty = true;
        js.resyncAt = Date.now() + RESYNC_MS;
      }
      mergeSteps(js, r.steps || []);
    }),
    guarded('stages', async () => {
      try {
        const r = await getJSON(`jobs/${id}/stages`);
        if (state.job !== js) return;
        js.stages = r.stages || [];
        js.stagesError = null;
      } catch (e) {
        if (state.job === js) js.stagesError = e.message;
        throw e;
      }
    }),
  ];
  if (slow) {
    tasks.push(guarded('events', async () => {
      const r = await getJSON(`jobs/${id}/events?after_seq=${js.lastSeq}`);
      if (state.job !== js) return;
      for (const e of r.events || []) js.events.set(num(e.seq), e);
      const keys = [...js.events.keys()].sort((a, b) => a - b);
      while (keys.length > MAX_EVENTS) js.events.delete(keys.shift());
      // A full page (the manager returns at most 1000) may stop short of last_seq: continue
      // from the newest event actually received.
      const got = (r.events || []).map((e) => num(e.seq)).filter(Number.isFinite);
      const ls = got.length >= 1000 ? Math.max(...got) : num(r.last_seq);
      if (Number.isFinite(ls) && ls > js.lastSeq) js.lastSeq = ls;
    }));
    // Logs fail while workers restart: shown quietly in the logs panel, not in the banner.
    tasks.push((async () => {
      try {
        const r = await getJSON(`jobs/${id}/logs?tail=${LOG_TAIL}`);
        if (state.job !== js) return;
        js.logs = r.ranks || [];
        js.logsError = null;
      } catch (e) {
        if (state.job === js) js.logsError = e.message;
      }
    })());
  }
  await Promise.all(tasks);
  if (state.job === js) renderJob();
}

function mergeSteps(js, steps) {
  for (const s of steps) {
    const step = num(s.step);
    if (!Number.isFinite(step)) continue;
    const old = js.steps.get(step);
    if (!old || num(s.generation) >= num(old.generation)) {
      js.steps.set(step, s);
      js.dirty = true;
    }
    if (step > js.cursor) js.cursor = step;
  }
}

// Skips rebuilding a section whose input has not changed (keeps hover titles and scroll).
const lastKeys = new Map();
function unchanged(name, value) {
  const key = JSON.stringify(value);
  if (lastKeys.get(name) === key) return true;
  lastKeys.set(name, key);
  return false;
}

async function tick() {
  if (auth.needed) return;  // nothing to show until the token is entered
  const slow = state.tick % SLOW_EVERY === 0;
  state.tick++;
  await Promise.all([
    guarded('nodes', async () => { state.nodes = (await getJSON('nodes')).nodes || []; }),
    guarded('jobs', async () => { state.jobs = await getAllJobs(); }),
  ]);
  if (!state.selected || !state.pinned) {
    const hashId = jobFromHash();
    if (hashId) selectJob(hashId, true);
    else {
      const auto = defaultJob();
      if (auto && auto !== state.selected) selectJob(auto, false);
    }
  }
  renderSummary();
  renderNodes();
  renderJobs();
  renderAllocation();
  await refreshSelected(slow);
  renderBanner();
}

function defaultJob() {
  const jobs = state.jobs;
  if (!jobs.length) return null;
  if (state.selected && !state.pinned) {
    const cur = jobs.find((j) => j.id === state.selected);
    if (cur && RUNNING_STATES.has(cur.state)) return state.selected;
  }
  for (let i = jobs.length - 1; i >= 0; i--) if (RUNNING_STATES.has(jobs[i].state)) return jobs[i].id;
  return state.selected && jobs.some((j) => j.id === state.selected) ? state.selected
                                                                      : jobs[jobs.length - 1].id;
}

async function loop() {
  const t0 = performance.now();
  try {
    await tick();
  } catch (e) {
    noteError('render', e);
    renderBanner();
  }
  const wait = Math.max(200, FAST_MS - (performance.now() - t0));
  setTimeout(loop, wait);
}

// ---- rendering: header, banner, nodes, jobs --------------------------------------------

function renderBanner() {
  const b = $('#banner');
  const dot = $('#live-dot');
  if (state.errors.size) {
    b.hidden = false;
    b.textContent = '';
    b.append(el('b', null, 'API error, retrying: '), [...state.errors.values()].join(' · '));
    dot.className = 'dot err';
  } else {
    b.hidden = true;
    dot.className = 'dot ok';
  }
  $('#updated').textContent = 'updated ' + new Date().toLocaleTimeString([], { hour12: false });
  document.body.dataset.lastUpdate = String(Date.now());
}

function renderSummary() {
  const nodes = state.nodes;
  const alive = nodes.filter((n) => n.state === 'ALIVE' || n.state === 'DRAINING').length;
  let slots = 0, used = 0;
  for (const n of nodes) {
    if (n.state === 'DEAD') continue;
    slots += num(n.slots) || 0;
    used += num(n.used_slots) || 0;
  }
  const running = state.jobs.filter((j) => RUNNING_STATES.has(j.state)).length;
  $('#sum-nodes').textContent = `${alive} / ${nodes.length}`;
  $('#sum-slots').textContent = `${used} / ${slots}`;
  $('#sum-jobs').textContent = `${running}`;
}

function slotBar(used, total) {
  const f = total > 0 ? Math.min(1, used / total) : 0;
  return el('span', { class: 'slotbar', title: `${used} of ${total} slots used` },
    el('span', { class: 'fill', style: { width: `${(f * 100).toFixed(0)}%` } }),
    el('span', { class: 'txt' }, `${used}/${total}`));
}

function renderNodes() {
  const tbody = $('#nodes tbody');
  tbody.textContent = '';
  if (!state.nodes.length) {
    tbody.append(el('tr', null, el('td', { colspan: 7, class: 'muted' }, 'no nodes registered')));
    return;
  }
  for (const n of state.nodes) {
    const age = num(n.last_heartbeat_age_s);
    const labels = Object.entries(n.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ');
    tbody.append(el('tr', { 'data-node': n.name, class: `node-${(n.state || '').toLowerCase()}` },
      el('td', { title: labels || null }, n.name),
      el('td', { class: 'mono muted' }, n.address),
      el('td', null, stateBadge(n.state)),
      el('td', null, slotBar(num(n.used_slots) || 0, num(n.slots) || 0)),
      el('td', { class: `num ${age > 10 ? 'warn' : ''}` }, Number.isFinite(age) ? `${age.toFixed(1)} s` : '–'),
      el('td', { class: `num ${n.speed_note ? 'warn' : ''}`, 'data-speed': num(n.relative_speed) || null },
        num(n.relative_speed) > 0 ? `${num(n.relative_speed).toFixed(2)}x` : '–'),
      el('td', { class: 'reason' }, [n.reason, n.speed_note].filter(Boolean).join('; '))));
  }
}

function renderJobs() {
  const tbody = $('#jobs tbody');
  tbody.textContent = '';
  if (!state.jobs.length) {
    tbody.append(el('tr', null, el('td', { colspan: 8, class: 'muted' }, 'no jobs yet')));
    return;
  }
  // Newest first: that is what one looks for.
  for (const j of [...state.jobs].reverse()) {
    const step = num(j.step) || 0;
    const total = num(j.total_steps) || 0;
    const f = total > 0 ? Math.min(1, step / total) : 0;
    tbody.append(el('tr', {
      'data-job-id': j.id,
      class: j.id === state.selected ? 'selected' : null,
      title: j.reason || null,
      onclick: () => { location.hash = `job=${encodeURIComponent(j.id)}`; selectJob(j.id, true); },
    },
      el('td', { class: 'mono' }, j.id),
      el('td', null, j.name, j.profile_job ? el('span', { class: 'tag' }, 'profile') : null),
      el('td', null, stateBadge(j.state)),
      el('td', { class: 'num' },
        el('span', { class: 'progress' },
          el('span', { class: 'fill', style: { width: `${(f * 100).toFixed(1)}%` } }),
          el('span', { class: 'txt' }, `${step}/${total || '?'}`))),
      el('td', { class: 'num' }, fmt(j.loss, 4)),
      el('td', { class: 'num' }, fmt(j.samples_per_s)),
      el('td', { class: 'mono' }, jobShape(j)),
      el('td', { class: 'muted' }, j.submitted_by || '')));
  }
}

// ---- rendering: the selected job --------------------------------------------------------

function kpi(label, value, title) {
  return el('div', { class: 'kpi', title: title || null },
    el('div', { class: 'kv-label' }, label), el('div', { class: 'kv-value' }, value));
}

function renderJob() {
  const js = state.job;
  const detail = $('#job-detail');
  if (!js) {
    detail.dataset.jobId = '';
    $('#job-title').textContent = 'No job selected';
    $('#job-meta').textContent = '';
    $('#kpis').textContent = '';
    return;
  }
  const j = js.info;
  detail.dataset.jobId = js.id;
  detail.dataset.generation = j ? String(j.generation ?? '') : '';
  detail.dataset.state = j ? j.state || '' : '';
  const title = $('#job-title');
  title.textContent = '';
  title.append(`Job ${js.id}`, j ? ` · ${j.name}` : '', ' ', j ? stateBadge(j.state) : '');
  if (j && j.state === 'RECONFIGURING') title.append(el('span', { class: 'badge pulse' }, 'morphing'));

  const meta = $('#job-meta');
  meta.textContent = '';
  if (j) {
    const items = [
      ['gen', j.generation],
      ['shape', jobShape(j)],
      ['schedule', j.schedule || '–'],
      ['plan', j.plan_source || '–'],
      ['predicted', num(j.predicted_step_s) > 0 ? secs(j.predicted_step_s) + '/step' : '–'],
      ['slots', j.slots],
      ['master', j.master || '–'],
      ['submitted', when(j.submitted_at) + (j.submitted_by ? ` by ${j.submitted_by}` : '')],
      ['started', when(j.started_at)],
    ];
    if (j.finished_at) items.push(['finished', when(j.finished_at)]);
    if (j.cancelled_by) items.push(['cancelled by', j.cancelled_by]);
    for (const [k, v] of items) meta.append(el('span', { class: 'm' }, el('span', { class: 'k' }, k), ' ', String(v)));
    if (j.reason) meta.append(el('div', { class: 'reason-line' }, j.reason));
  }
  renderKpis(js);
  renderCharts(js);
  renderStages(js);
  renderMorphs(js);
  renderEvents(js);
  renderLogs(js);
}

function latestStep(js) {
  let best = null;
  for (const [k, v] of js.steps) if (!best || k > num(best.step)) best = v;
  return best;
}

function renderKpis(js) {
  const j = js.info || {};
  const s = latestStep(js) || {};
  const box = $('#kpis');
  box.textContent = '';
  const step = num(j.step) || 0, total = num(j.total_steps) || 0;
  const morphs = j.morphs || [];
  const lost = morphs.reduce((a, m) => a + Math.max(0, num(m.steps_lost) || 0), 0);
  const eta = total > step && num(j.step_time_s) > 0 ? dur((total - step) * num(j.step_time_s)) : '–';
  box.append(
    kpi('step', `${step} / ${total || '?'}`, total ? `${(100 * step / total).toFixed(1)}% done` : null),
    kpi('loss', fmt(s.loss ?? j.loss, 4)),
    kpi('samples/s', fmt(s.samples_per_s ?? j.samples_per_s)),
    kpi('tokens/s', fmt(s.tokens_per_s)),
    kpi('step time', secs(s.step_time_s ?? j.step_time_s)),
    kpi('bubble', pct(s.bubble_ratio), 'measured pipeline bubble of pipeline 0, newest step'),
    kpi('MFU', pct(s.mfu), 'model FLOP/s utilisation, newest step'),
    kpi('grad norm', fmt(s.grad_norm)),
    kpi('lr', fmt(s.lr)),
    kpi('ETA', eta),
    kpi('morphs', `${morphs.length}`, `${lost} steps lost in total`),
    kpi('steps lost', `${lost}`));
}

// ---- charts ----------------------------------------------------------------------------

const charts = {};   // name → {u, el}
const AXIS = { stroke: '#8b949e', grid: { stroke: '#222a33', width: 1 }, ticks: { stroke: '#30363d', width: 1 },
               font: '11px system-ui, sans-serif' };

// Vertical dashed lines where a morph's generation resumed.
function morphMarkers() {
  return {
    hooks: {
      draw: [(u) => {
        const js = state.job;
        if (!js || !js.info) return;
        const ctx = u.ctx;
        ctx.save();
        ctx.strokeStyle = 'rgba(255, 166, 87, 0.8)';
        ctx.setLineDash([4, 4]);
        ctx.lineWidth = 1;
        for (const m of js.info.morphs || []) {
          const x = num(m.resumed_from);
          if (!Number.isFinite(x) || x < 0) continue;
          const px = Math.round(u.valToPos(x, 'x', true));
          if (px < u.bbox.left || px > u.bbox.left + u.bbox.width) continue;
          ctx.beginPath();
          ctx.moveTo(px, u.bbox.top);
          ctx.lineTo(px, u.bbox.top + u.bbox.height);
          ctx.stroke();
        }
        ctx.restore();
      }],
    },
  };
}

function legendValue(f) {
  return (u, v, si, idx) => {
    if (idx === null || idx === undefined) {
      const d = u.data[si] || [];
      for (let i = d.length - 1; i >= 0; i--) if (d[i] !== null && d[i] !== undefined) { v = d[i]; break; }
    }
    return v === null || v === undefined ? '–' : f(v);
  };
}

function makeChart(name, series, axes, scales) {
  const box = $(`#chart-${name}`);
  const width = Math.max(200, box.clientWidth || 380);
  const opts = {
    width, height: 170,
    scales: Object.assign({ x: { time: false } }, scales || {}),
    // Without a cursor the legend shows the newest value.
    series: [{ label: 'step', value: legendValue((v) => String(v)) },
             ...series.map((s) => ({ ...s, value: legendValue(s.fmt) }))],
    axes: [{ ...AXIS, label: null }, ...axes],
    legend: { live: true },
    cursor: { drag: { x: true, y: false }, points: { size: 5 } },
    plugins: [morphMarkers()],
  };
  const data = [[], ...series.map(() => [])];
  const u = new uPlot(opts, data, box);
  charts[name] = { u, box };
  return charts[name];
}

function ensureCharts() {
  if (charts.loss) return;
  makeChart('loss',
    [{ label: 'loss', stroke: '#58a6ff', width: 1.5, fmt: (v) => fmt(v, 4) },
     // Validation steps are sparse: joined across the steps between them, each one marked.
     { label: 'eval loss', stroke: '#ffa657', width: 1.5, spanGaps: true,
       points: { show: true, size: 5, fill: '#ffa657' }, fmt: (v) => fmt(v, 4) }],
    [{ ...AXIS, size: 50 }]);
  makeChart('tput',
    [{ label: 'samples/s', stroke: '#3fb950', width: 1.5, scale: 'y', fmt: (v) => fmt(v) },
     { label: 'tokens/s', stroke: '#d2a8ff', width: 1, scale: 'tok', fmt: (v) => fmt(v) }],
    [{ ...AXIS, scale: 'y', size: 50, values: (u, vs) => vs.map((v) => fmt(v)) },
     { ...AXIS, scale: 'tok', side: 1, size: 50, grid: { show: false }, values: (u, vs) => vs.map((v) => fmt(v)) }]);
  makeChart('eff',
    [{ label: 'bubble %', stroke: '#ffa657', width: 1.5, fmt: (v) => v.toFixed(1) },
     { label: 'MFU %', stroke: '#f778ba', width: 1.5, fmt: (v) => v.toFixed(1) }],
    [{ ...AXIS, size: 40 }],
    { y: { range: (u, min, max) => [0, Math.max(10, Math.ceil((max || 0) / 10) * 10)] } });
  const ro = new ResizeObserver(() => {
    for (const c of Object.values(charts)) {
      const w = Math.max(200, c.box.clientWidth);
      if (Math.abs(w - c.u.width) > 2) c.u.setSize({ width: w, height: 170 });
    }
  });
  for (const c of Object.values(charts)) ro.observe(c.box);
}

function clearCharts() {
  if (!charts.loss) return;
  charts.loss.u.setData([[], [], []]);
  charts.tput.u.setData([[], [], []]);
  charts.eff.u.setData([[], [], []]);
  for (const c of Object.values(charts)) c.box.dataset.points = '0';
  charts.loss.box.dataset.job = '';
}

function renderCharts(js) {
  ensureCharts();
  if (!js.dirty) {
    for (const c of Object.values(charts)) c.u.redraw(false, false);  // morph markers
    return;
  }
  js.dirty = false;
  const keys = [...js.steps.keys()].sort((a, b) => a - b);
  const x = new Array(keys.length);
  const loss = [], evals = [], sps = [], tps = [], bub = [], mfu = [];
  keys.forEach((k, i) => {
    const s = js.steps.get(k);
    x[i] = k;
    const l = num(s.loss);
    loss.push(Number.isFinite(l) ? l : null);
    const e = s.eval_loss === undefined ? NaN : num(s.eval_loss);
    evals.push(Number.isFinite(e) ? e : null);
    sps.push(Number.isFinite(num(s.samples_per_s)) ? num(s.samples_per_s) : null);
    tps.push(num(s.tokens_per_s) > 0 ? num(s.tokens_per_s) : null);
    bub.push(Number.isFinite(num(s.bubble_ratio)) ? num(s.bubble_ratio) * 100 : null);
    mfu.push(num(s.mfu) > 0 ? num(s.mfu) * 100 : null);
  });
  charts.loss.u.setData([x, loss, evals]);
  charts.tput.u.setData([x, sps, tps]);
  charts.eff.u.setData([x, bub, mfu]);
  // What was actually plotted (the browser test reads it).
  for (const c of Object.values(charts)) c.box.dataset.points = String(c.u.data[0].length);
  charts.loss.box.dataset.job = js.id;
  charts.loss.box.dataset.lastStep = keys.length ? String(keys[keys.length - 1]) : '';
  const plotted = evals.filter((v) => v !== null);
  charts.loss.box.dataset.evalPoints = String(plotted.length);
  charts.loss.box.dataset.lastEval = plotted.length ? String(plotted[plotted.length - 1]) : '';
}

// ---- allocation over time ---------------------------------------------------------------
// Every job's slots over time, one stepped line per job (the newest MAX_ALLOC_JOBS that held
// slots), rebuilt from the job list at each poll, so it has the history from before the page
// opened: the morph records give the changes (each morph's from and to at its time, an
// eviction's to being empty), started_at and finished_at the ends, and the job's slots now the
// newest point. A start after an eviction has a time only when it is the newest start
// (started_at); an older one shows at the next morph. /metrics has the same as
// varuna_job_allocated_slots for a long view.

const MAX_ALLOC_JOBS = 12;
const ALLOC_COLORS = ['#58a6ff', '#3fb950', '#d2a8ff', '#ffa657', '#f778ba', '#79c0ff', '#56d364',
                      '#e3b341', '#ff7b72', '#a5d6ff', '#7ee787', '#bc8cff'];
let allocChart = null;  // {u, box, key}

function shapeSlots(sh) {
  if (!sh) return 0;
  const tp = Math.max(1, num(sh.tp_size) || 1);
  const depths = (sh.depths || []).map(Number);
  if (depths.length) return depths.reduce((a, b) => a + b, 0) * tp;
  return (num(sh.stages) || 0) * (num(sh.replicas) || 0) * tp;
}

const unixS = (text) => { const v = Date.parse(text || ''); return Number.isFinite(v) ? v / 1000 : NaN; };

// [[t, slots], ...] in time order for job j (empty: it never held slots).
function allocSteps(j, nowS) {
  const pts = [];
  const started = unixS(j.started_at);
  const holding = RUNNING_STATES.has(j.state);
  const morphs = (j.morphs || []).filter((m) => Number.isFinite(unixS(m.at)));
  if (!morphs.length) {
    if (!Number.isFinite(started)) return pts;
    pts.push([started, num(j.slots) || 0]);
  } else {
    const first = unixS(morphs[0].at);
    pts.push([Number.isFinite(started) && started < first ? started : first, shapeSlots(morphs[0].from)]);
    morphs.forEach((m, i) => {
      const at = unixS(m.at);
      pts.push([at, shapeSlots(m.to)]);
      const next = morphs[i + 1];
      if (next && shapeSlots(next.from) !== shapeSlots(m.to)) {  // it started again in between
        const nextAt = unixS(next.at);
        pts.push([started > at && started < nextAt ? started : nextAt, shapeSlots(next.from)]);
      }
    });
    const last = morphs[morphs.length - 1];
    if (shapeSlots(last.to) === 0 && started > unixS(last.at)) pts.push([started, num(j.slots) || 0]);
  }
  const finished = unixS(j.finished_at);
  if (TERMINAL_STATES.has(j.state) && Number.isFinite(finished)) pts.push([finished, 0]);
  else pts.push([nowS, holding ? num(j.slots) || 0 : 0]);
  pts.sort((a, b) => a[0] - b[0]);
  return pts;
}

function renderAllocation() {
  const nowS = Date.now() / 1000;
  const box = $('#chart-alloc');
  const lines = [];
  for (const j of [...state.jobs].reverse()) {
    if (lines.length >= MAX_ALLOC_JOBS) break;
    const pts = allocSteps(j, nowS);
    if (pts.some((p) => p[1] > 0)) lines.push({ id: j.id, name: j.name, pts });
  }
  lines.reverse();  // oldest first: colours stay put as jobs come
  const key = lines.map((l) => l.id).join(',');
  if (!allocChart || allocChart.key !== key) {
    if (allocChart) allocChart.u.destroy();
    box.textContent = '';
    const stepped = uPlot.paths.stepped({ align: 1 });
    const opts = {
      width: Math.max(300, box.clientWidth || 600), height: 150,
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max || 0)] } },
      series: [{ label: 'time' }, ...lines.map((l, i) => ({
        label: `${l.id} ${l.name || ''}`.trim(), stroke: ALLOC_COLORS[i % ALLOC_COLORS.length],
        width: 1.5, paths: stepped, spanGaps: false, value: legendValue((v) => `${v} slots`),
      }))],
      axes: [{ ...AXIS }, { ...AXIS, size: 40, label: 'slots', labelSize: 14 }],
      legend: { live: true },
      cursor: { points: { size: 5 } },
    };
    allocChart = { u: new uPlot(opts, [[], ...lines.map(() => [])], box), box, key };
    new ResizeObserver(() => {
      const w = Math.max(300, box.clientWidth);
      if (Math.abs(w - allocChart.u.width) > 2) allocChart.u.setSize({ width: w, height: 150 });
    }).observe(box);
  }
  // Aligned data: every line's value at every time point (its newest step at or before it).
  const xs = [...new Set(lines.flatMap((l) => l.pts.map((p) => p[0])))].sort((a, b) => a - b);
  const ys = lines.map((l) => {
    let k = -1;
    return xs.map((x) => {
      while (k + 1 < l.pts.length && l.pts[k + 1][0] <= x) k++;
      return k < 0 || x > l.pts[l.pts.length - 1][0] ? null : l.pts[k][1];
    });
  });
  allocChart.u.setData([xs, ...ys]);
  box.dataset.jobs = key;
  box.dataset.points = String(xs.length);
  box.dataset.slots = lines.map((l) => `${l.id}:${l.pts[l.pts.length - 1][1]}`).join(',');
  box.dataset.values = lines.map((l) => `${l.id}:${l.pts.map((p) => p[1])
    .filter((v, i, a) => i === 0 || v !== a[i - 1]).join('>')}`).join(';');
}

// ---- stage map -------------------------------------------------------------------------

function layersText(layers) {
  if (!layers || !layers.length) return '–';
  if (layers.length <= 3) return layers.join(', ');
  return `${layers[0]} … ${layers[layers.length - 1]} (${layers.length})`;
}

function renderStages(js) {
  if (unchanged('stages', [js.id, js.stages, js.stagesError, js.info && js.info.state])) return;
  const map = $('#stage-map');
  const note = $('#stage-note');
  map.textContent = '';
  const stages = js.stages;
  if (!stages || !stages.length) {
    map.dataset.source = 'none';
    map.dataset.ranks = '0';
    note.textContent = js.stagesError ? `(${js.stagesError})` : '';
    map.append(el('div', { class: 'muted empty' },
      js.info && TERMINAL_STATES.has(js.info.state) ? 'job finished: no ranks running' : 'no ranks placed yet'));
    return;
  }
  map.dataset.source = 'stages';
  map.dataset.ranks = String(stages.length);
  const pipes = new Map();
  for (const s of stages) {
    const p = num(s.pipeline) || 0;
    if (!pipes.has(p)) pipes.set(p, []);
    pipes.get(p).push(s);
  }
  const depths = [...pipes.values()].map((l) => l.length);
  const uniform = depths.every((d) => d === depths[0]);
  note.textContent = (uniform ? `${pipes.size} pipeline${pipes.size > 1 ? 's' : ''} of ${depths[0]} stage${depths[0] === 1 ? '' : 's'}`
                              : `${pipes.size} pipelines of ${depthsText(depths)} stages (het)`) +
    (js.stagesError ? ` (stale: ${js.stagesError})` : '');
  for (const [p, list] of [...pipes.entries()].sort((a, b) => a[0] - b[0])) {
    list.sort((a, b) => (num(a.stage) || 0) - (num(b.stage) || 0));
    const costs = list.map((s) => Math.max(0, num(s.cost) || 0));
    const maxCost = Math.max(...costs, 1e-9);
    const even = 1 / list.length;
    const nodes = [...new Set(list.map((s) => s.node))];
    const row = el('div', { class: 'pipe', 'data-pipeline': p },
      el('div', { class: 'pipe-label' }, el('b', null, `P${p}`), el('span', { class: 'muted' }, `${list.length} stage${list.length === 1 ? '' : 's'}`),
        el('span', { class: 'muted small' }, nodes.join(', '))));
    const cells = el('div', { class: 'pipe-cells' });
    list.forEach((s, i) => {
      const cost = costs[i];
      const heavy = list.length > 1 && cost >= maxCost - 1e-9 && cost > even * 1.1;
      const busy = num(s.busy_s) || 0, wait = num(s.wait_s) || 0;
      const bw = busy + wait;
      // The straggler detector's view of the rank's node (docs/morphing.md "Stragglers").
      const speed = num(s.node_speed) || 0;
      const slow = !!s.slow;
      const intensity = 0.15 + 0.6 * (cost / maxCost);
      cells.append(el('div', {
        class: `stage${heavy ? ' heavy' : ''}${slow ? ' slow' : ''}`,
        'data-rank': num(s.rank),
        'data-slow': slow ? 'true' : null,
        'data-stage': num(s.stage),
        'data-node': s.node,
        'data-cost': cost.toFixed(3),
        title: `rank ${s.rank} on ${s.node}\nstage ${s.stage} of pipeline ${p}\ncost ${(cost * 100).toFixed(1)}% of the pipeline\nlayers: ${(s.layers || []).join(', ')}` +
          (speed > 0 ? `\nnode speed ${speed.toFixed(2)}x its peers${slow ? ' (straggler)' : ''}` : ''),
        style: { flexGrow: String(Math.max(0.05, cost)), background: `rgba(88, 166, 255, ${intensity.toFixed(3)})` },
      },
        el('div', { class: 'stage-top' }, el('b', null, `r${s.rank}`), el('span', { class: 'node' }, s.node),
          el('span', { class: 'sidx' }, `S${s.stage}`)),
        el('div', { class: 'layers mono' }, layersText(s.layers)),
        el('div', { class: 'cost' }, `cost ${(cost * 100).toFixed(0)}%`, heavy ? el('span', { class: 'heavy-tag' }, '▲ heaviest') : null,
          slow ? el('span', { class: 'slow-tag' }, `slow node ${speed.toFixed(2)}x`) : null),
        el('div', { class: 'bw', title: `busy ${busy.toFixed(3)} s, wait ${wait.toFixed(3)} s (newest step)` },
          bw > 0 ? [el('span', { class: 'busy', style: { width: `${(100 * busy / bw).toFixed(1)}%` } }),
                    el('span', { class: 'wait', style: { width: `${(100 * wait / bw).toFixed(1)}%` } })] : null),
        el('div', { class: 'bw-txt small' }, bw > 0 ? `busy ${secs(busy)} · wait ${secs(wait)}` : 'busy/wait –')));
    });
    row.append(cells);
    map.append(row);
  }
}

// ---- morph timeline --------------------------------------------------------------------

function renderMorphs(js) {
  const box = $('#morphs');
  const morphs = (js.info && js.info.morphs) || [];
  if (unchanged('morphs', [js.id, morphs, Math.floor(Date.now() / 10000)])) return;
  box.textContent = '';
  box.dataset.count = String(morphs.length);
  $('#morph-count').textContent = morphs.length ? `${morphs.length}` : '';
  if (!morphs.length) {
    box.append(el('div', { class: 'muted empty' }, 'no morphs: the job has kept its shape'));
    return;
  }
  const totals = morphs.map((m) => {
    const ph = m.phases || {};
    const t = num(ph.total);
    return Number.isFinite(t) && t > 0 ? t : Object.entries(ph).filter(([k]) => k !== 'total')
      .reduce((a, [, v]) => a + (num(v) || 0), 0);
  });
  const maxTotal = Math.max(...totals, 1e-9);
  // Newest first.
  for (let i = morphs.length - 1; i >= 0; i--) {
    const m = morphs[i];
    const ph = m.phases || {};
    const keys = [...PHASES.filter((k) => k in ph), ...Object.keys(ph).filter((k) => k !== 'total' && !PHASES.includes(k))];
    const sum = keys.reduce((a, k) => a + Math.max(0, num(ph[k]) || 0), 0);
    const bar = el('div', { class: 'phasebar', style: { width: `${Math.max(8, 100 * totals[i] / maxTotal).toFixed(1)}%` } });
    for (const k of keys) {
      const v = Math.max(0, num(ph[k]) || 0);
      if (sum <= 0 || v <= 0) continue;
      const w = 100 * v / sum;
      bar.append(el('span', { class: `ph ph-${k}`, style: { width: `${w.toFixed(2)}%` }, title: `${k}: ${secs(v)}` },
        w > 9 ? `${k} ${v.toFixed(v < 10 ? 1 : 0)}s` : ''));
    }
    const lost = num(m.steps_lost);
    box.append(el('div', { class: 'morph', 'data-morph': i, 'data-generation': m.generation },
      el('div', { class: 'morph-head' },
        el('span', { class: 'gen' }, `gen ${m.generation}`),
        el('span', { class: 'mono shape' }, `${shapeText(m.from)} → ${shapeText(m.to)}`),
        el('span', { class: m.graceful ? 'tag ok' : 'tag bad' }, m.graceful ? 'graceful' : 'abrupt'),
        el('span', { class: m.in_place ? 'tag ok' : 'tag', title: m.path || '' }, m.in_place ? 'in place' : 'relaunch'),
        el('span', { class: lost > 0 ? 'lost bad' : 'lost' }, lost < 0 ? 'steps lost: counted by next' : `${lost} step${lost === 1 ? '' : 's'} lost`),
        el('span', { class: 'muted at' }, when(m.at))),
      el('div', { class: 'morph-reason' }, m.reason || '', num(m.resumed_from) >= 0 ? el('span', { class: 'muted' }, ` · resumed from step ${m.resumed_from}`) : null),
      m.note ? el('div', { class: 'morph-note' }, m.note) : null,
      m.in_place ? el('div', { class: 'muted morph-moved' }, `${bytes(num(m.moved_bytes) || 0)} moved between ranks · ${bytes(num(m.checkpoint_bytes_read) || 0)} read from the checkpoint`) : null,
      el('div', { class: 'phase-row' }, bar, el('span', { class: 'total' }, secs(totals[i])))));
  }
  const legend = el('div', { class: 'phase-legend' });
  for (const k of PHASES) legend.append(el('span', null, el('i', { class: `ph-${k}` }), k.replace('_', ' ')));
  box.append(legend);
}

// ---- events and logs -------------------------------------------------------------------

function renderEvents(js) {
  if (unchanged('events', [js.id, js.lastSeq, js.events.size])) return;
  const box = $('#events');
  box.textContent = '';
  const list = [...js.events.values()].sort((a, b) => num(b.seq) - num(a.seq));
  if (!list.length) {
    box.append(el('div', { class: 'muted empty' }, 'no events'));
    return;
  }
  for (const e of list.slice(0, 100)) {
    box.append(el('div', { class: `ev ev-${(e.kind || '').replace(/[^a-z_]/gi, '')}`, 'data-seq': e.seq },
      el('span', { class: 'muted at' }, when(e.at).replace(/ \(.*\)$/, '')),
      el('span', { class: 'kind' }, e.kind),
      e.node ? el('span', { class: 'node' }, e.node) : null,
      el('span', { class: 'msg' }, e.message)));
  }
}

function renderLogs(js) {
  const box = $('#logs');
  $('#logs-error').textContent = js.logsError ? js.logsError : '';
  if (js.logs === null) {
    if (!box.childElementCount) box.append(el('div', { class: 'muted empty' }, 'loading…'));
    return;
  }
  if (unchanged('logs', [js.id, js.logs])) return;
  box.textContent = '';
  if (!js.logs.length) {
    box.append(el('div', { class: 'muted empty' }, 'no log output'));
    return;
  }
  for (const r of [...js.logs].sort((a, b) => num(a.rank) - num(b.rank))) {
    const lines = r.lines || [];
    const rank = num(r.rank);
    const d = el('details', { 'data-log-rank': rank, open: js.openLogs.has(rank) },
      el('summary', null, el('b', null, `rank ${rank}`), el('span', { class: 'muted' }, ` ${r.node || ''} `),
        el('span', { class: 'last mono' }, lines.length ? lines[lines.length - 1] : '(no output)')),
      el('pre', null, lines.join('\n')));
    d.addEventListener('toggle', () => { if (d.open) js.openLogs.add(rank); else js.openLogs.delete(rank); });
    box.append(d);
  }
}

// ---- start -----------------------------------------------------------------------------

const initial = jobFromHash();
if (initial) selectJob(initial, true);
loop();
