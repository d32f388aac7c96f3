// SPDX-License-Identifier: Apache-2.0
// The gpufleet dashboard (docs/dashboard.md). A page of hash routes (#/, #/nodes/NAME,
// #/jobs/NAME, ...) that reads everything through the REST API with the token the user logs in
// with, kept in sessionStorage and sent as `Authorization: Bearer`. Every text from the API is
// put in the page as text (textContent, never innerHTML), so a job named `<img onerror=...>`
// shows as those characters. The current page polls every few seconds while the tab is
// visible, more slowly while the server fails to answer, and not at all while the tab is hidden.
'use strict';

(function () {
  const TOKEN_KEY = 'gpufleet.token';
  const POLL_MS = 3000;
  const POLL_MAX_MS = 30000;  // the slowest polling, after the server failed to answer 4 times
  const STATES = ['Pending', 'Scheduled', 'Running', 'Stopping', 'Succeeded', 'Failed',
    'Cancelled', 'Preempted', 'Suspended'];

  let me = null;          // {role, team, name} of the token
  let current = null;     // the page shown: {refresh(), destroy()}
  let timer = null;
  let resume = null;      // refreshes the page shown now and polls again (a tab shown again)
  let generation = 0;     // bumped on each navigation: late answers of an old page are dropped
  let loginMessage = '';

  // ---- DOM ---------------------------------------------------------------------------------
  // h('a', {href: '#/'}, 'text', child, [more]): attributes are set as properties or
  // attributes, children as text nodes or elements; null and undefined are skipped.
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
      else if (key === 'class') el.className = value;
      else if (key === 'style') el.style.cssText = value;
      else el.setAttribute(key, value === true ? '' : String(value));
    }
    append(el, children);
    return el;
  }
  function append(el, ...children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }
  function replace(el, ...children) {
    el.replaceChildren();
    return append(el, children);
  }
  const main = () => document.getElementById('main');
  const badge = (text) => h('span', {class: 'badge s-' + String(text).replace(/[^A-Za-z]/g, '')}, text);
  const na = (what) => h('p', {class: 'na'}, what + ': not available on this server');
  // Path segments of a link, each encoded, so a name cannot add segments or a query.
  const jobHref = (job) => '#/jobs/' + (job.team ? encodeURIComponent(job.team) + '/' : '') +
    encodeURIComponent(job.name);
  const nodeHref = (name) => '#/nodes/' + encodeURIComponent(name);
  const fmtGpus = (milli) => (milli / 1000).toFixed(milli % 1000 === 0 ? 0 : 2);
  // "45s", "2m", "3h 5m", "2d 4h": how long before now a Unix-nanosecond time was.
  const fmtAgo = (ns) => {
    const s = Math.max(0, Math.floor(Date.now() / 1000 - ns / 1e9));
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm';
    if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
    return Math.floor(s / 86400) + 'd ' + Math.floor((s % 86400) / 3600) + 'h';
  };
  const pct = (x) => (Number.isFinite(x) ? Math.round(x) + '%' : '–');
  // A span as the CLI's FormatAge writes it, two units at most where it matters: "45s",
  // "2m30s", "17m", "3h12m", "2d5h".
  function fmtAge(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    const two = (big, bigUnit, small, smallUnit) => big + bigUnit + (small ? small + smallUnit : '');
    if (s < 120) return s + 's';
    const m = Math.floor(s / 60), hr = Math.floor(m / 60), d = Math.floor(hr / 24);
    if (m < 10) return two(m, 'm', s % 60, 's');
    if (m < 180) return m + 'm';
    if (hr < 8) return two(hr, 'h', m % 60, 'm');
    if (hr < 48) return hr + 'h';
    return two(d, 'd', hr % 24, 'h');
  }

  function table(headers, rows, empty) {
    if (rows.length === 0) return h('p', {class: 'muted'}, empty || 'none');
    return h('table', {},
      h('thead', {}, h('tr', {}, headers.map((x) => {
        const [label, num] = Array.isArray(x) ? x : [x, false];
        return h('th', {class: num ? 'num' : null}, label);
      }))),
      h('tbody', {}, rows.map((cells) => h('tr', {}, cells.map((c) => {
        if (c && typeof c === 'object' && !(c instanceof Node) && 'num' in c) {
          return h('td', {class: 'num'}, c.num);
        }
        return h('td', {}, c);
      })))));
  }
  const num = (x) => ({num: x});

  // ---- API ---------------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }
  function token() { return sessionStorage.getItem(TOKEN_KEY); }

  async function api(path, options) {
    const headers = {Authorization: 'Bearer ' + token()};
    if (options && options.body) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, Object.assign({headers, cache: 'no-store'}, options || {}));
    let body = null;
    try { body = await res.json(); } catch (e) { body = null; }
    if (res.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      loginMessage = 'Your token was refused (expired or revoked). Log in again.';
      location.hash = '#/login';
      throw new ApiError(401, 'unauthenticated');
    }
    if (!res.ok) {
      throw new ApiError(res.status, (body && body.error && body.error.message) || res.statusText);
    }
    return body;
  }
  // The answer, or null when the route is absent (404) or forbidden (403): optional panels.
  async function optional(path) {
    try { return await api(path); } catch (e) {
      if (e.status === 404 || e.status === 403) return {missing: e.status};
      throw e;
    }
  }

  // ---- charts (uPlot) ----------------------------------------------------------------------
  function lineChart(el, title, series) {
    const width = Math.max(320, el.clientWidth || 600);
    const opts = {
      title, width, height: 220,
      scales: {x: {time: true}},
      axes: [{}, {size: 50}],
      series: [{}].concat(series.map((s) => ({label: s.label, stroke: s.color, width: 2,
        fill: s.fill || undefined, value: (u, v) => (v == null ? '–' : v.toFixed(s.digits || 0))}))),
    };
    const chart = new uPlot(opts, [[], ...series.map(() => [])], el);
    return chart;
  }

  // ---- topology ----------------------------------------------------------------------------
  // The levels of the nodes' topology, widest first: the level with fewer distinct values is
  // the higher one (2 blocks hold 8 leaves).
  function topologyLevels(nodes) {
    const values = {};
    for (const n of nodes) {
      for (const [level, value] of Object.entries(n.topology || {})) {
        (values[level] = values[level] || new Set()).add(value);
      }
    }
    return Object.keys(values).sort((a, b) => values[a].size - values[b].size || a.localeCompare(b));
  }
  function nodePath(node, levels) {
    return levels.map((l) => (node.topology || {})[l]).filter((x) => x);
  }

  function gpuCell(node, gpu, util) {
    const quarantined = gpu.health === 'Quarantined';
    const alloc = Math.min(1000, gpu.allocated_milli || 0);
    const title = [`${node.name} GPU ${gpu.index} (${gpu.model})`,
      `allocated ${fmtGpus(alloc)} GPU`,
      `utilization ${util === undefined ? 'not reported' : util + '%'}`,
      `temperature headroom ${gpu.thermal_headroom_c === undefined ? '–' : gpu.thermal_headroom_c + ' °C'}`,
      `health ${gpu.health}${gpu.quarantine_reason ? ': ' + gpu.quarantine_reason : ''}`].join('\n');
    return h('div', {class: 'gpu' + (quarantined ? ' q' : '') +
        (gpu.health && gpu.health !== 'Healthy' && !quarantined ? ' bad' : ''),
      title, 'data-gpu': gpu.index},
      h('div', {class: 'fill', style: `height:${alloc / 10}%`}),
      h('div', {class: 'util', style: `height:${Math.min(100, util || 0)}%`}));
  }

  function utilMap(items) {
    const m = {};
    for (const it of items || []) m[it.node + '/' + it.gpu] = it.utilization_pct;
    return m;
  }

  // ---- pages -------------------------------------------------------------------------------
  function page(mount, refresh) {
    return {mount, refresh};
  }

  // ---- the fleet at a glance ---------------------------------------------------------------
  // Idle: nothing allocated on it, Healthy, on a Ready node. A MIG-enabled GPU is no whole GPU,
  // so it counts as idle but in no block.
  const isIdle = (node, gpu) => node.state === 'Ready' && !(gpu.allocated_milli > 0) &&
    (gpu.health || 'Healthy') === 'Healthy';
  // The most whole GPUs one task of a pending job asks for (0: none pends).
  function largestPendingTask(jobs) {
    let most = 0;
    for (const j of jobs) {
      for (const t of ((j.spec && j.spec.spec) || {}).tasks || []) {
        const g = (t.resources && t.resources.gpus) || {};
        if (g.migProfile === undefined && Number.isInteger(g.count)) most = Math.max(most, g.count);
      }
    }
    return most;
  }
  // Idle GPUs, nodes by their idle whole GPUs (8 or more, 4-7, 2-3, 1: the sizes of tasks that
  // fit there), and fragmentation: the share of idle whole GPUs outside blocks of `block` GPUs
  // on one node, `block` being the largest task that pends (the largest node's GPUs when none
  // does): with 12 idle on one node and blocks of 8, 4 are stranded. 0 % when every idle GPU
  // serves the largest waiting task; 100 % when none can.
  function fleetGlance(nodes, pending) {
    let idle = 0, whole = 0, stranded = 0, largestNode = 0;
    const idleByNode = [];
    for (const n of nodes) {
      const gpus = n.gpus || [];
      largestNode = Math.max(largestNode, gpus.length);
      idle += gpus.filter((g) => isIdle(n, g)).length;
      idleByNode.push(gpus.filter((g) => isIdle(n, g) && !g.mig_enabled).length);
    }
    const sizes = [];
    for (let size = 1; size <= Math.max(1, largestNode); size *= 2) sizes.unshift(size);
    const blocks = sizes.map((size, i) => ({size, top: i === 0,
      nodes: idleByNode.filter((x) => x >= size && (i === 0 || x < sizes[i - 1])).length}));
    const pendingTask = largestPendingTask(pending);
    const block = Math.max(1, Math.min(pendingTask || largestNode, largestNode || 1));
    for (const x of idleByNode) { whole += x; stranded += x % block; }
    return {idle, blocks, block, blockFromPending: pendingTask > 0,
      fragmentation: whole ? 100 * stranded / whole : null};
  }
  // The mean and peak (percent of the fleet's GPUs) of history rows, or null for none. A coarse
  // row stands for `samples` samples (its mean weighs that much) and carries its own peak.
  function meanPeak(items, milli, peakMilli) {
    let sum = 0, weight = 0, peak = -Infinity;
    for (const s of items) {
      if (!s.gpus) continue;
      const n = s.samples || 1;
      sum += n * s[milli] / s.gpus / 10;
      weight += n;
      peak = Math.max(peak, (s[peakMilli] ?? s[milli]) / s.gpus / 10);
    }
    return weight ? {mean: sum / weight, peak} : null;
  }
  const busyMeanPeak = (items) => meanPeak(items, 'busy_milli', 'peak_busy_milli');
  const allocatedMeanPeak = (items) => meanPeak(items, 'allocated_milli', 'peak_allocated_milli');
  const allocatedPct = (s) => (s.gpus ? s.allocated_milli / s.gpus / 10 : null);
  const busyPct = (s) => (s.gpus ? s.busy_milli / s.gpus / 10 : null);
  const meanPeakText = (x) => (x ? `mean ${pct(x.mean)}, peak ${pct(x.peak)}` : '–');

  function fleetPage() {
    let root, cards, blocks, chartEl, chart, tree, quarantines;
    return page((el) => {
      root = el;
      cards = h('div', {class: 'cards'});
      chartEl = h('div', {class: 'chart'});
      tree = h('div', {});
      quarantines = h('div', {id: 'fleet-quarantines'});
      blocks = h('div', {class: 'panel', id: 'fleet-blocks'});
      append(root, h('h1', {}, 'Fleet'), cards, blocks, quarantines,
        h('div', {class: 'panel'}, h('h2', {}, 'GPUs allocated and busy, % of the fleet (last hour)'), chartEl),
        h('div', {class: 'panel'}, h('h2', {}, 'Topology'),
          h('div', {class: 'legend'}, 'each square is a GPU:',
            h('i', {style: 'background:var(--alloc)'}), 'allocated share',
            h('i', {style: 'background:var(--busy)'}), 'utilization',
            h('i', {style: 'border:2px solid var(--bad)'}), 'quarantined',
            h('i', {style: 'background:#fecaca'}), 'unhealthy'), tree));
    }, async (gen) => {
      const since = new Date(Date.now() - 3600e3).toISOString().replace(/\.\d+Z$/, 'Z');
      const [nodes, util, history, jobs] = await Promise.all([api('/v1/nodes'),
        api('/v1/utilization'), api('/v1/history?since=' + since),
        api('/v1/jobs?state=Pending')]);
      if (gen !== generation) return;
      const u = utilMap(util.items);
      const items = nodes.items.slice().sort((a, b) => a.name.localeCompare(b.name));
      let gpus = 0, alloc = 0, utilSum = 0, utilN = 0, ready = 0, quarantined = 0;
      for (const n of items) {
        ready += n.state === 'Ready' ? 1 : 0;
        for (const g of n.gpus || []) {
          gpus += 1; alloc += Math.min(1000, g.allocated_milli || 0);
          quarantined += g.health === 'Quarantined' ? 1 : 0;
          const x = u[n.name + '/' + g.index];
          if (x !== undefined) { utilSum += x; utilN += 1; }
        }
      }
      const last = history.items[history.items.length - 1];
      const glance = fleetGlance(items, jobs.items);
      const busy = busyMeanPeak(history.items);
      const allocated = allocatedMeanPeak(history.items);
      replace(cards,
        h('div', {class: 'card'}, h('div', {class: 'v', id: 'gpus-idle'}, String(glance.idle)),
          h('div', {class: 'l'}, 'GPUs idle (nothing allocated, healthy, node Ready)')),
        h('div', {class: 'card'}, h('div', {class: 'v', id: 'fragmentation'}, glance.fragmentation === null ? '–' : pct(glance.fragmentation)),
          h('div', {class: 'l'}, `fragmentation: idle GPUs outside blocks of ${glance.block} on one node ` +
            (glance.blockFromPending ? '(the largest pending task)' : '(the largest node)'))),
        h('div', {class: 'card'}, h('div', {class: 'v', id: 'busy-pct'}, busy ? pct(busy.mean) : '–'),
          h('div', {class: 'l'}, `GPUs busy, mean (peak ${busy ? pct(busy.peak) : '–'}), last hour`)),
        h('div', {class: 'card'}, h('div', {class: 'v', id: 'allocated-pct'}, allocated ? pct(allocated.mean) : '–'),
          h('div', {class: 'l'}, `GPUs allocated, mean (peak ${allocated ? pct(allocated.peak) : '–'}), last hour`)),
        h('div', {class: 'card'}, h('div', {class: 'v', id: 'nodes-ready'}, `${ready}/${items.length}`),
          h('div', {class: 'l'}, 'nodes Ready')),
        h('div', {class: 'card'}, h('div', {class: 'v'}, `${fmtGpus(alloc)}/${gpus}`),
          h('div', {class: 'l'}, `GPUs allocated (${pct(gpus ? alloc / gpus / 10 : 0)})`)),
        h('div', {class: 'card'}, h('div', {class: 'v'}, pct(gpus ? utilSum / gpus : 0)),
          h('div', {class: 'l'}, 'mean GPU utilization')),
        h('div', {class: 'card'}, h('div', {class: 'v'}, String(jobs.items.length)),
          h('div', {class: 'l'}, 'jobs pending' + (me.role === 'admin' ? '' : ` (team ${me.team})`))),
        h('div', {class: 'card'}, h('div', {class: 'v'}, last ? String(last.running_jobs) : '–'),
          h('div', {class: 'l'}, 'jobs placed (fleet)')),
        h('div', {class: 'card'}, h('div', {class: 'v'}, String(quarantined)),
          h('div', {class: 'l'}, 'GPUs quarantined')));
      replace(blocks, h('h2', {}, 'Nodes by idle whole GPUs'),
        table([''].concat(glance.blocks.map((b) => [(b.top ? `${b.size}+` : b.size > 1 ? `${b.size}-${b.size * 2 - 1}` : '1') + ' idle', true])),
          [['nodes'].concat(glance.blocks.map((b) => num(String(b.nodes))))], 'no GPUs'));
      if (!chart) {
        chart = lineChart(chartEl, '', percentSeries());
        liveCharts.push(chart);
      }
      chart.setData(percentData(history.items));
      // The same reason the failure report shows: both come from one commit of the quarantine.
      const out = items.flatMap((n) => (n.gpus || []).filter((g) => g.health === 'Quarantined')
        .map((g) => [h('a', {href: nodeHref(n.name)}, `${n.name} GPU ${g.index}`), g.quarantine_reason || '']));
      replace(quarantines, out.length ? h('div', {class: 'panel'}, h('h2', {}, 'Quarantined GPUs'),
        table(['GPU', 'reason'], out, 'none')) : null);
      renderTree(tree, items, u);
    });
  }
  let liveCharts = [];
  // The fleet's allocation and utilization in % of its GPUs then: a fleet that grew or shrank
  // reads the same.
  const percentSeries = () => [{label: 'allocated %', color: '#2563eb', digits: 1},
    {label: 'busy %', color: '#16a34a', digits: 1}];
  const percentData = (items) => [items.map((s) => s.unix_ms / 1000), items.map(allocatedPct),
    items.map(busyPct)];

  function renderTree(el, nodes, u) {
    const levels = topologyLevels(nodes);
    const render = (group, depth) => {
      if (depth === levels.length) {
        return h('div', {class: 'nodes'}, group.map((n) => h('div', {class: 'node', 'data-node': n.name},
          h('div', {class: 'nh'}, h('a', {href: nodeHref(n.name)}, n.name), badge(n.state)),
          h('div', {class: 'gpus'}, (n.gpus || []).map((g) => gpuCell(n, g, u[n.name + '/' + g.index]))))));
      }
      const by = new Map();
      for (const n of group) {
        const v = (n.topology || {})[levels[depth]] || '(none)';
        if (!by.has(v)) by.set(v, []);
        by.get(v).push(n);
      }
      return [...by.keys()].sort().map((v) => {
        const members = by.get(v);
        let gpus = 0, alloc = 0;
        for (const n of members) for (const g of n.gpus || []) { gpus++; alloc += Math.min(1000, g.allocated_milli || 0); }
        return h('div', {class: 'domain'},
          h('div', {class: 'dh'}, `${levels[depth]} ${v} `,
            h('span', {class: 'muted'}, `${members.length} nodes, ${fmtGpus(alloc)}/${gpus} GPUs allocated`)),
          render(members, depth + 1));
      });
    };
    replace(el, render(nodes, 0));
  }

  // An action of the CLI's (docs/dashboard.md, "Actions"): a button that POSTs `path`, says
  // the server's answer beside it and refreshes the page. The server checks the role, as it does
  // for the CLI; the page offers only what the token's role may do.
  // `body()`, when given, is the JSON the route takes (a quarantine's GPU and reason).
  async function postAction(path, body, button, status) {
    button.disabled = true;
    try {
      await api(path, body === undefined ? {method: 'POST'} : {method: 'POST', body: JSON.stringify(body)});
      status.textContent = ' done';
      current.refresh(generation);
    } catch (e) {
      status.textContent = ' refused: ' + e.message;
    }
    button.disabled = false;
  }
  function actionButton(label, id, path, body) {
    const status = h('span', {class: 'muted', id: id + '-status'});
    const button = h('button', {type: 'button', id, onclick: () => postAction(path, body, button, status)}, label);
    return h('span', {class: 'action'}, button, status);
  }
  // An admin's quarantine of one GPU or all of a node's, with the reason every page then shows
  // (`gpufleet quarantine NODE --gpu N --reason TEXT`). Made once per page, so that the poll's
  // redraws keep what is being typed.
  function quarantineForm(name) {
    const gpu = h('select', {id: 'quarantine-gpu', 'aria-label': 'GPU'}, h('option', {value: ''}, 'every GPU'));
    const reason = h('input', {id: 'quarantine-reason', 'aria-label': 'reason', size: 36,
      placeholder: 'reason, shown on every page'});
    const status = h('span', {class: 'muted', id: 'node-quarantine-status'});
    const button = h('button', {type: 'submit', id: 'node-quarantine'}, 'Quarantine');
    const form = h('form', {class: 'actions', onsubmit: (e) => {
      e.preventDefault();
      const body = gpu.value === '' ? {} : {gpu: Number(gpu.value)};
      if (reason.value.trim()) body.reason = reason.value.trim();
      postAction(`/v1/nodes/${encodeURIComponent(name)}/quarantine`, body, button, status);
    }}, gpu, ' ', reason, ' ', button, status);
    // The node's GPUs, once its first answer came.
    form.setGpus = (count) => {
      if (gpu.options.length > 1) return;
      for (let i = 0; i < count; i++) gpu.append(h('option', {value: String(i)}, `GPU ${i}`));
    };
    return form;
  }

  function nodePage(name) {
    let body, actions, quarantine;
    return page((el) => {
      body = h('div', {});
      actions = h('div', {class: 'actions', id: 'node-actions'});
      quarantine = me.role === 'admin' ? quarantineForm(name) : null;
      append(el, h('h1', {}, 'Node ', name), actions, quarantine, body);
    }, async (gen) => {
      let node;
      try { node = await api('/v1/nodes/' + encodeURIComponent(name)); } catch (e) {
        if (e.status === 404) { replace(body, h('p', {class: 'error'}, `Node "${name}" not found.`)); return; }
        throw e;
      }
      // Only jobs that hold GPUs: a busy fleet keeps thousands of finished ones.
      const [util, events, ...held] = await Promise.all([api('/v1/utilization'),
        me.role === 'admin' ? optional(`/v1/nodes/${encodeURIComponent(name)}/events`) : null,
        ...['Scheduled', 'Running', 'Stopping'].map((st) => api('/v1/jobs?state=' + st))]);
      if (gen !== generation) return;
      // Cordon, drain, uncordon, quarantine and release are an admin's, as in the CLI.
      const admin = me.role === 'admin';
      const nodePath = `/v1/nodes/${encodeURIComponent(name)}`;
      const unschedulable = node.state === 'Cordoned' || node.state === 'Draining';
      replace(actions, admin ? [actionButton(unschedulable ? 'Uncordon' : 'Cordon', 'node-cordon',
        `${nodePath}/${unschedulable ? 'uncordon' : 'cordon'}`),
      node.state === 'Draining' ? null : actionButton('Drain', 'node-drain', `${nodePath}/drain`)] : null);
      if (quarantine) quarantine.setGpus((node.gpus || []).length);
      const jobs = {items: held.flatMap((x) => x.items)};
      const u = utilMap(util.items);
      const here = jobs.items.filter((j) => (j.placements || []).some((p) => p.node === name));
      const byGpu = {};
      for (const j of here) {
        for (const p of j.placements) {
          if (p.node !== name) continue;
          (p.gpus || []).forEach((g, i) => {
            const milli = ((p.assignments || [])[i] || {}).milli;
            (byGpu[g] = byGpu[g] || []).push(h('span', {}, h('a', {href: jobHref(j)}, j.name),
              milli !== undefined && milli < 1000 ? ` (${fmtGpus(milli)})` : '', ' '));
          });
        }
      }
      replace(body,
        h('div', {class: 'panel'}, h('dl', {class: 'kv'},
          h('dt', {}, 'state'), h('dd', {}, badge(node.state), node.excluded ? ' excluded: ' + node.excluded : ''),
          h('dt', {}, 'topology'), h('dd', {class: 'path'},
            Object.entries(node.topology || {}).map(([k, v]) => `${k}=${v}`).join('  ') || '–'),
          h('dt', {}, 'fault domains'), h('dd', {class: 'path'},
            Object.entries(node.fault_domains || {}).map(([k, v]) => `${k}=${v}`).join('  ') || '–'),
          h('dt', {}, 'CPU, memory'), h('dd', {}, `${(node.cpu_milli || 0) / 1000} cores, ${Math.round((node.memory_mib || 0) / 1024)} GiB`),
          h('dt', {}, 'labels'), h('dd', {class: 'path'},
            Object.entries(node.labels || {}).map(([k, v]) => `${k}=${v}`).join('  ') || '–'))),
        h('div', {class: 'panel'}, h('h2', {}, 'GPUs'),
          table(['GPU', 'model', ['allocated', true], '', ['utilization', true], ['temp. headroom', true], 'health', 'jobs'],
            (node.gpus || []).map((g) => [String(g.index), g.model + (g.mig_enabled ? ' (MIG)' : ''),
              num(fmtGpus(Math.min(1000, g.allocated_milli || 0))),
              h('div', {class: 'bar'}, h('span', {style: `width:${Math.min(100, (g.allocated_milli || 0) / 10)}%`})),
              num(u[name + '/' + g.index] === undefined ? '–' : u[name + '/' + g.index] + '%'),
              num(g.thermal_headroom_c === undefined ? '–' : g.thermal_headroom_c + ' °C'),
              [badge(g.health || '–'), g.quarantine_reason ? ' ' + g.quarantine_reason : '',
                admin && g.health === 'Quarantined'
                  ? [' ', actionButton('Release', `gpu-release-${g.index}`, `${nodePath}/release`, {gpu: g.index})] : null],
              byGpu[g.index] || '']))),
        h('div', {class: 'panel'}, h('h2', {}, 'Jobs on this node'),
          table(['job', 'team', 'state', 'tasks here'], here.map((j) => [h('a', {href: jobHref(j)}, j.name), j.team || '–',
            badge(j.state), j.placements.filter((p) => p.node === name).map((p) => p.task).join(', ')]),
          me.role === 'admin' ? 'none' : 'none of your team\'s')),
        events === null ? null : h('div', {class: 'panel'}, h('h2', {}, 'Events'),
          events.missing ? na('node events') : timeline(events.items)));
    });
  }

  function timeline(items) {
    if (!items || items.length === 0) return h('p', {class: 'muted'}, 'no events');
    // A repeated event is one entry with its count and span, "(x97, 07:12-07:18)" (UTC).
    const hhmm = (t) => (t || '').slice(11, 16);
    return h('ul', {class: 'timeline'}, items.map((e) =>
      h('li', {}, h('span', {class: 'rev'}, '#' + e.revision),
        e.at ? h('time', {datetime: e.at}, e.at.replace('T', ' ').replace('Z', ' UTC')) : null,
        e.message,
        e.count > 1 ? h('span', {class: 'repeats'}, ` (x${e.count}, ${hhmm(e.firstTime)}-${hhmm(e.lastTime)})`) : null)));
  }

  function queuesPage() {
    let body;
    return page((el) => {
      body = h('div', {class: 'panel'});
      append(el, h('h1', {}, 'Queues'), body);
    }, async (gen) => {
      const queues = await api('/v1/queues');
      if (gen !== generation) return;
      const quota = (q) => Object.entries(q || {}).map(([m, n]) => `${m === '*' ? 'any' : m}: ${n}`).join(', ') || '–';
      const items = queues.items.slice().sort((a, b) => a.name.localeCompare(b.name));
      replace(body, table(['queue', 'team', 'guarantee', 'limit', ['used (GPUs)', true], ['borrowed', true],
        ['weight share', true], ['fair share', true], ['pending', true], ['running', true]],
      items.map((q) => {
        const depth = q.name.split('/').length - 1;
        return [h('span', {style: `padding-left:${depth * 18}px`}, depth ? '└ ' : '', q.name.split('/').pop()),
          q.team || 'shared', quota(q.guarantee), quota(q.limit), num(String(q.gpus_allocated ?? 0)),
          num((q.borrowed ?? 0).toFixed(1)), num(q.weight_share === undefined ? '–' : pct(q.weight_share * 100)),
          num(q.fair_share === undefined ? '–' : q.fair_share.toFixed(2)), num(String(q.pending ?? 0)),
          num(String(q.running ?? 0))];
      })), h('p', {class: 'muted'}, 'fair share: the queue\'s share of recent use over its weight share; below 1 its jobs go first.'));
    });
  }

  function jobsPage(params) {
    let body, form;
    const f = {state: params.get('state') || '', queue: params.get('queue') || '',
      team: params.get('team') || '', q: params.get('q') || ''};
    return page((el) => {
      const sel = (name, options) => h('select', {name, onchange: apply},
        [h('option', {value: ''}, 'any')].concat(options.map((o) => {
          const opt = h('option', {value: o}, o);
          if (o === f[name]) opt.selected = true;
          return opt;
        })));
      const queueSel = sel('queue', []);
      form = h('form', {class: 'filters', onsubmit: (e) => { e.preventDefault(); apply(); }},
        h('label', {}, 'state', sel('state', STATES)),
        h('label', {}, 'queue', queueSel),
        me.role === 'admin' ? h('label', {}, 'team', h('input', {name: 'team', value: f.team, placeholder: 'any', oninput: apply})) : null,
        h('label', {}, 'name contains', h('input', {name: 'q', value: f.q, oninput: apply})));
      body = h('div', {class: 'panel'});
      append(el, h('h1', {}, 'Jobs'), form, body);
      api('/v1/queues').then((qs) => {
        for (const q of qs.items) {
          const opt = h('option', {value: q.name}, q.name);
          if (q.name === f.queue) opt.selected = true;
          queueSel.append(opt);
        }
      }).catch(() => {});
      function apply() {
        for (const k of Object.keys(f)) if (form.elements[k]) f[k] = form.elements[k].value;
        const qs = new URLSearchParams(Object.entries(f).filter(([, v]) => v)).toString();
        history.replaceState(null, '', '#/jobs' + (qs ? '?' + qs : ''));
        current.refresh(generation);
      }
    }, async (gen) => {
      const qs = new URLSearchParams();
      if (f.state) qs.set('state', f.state);
      if (f.queue) qs.set('queue', f.queue);
      const jobs = await api('/v1/jobs' + (qs.toString() ? '?' + qs : ''));
      if (gen !== generation) return;
      const items = jobs.items.filter((j) => (!f.team || j.team === f.team) &&
        (!f.q || j.name.includes(f.q))).sort((a, b) => (b.submit_seq || 0) - (a.submit_seq || 0));
      const gpusOf = (j) => {
        let m = 0;
        for (const p of j.placements || []) for (const a of p.assignments || []) m += a.milli || 0;
        return m;
      };
      const shown = items.slice(0, 500);
      replace(body, h('p', {class: 'muted'}, `${items.length} jobs` + (items.length > shown.length ? ` (newest ${shown.length} shown)` : '')),
        table(['job', 'team', 'queue', 'state', ['GPUs held', true], 'submitted', 'reason'],
          shown.map((j) => [h('a', {href: jobHref(j), class: 'job-link'}, j.name), j.team || '–', j.queue,
            badge(j.state), num(fmtGpus(gpusOf(j))), j.created_at || '–',
            h('span', {class: 'muted'}, (j.reason || '').slice(0, 140))]), 'no jobs match'));
    });
  }

  function jobPage(name) {
    let body, actions;
    const path = '/v1/jobs/' + name.split('/').map(encodeURIComponent).join('/');
    return page((el) => {
      body = h('div', {});
      actions = h('div', {class: 'actions', id: 'job-actions'});
      append(el, h('h1', {}, 'Job ', h('span', {id: 'job-name'}, name)), actions, body);
    }, async (gen) => {
      let job;
      try { job = await api(path); } catch (e) {
        if (e.status === 404) {
          replace(body, h('p', {class: 'error', id: 'not-found'}, `Job "${name}" not found.`));
          return;
        }
        throw e;
      }
      const [events, explain, provenance, nodes, logs] = await Promise.all([api(path + '/events'),
        optional(path + '/explain'), optional('/v1/provenance?job=' + encodeURIComponent(job.team ? job.team + '/' + job.name : job.name)),
        (job.placements || []).length ? api('/v1/nodes') : {items: []}, optional(path + '/logs')]);
      if (gen !== generation) return;
      // A job the token sees it may cancel (its own team's, or any for an admin), as
      // `gpufleet cancel` may.
      replace(actions, ['Pending', 'Scheduled', 'Running', 'Suspended'].includes(job.state)
        ? actionButton('Cancel job', 'job-cancel', path + '/cancel') : null);
      const levels = topologyLevels(nodes.items);
      const byName = Object.fromEntries(nodes.items.map((n) => [n.name, n]));
      const spec = (job.spec && job.spec.spec) || {};
      replace(body,
        h('div', {class: 'cols'},
          h('div', {class: 'panel'}, h('dl', {class: 'kv'},
            h('dt', {}, 'state'), h('dd', {}, badge(job.state), job.stopping ? ` → ${job.stopping.then}` : ''),
            h('dt', {}, 'team'), h('dd', {}, job.team || '–'),
            h('dt', {}, 'queue'), h('dd', {}, job.queue),
            h('dt', {}, 'priority'), h('dd', {}, String(job.priority ?? 0)),
            h('dt', {}, 'submitted'), h('dd', {}, (job.created_at || '–') + (job.submitted_by ? ' by ' + job.submitted_by : '')),
            h('dt', {}, 'attempt'), h('dd', {}, String(job.attempt ?? '–')),
            job.progress ? [h('dt', {}, 'running for'), h('dd', {id: 'job-elapsed'}, fmtAge(job.progress.elapsed_s)),
              h('dt', {}, 'GPUs busy'), h('dd', {id: 'job-busy'}, job.progress.busy_pct === undefined ? 'not measured yet' : pct(job.progress.busy_pct) + ' (measured, since it was placed)')] : null,
            h('dt', {}, 'tasks'), h('dd', {}, (spec.tasks || []).map((t) =>
              `${t.name} x${t.replicas || 1} (${(t.resources && t.resources.gpus && (t.resources.gpus.count ?? t.resources.gpus.fraction ?? t.resources.gpus.migProfile)) ?? 0} GPU)`).join(', ') || '–'),
            job.reason ? [h('dt', {}, 'reason'), h('dd', {id: 'job-reason'}, job.reason)] : null,
            job.last_checkpoint_ns !== undefined ? [h('dt', {}, 'checkpoint'),
              h('dd', {id: 'job-checkpoint'}, `last checkpoint ${fmtAgo(job.last_checkpoint_ns)} ago`)] : null,
            job.warning ? [h('dt', {}, 'warning'), h('dd', {}, job.warning)] : null)),
          h('div', {class: 'panel'}, h('h2', {}, 'Where it runs'),
            (job.placements || []).length === 0 ? h('p', {class: 'muted'}, 'not placed') :
              table(['task', 'topology', 'GPUs', 'phase'], job.placements.map((p) => [p.task,
                h('span', {class: 'path'}, nodePath(byName[p.node] || {}, levels).join(' › '),
                  levels.length ? ' › ' : '', h('a', {href: nodeHref(p.node)}, p.node)),
                (p.gpus || []).map((g, i) => {
                  const milli = ((p.assignments || [])[i] || {}).milli;
                  return 'GPU ' + g + (milli !== undefined && milli < 1000 ? ` (${fmtGpus(milli)})` : '');
                }).join(', '), p.phase || '–'])))),
        h('div', {class: 'panel', id: 'explain'}, h('h2', {}, 'Why (explain)'), renderExplain(explain)),
        h('div', {class: 'panel', id: 'job-logs'}, h('h2', {}, 'Logs (tail)'), renderLogs(logs)),
        h('div', {class: 'panel'}, h('h2', {}, 'Timeline'), timeline(events.items)),
        h('div', {class: 'panel'}, h('h2', {}, 'Provenance'), renderProvenance(provenance)));
    });
  }

  // One entry of explain's `ahead`: a job the caller may see, or a count of those it may not
  // (`hidden`: other teams' jobs) or that were left out (`more`).
  function aheadText(a) {
    if (typeof a === 'string') return a;
    if (a.name) return a.gpus === undefined || a.gpus === null ? a.name : `${a.name} (${a.gpus} GPUs)`;
    if (a.hidden !== undefined) return `${a.hidden} of other teams`;
    if (a.more !== undefined) return `${a.more} more`;
    return JSON.stringify(a);
  }

  // "in 4m" beside the absolute time: the relative one reads at a glance, the absolute is exact.
  function etaText(eta) {
    if (!eta.at) return 'unknown' + (eta.why ? ` (${eta.why})` : '');
    const relative = Number.isInteger(eta.inSeconds)
      ? (eta.inSeconds <= 0 ? 'now' : 'in ' + fmtAge(eta.inSeconds)) : '';
    const why = [relative, eta.why].filter((x) => x).join('; ');
    return eta.at + (why ? ` (${why})` : '');
  }

  function renderExplain(x) {
    if (x.missing) return na('explain');
    const eta = x.eta || {};
    return [h('dl', {class: 'kv'},
      h('dt', {}, 'reason'), h('dd', {}, x.reason || '–'),
      h('dt', {}, 'message'), h('dd', {}, x.message || '–'),
      h('dt', {}, 'queue position'), h('dd', {}, x.queuePosition === undefined || x.queuePosition === null ? '–' : String(x.queuePosition)),
      h('dt', {}, 'ahead'), h('dd', {}, (x.ahead || []).map(aheadText).join(', ') || 'none'),
      h('dt', {}, 'ETA'), h('dd', {id: 'job-eta'}, etaText(eta)),
      h('dt', {}, 'evidence'), h('dd', {class: 'path'}, JSON.stringify(x.evidence || {}))),
    (x.whatIf || []).length ? [h('h2', {}, 'What if'), table(['change', 'would start now', 'detail'],
      x.whatIf.map((w) => [w.change, w.wouldStartNow ? 'yes' : 'no', w.detail || '']))] : null];
  }

  // The tail of each task's log its agent shipped (docs/agent.md, "Task logs"), as text.
  function renderLogs(x) {
    if (x.missing) return na('task logs');
    if ((x.items || []).length === 0) return h('p', {class: 'muted'}, x.why || 'no runs yet');
    return x.items.map((it) => [h('h3', {}, `${it.task} (attempt ${it.attempt}, node ${it.node})`),
      it.text === null || it.text === undefined ? h('p', {class: 'muted'}, it.why || 'no log received yet')
        : [it.from > 0 ? h('p', {class: 'muted'}, `the tail of a log of ${it.size} bytes: the ${it.from} before it are on the node only`) : null,
          h('pre', {class: 'log'}, it.text)]]);
  }

  function renderProvenance(p) {
    if (p.missing) return na('provenance');
    return table(['attempt', 'task', 'node', 'image', 'digest', 'driver', 'command'],
      (p.items || []).map((r) => [String(r.attempt ?? '–'), r.task || '–', r.node || '–', r.image || '–',
        h('span', {class: 'path'}, (r.image_digest || r.digest || '–').slice(0, 24)), r.driver_version || '–',
        h('span', {class: 'path'}, (r.command || []).join(' ').slice(0, 80))]), 'no runs recorded yet');
  }

  const HISTORY_RANGES = [['1h', 3600], ['6h', 6 * 3600], ['24h', 24 * 3600], ['7d', 7 * 86400],
    ['30d', 30 * 86400]];

  function historyPage() {
    let gpuEl, jobEl, gpuChart, jobChart, rangeSel;
    return page((el) => {
      gpuEl = h('div', {class: 'chart'});
      jobEl = h('div', {class: 'chart'});
      rangeSel = h('select', {onchange: () => current.refresh(generation)},
        HISTORY_RANGES.map(([l, s]) => h('option', {value: s}, l)));
      append(el, h('h1', {}, 'Allocation and utilization over time'),
        h('div', {class: 'filters'}, h('label', {}, 'range', rangeSel)),
        h('div', {class: 'panel'}, h('h2', {}, 'GPUs, % of the fleet'),
          h('p', {id: 'history-summary'}), gpuEl),
        h('div', {class: 'panel'}, h('h2', {}, 'Jobs'), jobEl),
        h('p', {class: 'muted', id: 'history-note'}));
    }, async (gen) => {
      const since = new Date(Date.now() - Number(rangeSel.value) * 1000).toISOString().replace(/\.\d+Z$/, 'Z');
      const history = await api('/v1/history?since=' + since);
      if (gen !== generation) return;
      // Ranges longer than what the server keeps are not offered.
      const kept = history.kept_s ?? (history.capacity || 0) * (history.interval_s || 0);
      for (const option of rangeSel.options) option.disabled = Number(option.value) > Math.max(kept, 3600);
      if (!gpuChart) {
        gpuChart = lineChart(gpuEl, '', percentSeries());
        jobChart = lineChart(jobEl, '', [{label: 'pending', color: '#d97706'}, {label: 'placed', color: '#2563eb'}]);
        liveCharts.push(gpuChart, jobChart);
      }
      const it = history.items;
      const t = it.map((s) => s.unix_ms / 1000);
      gpuChart.setData(percentData(it));
      jobChart.setData([t, it.map((s) => s.pending_jobs), it.map((s) => s.running_jobs)]);
      document.getElementById('history-summary').textContent =
        `busy: ${meanPeakText(busyMeanPeak(it))}; allocated: ${meanPeakText(allocatedMeanPeak(it))}`;
      document.getElementById('history-note').textContent =
        `${it.length} samples, one every ${history.interval_s} s` +
        (history.coarse_capacity ? `, and before the last ${history.capacity} the means and peaks of every 60` : '') +
        `; the server keeps ${fmtAge(kept)}.`;
    });
  }

  function usagePage() {
    let body, bySel, rangeSel;
    return page((el) => {
      body = h('div', {class: 'panel'});
      bySel = h('select', {onchange: () => current.refresh(generation)}, ['team', 'queue', 'user', 'model'].map((b) => h('option', {value: b}, b)));
      rangeSel = h('select', {onchange: () => current.refresh(generation)},
        [['last hour', 3600], ['last day', 86400], ['last 7 days', 7 * 86400], ['last 30 days', 30 * 86400]].map(([l, s]) => h('option', {value: s}, l)));
      append(el, h('h1', {}, 'Usage'), h('div', {class: 'filters'}, h('label', {}, 'range', rangeSel), h('label', {}, 'by', bySel)), body);
    }, async (gen) => {
      const to = new Date();
      const from = new Date(to.getTime() - Number(rangeSel.value) * 1000);
      const iso = (d) => d.toISOString().replace(/\.\d+Z$/, 'Z');
      const u = await optional(`/v1/usage?from=${iso(from)}&to=${iso(to)}&by=${bySel.value}`);
      if (gen !== generation) return;
      if (u.missing) { replace(body, na('the usage ledger')); return; }
      const hasCost = (u.rows || []).some((r) => r.cost !== undefined && r.cost !== null);
      const f2 = (x) => (Number.isFinite(x) ? x.toFixed(2) : '–');
      replace(body, table([u.by || bySel.value, ['allocated GPU-h', true], ['busy GPU-h', true], ['idle GPU-h', true]].concat(hasCost ? [['cost', true]] : []),
        // Jobs of no team (an admin's own) have an empty key, as `report usage` says it.
        (u.rows || []).map((r) => [r.key || ((u.by || bySel.value) === 'team' ? '(no team)' : '(none)'), num(f2(r.allocatedGpuHours)), num(f2(r.busyGpuHours)), num(f2(r.idleGpuHours))]
          .concat(hasCost ? [num(r.cost === undefined || r.cost === null ? '–' : f2(r.cost))] : [])), 'no usage in this range'),
      h('p', {}, 'unallocated GPU-hours of the fleet: ', f2(u.unallocatedGpuHours)));
    });
  }

  function failuresPage() {
    let body;
    return page((el) => {
      body = h('div', {});
      append(el, h('h1', {}, 'Failure report'), body);
    }, async (gen) => {
      if (me.role !== 'admin') {  // the API would answer 403: ask it nothing
        replace(body, h('p', {class: 'na'}, 'The failure report is for admins.'));
        return;
      }
      const r = await optional('/v1/reports/failures');
      if (gen !== generation) return;
      if (r.missing === 403) { replace(body, h('p', {class: 'na'}, 'The failure report is for admins.')); return; }
      if (r.missing) { replace(body, na('the failure report')); return; }
      const c = r.concentration || {};
      const dev = (s) => (s.device === 'gpu' ? `${s.node} GPU ${s.gpu}` : s.node || s.id);
      replace(body,
        h('div', {class: 'cards'},
          h('div', {class: 'card'}, h('div', {class: 'v'}, String(r.runs ?? 0)), h('div', {class: 'l'}, 'runs (30 days)')),
          h('div', {class: 'card'}, h('div', {class: 'v'}, String(r.failed_runs ?? 0)), h('div', {class: 'l'}, 'failed runs')),
          h('div', {class: 'card'}, h('div', {class: 'v'}, String(r.application_failed_runs ?? 0)), h('div', {class: 'l'}, 'application failures')),
          h('div', {class: 'card'}, h('div', {class: 'v'}, String((r.quarantines || []).length)), h('div', {class: 'l'}, 'quarantines in force'))),
        c.summary ? h('div', {class: 'panel'}, c.summary) : null,
        h('div', {class: 'panel'}, h('h2', {}, 'Suspects'),
          table(['device', ['failures', true], ['GPU-hours', true], ['expected', true], 'flagged'],
            (r.suspects || []).map((s) => [h('a', {href: nodeHref(s.node || '')}, dev(s)), num(String(s.failures ?? 0)),
              num((s.gpu_hours ?? 0).toFixed(2)), num((s.expected ?? 0).toPrecision(3)), s.flagged ? 'yes' : 'no']), 'no suspects')),
        h('div', {class: 'panel'}, h('h2', {}, 'Quarantines'),
          table(['device', 'since', 'by', 'reason'], (r.quarantines || []).map((q) => [dev(q),
            q.since_ns ? new Date(q.since_ns / 1e6).toISOString() : '–', q.actor || q.source || '–', q.reason || '']), 'none')),
        // The loop (docs/reliability.md, "The loop"): its breaker and each GPU's steps, as audited.
        h('div', {class: 'panel', id: 'failures-loop'}, h('h2', {}, 'Diagnostics loop'),
          r.breaker && r.breaker.open
            ? h('p', {class: 'error'}, `Circuit breaker open: ${r.breaker.out} of ${r.breaker.gpus} GPUs went out within ${r.breaker.window_s} s; no automatic drain or quarantine.`)
            : null,
          table(['device', 'phase', ['remediations', true], 'audit events'], (r.loop || []).map((l) => [dev(l), l.phase || '–',
            num(String(l.remediations ?? 0)), h('div', {}, ...(l.events || []).map((e) => h('div', {}, e)))]), 'no GPU in the loop')));
    });
  }

  function loginPage() {
    return page((el) => {
      const input = h('input', {type: 'password', id: 'token', autocomplete: 'off', placeholder: 'token', required: true});
      const msg = h('p', {class: 'error', id: 'login-error'}, loginMessage);
      loginMessage = '';
      append(el, h('form', {class: 'panel login', onsubmit: async (e) => {
        e.preventDefault();
        const value = input.value.trim();
        msg.textContent = '';
        let res;
        try {
          res = await fetch('/v1/whoami', {headers: {Authorization: 'Bearer ' + value}, cache: 'no-store'});
        } catch (err) { msg.textContent = 'The server cannot be reached.'; return; }
        if (!res.ok) {
          msg.textContent = res.status === 401 || res.status === 403 ? 'That token was refused.' : `The server answered ${res.status}.`;
          return;
        }
        sessionStorage.setItem(TOKEN_KEY, value);
        location.hash = '#/';
      }},
      h('h1', {}, 'Log in to gpufleet'),
      h('p', {class: 'muted'}, 'Paste an API token (the admin token `gpufleet server` or `gpufleet dev` printed, or one from `gpufleet create token`). It stays in this browser tab only.'),
      input, h('button', {class: 'primary', type: 'submit'}, 'Log in'), msg));
      input.focus();
    }, async () => {});
  }

  // ---- router ------------------------------------------------------------------------------
  const NAV = [['#/', 'Fleet'], ['#/queues', 'Queues'], ['#/jobs', 'Jobs'], ['#/history', 'History'],
    ['#/usage', 'Usage'], ['#/failures', 'Failures']];

  function renderHeader(route) {
    const nav = document.getElementById('nav');
    const who = document.getElementById('who');
    if (!me) { replace(nav); replace(who); return; }
    replace(nav, NAV.map(([href, label]) => h('a', {href, class: (route === href || (href !== '#/' && route.startsWith(href))) ? 'active' : null}, label)));
    replace(who, me.role === 'admin' ? `${me.name} (admin)` : `${me.name} (team ${me.team})`,
      h('button', {id: 'logout', onclick: () => { sessionStorage.removeItem(TOKEN_KEY); me = null; location.hash = '#/login'; }}, 'Log out'));
  }

  async function navigate() {
    generation += 1;
    const gen = generation;
    clearTimeout(timer);
    resume = null;
    for (const c of liveCharts) c.destroy();
    liveCharts = [];
    let hash = location.hash || '#/';
    if (hash.startsWith('#token=')) {
      // `gpufleet dev` prints a link that logs in at once; the token leaves the address bar.
      sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(hash.slice(7)));
      history.replaceState(null, '', '#/');
      hash = '#/';
    }
    const root = main();
    replace(root);
    if (!token() || hash === '#/login') {
      me = null;
      if (hash !== '#/login') { location.hash = '#/login'; return; }
      renderHeader(hash);
      current = loginPage();
      current.mount(root);
      return;
    }
    if (!me) {
      try { me = await api('/v1/whoami'); } catch (e) {
        if (e.status !== 401) replace(root, h('p', {class: 'error'}, 'The server cannot be reached: ' + e.message));
        return;
      }
      if (gen !== generation) return;
    }
    const [path, query] = hash.slice(1).split('?');
    const params = new URLSearchParams(query || '');
    const parts = path.split('/').filter((x) => x).map(decodeURIComponent);
    renderHeader('#' + path);
    if (parts.length === 0) current = fleetPage();
    else if (parts[0] === 'nodes' && parts.length === 2) current = nodePage(parts[1]);
    else if (parts[0] === 'queues') current = queuesPage();
    else if (parts[0] === 'jobs' && parts.length === 1) current = jobsPage(params);
    else if (parts[0] === 'jobs') current = jobPage(parts.slice(1).join('/'));
    else if (parts[0] === 'history') current = historyPage();
    else if (parts[0] === 'usage') current = usagePage();
    else if (parts[0] === 'failures') current = failuresPage();
    else current = page((el) => append(el, h('p', {class: 'error'}, 'No such page.')), async () => {});
    const shown = current;
    const status = h('p', {class: 'error', id: 'page-error'});
    shown.mount(root);
    root.append(status);
    // One refresh at a time, the next POLL_MS after the last answer; each failure in a row
    // doubles the wait (up to POLL_MAX_MS); a hidden tab asks nothing until it is shown again.
    let failures = 0;
    const schedule = () => {
      clearTimeout(timer);
      if (gen !== generation || document.hidden) return;
      timer = setTimeout(tick, Math.min(POLL_MAX_MS, POLL_MS * 2 ** failures));
    };
    const tick = async () => {
      if (gen !== generation) return;
      try {
        await shown.refresh(gen);
        status.textContent = '';
        failures = 0;
      } catch (e) {
        if (e.status !== 401 && gen === generation) {
          status.textContent = 'Could not refresh: ' + e.message;
          failures = Math.min(failures + 1, 4);
        }
      }
      schedule();
    };
    shown.refresh = ((f) => (g) => f(g === undefined ? generation : g))(shown.refresh);
    resume = tick;
    await tick();
  }

  document.addEventListener('visibilitychange', () => {
    if (document.hidden) clearTimeout(timer);
    else if (resume) resume();
  });
  window.addEventListener('hashchange', navigate);
  window.addEventListener('DOMContentLoaded', navigate);
})();
