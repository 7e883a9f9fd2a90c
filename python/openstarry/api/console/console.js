// The openstarry console: chat over POST /process, the bus over GET /events,
// charts from GET /metrics.json. Plain JavaScript, no build step, nothing fetched
// from elsewhere. When the server has an API key (GET /signin answers), the page
// asks for it once; POST /signin trades it for an HttpOnly session cookie that
// every request below then carries by itself, /events included.
"use strict";

const MAX_EVENTS = 2000;       // events kept in the timeline (the oldest go first)
const HISTORY = 60;            // chart points (one per second)
const LANES = ["#ff5c5c", "#ff9f43", "#ffd93d", "#6bcb77", "#4d96ff", "#9b7bff"];
const PALETTE = ["#4d96ff", "#6bcb77", "#ffd93d", "#ff9f43", "#ff5c5c", "#9b7bff", "#3ec1d3", "#f78fb3"];

const $ = (id) => document.getElementById(id);
const session = "console_" + Math.random().toString(36).slice(2, 10);
$("session-label").textContent = "session " + session;

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

// ---------------------------------------------------------------- chat

const chatLog = $("chat-log");
let running = false;

function say(cls, text) {
  const node = el("div", "msg " + cls, text);
  chatLog.appendChild(node);
  chatLog.scrollTop = chatLog.scrollHeight;
  return node;
}

function sseFrames(buffer) {
  // Complete frames of an SSE buffer, and what is left of it.
  const frames = [];
  let cut;
  while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
    const raw = buffer.slice(0, cut);
    buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
    const frame = { id: null, data: [] };
    for (const line of raw.split(/\r?\n/)) {
      if (line.startsWith("id:")) frame.id = line.slice(3).trim();
      else if (line.startsWith("data:")) frame.data.push(line.slice(5).replace(/^ /, ""));
    }
    if (frame.data.length) frames.push(frame);
  }
  return [frames, buffer];
}

class ChatRun {
  constructor(text) {
    this.text = text;
    this.responseId = null;
    this.lastId = null;
    this.done = false;
    this.bubbles = new Map();   // msg_id -> assistant text bubble
    this.kinds = new Map();     // msg_id -> message type
    this.shown = new Set();     // msg_ids of tool calls/results already shown
  }

  async start() {
    const body = {
      input: [{ role: "user", content: [{ type: "text", text: this.text }] }],
      session_id: session,
      stream: true,
    };
    let response = await fetch("/process", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    for (let attempt = 0; ; attempt++) {
      try {
        if (!response.ok) {
          const err = await response.json().catch(() => ({}));
          if (response.status === 401) signedOut();
          say("error", `${response.status} ${err.code || ""}: ${err.message || ""}`);
          return;
        }
        this.responseId = response.headers.get("x-openstarry-response-id") || this.responseId;
        await this.read(response);
        if (this.done) return;
      } catch (exc) {
        if (this.done) return;
      }
      // The connection dropped before the run ended: resume with Last-Event-ID.
      if (!this.responseId || attempt >= 10) {
        say("run-status failed", "connection lost");
        return;
      }
      await new Promise((r) => setTimeout(r, 500 * (attempt + 1)));
      try {
        response = await fetch("/process/" + encodeURIComponent(this.responseId), {
          headers: this.lastId ? { "last-event-id": this.lastId } : {},
        });
      } catch (exc) {
        response = { ok: false, status: 0, json: async () => ({ message: String(exc) }) };
      }
    }
  }

  async read(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let frames;
      [frames, buffer] = sseFrames(buffer);
      for (const frame of frames) {
        if (frame.id) this.lastId = frame.id;
        this.handle(JSON.parse(frame.data.join("\n")));
      }
    }
  }

  bubble(msgId) {
    let node = this.bubbles.get(msgId);
    if (!node) {
      node = say("assistant", "");
      this.bubbles.set(msgId, node);
    }
    return node;
  }

  toolLine(kind, data) {
    if (kind === "function_call") {
      return say("tool-call", `\u2192 ${data.name}(${data.arguments})`);
    }
    return say("tool-result", `\u2190 ${data.name}: ${data.output}`);
  }

  handle(ev) {
    if (ev.object === "response") {
      if (["completed", "failed", "canceled"].includes(ev.status)) {
        this.done = true;
        const why = ev.error ? `: ${ev.error.code} ${ev.error.message}` : "";
        say("run-status " + ev.status, `run ${ev.status}${why}`).dataset.status = ev.status;
      }
      return;
    }
    if (ev.object === "message") {
      this.kinds.set(ev.id, ev.type);
      if (ev.status === "completed" && ev.content && ev.content.length) {
        this.showMessage(ev.id, ev.type, ev.content);
      }
      return;
    }
    if (ev.object === "content") {
      const kind = this.kinds.get(ev.msg_id) || "message";
      if (ev.type === "text" && kind === "message") {
        const node = this.bubble(ev.msg_id);
        if (ev.delta) node.textContent += ev.text || "";
        else if (ev.status === "completed" && typeof ev.text === "string") node.textContent = ev.text;
      } else if (ev.type === "data" && ev.status === "completed" && !ev.delta) {
        this.showMessage(ev.msg_id, kind, [ev]);
      }
    }
  }

