// agenthost's page: plain JS, no build step. The token comes from the
// address's fragment (never sent to the server) and is kept for the tab.
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "agenthost.token";

let token = "";
// can are a room token's permissions (GET /v1/token); null for the admin
// token, which may do everything.
let can = null;
let current = null; // the open room: {id, lastSeq, abort, turn, kick}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function setStatus(state, text) {
  const s = $("status");
  s.dataset.state = state;
  s.textContent = text;
}

// readFragment takes token= and room= from the fragment, keeps the token
// in sessionStorage and leaves only the room in the address bar.
function readFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  const t = params.get("token");
  if (t) {
    sessionStorage.setItem(TOKEN_KEY, t);
  }
  token = sessionStorage.getItem(TOKEN_KEY) || "";
  const room = params.get("room");
  history.replaceState(null, "", location.pathname + location.search + (room ? "#room=" + encodeURIComponent(room) : ""));
  return room;
}

// may says whether the token may do perm: the page hides the buttons it
// cannot use (the server refuses them anyway).
function may(perm) {
  return can === null || can.includes(perm);
}

// loadScope reads the token's scope and hides what it cannot use.
async function loadScope() {
  try {
    const me = await api("GET", "/v1/token");
    can = me.admin ? null : me.can;
  } catch (_) {
    can = null; // an older server: everything shows, as before
  }
  $("send-form").hidden = !may("send");
  $("config-save").hidden = !may("configure");
  document.body.dataset.scope = can === null ? "admin" : can.join(" ");
}

