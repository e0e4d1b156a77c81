// agenthost's page: plain JS, no build step. The token comes from the
// address's fragment (never sent to the server) and is kept for the tab.
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "agenthost.token";

let token = "";
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

async function refreshRooms() {
  let data;
  try {
    data = await api("GET", "/v1/rooms");
  } catch (e) {
    return;
  }
  const ul = $("rooms");
  ul.replaceChildren();
  for (const r of data.rooms) {
    const li = el("li");
    const b = el("button", "room-link", r.id);
    b.type = "button";
    if (current && current.id === r.id) b.setAttribute("aria-current", "true");
    const waiting = r.approvals.length + r.questions.length;
    if (r.turn) b.append(el("span", "badge", "busy"));
    if (waiting) b.append(el("span", "badge warn", waiting + " waiting"));
    b.addEventListener("click", () => openRoom(r.id));
    li.append(b);
    ul.append(li);
  }
  if (!data.rooms.length) ul.append(el("li", "note", "No rooms yet."));
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
  current = { id, lastSeq: 0, abort: new AbortController(), turn: null, kick: null, turns: new Map(), tools: new Map(), lastTurn: "" };
  history.replaceState(null, "", "#room=" + encodeURIComponent(id));
  $("room").hidden = false;
  $("room-title").textContent = "Room " + id;
  $("log").replaceChildren();
  $("approvals").replaceChildren();
  $("questions").replaceChildren();
  $("room-note").hidden = true;
  updatePending();
  setTurn(null);
  stream(current);
  refreshRooms();
}

// stream follows the room's events for as long as it is open, resuming
// after the last seq it applied: a reconnect (a cut, a server restart)
// neither loses nor repeats an event.
async function stream(rm) {
  let delay = 500;
  while (!rm.abort.signal.aborted) {
    let connected = false;
    try {
      setStatus("connecting", rm.lastSeq ? "reconnecting…" : "connecting…");
      const res = await fetch(roomPath(rm.id) + "/events", {
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
      connected = true;
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

function note(text) {
  $("log").append(el("li", "msg system", text));
}

function scroll() {
  const log = $("log");
  log.lastElementChild && log.lastElementChild.scrollIntoView({ block: "nearest" });
}

function apply(rm, type, ev) {
  switch (type) {
    case "message.accepted": {
      const li = el("li", "msg user");
      li.dataset.message = ev.message_id;
      li.append(el("span", "who", ev.sender || "you"), el("div", "text", ev.text));
      $("log").append(li);
      break;
    }
    case "turn.started":
      turnBubble(rm, ev.turn_id);
      setTurn(ev.turn_id);
      break;
    case "text.delta": {
      const t = bubbleFor(rm, ev.turn_id);
      // A late delta of an ended turn: its final text already has it.
      if (!ev.turn_id && t.li.dataset.outcome) break;
      t.body.append(ev.text);
      t.li.dataset.deltas = String(Number(t.li.dataset.deltas || 0) + 1);
      break;
    }
    case "tool.started": {
      const t = bubbleFor(rm, ev.turn_id);
      const d = el("details", "tool running");
      const s = el("summary", "", ev.tool + " …");
      d.append(s);
      if (ev.input) d.append(el("pre", "input", typeof ev.input === "string" ? ev.input : JSON.stringify(ev.input)));
      t.tools.append(d);
      rm.tools.set(ev.call_id, { d, s });
      break;
    }
    case "tool.ended": {
      let tl = rm.tools.get(ev.call_id);
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
    case "approval.requested":
      addApproval(rm, ev);
      roomsSoon();
      break;
    case "approval.resolved": {
      const li = $("approvals").querySelector('[data-id="' + CSS.escape(ev.approval_id) + '"]');
      if (li) li.remove();
      note("approval " + (ev.decision === "allow" ? "allowed" : "denied") + " by " + ev.by);
      break;
    }
    case "question.asked":
      addQuestion(rm, ev);
      break;
    case "question.answered": {
      const li = $("questions").querySelector('[data-id="' + CSS.escape(ev.question_id) + '"]');
      if (li) li.remove();
      note(ev.cancelled ? "question withdrawn" : "answered: " + ev.answer);
      break;
    }
    case "turn.ended": {
      const t = turnBubble(rm, ev.turn_id);
      // The final text is authoritative (deltas may be partial).
      if (ev.text) t.body.textContent = ev.text;
      t.li.dataset.outcome = ev.outcome;
      t.outcome.textContent = ev.outcome === "settled" ? "" : ev.outcome + (ev.reason ? ": " + ev.reason : "");
      if (rm.turn === ev.turn_id) setTurn(null);
      roomsSoon();
      break;
    }
    case "context.lost":
      note("the agent lost its earlier context" + (ev.reason ? ": " + ev.reason : ""));
      break;
    default:
      return;
  }
  updatePending();
  scroll();
}

function setTurn(id) {
  if (current) current.turn = id;
  $("cancel").disabled = !id;
}

function updatePending() {
  $("pending").hidden = !$("approvals").children.length && !$("questions").children.length;
}

function addApproval(rm, ev) {
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
  li.append(row, err);
  $("approvals").append(li);
}

function addQuestion(rm, ev) {
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
  for (const opt of ev.options || []) {
    const b = el("button", "", opt);
    b.type = "button";
    b.addEventListener("click", () => send(opt));
    row.append(b);
  }
  const form = el("form", "row");
  const inputID = "qa-" + ev.question_id;
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
  li.append(row, form, err);
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
  $("send-form").addEventListener("submit", sendMessage);
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
  refreshRooms();
  if (room) openRoom(room);
}

start();
