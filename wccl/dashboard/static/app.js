// WCCL dashboard: reads the run as server-sent events (/events) and draws it with plain canvas.
// Every record of the run comes in order (a page opened late gets the whole history first), so the
// page's state is a pure function of the records: `window.wccl` holds it (tests read it too).
"use strict";

const PALETTE = ["#2f6db5", "#e07b1a", "#2e9e54", "#c9403a", "#7d5ab5", "#8c6d31", "#d45a9e", "#5f7f8f"];
const PHASE_COLOURS = {compute: "#7d5ab5", uplink: "#e07b1a", reduce: "#c9403a", downlink: "#2f6db5",
                       apply: "#2e9e54", guard: "#9aa4ad"};

const wccl = window.wccl = {};

function reset(hello) {
  Object.assign(wccl, {
    hello, runId: hello.run_id, records: 0, started: null, finished: null, end: false,
    stepPeriod: hello.step_period_s,
    nodes: {},           // name -> {roles, colour, phase, step, clock, link...}
    acc: {}, loss: {},   // node -> [{step, t, value}]
    link: {},            // camera node -> [{step, t, goodput, cer, ok, rejected, lost}]
    marks: [],           // {step, kind: "missed" | "recovered", node}
    predictions: null, predictionsFrom: null, events: [],
    arrivals: [],        // [performance.now(), node, step] of every accuracy point, as it arrived
  });
  hello.nodes.forEach((n, i) => {
    wccl.nodes[n.name] = {name: n.name, roles: n.roles, colour: PALETTE[i % PALETTE.length],
                          phase: null, step: null, clock: null, thumb: null, layout: null,
                          phases: (hello.phases || []).map(p => p[0])};
  });
  document.getElementById("steps").textContent = hello.steps;
  buildNodes();
  buildDigits();
  document.getElementById("events").textContent = "";
  for (const id of ["step-now", "accuracy-now", "final-accuracy", "observer-identical"]) {
    document.getElementById(id).textContent = "–";
  }
}

function roomTime(rec) {
  if (rec.t == null) return null;
  return wccl.started ? rec.t - wccl.started.t : rec.t;
}

function push(map, node, point) {
  (map[node] = map[node] || []).push(point);
}

function note(text, kind) {
  wccl.events.push({text, kind});
  const li = document.createElement("li");
  li.textContent = text;
  if (kind) li.className = kind;
  const list = document.getElementById("events");
  list.prepend(li);
  while (list.children.length > 60) list.lastChild.remove();
}