class APIError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(method, path, body) {
  const init = { method, headers: { Authorization: "Bearer " + token } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  let data = null;
  try {
    data = await res.json();
  } catch (_) {
    data = null;
  }
  if (!res.ok) {
    if (res.status === 401) showLogin();
    throw new APIError(res.status, (data && data.error) || res.status + " " + res.statusText);
  }
  return data;
}

function roomPath(id) {
  return "/v1/rooms/" + encodeURIComponent(id);
}

// ---- rooms list

// The list shows rooms a page at a time, in order of id: "More rooms"
// reads the next page; a refresh reads again as many as are shown.
const ROOMS_PAGE = 100;
let roomsShown = ROOMS_PAGE;
let roomsNext = "";

function roomItem(r) {
  const li = el("li");
  const b = el("button", "room-link");
  b.append(el("span", "name", r.id));
  b.dataset.room = r.id;
  b.type = "button";
  if (current && current.id === r.id) b.setAttribute("aria-current", "true");
  const waiting = r.approvals.length + r.questions.length;
  if (r.turn) b.append(el("span", "badge", "busy"));
  if (waiting) b.append(el("span", "badge warn", waiting + " waiting"));
  if (r.usage && tokensOf(r.usage) > 0) b.append(el("span", "usage", usageShort(r.usage)));
  b.addEventListener("click", () => openRoom(r.id));
  li.append(b);
  return li;
}

// ---- usage: what the agents reported their turns cost

function tokensOf(u) {
  return u.input_tokens + u.output_tokens + u.cache_read_tokens + u.cache_write_tokens;
}

function dollars(x) {
  return "$" + (x >= 0.01 ? x.toFixed(2) : x.toPrecision(2));
}

function usageShort(u) {
  return tokensOf(u).toLocaleString("en-US") + " tokens" + (u.cost_usd > 0 ? " · " + dollars(u.cost_usd) : "");
}

function usageLong(u) {
  return usageShort(u) + " (input " + u.input_tokens + ", output " + u.output_tokens + ", cache read " +
    u.cache_read_tokens + ", cache write " + u.cache_write_tokens + ")";
}

// ---- compute: what the room's processes used, measured by its groups

function bytesShort(n) {
  const units = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  for (const [name, size] of units) {
    if (n >= size) return (n / size).toFixed(n % size === 0 ? 0 : 1) + " " + name;
  }
  return n + " bytes";
}

// sizeExact writes a size the server reads back to the same bytes.
function sizeExact(n) {
  for (const [unit, size] of [["T", 2 ** 40], ["G", 2 ** 30], ["M", 2 ** 20], ["K", 2 ** 10]]) {
    if (n >= size && n % size === 0) return n / size + unit;
  }
  return String(n);
}

function computeShort(c) {
  return c.cpu_seconds.toFixed(c.cpu_seconds >= 10 ? 0 : 2) + " s CPU · " + bytesShort(c.peak_memory_bytes) + " peak · " +
    c.processes + (c.processes === 1 ? " process" : " processes");
}

function hasCompute(c) {
  return c && (c.cpu_seconds > 0 || c.peak_memory_bytes > 0 || c.processes > 0);
}

// showUsage shows the room's totals: from its state, then each turn.ended
// newer than what is shown (rm.usageSeq).
function showUsage(rm) {
  const p = $("room-usage");
  p.hidden = false;
  p.textContent = rm.turnCount + (rm.turnCount === 1 ? " turn" : " turns") + ", " + usageLong(rm.usage) +
    (hasCompute(rm.compute) ? "; " + computeShort(rm.compute) : "");
}

function addUsage(rm, ev) {
  if (!rm.usage || ev.seq <= rm.usageSeq) return;
  rm.usageSeq = ev.seq;
  rm.turnCount++;
  if (ev.usage) {
    for (const k of ["input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost_usd"]) rm.usage[k] += ev.usage[k];
  }
  if (ev.compute) {
    rm.compute.cpu_seconds += ev.compute.cpu_seconds;
    rm.compute.processes += ev.compute.processes;
    rm.compute.peak_memory_bytes = Math.max(rm.compute.peak_memory_bytes, ev.compute.peak_memory_bytes);
  }
  showUsage(rm);
}

function showRoomsMore(shown, total) {
  const more = $("more-rooms");
  more.hidden = !roomsNext;
  more.textContent = "More rooms (" + shown + " of " + total + ")";
}

async function refreshRooms() {
  let data;
  try {
    data = await api("GET", "/v1/rooms?limit=" + Math.min(roomsShown, 1000));
  } catch (e) {
    if (!current) setStatus("down", "cannot reach the server: " + e.message);
    return;
  }
  // Before a room is opened the list is what the page is connected for.
  if (!current) setStatus("live", "connected: open a room");
  const ul = $("rooms");
  ul.replaceChildren();
  for (const r of data.rooms) ul.append(roomItem(r));
  if (!data.rooms.length) ul.append(el("li", "note", "No rooms yet."));
  roomsNext = data.next || "";
  showRoomsMore(data.rooms.length, data.total);
}

async function moreRooms() {
  if (!roomsNext) return;
  let data;
  try {
    data = await api("GET", "/v1/rooms?limit=" + ROOMS_PAGE + "&after=" + encodeURIComponent(roomsNext));
  } catch (e) {
    return;
  }
  const ul = $("rooms");
  for (const r of data.rooms) ul.append(roomItem(r));
  roomsShown = ul.querySelectorAll(".room-link").length;
  roomsNext = data.next || "";
  showRoomsMore(roomsShown, data.total);
}

// roomsSoon refreshes the list once after a burst of events (a replay
// would otherwise fetch it once per turn).
let roomsTimer = 0;
function roomsSoon() {
  clearTimeout(roomsTimer);
  roomsTimer = setTimeout(refreshRooms, 300);
}

// ---- a room

function openRoom(id) {
  if (current) current.abort.abort();
  current = { id, lastSeq: 0, abort: new AbortController(), turn: null, kick: null, turns: new Map(), msgs: new Set(), tools: new Map(), lastTurn: "", confSeq: 0 };
  history.replaceState(null, "", "#room=" + encodeURIComponent(id));
  $("room").hidden = false;
  $("room-title").textContent = "Room " + id;
  $("room-usage").hidden = true;
  loadConfig(current);
  $("log").replaceChildren();
  $("approvals").replaceChildren();
  $("questions").replaceChildren();
  $("room-note").hidden = true;
  showConfinement(null);
  updatePending();
  setTurn(null);
  const rm = current;
  // A history that failed half-way leaves the rest to the stream (what
  // it shows twice is applied once).
  loadHistory(rm)
    .catch(() => {})
    .then(() => stream(rm));
  refreshRooms();
}

// loadHistory shows the room's conversation from its records (messages,
// turns with their final text, what waits for an answer) rather than by
// replaying its event log, whose text deltas made a long room's page take
// a minute. The stream then starts after the last event the records cover,
// or, while a turn runs, after its message: its deltas, tool calls and
// approvals are in the log only. Events the records already show are
// applied idempotently. A room the server does not know yet (or a failed
// read) leaves the whole log to the stream.
async function loadHistory(rm) {
  let st;
  try {
    st = await api("GET", roomPath(rm.id));
  } catch (_) {
    // The stream replays the whole log: its turn.ended events add up.
    if (rm === current && !rm.usage) Object.assign(rm, { usage: { input_tokens: 0, output_tokens: 0, cache_read_tokens: 0, cache_write_tokens: 0, cost_usd: 0 },
      compute: { cpu_seconds: 0, peak_memory_bytes: 0, processes: 0 }, turnCount: 0, usageSeq: 0 });
    return;
  }
  if (rm !== current) return;
  // The stream asks for this incarnation: one of a room purged and
  // created again starts with a reset (and the page starts over).
  rm.incarnation = st.incarnation || "";
  if (st.last_seq >= rm.confSeq) {
    rm.confSeq = st.last_seq;
    showConfinement(st.confinement);
  }
  if (st.usage && !rm.usage) {
    rm.usage = Object.assign({}, st.usage);
    rm.compute = Object.assign({ cpu_seconds: 0, peak_memory_bytes: 0, processes: 0 }, st.compute);
    rm.turnCount = st.turns;
    rm.usageSeq = st.last_seq;
    showUsage(rm);
  }
  const msgs = [];
  const turns = [];
  try {
    for (let after = 0; ; ) {
      const page = (await api("GET", roomPath(rm.id) + "/messages?limit=1000&after=" + after)).messages;
      msgs.push(...page);
      if (page.length < 1000) break;
      after = page[page.length - 1].seq;
    }
    const seqOf = new Map(msgs.map((m) => [m.id, m.seq]));
    for (let after = 0; ; ) {
      const page = (await api("GET", roomPath(rm.id) + "/turns?limit=1000&after=" + after)).turns;
      turns.push(...page);
      if (page.length < 1000 || !seqOf.has(page[page.length - 1].message_id)) break;
      after = seqOf.get(page[page.length - 1].message_id);
    }
  } catch (_) {
    return; // the stream replays the whole log
  }
  if (rm !== current) return;
  // A message accepted after the room's state was read, and its turn,
  // come with the stream (their events are after st.last_seq).
  const byMessage = new Map();
  for (const t of turns) {
    if (!byMessage.has(t.message_id)) byMessage.set(t.message_id, []);
    byMessage.get(t.message_id).push(t);
  }
  let from = st.last_seq;
  for (const m of msgs) {
    showMessage(rm, m.id, m.sender, m.text);
    for (const t of byMessage.get(m.id) || []) {
      const b = turnBubble(rm, t.id);
      if (t.outcome) {
        b.recorded = true;
        endTurn(b, t);
        // Its record has no counts: the summary is read with the diff.
        showChanges(rm, b, { turn_id: t.id, changes: "unread" });
      } else {
        from = Math.min(from, m.seq);
      }
    }
  }
  for (const a of st.approvals) addApproval(rm, { approval_id: a.id, tool: a.tool, input: a.input });
  for (const q of st.questions) addQuestion(rm, { question_id: q.id, title: q.title, options: q.options });
  rm.lastSeq = from;
  updatePending();
  scroll();
}

// ---- a room's settings (GET and PUT .../config)

const CONFIG_TEXT = ["agent", "model", "thinking", "approval_mode", "turn_timeout", "approval_timeout", "question_timeout", "idle_after", "instructions"];
const CONFIG_BUDGET = ["tokens", "cost_usd", "turns"];

// loadConfig fills the settings form from the room's effective settings
// (a room the server does not know yet shows the form empty).
async function loadConfig(rm) {
  $("config-error").textContent = "";
  $("config-status").textContent = "";
  let c;
  try {
    c = await api("GET", roomPath(rm.id) + "/config");
  } catch (e) {
    if (e.status !== 404) $("config-error").textContent = e.message;
    return;
  }
  if (rm !== current) return;
  showConfig(c);
}

function showConfig(c) {
  for (const k of CONFIG_TEXT) $("cfg-" + k).value = c[k] || "";
  // The limits in force: 0 is none (the field left empty takes the
  // server's default, which may be a limit).
  for (const k of CONFIG_BUDGET) $("cfg-budget-" + k).value = c.budget && k in c.budget ? String(c.budget[k]) : "";
  $("cfg-mcp").value = c.mcp && Object.keys(c.mcp).length ? JSON.stringify(c.mcp) : "";
  const res = c.resources || {};
  $("cfg-res-memory").value = res.memory ? sizeExact(res.memory) : "";
  $("cfg-res-pids").value = res.pids || "";
  $("cfg-res-cpu").value = res.cpu || "";
  $("cfg-ws-git").value = c.workspace ? c.workspace.git : "";
  $("cfg-ws-ref").value = c.workspace ? c.workspace.ref : "";
  $("config-status").textContent = c.next_start && c.next_start.length ? "At the agent's next start: " + c.next_start.join(", ") + "." : "";
}

async function saveConfig(e) {
  e.preventDefault();
  const rm = current;
  if (!rm) return;
  $("config-error").textContent = "";
  const body = { budget: {} };
  for (const k of CONFIG_TEXT) {
    const v = $("cfg-" + k).value.trim();
    if (v) body[k] = v;
  }
  for (const k of CONFIG_BUDGET) {
    const v = $("cfg-budget-" + k).value;
    if (v !== "") body.budget[k] = Number(v);
  }
  // Sizes as the form shows them ("4G", or bytes); the server reads them.
  const mem = $("cfg-res-memory").value.trim();
  body.resources = { memory: mem === "" ? 0 : /^[0-9]+$/.test(mem) ? Number(mem) : mem,
    pids: Number($("cfg-res-pids").value || 0), cpu: Number($("cfg-res-cpu").value || 0) };
  const git = $("cfg-ws-git").value.trim();
  if (git) body.workspace = { git, ref: $("cfg-ws-ref").value.trim() };
  const mcp = $("cfg-mcp").value.trim();
  if (mcp) {
    try {
      body.mcp = JSON.parse(mcp);
    } catch (_) {
      $("config-error").textContent = "MCP servers: not valid JSON";
      return;
    }
  }
  try {
    const c = await api("PUT", roomPath(rm.id) + "/config", body);
    if (rm !== current) return;
    showConfig(c);
    $("config-status").textContent = "Saved." + ($("config-status").textContent ? " " + $("config-status").textContent : "");
    refreshRooms();
  } catch (err) {
    $("config-error").textContent = err.message;
  }
}

// showConfinement says what confines the room's agent: the room's state
// (the resident agent's, else the next one's), or an agent.started newer
// than that state (rm.confSeq: the seq of what is shown).
function showConfinement(c) {
  const p = $("room-confinement");
  p.hidden = !c;
  if (!c) return;
  p.dataset.mode = c.mode;
  if (c.mode === "landlock") {
    const net = c.net === "any" ? "any network" : "TCP to port" + (c.net.length === 1 ? " " : "s ") + c.net.join(", ") + " only";
    p.textContent = "Confined (Landlock ABI " + c.abi + "): the agent reaches only this room's workspace, its home and temporary folder; " +
      (c.signals ? "it signals only its own processes; " : "") + net + ".";
  } else {
    p.textContent = "Not confined: this room's agent can reach whatever the server's user can.";
  }
}

// stream follows the room's events for as long as it is open, resuming
// after the last seq it applied: a reconnect (a cut, a server restart)
// neither loses nor repeats an event.
async function stream(rm) {
  let delay = 500;
  while (!rm.abort.signal.aborted) {
    let connected = false;
    try {
      setStatus("connecting", rm.streamed ? "reconnecting…" : "connecting…");
      const q = rm.incarnation ? "?incarnation=" + encodeURIComponent(rm.incarnation) : "";
      const res = await fetch(roomPath(rm.id) + "/events" + q, {
        headers: { Authorization: "Bearer " + token, "Last-Event-ID": String(rm.lastSeq), Accept: "text/event-stream" },
        signal: rm.abort.signal,
        cache: "no-store",
      });
      if (res.status === 404) {
        // Not created yet: the first message creates it.
        setStatus("live", "new room: send a message to start it");
        $("room-note").textContent = "This room has no messages yet.";
        $("room-note").hidden = false;
        await waitKick(rm, 5000);
        continue;
      }
      if (res.status === 401) {
        showLogin();
        return;
      }
      if (!res.ok || !res.body) throw new Error("events: " + res.status);
      if (!rm.incarnation) rm.incarnation = res.headers.get("Room-Incarnation") || "";
      connected = rm.streamed = true;
      $("room-note").hidden = true;
      const n = Number(document.body.dataset.connects || 0) + 1;
      document.body.dataset.connects = String(n);
      setStatus("live", "connected");
      delay = 500;
      await readSSE(res.body, rm);
    } catch (e) {
      if (rm.abort.signal.aborted) return;
    }
    if (rm.abort.signal.aborted) return;
    setStatus("down", "disconnected: reconnecting…");
    await waitKick(rm, connected ? 200 : delay);
    delay = Math.min(delay * 2, 5000);
  }
}

// waitKick waits ms, or less if a send kicks the stream.
function waitKick(rm, ms) {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      rm.kick = null;
      resolve();
    }
    rm.kick = done;
    rm.abort.signal.addEventListener("abort", done, { once: true });
  });
}

