// The fedmoe browser view: the runs, a run's (or several runs') curves updating
// live, a round's clients, a client's curve. Everything comes from the JSON API
// of docs/http.md; nothing is fetched from elsewhere.
'use strict';

const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#17becf'];
const POLL_MS = 2000;
const main = document.getElementById('main');
const tip = document.getElementById('tip');
let timer = null;   // the live page's poll
let view = 0;       // bumped on every navigation: a stale poll drops its answer

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => '&#' + c.charCodeAt(0) + ';');
const pct = (v) => (v == null ? '-' : (100 * v).toFixed(2) + '%');
const fix = (v, d) => (v == null ? '-' : Number(v).toFixed(d));

// the view's token, when it needs one: opened as http://HOST:PORT/?token=...
const TOKEN = new URLSearchParams(location.search).get('token');

async function api(path) {
  const r = await fetch(path, { cache: 'no-store', headers: TOKEN ? { Authorization: 'Bearer ' + TOKEN } : {} });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.status);
  return body;
}

// Every row of a paged list (rounds, a client's history) after round since:
// its pages, following next_since while more follow. Returns {rows, since, page}.
async function allPages(path, since) {
  const rows = [];
  for (;;) {
    const page = await api(path + (path.includes('?') ? '&' : '?') + 'since=' + since);
    rows.push(...page.rounds);
    since = page.next_since;
    if (!page.more) return { rows, since, page };
  }
}

function setLive(text) { document.getElementById('live').textContent = text; }

function fail(e) { main.innerHTML = '<p class="bad">' + esc(e.message || e) + '</p>'; }

// ---- runs ------------------------------------------------------------------------

async function showRuns() {
  const { runs } = await api('/api/runs');
  document.getElementById('where').textContent = 'runs';
  let h = '<p>Tick runs to compare them on one page.</p><div class="wrap"><table id="runs"><tr><th></th>' +
    '<th>run</th><th>strategy</th><th>status</th><th>rounds</th><th>last test</th><th>started</th></tr>';
  for (const r of runs.slice().reverse()) {
    const last = r.last ? (r.text ? fix(r.last.test_loss / Math.LN2, 4) + ' bits/byte' : pct(r.last.test_accuracy)) : '-';
    h += '<tr><td><input type="checkbox" value="' + esc(r.id) + '"></td><td class="l"><a href="#/run/' +
      encodeURIComponent(r.id) + '">' + esc(r.id) + '</a></td><td class="l">' + esc(r.strategy) + '</td><td class="l">' +
      esc(r.status) + (r.holdout ? ' (holdout)' : '') + '</td><td>' + r.rounds_done + '/' + r.rounds_planned +
      '</td><td>' + last + '</td><td class="l">' + esc(r.started_at) + '</td></tr>';
  }
  h += '</table></div><p><button id="compare">compare ticked runs</button></p>';
  main.innerHTML = h;
  document.getElementById('compare').onclick = () => {
    const ids = [...main.querySelectorAll('input:checked')].map((c) => encodeURIComponent(c.value));
    if (ids.length) location.hash = '#/run/' + ids.join(',');
  };
  const running = runs.some((r) => r.status === 'running');
  setLive(running ? 'live: a run is in progress' : '');
  if (running) schedule(showRuns);
}

// ---- charts ----------------------------------------------------------------------