// ---------------------------------------------------------------- records
const HANDLERS = {
  hello(r) { reset(r); },
  run_started(r) {
    wccl.started = r;
    note(`run started: ${r.nodes.join(", ")}, ${r.profile} room, ${r.clock} clock, ${r.steps} steps`);
  },
  schedule_sized(r) {
    wccl.stepPeriod = r.period_s;
    note(`schedule sized: ${r.period_s} s steps (frames through: up ${r.uplink_frames_ok}, down ${r.downlink_frames_ok})`);
  },
  schedule_changed(r) {
    wccl.stepPeriod = r.period_s;
    note(`schedule changed from step ${r.first_step}: ${r.period_s} s steps (was ${r.was_s}), for the layouts in use`);
  },
  snapshot_shown(r) { note(`step ${r.step}: ${r.node} shows a snapshot (${r.applied} updates, ${r.reason})`); },
  snapshot_adopted(r) { note(`${r.node} adopted a snapshot (${r.reason})`, "good"); },
  observer_snapshot_checked(r) {
    note(`${r.node} checked a snapshot after ${r.applied} updates: ${r.identical ? "identical" : "DIFFERENT"}`,
         r.identical ? "good" : "bad");
  },
  dashboard_listening(r) { note(`dashboard at ${r.url}`); },
  tick(r) {
    const n = wccl.nodes[r.node];
    if (!n) return;
    n.phase = r.phase; n.step = r.step;
    if (!n.phases.includes(r.phase)) n.phases.push(r.phase);
    if (r.phase === "compute") {  // the step period, as this node's schedule runs it
      if (n.lastCompute != null && r.start > n.lastCompute) n.period = r.start - n.lastCompute;
      n.lastCompute = r.start;
    }
  },
  step_applied(r) {
    if (r.test_accuracy != null) {
      push(wccl.acc, r.node, {step: r.step, t: roomTime(r), value: r.test_accuracy});
      wccl.arrivals.push([performance.now(), r.node, r.step]);
    }
    if (r.test_loss != null) push(wccl.loss, r.node, {step: r.step, t: roomTime(r), value: r.test_loss});
  },
  observer_step(r) {
    push(wccl.acc, r.node, {step: r.step, t: roomTime(r), value: r.test_accuracy});
    push(wccl.loss, r.node, {step: r.step, t: roomTime(r), value: r.test_loss});
    wccl.arrivals.push([performance.now(), r.node, r.step]);
    wccl.predictions = r.predictions; wccl.predictionsFrom = r.node;
  },
  observer_missed_step(r) {
    wccl.marks.push({step: r.step, kind: "missed", node: r.node});
    note(`${r.node} missed step ${r.missing.join(", ")}: waits for a snapshot`, "bad");
  },
  observer_recovered(r) {
    wccl.marks.push({step: r.applied, kind: "recovered", node: r.node});
    note(`${r.node} recovered from a snapshot after ${r.applied} updates`, "good");
  },
  link_report(r) {
    const rejected = Object.values(r.frames_rejected || {}).reduce((a, b) => a + b, 0);
    push(wccl.link, r.node, {
      i: (wccl.link[r.node] || []).length, t: roomTime(r), ok: r.frames_ok, rejected, lost: 0, tensors: r.tensors,
      goodput: r.seconds > 0 ? r.tensor_bytes / r.seconds : null,
      cer: r.cells_read > 0 ? 100 * r.cells_wrong / r.cells_read : null,
    });
  },
  layout_used(r) {
    const n = wccl.nodes[r.node];
    const text = layoutWords(r);
    if (r.reader) {  // one reader asked for another layout: what this screen shows it from now on
      if (n) n.layout = `${text} to ${r.reader}`;
      note(`${r.node}'s screen to ${r.reader}: ${text} (was ${r.was})`);
      return;
    }
    if (n) n.layout = text;
    note(`${r.node}'s screen: ${text} (${r.measured ? "measured at start-up" : "the room file's"})`);
  },
  layout_asked(r) {
    note(`${r.direction}: asks for ${r.layout} (was ${r.was}: ${r.read} of its captures read)`,
         r.why === "better" ? "good" : "bad");
  },
  screen_lost(r) { note(`${r.direction}: the screen is lost: ${r.problem}`, "bad"); },
  screen_unread(r) { note(`${r.direction}: the screen is seen but not read: ${r.problem}`, "bad"); },
  screen_found_again(r) { note(`${r.direction}: read again after ${r.after_s} s`, "good"); },
  camera_reads_nothing(r) { note(`${r.node}'s camera reads nothing: ${r.problem}`, "bad"); },
  clock_synced(r) {
    const n = wccl.nodes[r.node];
    if (n) n.clock = {offset_s: r.offset_s, drift_ppm: r.drift_ppm, residual_ms: r.residual_ms};
  },
  gradient_missing(r) { note(`step ${r.step}: server missed gradient(s) of ${r.missing.join(", ")}`, "bad"); },
  average_missing(r) { note(`step ${r.step}: ${r.node} never read the average`, "bad"); },
  step_skipped(r) { note(`step ${r.step}: server skipped the step (${r.arrived} of ${r.quorum})`, "bad"); },
  steps_made_up(r) { note(`${r.steps - r.was} skipped step(s) made up: the run now has ${r.steps} steps`); },
  actor_restarted(r) { note(`${r.node}: ${r.actor || "an actor"} restarted (${r.error})`, "bad"); },
  run_finished(r) {
    wccl.finished = r;
    note(`run finished: test accuracy ${r.test_accuracy}, ${r.applied}/${r.steps} steps applied`, "good");
  },
  run_interrupted(r) { wccl.interrupted = r; note("run interrupted", "bad"); },
  run_failed(r) { wccl.failed = r; note(`run failed: ${r.error}`, "bad"); },
  thumb(r) { const n = wccl.nodes[r.node]; if (n) n.thumb = r; },
  end() { wccl.end = true; },
};