  showMessage(msgId, kind, content) {
    if (this.shown.has(msgId)) return;
    if (kind === "function_call" || kind === "function_call_output") {
      this.shown.add(msgId);
      for (const item of content) if (item.data) this.toolLine(kind, item.data);
    } else if (kind === "error") {
      this.shown.add(msgId);
      for (const item of content) {
        const data = item.data || {};
        say("error", `${data.code || "error"}: ${data.message || item.text || ""}`);
      }
    } else if (kind === "message") {
      const text = content.filter((c) => c.type === "text").map((c) => c.text).join("");
      if (text) this.bubble(msgId).textContent = text;
    }
  }
}

$("chat-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const input = $("chat-input");
  const text = input.value.trim();
  if (!text || running) return;
  input.value = "";
  say("user", text);
  running = true;
  try {
    await new ChatRun(text).start();
  } catch (exc) {
    say("error", String(exc));
  } finally {
    running = false;
  }
});

$("stop").addEventListener("click", async () => {
  const r = await fetch("/stop", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ session_id: session }),
  });
  if (r.status === 401) signedOut();
  if (!r.ok) say("error", "/stop: " + r.status);
});

// ---------------------------------------------------------------- timeline

const timeline = $("timeline");
const byId = new Map();
const rows = [];
let selected = null;

for (let p = 0; p < LANES.length; p++) {
  const item = el("span", "", "");
  const lane = el("span", "lane");
  lane.style.background = LANES[p];
  item.appendChild(lane);
  item.appendChild(document.createTextNode("P" + p));
  $("lanes-legend").appendChild(item);
}