// series: [{name, color, points: [[x, y], ...]}]; returns an SVG element with
// a hover read-out of the nearest x, and calls onpick(x) on a click.
function chart(title, series, opts) {
  const W = 640, H = 260, L = 54, R = 12, T = 10, B = 28;
  const xs = series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = series.flatMap((s) => s.points.map((p) => p[1])).filter((v) => v != null && isFinite(v));
  const box = document.createElement('div');
  box.className = 'chart';
  box.innerHTML = '<h3>' + esc(title) + '</h3>';
  if (!xs.length || !ys.length) {
    box.innerHTML += '<p style="margin:10px">no rounds yet</p>';
    return box;
  }
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (opts && opts.zero) y0 = Math.min(0, y0);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 += 0.5; y0 -= 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= opts && opts.zero && y0 === 0 ? 0 : pad; y1 += pad;
  const px = (x) => L + (W - L - R) * (x - x0) / (x1 - x0);
  const py = (y) => T + (H - T - B) * (1 - (y - y0) / (y1 - y0));
  const fmt = (opts && opts.fmt) || ((v) => Number(v).toPrecision(4));
  let s = '<svg viewBox="0 0 ' + W + ' ' + H + '" role="img" aria-label="' + esc(title) + '">';
  for (let i = 0; i <= 4; i++) {
    const v = y0 + (y1 - y0) * i / 4, y = py(v);
    s += '<line x1="' + L + '" x2="' + (W - R) + '" y1="' + y + '" y2="' + y + '" stroke="#eee"/>' +
      '<text x="' + (L - 4) + '" y="' + (y + 4) + '" font-size="11" text-anchor="end">' + esc(fmt(v)) + '</text>';
  }
  s += '<text x="' + px(x0) + '" y="' + (H - 8) + '" font-size="11">' + x0 + '</text>' +
    '<text x="' + px(x1) + '" y="' + (H - 8) + '" font-size="11" text-anchor="end">round ' + x1 + '</text>';
  for (const se of series) {
    const pts = se.points.filter((p) => p[1] != null && isFinite(p[1]));
    if (!pts.length) continue;
    s += '<polyline fill="none" stroke-width="1.8" stroke="' + se.color + '" points="' +
      pts.map((p) => px(p[0]).toFixed(1) + ',' + py(p[1]).toFixed(1)).join(' ') + '"/>';
    if (pts.length < 60) s += pts.map((p) => '<circle r="2.2" fill="' + se.color + '" cx="' + px(p[0]).toFixed(1) +
      '" cy="' + py(p[1]).toFixed(1) + '"/>').join('');
  }
  s += '<line class="cursor" y1="' + T + '" y2="' + (H - B) + '" stroke="#888" visibility="hidden"/>';
  s += '<rect x="' + L + '" y="' + T + '" width="' + (W - L - R) + '" height="' + (H - T - B) + '" fill="transparent"/></svg>';
  box.insertAdjacentHTML('beforeend', s);
  box.insertAdjacentHTML('beforeend', '<div class="legend" style="margin:4px 10px">' + series.map((se) =>
    '<span><i style="background:' + se.color + '"></i>' + esc(se.name) + '</span>').join('') + '</div>');
  const svg = box.querySelector('svg'), cursor = svg.querySelector('.cursor');
  const nearest = (ev) => {
    const r = svg.getBoundingClientRect();
    const x = x0 + (x1 - x0) * ((ev.clientX - r.left) * W / r.width - L) / (W - L - R);
    let best = xs[0];
    for (const v of xs) if (Math.abs(v - x) < Math.abs(best - x)) best = v;
    return best;
  };
  svg.addEventListener('mousemove', (ev) => {
    const x = nearest(ev);
    cursor.setAttribute('x1', px(x)); cursor.setAttribute('x2', px(x)); cursor.setAttribute('visibility', 'visible');
    const lines = ['round ' + x];
    for (const se of series) {
      const p = se.points.find((q) => q[0] === x);
      if (p && p[1] != null) lines.push(se.name + ': ' + fmt(p[1]));
    }
    tip.textContent = lines.join('\n');
    tip.hidden = false;
    tip.style.left = Math.min(ev.clientX + 14, innerWidth - 220) + 'px';
    tip.style.top = (ev.clientY + 14) + 'px';
  });
  svg.addEventListener('mouseleave', () => { tip.hidden = true; cursor.setAttribute('visibility', 'hidden'); });
  if (opts && opts.onpick) svg.addEventListener('click', (ev) => opts.onpick(nearest(ev)));
  return box;
}

// ---- a run, or several overlaid ----------------------------------------------------

async function showRun(ids, round) {
  const runs = [];
  for (const id of ids) {
    const { run } = await api('/api/runs/' + encodeURIComponent(id));
    runs.push({ run, rounds: [], since: 0 });
  }
  document.getElementById('where').textContent = ids.join(' vs ');
  main.innerHTML = '<div class="charts" id="charts"></div><div id="clients"></div>';
  const my = view;
  const pick = (r) => { location.hash = '#/run/' + ids.map(encodeURIComponent).join(',') + '/round/' + r; };
  async function poll() {
    for (const x of runs) {
      const got = await allPages('/api/runs/' + encodeURIComponent(x.run.id) + '/rounds', x.since);
      x.rounds.push(...got.rows);
      x.since = got.since;
      x.run.status = got.page.status;
    }
    if (my !== view) return;
    draw(runs, pick);
    const live = runs.some((x) => x.run.status === 'running');
    setLive(live ? 'live: updating every ' + POLL_MS / 1000 + ' s' : 'finished');
    if (live) schedule(poll);
  }
  await poll();
  if (round) {
    await showClients(ids[0], round, 'client', 'asc', 0);
    document.getElementById('clients').scrollIntoView();
  }
}