function layoutWords(r) {
  return `${r.rows}x${r.cols} cells of ${r.cell_px} px, ${r.colours} colours, frames held ${Math.round(r.hold_s * 1000)} ms`;
}

function handle(rec) {
  if (rec.event !== "hello" && !wccl.hello) return;
  wccl.records += 1;
  const h = HANDLERS[rec.event];
  if (h) h(rec);
  schedule();
}

// ---------------------------------------------------------------- charts
function setup(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return {ctx, w, h};
}

function niceTicks(lo, hi, n) {
  const span = hi - lo || 1;
  const raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(+v.toFixed(10));
  return out;
}

function fmt(v) {
  if (Math.abs(v) >= 10000) return (v / 1000).toFixed(0) + "k";
  if (Math.abs(v) >= 1000) return (v / 1000).toFixed(1) + "k";
  return +v.toFixed(3) + "";
}

// series: [{name, colour, points: [[x, y]]}]; opts: {xMin, xMax, yMin, yMax, marks: [{x, colour}]}
function lineChart(canvas, series, opts) {
  const {ctx, w, h} = setup(canvas);
  const pad = {l: 44, r: 10, t: 20, b: 26};
  const xs = [], ys = [];
  for (const s of series) for (const [x, y] of s.points) { if (y != null) { xs.push(x); ys.push(y); } }
  let xMin = opts.xMin ?? Math.min(0, ...xs), xMax = opts.xMax ?? Math.max(1, ...xs);
  let yMin = opts.yMin ?? (ys.length ? Math.min(...ys) : 0), yMax = opts.yMax ?? (ys.length ? Math.max(...ys) : 1);
  if (xs.length) xMax = Math.max(xMax, ...xs);
  if (yMax - yMin < 1e-9) { yMax += 0.5; yMin -= 0.5; if (opts.yMin === 0) yMin = 0; }
  const X = x => pad.l + (x - xMin) / (xMax - xMin || 1) * (w - pad.l - pad.r);
  const Y = y => h - pad.b - (y - yMin) / (yMax - yMin || 1) * (h - pad.t - pad.b);
  ctx.font = "11px system-ui, sans-serif";
  ctx.strokeStyle = "#e3e7eb"; ctx.fillStyle = "#66717c"; ctx.lineWidth = 1;
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (const v of niceTicks(yMin, yMax, 4)) {
    ctx.beginPath(); ctx.moveTo(pad.l, Y(v) + 0.5); ctx.lineTo(w - pad.r, Y(v) + 0.5); ctx.stroke();
    ctx.fillText(fmt(v), pad.l - 5, Y(v));
  }
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  for (const v of niceTicks(xMin, xMax, 6)) ctx.fillText(fmt(v), X(v), h - pad.b + 5);
  if (opts.xLabel) { ctx.textAlign = "right"; ctx.fillText(opts.xLabel, w - pad.r, h - 12); }
  for (const m of opts.marks || []) {
    ctx.strokeStyle = m.colour; ctx.setLineDash([3, 3]);
    ctx.beginPath(); ctx.moveTo(X(m.x) + 0.5, pad.t); ctx.lineTo(X(m.x) + 0.5, h - pad.b); ctx.stroke();
    ctx.setLineDash([]);
  }
  for (const s of series) {
    ctx.strokeStyle = s.colour; ctx.fillStyle = s.colour; ctx.lineWidth = s.width || 2;
    if (s.dash) ctx.setLineDash(s.dash);
    ctx.beginPath();
    let pen = false;
    for (const [x, y] of s.points) {
      if (y == null) { pen = false; continue; }
      if (pen) ctx.lineTo(X(x), Y(y)); else ctx.moveTo(X(x), Y(y));
      pen = true;
    }
    ctx.stroke(); ctx.setLineDash([]);
    for (const [x, y] of s.points) {
      if (y == null) continue;
      ctx.beginPath(); ctx.arc(X(x), Y(y), s.dot || 2.2, 0, 2 * Math.PI); ctx.fill();
    }
  }
  legend(ctx, series, pad.l, 2);
}