function clock(ms) {
  const d = new Date(ms);
  return d.toTimeString().slice(0, 8) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function addEvent(ev) {
  if (byId.has(ev.id)) return;
  byId.set(ev.id, ev);
  const row = el("div", "ev p" + ev.priority);
  row.setAttribute("role", "listitem");
  row.dataset.id = ev.id;
  row.dataset.type = ev.type;
  row.dataset.trace = ev.traceId;
  row.appendChild(el("span", "time", clock(ev.timestamp)));
  row.appendChild(el("span", "prio", "P" + ev.priority));
  row.appendChild(el("span", "type", ev.type));
  row.appendChild(el("span", "session", ev.sessionId));
  row.addEventListener("click", () => select(ev.id));
  const atBottom = timeline.scrollTop + timeline.clientHeight >= timeline.scrollHeight - 4;
  timeline.appendChild(row);
  rows.push(row);
  while (rows.length > MAX_EVENTS) {
    const old = rows.shift();
    byId.delete(old.dataset.id);
    old.remove();
  }
  if (atBottom) timeline.scrollTop = timeline.scrollHeight;
  if (selected && byId.get(selected) && byId.get(selected).traceId === ev.traceId) drawTrace(selected);
}

function select(id) {
  selected = id;
  for (const row of timeline.querySelectorAll(".ev.selected")) row.classList.remove("selected");
  const row = timeline.querySelector(`.ev[data-id="${CSS.escape(id)}"]`);
  if (row) row.classList.add("selected");
  const ev = byId.get(id);
  $("payload").textContent = ev ? JSON.stringify(ev, null, 2) : "";
  drawTrace(id);
}

function drawTrace(id) {
  const ev = byId.get(id);
  const tree = $("trace-tree");
  tree.textContent = "";
  if (!ev) return;
  const members = [...byId.values()].filter((e) => e.traceId === ev.traceId);
  const ids = new Set(members.map((e) => e.id));
  const children = new Map();
  const roots = [];
  for (const e of members) {
    if (e.parentId && ids.has(e.parentId)) {
      if (!children.has(e.parentId)) children.set(e.parentId, []);
      children.get(e.parentId).push(e);
    } else {
      roots.push(e);
    }
  }
  const build = (list) => {
    const ul = el("ul");
    for (const e of list) {
      const li = el("li");
      li.dataset.id = e.id;
      li.dataset.type = e.type;
      const label = el("span", e.id === id ? "selected" : "", `${e.type}  P${e.priority}  ${e.id.slice(0, 8)}`);
      label.addEventListener("click", () => select(e.id));
      li.appendChild(label);
      if (children.has(e.id)) li.appendChild(build(children.get(e.id)));
      ul.appendChild(li);
    }
    return ul;
  };
  tree.appendChild(build(roots));
  tree.dataset.trace = ev.traceId;
}

let bus = null;

function connectBus() {
  if (bus) bus.close();
  const source = new EventSource("/events");   // reconnects itself, with Last-Event-ID
  bus = source;
  const status = $("bus-status");
  source.onopen = () => { status.textContent = "live"; status.className = "status live"; };
  source.onerror = () => {
    status.textContent = "reconnecting";
    status.className = "status down";
    // Refused (a 401 after the sign-in expired): EventSource gives up, so ask why.
    if (source.readyState === EventSource.CLOSED) checkSignIn();
  };
  source.addEventListener("bus", (m) => addEvent(JSON.parse(m.data)));
}

// ---------------------------------------------------------------- charts

const series = { rate: new Map(), depth: new Map(), latency: new Map() };
let previous = null;

function push(group, name, value) {
  let points = series[group].get(name);
  if (!points) { points = []; series[group].set(name, points); }
  points.push(value);
  if (points.length > HISTORY) points.shift();
}

function draw(canvasId, legendId, group) {
  const canvas = $(canvasId);
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 24;
  ctx.clearRect(0, 0, w, h);
  let max = 1;
  for (const points of series[group].values()) for (const v of points) if (v > max) max = v;
  ctx.strokeStyle = "#2a3348";
  ctx.fillStyle = "#8a93a8";
  ctx.font = "10px sans-serif";
  for (let i = 0; i <= 2; i++) {
    const y = h - pad - ((h - 2 * pad) * i) / 2;
    ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w - 4, y); ctx.stroke();
    ctx.fillText(String(Math.round((max * i) / 2 * 10) / 10), 2, y + 3);
  }
  const legend = $(legendId);
  legend.textContent = "";
  let i = 0;
  for (const [name, points] of series[group]) {
    const colour = group === "depth" ? LANES[Number(name.slice(1))] : PALETTE[i % PALETTE.length];
    i++;
    ctx.strokeStyle = colour;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    points.forEach((v, k) => {
      const x = pad + ((w - pad - 4) * (k + HISTORY - points.length)) / (HISTORY - 1);
      const y = h - pad - ((h - 2 * pad) * v) / max;
      if (k === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
    const item = el("span", "", name + " " + (Math.round(points[points.length - 1] * 10) / 10));
    item.style.color = colour;
    legend.appendChild(item);
  }
}

async function poll() {
  if (signingIn) return;
  try {
    const r = await fetch("/metrics.json");
    if (r.status === 401) { signedOut(); return; }
    const m = await r.json();
    $("agent-name").textContent = m.agent || "";
    const dispatched = m.bus.dispatched;
    if (previous) {
      const dt = Math.max(m.time - previous.time, 0.001);
      const names = new Set([...Object.keys(dispatched), ...series.rate.keys()]);
      for (const name of names) {
        push("rate", name, ((dispatched[name] || 0) - (previous.bus.dispatched[name] || 0)) / dt);
      }
    }
    m.bus.depth.forEach((d, p) => push("depth", "P" + p, d));
    push("latency", "p50", m.bus.latency_us.p50 || 0);
    push("latency", "p99", m.bus.latency_us.p99 || 0);
    previous = m;
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
    draw("chart-rate", "legend-rate", "rate");
    draw("chart-depth", "legend-depth", "depth");
    draw("chart-latency", "legend-latency", "latency");
  } catch (exc) {
    // The server is away; the next poll tries again.
  }
}

// ---------------------------------------------------------------- sign-in

let started = false;
let signingIn = false;

function start() {
  connectBus();
  if (started) return;
  started = true;
  poll();
  setInterval(poll, 1000);
}

function showSignIn(message) {
  signingIn = true;
  $("signout").hidden = true;
  $("signin-error").textContent = message || "";
  $("signin").hidden = false;
  $("signin-key").focus();
}

function signedOut() {
  if (signingIn) return;
  if (bus) { bus.close(); bus = null; }
  showSignIn("The sign-in has expired: enter the key again.");
}

async function signInState() {
  // {required, signed_in}; a server without a key has no /signin (404).
  try {
    const r = await fetch("/signin", { cache: "no-store" });
    if (r.ok) return await r.json();
  } catch (exc) {
    // The server is away: carry on as without a key; requests will say more.
  }
  return { required: false, signed_in: true };
}

async function checkSignIn() {
  const state = await signInState();
  if (state.required && !state.signed_in) signedOut();
}

$("signin-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const box = $("signin-key");
  const error = $("signin-error");
  error.textContent = "";
  let r;
  try {
    r = await fetch("/signin", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ key: box.value }),
    });
  } catch (exc) {
    error.textContent = "The server cannot be reached: " + exc;
    return;
  }
  if (r.ok) {
    box.value = "";
    $("signin").hidden = true;
    $("signout").hidden = false;
    signingIn = false;
    start();
    return;
  }
  const err = await r.json().catch(() => ({}));
  error.textContent = r.status === 429
    ? `Too many wrong keys: try again in ${r.headers.get("retry-after") || "a few"} s.`
    : (err.message || `sign-in refused (${r.status})`);
  box.select();
});

$("signout").addEventListener("click", async () => {
  await fetch("/signout", { method: "POST" }).catch(() => null);
  if (bus) { bus.close(); bus = null; }
  showSignIn("");
});

(async () => {
  const state = await signInState();
  if (state.required && !state.signed_in) {
    showSignIn("");
  } else {
    $("signout").hidden = !state.required;
    start();
  }
})();