function draw(runs, pick) {
  const box = document.getElementById('charts');
  if (!box) return;
  const text = runs.every((x) => x.run.text);
  const many = runs.length > 1;
  const name = (x, what) => (many ? x.run.strategy + ' ' + x.run.id.slice(-4) + ' ' : '') + what;
  const acc = [], loss = [], part = [], bytes = [], secs = [], share = [], eps = [];
  runs.forEach((x, i) => {
    const c = COLORS[(2 * i) % COLORS.length], c2 = COLORS[(2 * i + 1) % COLORS.length];
    const unit = x.run.text ? 1 / Math.LN2 : 1;
    const pts = (f) => x.rounds.map((r) => [r.round, f(r)]);
    if (text) {
      acc.push({ name: name(x, 'test bits/byte'), color: c, points: pts((r) => r.test_loss * unit) });
    } else {
      acc.push({ name: name(x, 'test'), color: c, points: pts((r) => 100 * r.test_accuracy) });
      acc.push({ name: name(x, 'validation'), color: c2, points: pts((r) => 100 * r.val_accuracy) });
    }
    loss.push({ name: name(x, 'train'), color: c, points: pts((r) => r.train_loss * unit) });
    loss.push({ name: name(x, 'test'), color: c2, points: pts((r) => r.test_loss * unit) });
    secs.push({ name: name(x, 'seconds'), color: c, points: pts((r) => r.seconds) });
    share.push({ name: name(x, 'generalist share'), color: c, points: pts((r) => r.generalist_share) });
    if (x.rounds.some((r) => r.epsilon !== null && r.epsilon !== undefined)) {
      eps.push({ name: name(x, 'epsilon'), color: c, points: pts((r) => r.epsilon) });
    }
    if (i === 0) {
      part.push({ name: 'selected', color: '#1f77b4', points: pts((r) => r.selected) });
      part.push({ name: 'completed', color: '#2ca02c', points: pts((r) => r.completed) });
      part.push({ name: 'dropped', color: '#d62728', points: pts((r) => r.dropped) });
      bytes.push({ name: 'MB up', color: '#9467bd', points: pts((r) => r.bytes_up / 1e6) });
      bytes.push({ name: 'MB down', color: '#8c564b', points: pts((r) => r.bytes_down / 1e6) });
    }
  });
  const u = text ? ' (bits per byte)' : '';
  const charts = [
    chart(text ? 'test bits per byte (click a round for its clients)' : 'accuracy % (click a round for its clients)', acc,
      { onpick: pick, fmt: (v) => Number(v).toFixed(text ? 3 : 2) }),
    chart('loss' + u, loss, { onpick: pick }),
    chart('generalist routing share (mean over the clients\' test examples)', share, { zero: true, onpick: pick,
      fmt: (v) => Number(v).toFixed(3) }),
    chart('participation' + (runs.length > 1 ? ' (first run)' : ''), part, { zero: true, onpick: pick, fmt: (v) => Math.round(v) }),
    chart('traffic per round' + (runs.length > 1 ? ' (first run)' : ''), bytes, { zero: true, onpick: pick }),
    chart('seconds per round', secs, { zero: true, onpick: pick }),
  ];
  // differential privacy spent after each round (runs with --dp-noise only)
  if (eps.length) {
    charts.splice(1, 0, chart('differential privacy spent: epsilon after the round', eps, { zero: true, onpick: pick,
      fmt: (v) => Number(v).toFixed(3) }));
  }
  box.replaceChildren(...charts);
  // (when the first charts were drawn, in ms since the navigation: bench/view_page_load.py)
  if (!window.fedmoeDrawn && runs.some((x) => x.rounds.length)) window.fedmoeDrawn = performance.now();
}

// ---- a round's clients, a client's curve -----------------------------------------------

const CLIENT_COLUMNS = [['client', 'client'], ['status', 'status'], ['test_accuracy', 'test acc'],
  ['test_loss', 'test loss'], ['val_loss', 'val loss'], ['train_loss', 'train loss'],
  ['generalist_share', 'gen share'], ['train_samples', 'samples'], ['seconds', 'seconds'], ['bytes_up', 'bytes up']];