function legend(ctx, series, x, y) {
  ctx.font = "11px system-ui, sans-serif"; ctx.textAlign = "left"; ctx.textBaseline = "top";
  for (const s of series) {
    ctx.fillStyle = s.colour; ctx.fillRect(x, y + 4, 10, 3);
    ctx.fillStyle = "#33404c"; ctx.fillText(s.name, x + 14, y);
    x += 22 + ctx.measureText(s.name).width;
  }
}

// Stacked bars per link report (one a second), one group per camera: read (green), rejected (orange).
function framesChart(canvas) {
  const {ctx, w, h} = setup(canvas);
  const pad = {l: 44, r: 10, t: 22, b: 26};
  const cams = Object.keys(wccl.link);
  const steps = Math.max(1, ...cams.map(c => wccl.link[c].length));
  let top = 1;
  for (const c of cams) for (const p of wccl.link[c]) top = Math.max(top, p.ok + p.rejected + p.lost);
  const groupW = (w - pad.l - pad.r) / steps, barW = Math.max(1, groupW / Math.max(cams.length, 1) - 1);
  const Y = v => h - pad.b - v / top * (h - pad.t - pad.b);
  ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = "#66717c"; ctx.strokeStyle = "#e3e7eb";
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (const v of niceTicks(0, top, 3)) {
    ctx.beginPath(); ctx.moveTo(pad.l, Y(v) + 0.5); ctx.lineTo(w - pad.r, Y(v) + 0.5); ctx.stroke();
    ctx.fillText(fmt(v), pad.l - 5, Y(v));
  }
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  for (const v of niceTicks(0, steps - 1, 6)) ctx.fillText(fmt(v), pad.l + (v + 0.5) * groupW, h - pad.b + 5);
  ctx.textAlign = "right"; ctx.fillText("second", w - pad.r, h - 12);
  cams.forEach((c, i) => {
    for (const p of wccl.link[c]) {
      const x = pad.l + p.i * groupW + i * (barW + 1);
      let base = 0;
      for (const [v, col] of [[p.ok, "#2e9e54"], [p.rejected, "#e0a21a"], [p.lost, "#c9403a"]]) {
        if (!v) continue;
        ctx.fillStyle = col; ctx.fillRect(x, Y(base + v), barW, Y(base) - Y(base + v)); base += v;
      }
    }
  });
  ctx.textAlign = "left"; ctx.textBaseline = "top"; ctx.fillStyle = "#33404c";
  ctx.fillText(cams.length ? "bars left to right: → " + cams.join(", → ") : "no link figures yet", pad.l + 4, 4);
}

function nodeSeries(map, xKey) {
  return Object.keys(wccl.nodes).filter(n => map[n] && map[n].length).map(n => {
    const obs = wccl.nodes[n].roles.includes("observer");
    return {name: obs ? `${n} (observer)` : n, colour: wccl.nodes[n].colour, dash: obs ? [5, 3] : null,
            width: obs ? 2.5 : 2, points: map[n].map(p => [p[xKey], p.value])};
  });
}

function linkSeries(key) {
  return Object.keys(wccl.link).map(n => ({
    name: "→ " + n, colour: wccl.nodes[n] ? wccl.nodes[n].colour : "#888",
    points: wccl.link[n].map(p => [p.step, p[key]]),
  }));
}