// readSSE parses a Server-Sent Events body (fetch, not EventSource, since
// EventSource cannot send the Authorization header).
async function readSSE(body, rm) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  let data = [];
  let type = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.search(/\r\n|\r|\n/)) >= 0) {
        // A lone \r at the end may be half of \r\n: wait for more.
        if (buf[i] === "\r" && i === buf.length - 1) break;
        const line = buf.slice(0, i);
        buf = buf.slice(i + (buf[i] === "\r" && buf[i + 1] === "\n" ? 2 : 1));
        if (line === "") {
          if (data.length) dispatch(rm, type, data.join("\n"));
          data = [];
          type = "";
          continue;
        }
        if (line[0] === ":") continue; // heartbeat
        const c = line.indexOf(":");
        const field = c < 0 ? line : line.slice(0, c);
        let val = c < 0 ? "" : line.slice(c + 1);
        if (val[0] === " ") val = val.slice(1);
        if (field === "data") data.push(val);
        else if (field === "event") type = val;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

function dispatch(rm, type, raw) {
  if (rm !== current) return;
  let ev;
  try {
    ev = JSON.parse(raw);
  } catch (_) {
    return;
  }
  if (type === "reset") {
    // The room was purged (and maybe created again): what the page shows
    // is of the old room. Start over.
    openRoom(rm.id);
    return;
  }
  if (typeof ev.seq !== "number" || ev.seq <= rm.lastSeq) return; // already applied
  rm.lastSeq = ev.seq;
  apply(rm, ev.type || type, ev);
}

// ---- rendering events

function turnBubble(rm, turnID) {
  let t = rm.turns.get(turnID);
  if (!t) {
    const li = el("li", "msg assistant");
    li.dataset.turn = turnID;
    li.append(el("span", "who", "agent"));
    const body = el("div", "text");
    const tools = el("div", "tools");
    const outcome = el("p", "outcome");
    li.append(tools, body, outcome);
    $("log").append(li);
    t = { li, body, tools, outcome };
    rm.turns.set(turnID, t);
  }
  if (turnID) rm.lastTurn = turnID;
  return t;
}

// bubbleFor is the bubble of an agent event; one without a turn (the
// agent spoke after its turn ended) goes with the last turn.
function bubbleFor(rm, turnID) {
  if (!turnID && rm.lastTurn) return rm.turns.get(rm.lastTurn);
  return turnBubble(rm, turnID);
}

// endTurn shows a turn's end, from its turn.ended event or its record.
function endTurn(t, end) {
  // The final text is authoritative (deltas may be partial).
  if (end.text) t.body.textContent = end.text;
  t.li.dataset.outcome = end.outcome;
  t.outcome.textContent = end.outcome === "settled" ? "" : end.outcome + (end.reason ? ": " + end.reason : "");
  const spent = end.usage && tokensOf(end.usage) > 0;
  if ((spent || hasCompute(end.compute)) && !t.usage) {
    const parts = [];
    if (spent) parts.push(usageShort(end.usage));
    if (hasCompute(end.compute)) parts.push(computeShort(end.compute));
    t.usage = el("p", "turn-usage", parts.join(" · "));
    t.li.append(t.usage);
  }
}

// showMessage shows a user's message once, from its record or its
// message.accepted event.
function showMessage(rm, id, sender, text) {
  if (rm.msgs.has(id)) return;
  rm.msgs.add(id);
  const li = el("li", "msg user");
  li.dataset.message = id;
  li.append(el("span", "who", sender || "you"), el("div", "text", text));
  $("log").append(li);
}

function note(text) {
  $("log").append(el("li", "msg system", text));
}

function scroll() {
  const log = $("log");
  log.lastElementChild && log.lastElementChild.scrollIntoView({ block: "nearest" });
}

function apply(rm, type, ev) {
  switch (type) {
    case EV.MessageAccepted:
      showMessage(rm, ev.message_id, ev.sender, ev.text);
      break;
    case EV.TurnStarted:
      // A replayed start of a turn whose record shows it ended.
      if (!turnBubble(rm, ev.turn_id).li.dataset.outcome) setTurn(ev.turn_id);
      break;
    case EV.TextDelta: {
      const t = bubbleFor(rm, ev.turn_id);
      // A delta of an ended turn (a late one, or one the stream replays
      // after the turn's record): its final text already has it.
      if (t.li.dataset.outcome) break;
      t.body.append(ev.text);
      t.li.dataset.deltas = String(Number(t.li.dataset.deltas || 0) + 1);
      break;
    }
    case EV.ToolStarted: {
      const t = bubbleFor(rm, ev.turn_id);
      // A turn shown from its record shows its answer, not the part of
      // its tool calls the stream happens to replay.
      if (t.recorded) break;
      const d = el("details", "tool running");
      const s = el("summary", "", ev.tool + " …");
      d.append(s);
      if (ev.input) d.append(el("pre", "input", typeof ev.input === "string" ? ev.input : JSON.stringify(ev.input)));
      t.tools.append(d);
      rm.tools.set(ev.call_id, { d, s });
      break;
    }
    case EV.ToolEnded: {
      let tl = rm.tools.get(ev.call_id);
      if (!tl && bubbleFor(rm, ev.turn_id).recorded) break;
      if (!tl) {
        const d = el("details", "tool");
        const s = el("summary");
        d.append(s);
        bubbleFor(rm, ev.turn_id).tools.append(d);
        tl = { d, s };
      }
      tl.d.className = "tool " + (ev.is_error ? "failed" : "done");
      tl.s.textContent = ev.tool + (ev.is_error ? " failed" : " done");
      if (ev.output) tl.d.append(el("pre", "output", ev.output));
      break;
    }
    case EV.ApprovalRequested:
      addApproval(rm, ev);
      roomsSoon();
      break;
    case EV.ApprovalResolved: {
      const li = $("approvals").querySelector('[data-id="' + CSS.escape(ev.approval_id) + '"]');
      if (li) li.remove();
      note("approval " + (ev.decision === "allow" ? "allowed" : "denied") + " by " + ev.by);
      break;
    }
    case EV.QuestionAsked:
      addQuestion(rm, ev);
      break;
    case EV.QuestionAnswered: {
      const li = $("questions").querySelector('[data-id="' + CSS.escape(ev.question_id) + '"]');
      if (li) li.remove();
      note(ev.cancelled ? "question withdrawn" : "answered: " + ev.answer);
      break;
    }
    case EV.TurnEnded: {
      const t = turnBubble(rm, ev.turn_id);
      endTurn(t, ev);
      showChanges(rm, t, ev);
      addUsage(rm, ev);
      if (rm.turn === ev.turn_id) setTurn(null);
      roomsSoon();
      break;
    }
    case EV.AgentStarted:
      if (ev.confinement && ev.seq > rm.confSeq) {
        rm.confSeq = ev.seq;
        showConfinement(ev.confinement);
      }
      break;
    case EV.WorkspaceReady:
      note("workspace checked out: " + ev.url + " at " + ev.ref + " (" + ev.commit.slice(0, 12) + ")");
      break;
    case EV.RoomLimit:
      note(ev.limit === "memory"
        ? "the room's memory limit (" + bytesShort(ev.value) + ") was reached: " + ev.count + (ev.count === 1 ? " process" : " processes") + " killed" + (ev.agent_killed ? ", the agent among them" : "")
        : "the room's process limit (" + ev.value + ") was reached: " + ev.count + (ev.count === 1 ? " fork" : " forks") + " refused" + (ev.agent_killed ? ", and the agent ended" : ""));
      break;
    case EV.BudgetExhausted:
      note("the room's budget is exhausted (" + ev.limit + "): raise it in Settings to go on");
      break;
    case EV.WorkspaceReverted:
      note("workspace reverted to before turn " + ev.turn_id + " (" + ev.count + " file(s) restored)");
      break;
    case EV.SettingsChanged:
      if (ev.fields.length) note("settings changed: " + ev.fields.join(", ") + (ev.token ? " (by " + (ev.token.label || ev.token.id) + ")" : ""));
      break;
    case EV.ContextLost:
      note("the agent lost its earlier context" + (ev.reason ? ": " + ev.reason : ""));
      break;
    default:
      return;
  }
  updatePending();
  scroll();
}

// showChanges puts what a turn changed in the workspace under its answer:
// a collapsed summary whose diff is fetched when opened, and a Revert
// button that asks first.
function showChanges(rm, t, ev) {
  if (!("changes" in ev) || t.li.querySelector(".changes")) return;
  if (!ev.changes) {
    t.li.append(el("p", "changes note", "changes unknown" + (ev.changes_error ? ": " + ev.changes_error : "")));
    return;
  }
  const c = ev.changes;
  const unread = c === "unread"; // a turn shown from its record
  if (!unread && !c.files) return;
  const count = (c) => c.files + " file(s) changed, +" + c.insertions + " −" + c.deletions;
  const d = el("details", "changes");
  d.dataset.turn = ev.turn_id;
  const summary = el("summary", "", unread ? "changes" : count(c));
  d.append(summary);
  const body = el("div");
  const err = el("p", "error");
  err.setAttribute("role", "alert");
  const revert = el("button", "revert", "Revert");
  revert.type = "button";
  revert.title = "Restore the workspace to its state before this turn (later turns' changes go too)";
  revert.addEventListener("click", async () => {
    if (!confirm("Revert the workspace to its state before this turn? Changes made since, by this turn and later ones, are lost.")) return;
    revert.disabled = true;
    err.textContent = "";
    try {
      await api("POST", roomPath(rm.id) + "/turns/" + encodeURIComponent(ev.turn_id) + "/revert");
    } catch (e) {
      err.textContent = e.message;
    }
    revert.disabled = false;
  });
  revert.hidden = !may("configure");
  d.append(body, revert, err);
  let loaded = false;
  d.addEventListener("toggle", async () => {
    if (!d.open || loaded) return;
    loaded = true;
    try {
      const diff = await api("GET", roomPath(rm.id) + "/turns/" + encodeURIComponent(ev.turn_id) + "/diff");
      if (unread) {
        summary.textContent = count(diff.changes);
        revert.hidden = !diff.changes.files || !may("configure");
      }
      const files = el("ul", "files");
      for (const f of diff.files) {
        files.append(el("li", "file " + f.status, f.status + " " + f.path + (f.binary ? " (binary)" : " +" + f.insertions + " −" + f.deletions)));
      }
      const patch = el("pre", "patch");
      for (const line of diff.patch.split("\n")) {
        let cls = "";
        if (line.startsWith("+") && !line.startsWith("+++")) cls = "add";
        else if (line.startsWith("-") && !line.startsWith("---")) cls = "del";
        patch.append(el("span", cls, line + "\n"));
      }
      body.append(files, patch);
      if (diff.truncated) body.append(el("p", "note", "the diff was cut at the server's bound"));
      // Opened at the log's end, the diff would land below its fold:
      // bring what was opened into view (the log scrolls, then the page).
      d.scrollIntoView({ block: "nearest" });
    } catch (e) {
      loaded = false;
      err.textContent = e.message;
    }
  });
  t.li.append(d);
}

function setTurn(id) {
  if (current) current.turn = id;
  $("cancel").disabled = !id;
}

function updatePending() {
  $("pending").hidden = !$("approvals").children.length && !$("questions").children.length;
}

function addApproval(rm, ev) {
  if ($("approvals").querySelector('[data-id="' + CSS.escape(ev.approval_id) + '"]')) return; // shown from the room's state
  const li = el("li", "approval");
  li.dataset.id = ev.approval_id;
  const label = el("p", "", "Allow " + ev.tool + "?");
  label.id = "ap-" + ev.approval_id;
  li.append(label);
  if (ev.input) li.append(el("pre", "input", typeof ev.input === "string" ? ev.input : JSON.stringify(ev.input)));
  const row = el("div", "row");
  row.setAttribute("role", "group");
  row.setAttribute("aria-labelledby", label.id);
  for (const decision of ["allow", "deny"]) {
    const b = el("button", decision, decision === "allow" ? "Allow" : "Deny");
    b.type = "button";
    b.dataset.decision = decision;
    b.addEventListener("click", async () => {
      row.querySelectorAll("button").forEach((x) => (x.disabled = true));
      try {
        await api("POST", roomPath(rm.id) + "/approvals/" + encodeURIComponent(ev.approval_id), { decision });
      } catch (e) {
        if (e.status !== 409) row.querySelectorAll("button").forEach((x) => (x.disabled = false));
        err.textContent = e.message;
      }
    });
    row.append(b);
  }
  const err = el("p", "error");
  err.setAttribute("role", "alert");
  if (may("approve")) li.append(row, err);
  else li.append(el("p", "note", "waiting for someone who may decide"));
  $("approvals").append(li);
}

// OTHER_OPTION is omp's option for an answer of one's own.
const OTHER_OPTION = /^Other \(type your own\)$/;

function addQuestion(rm, ev) {
  if ($("questions").querySelector('[data-id="' + CSS.escape(ev.question_id) + '"]')) return; // shown from the room's state
  const li = el("li", "question");
  li.dataset.id = ev.question_id;
  const title = el("p", "", ev.title || "The agent asks");
  title.id = "q-" + ev.question_id;
  li.append(title);
  const err = el("p", "error");
  err.setAttribute("role", "alert");
  const send = async (answer) => {
    li.querySelectorAll("button").forEach((x) => (x.disabled = true));
    try {
      await api("POST", roomPath(rm.id) + "/questions/" + encodeURIComponent(ev.question_id), { answer });
    } catch (e) {
      if (e.status !== 409) li.querySelectorAll("button").forEach((x) => (x.disabled = false));
      err.textContent = e.message;
    }
  };
  const row = el("div", "row");
  row.setAttribute("role", "group");
  row.setAttribute("aria-labelledby", title.id);
  const inputID = "qa-" + ev.question_id;
  for (const opt of ev.options || []) {
    const b = el("button", "", opt);
    b.type = "button";
    // omp's own "Other (type your own)": answered, it asks again in its
    // terminal's words; the answer box below takes the person's own words.
    if (OTHER_OPTION.test(opt)) b.addEventListener("click", () => $(inputID).focus());
    else b.addEventListener("click", () => send(opt));
    row.append(b);
  }
  const form = el("form", "row");
  const lab = el("label", "", "Your answer");
  lab.htmlFor = inputID;
  const input = el("input");
  input.id = inputID;
  input.required = true;
  input.autocomplete = "off";
  const b = el("button", "", "Answer");
  b.type = "submit";
  form.append(lab, input, b);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    send(input.value);
  });
  if (may("approve")) li.append(row, form, err);
  else li.append(el("p", "note", "waiting for someone who may answer"));
  $("questions").append(li);
}