const PAGE = 100;

async function showClients(run, round, sort, order, offset) {
  const box = document.getElementById('clients');
  if (!box) return;
  const q = '?sort=' + sort + '&order=' + order + '&offset=' + offset + '&limit=' + PAGE;
  const page = await api('/api/runs/' + encodeURIComponent(run) + '/rounds/' + round + '/clients' + q);
  let h = '<h3>round ' + round + ': ' + page.total + ' clients (' + esc(run) + ')</h3><div class="wrap"><table id="clients-table"><tr>';
  for (const [k, label] of CLIENT_COLUMNS)
    h += '<th data-k="' + k + '">' + label + (k === sort ? (order === 'asc' ? ' &#9650;' : ' &#9660;') : '') + '</th>';
  h += '</tr>';
  for (const c of page.clients) {
    h += '<tr><td class="l"><a href="#/run/' + encodeURIComponent(run) + '/client/' + encodeURIComponent(c.client) + '">' +
      esc(c.client) + '</a></td><td class="l' + (c.status === 'completed' ? '' : ' bad') + '">' + esc(c.status) +
      '</td><td>' + pct(c.test_accuracy) + '</td><td>' + fix(c.test_loss, 4) + '</td><td>' + fix(c.val_loss, 4) +
      '</td><td>' + fix(c.train_loss, 4) + '</td><td>' + fix(c.generalist_share, 3) + '</td><td>' + c.train_samples +
      '</td><td>' + fix(c.seconds, 2) + '</td><td>' + c.bytes_up + '</td></tr>';
  }
  h += '</table></div><p>';
  if (offset > 0) h += '<button id="prev">previous ' + PAGE + '</button> ';
  if (offset + PAGE < page.total) h += '<button id="next">next ' + PAGE + '</button>';
  box.innerHTML = h + '</p>';
  box.querySelectorAll('th').forEach((th) => {
    th.onclick = () => showClients(run, round, th.dataset.k,
      th.dataset.k === sort && order === 'asc' ? 'desc' : 'asc', 0).catch(fail);
  });
  const prev = document.getElementById('prev'), next = document.getElementById('next');
  if (prev) prev.onclick = () => showClients(run, round, sort, order, Math.max(0, offset - PAGE)).catch(fail);
  if (next) next.onclick = () => showClients(run, round, sort, order, offset + PAGE).catch(fail);
}

async function showClient(run, client) {
  const { rows } = await allPages('/api/runs/' + encodeURIComponent(run) + '/clients/' + encodeURIComponent(client), 0);
  document.getElementById('where').textContent = run + ' / ' + client;
  const pts = (f) => rows.filter((r) => r.status === 'completed').map((r) => [r.round, f(r)]);
  main.innerHTML = '<p><a href="#/run/' + encodeURIComponent(run) + '">back to the run</a></p><div class="charts" id="charts"></div>' +
    '<p>' + rows.filter((r) => r.status !== 'completed').map((r) => 'round ' + r.round + ': ' + esc(r.status)).join(', ') + '</p>';
  document.getElementById('charts').replaceChildren(
    chart('test accuracy %', [{ name: client, color: COLORS[0], points: pts((r) => 100 * r.test_accuracy) }]),
    chart('loss', [{ name: 'train', color: COLORS[0], points: pts((r) => r.train_loss) },
      { name: 'validation', color: COLORS[1], points: pts((r) => r.val_loss) },
      { name: 'test', color: COLORS[2], points: pts((r) => r.test_loss) }]),
    chart('generalist routing share', [{ name: client, color: COLORS[4], points: pts((r) => r.generalist_share) }], { zero: true }));
  setLive('');
}

// ---- navigation ------------------------------------------------------------------------

function schedule(f) {
  clearTimeout(timer);
  const my = view;
  timer = setTimeout(() => { if (my === view) f().catch(fail); }, POLL_MS);
}

function route() {
  view++;
  clearTimeout(timer);
  tip.hidden = true;
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  let p;
  if (parts[0] === 'run' && parts[1] && parts[2] === 'client' && parts[3]) p = showClient(parts[1], parts[3]);
  else if (parts[0] === 'run' && parts[1]) p = showRun(parts[1].split(','), parts[2] === 'round' ? parts[3] : null);
  else p = showRuns();
  p.catch(fail);
}

addEventListener('hashchange', route);
route();