function marks() {
  return wccl.marks.map(m => ({x: m.step, colour: m.kind === "missed" ? "#c9403a" : "#2e9e54"}));
}

// ---------------------------------------------------------------- nodes, digits, headline
function buildNodes() {
  const box = document.getElementById("nodes");
  box.textContent = "";
  for (const n of Object.values(wccl.nodes)) {
    const card = document.createElement("article");
    card.className = "node";
    card.id = "node-" + n.name;
    card.innerHTML = `<h3><i class="dot"></i><span class="name"></span> <span class="roles"></span></h3>
      <div class="phase"><div class="bar"></div><span class="where"></span></div>
      <div class="clock"></div>
      <div class="layout"></div>
      <div class="cam"><img alt=""><span class="codes"></span></div>`;
    card.querySelector(".dot").style.background = n.colour;
    card.querySelector(".name").textContent = n.name;
    card.querySelector(".roles").textContent = n.roles.join(" + ");
    card.querySelector("img").alt = `what ${n.name}'s camera sees`;
    box.appendChild(card);
  }
}

function drawNodes() {
  const known = Object.values(wccl.nodes).map(n => n.phases).reduce((a, b) => b.length > a.length ? b : a, []);
  for (const n of Object.values(wccl.nodes)) {
    const card = document.getElementById("node-" + n.name);
    if (!card) continue;
    const phases = n.roles.includes("observer") ? [] : n.phases.length ? n.phases : known;
    const bar = card.querySelector(".bar");
    if (bar.childElementCount !== phases.length) {
      bar.textContent = "";
      for (const p of phases) {
        const seg = document.createElement("span");
        seg.textContent = p; seg.dataset.phase = p; bar.appendChild(seg);
      }
    }
    for (const seg of bar.children) {
      const on = seg.dataset.phase === n.phase;
      seg.classList.toggle("on", on);
      seg.style.background = on ? PHASE_COLOURS[seg.dataset.phase] || "#555" : "";
    }
    const where = card.querySelector(".where");
    if (n.roles.includes("observer")) {
      const a = wccl.acc[n.name];
      where.textContent = a && a.length ? `watching: step ${a[a.length - 1].step} applied` : "watching, no schedule";
    } else {
      where.textContent = n.step == null ? "waiting for step 0" : `step ${n.step} · ${n.phase}`;
    }
    const c = n.clock;
    card.querySelector(".clock").textContent = c
      ? `clock offset ${(c.offset_s * 1000).toFixed(1)} ms · drift ${c.drift_ppm == null ? "–" : c.drift_ppm.toFixed(1)} ppm · residual ${c.residual_ms == null ? "–" : c.residual_ms.toFixed(2)} ms`
      : n.roles.includes("server") ? "clock: the reference (the server's)"
      : n.roles.includes("observer") ? "clock: not needed (no schedule)" : "clock: not synced yet";
    card.querySelector(".layout").textContent = n.layout ? `screen: ${n.layout}`
      : n.roles.includes("observer") ? "screen: shows nothing (watches)" : "screen: choosing its layout";
    if (n.thumb) {
      const img = card.querySelector("img");
      if (img.dataset.v !== String(n.thumb.v)) { img.src = n.thumb.src; img.dataset.v = n.thumb.v; }
      card.querySelector(".codes").textContent = `${n.thumb.codes} code${n.thumb.codes === 1 ? "" : "s"} in view`;
    }
  }
}

function buildDigits() {
  const box = document.getElementById("digits");
  box.textContent = "";
  for (const d of wccl.hello.digits) {
    const fig = document.createElement("figure");
    fig.innerHTML = `<img alt=""><figcaption><span class="pred">?</span><span class="truth"></span></figcaption>`;
    fig.querySelector("img").src = d.src;
    fig.querySelector("img").alt = `digit ${d.label}`;
    fig.querySelector(".truth").textContent = `is ${d.label}`;
    box.appendChild(fig);
  }
}