// ---- forms

async function sendMessage(e) {
  e.preventDefault();
  if (!current) return;
  const box = $("message");
  const text = box.value;
  if (!text.trim()) return;
  $("send").disabled = true;
  $("send-error").textContent = "";
  try {
    await api("POST", roomPath(current.id) + "/messages", { text });
    box.value = "";
    if (current.kick) current.kick(); // a new room now exists
    refreshRooms();
  } catch (err) {
    $("send-error").textContent = "Not sent: " + err.message;
  } finally {
    $("send").disabled = false;
  }
}

async function cancelTurn() {
  if (!current) return;
  try {
    await api("POST", roomPath(current.id) + "/cancel");
  } catch (err) {
    $("send-error").textContent = "Cancel: " + err.message;
  }
}

function showLogin() {
  $("login").hidden = false;
  setStatus("down", "token needed");
}

function start() {
  const room = readFragment();
  $("open-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = $("open-id").value.trim();
    if (id) openRoom(id);
  });
  $("refresh-rooms").addEventListener("click", refreshRooms);
  $("more-rooms").addEventListener("click", moreRooms);
  $("send-form").addEventListener("submit", sendMessage);
  $("config-form").addEventListener("submit", saveConfig);
  // Read again on opening: the room may have been made since it was shown.
  $("room-config").addEventListener("toggle", () => {
    if ($("room-config").open && current) loadConfig(current);
  });
  $("message").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("send-form").requestSubmit();
  });
  $("cancel").addEventListener("click", cancelTurn);
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    location.reload();
  });
  if (!token) {
    showLogin();
    return;
  }
  loadScope().then(() => {
    refreshRooms();
    if (room) openRoom(room);
  });
}

start();