function drawDigits() {
  const figs = document.getElementById("digits").children;
  const p = wccl.predictions;
  document.getElementById("digits-source").textContent = wccl.predictionsFrom ? `${wccl.predictionsFrom}'s` : "the observer's";
  wccl.hello.digits.forEach((d, i) => {
    const fig = figs[i];
    if (!fig || !p || p[i] == null) return;
    fig.querySelector(".pred").textContent = p[i];
    fig.classList.toggle("right", p[i] === d.label);
    fig.classList.toggle("wrong", p[i] !== d.label);
  });
}

function drawHeadline() {
  const last = (arr) => arr && arr.length ? arr[arr.length - 1] : null;
  const observer = Object.values(wccl.nodes).find(n => n.roles.includes("observer"));
  const who = observer && last(wccl.acc[observer.name]) ? observer.name : wccl.hello.server;
  const a = last(wccl.acc[who]);
  document.getElementById("step-now").textContent = wccl.acc[who] ? wccl.acc[who].length : 0;
  document.getElementById("accuracy-now-label").textContent = `test accuracy (${who})`;
  if (a) document.getElementById("accuracy-now").textContent = a.value.toFixed(3);
  const f = wccl.finished;
  if (f) {
    document.getElementById("final-accuracy").textContent = String(f.test_accuracy);
    const same = f.observer_identical;
    const el = document.getElementById("observer-identical");
    el.textContent = same == null ? "n/a" : same ? "yes" : "no";
    el.className = "big " + (same ? "good" : same === false ? "bad" : "");
  }
  const status = document.getElementById("status");
  if (f) status.textContent = `finished: ${f.applied}/${f.steps} steps in ${f.sim_seconds} s of room time (${f.wall_seconds} s wall)`;
  else if (wccl.interrupted) status.textContent = "interrupted";
  else if (wccl.failed) status.textContent = "failed";
  else if (wccl.started) status.textContent = `running: ${wccl.started.profile} room, ${wccl.started.clock} clock`;
  else status.textContent = "starting";
  if (wccl.end) status.textContent += " · server closed";
}

function draw() {
  pending = false;
  if (!wccl.hello) return;
  const steps = wccl.hello.steps;
  const stepAxis = {xMin: 0, xMax: Math.max(1, steps - 1), xLabel: "step"};
  lineChart(document.getElementById("chart-acc-step"), nodeSeries(wccl.acc, "step"),
            {...stepAxis, yMin: 0, yMax: 1, marks: marks()});
  lineChart(document.getElementById("chart-acc-time"), nodeSeries(wccl.acc, "t"), {yMin: 0, yMax: 1, xLabel: "s"});
  lineChart(document.getElementById("chart-loss-step"), nodeSeries(wccl.loss, "step"), {...stepAxis, yMin: 0, marks: marks()});
  lineChart(document.getElementById("chart-loss-time"), nodeSeries(wccl.loss, "t"), {yMin: 0, xLabel: "s"});
  lineChart(document.getElementById("chart-goodput"), linkSeries("goodput"), {...stepAxis, yMin: 0});
  lineChart(document.getElementById("chart-cer"), linkSeries("cer"), {...stepAxis, yMin: 0});
  framesChart(document.getElementById("chart-frames"));
  drawNodes();
  drawDigits();
  drawHeadline();
}

let pending = false;
function schedule() {
  if (!pending) { pending = true; requestAnimationFrame(draw); }
}
window.addEventListener("resize", schedule);

// ---------------------------------------------------------------- the stream
function connect() {
  const es = new EventSource("/events");
  es.onmessage = (e) => handle(JSON.parse(e.data));
  es.onerror = () => {
    if (wccl.end) { es.close(); return; }
    document.getElementById("status").textContent = "disconnected: retrying…";
  };
  HANDLERS.end = () => { wccl.end = true; es.close(); };
}
connect();
