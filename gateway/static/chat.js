"use strict";
// The chat page. Conversations are kept in this browser (IndexedDB), each a tree of messages:
// an edit or a regeneration adds a sibling, and the arrows beside a message move between them.
// Each answer is asked over the WebSocket at /chat with its branch's messages (a "history"
// message, then the prompt), so the server holds no state the page depends on; a socket that
// drops mid-answer reconnects and resumes it from the last event received. The conversation shown
// is named in the URL (#/c/<id>), so a reload or a link opens it; a page without one opens an empty
// new chat. New chat, or another conversation, while an answer streams stops that answer first.
// The store and the message tree are chat-store.js's, which loads before this file.
// Settings (chat-settings.js) are checked as typed against the server's bounds; an invalid one
// holds back questions until it is fixed.
// Model output is markdown rendered by marked with its HTML escaped (never parsed), then
// sanitized by DOMPurify: nothing the model writes becomes markup, a script or a request.

const $ = (id) => document.getElementById(id);
const log = $("log"), statusLine = $("status"), promptInput = $("prompt");
const query = new URLSearchParams(location.search);
const apiKey = query.get("api_key");  // with LLM_API_KEY set on the server: /chat-ui?api_key=KEY
const THEME_KEY = "llm-stream-chat-theme";
const MAX_MESSAGES = 199;  // the socket takes 200 at most; the system prompt is one

let conversations = [], current = null, socket = null;
let answer = null;  // the answer being streamed: {conv, node, el, tokens, started, lastId, stopping}
let notKept = null;  // {conv, id}: the new chat opened for a URL naming a conversation this browser lacks

// ----- saving: the store is chat-store.js's -----
function persist(conv) {
  conv.updated = Date.now();
  if (!conversations.includes(conv)) conversations.unshift(conv);
  renderList();
  if (conv === current) showInUrl(false);  // its first message gives it an address
  return store("readwrite", (s) => s.put(conv));
}

// ----- markdown, safely -----
const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
function setUpMarkdown() {
  // the model's HTML is text; a single newline breaks the line, as chat answers mean it
  marked.use({ gfm: true, breaks: true, renderer: { html: (token) => escapeHtml(token.text) } });
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") { node.setAttribute("target", "_blank"); node.setAttribute("rel", "noopener noreferrer"); }
  });
  hljs.configure({ ignoreUnescapedHTML: true });
}
function renderMarkdown(text) {
  const root = document.createElement("div");
  root.className = "markdown";
  // no images, forms or styles: the page fetches nothing the model names
  root.innerHTML = DOMPurify.sanitize(marked.parse(text), {
    FORBID_TAGS: ["img", "style", "form", "input", "button", "iframe", "video", "audio"], FORBID_ATTR: ["style"] });
  for (const code of root.querySelectorAll("pre > code")) {
    hljs.highlightElement(code);
    const copy = button("Copy", "copy-code", () => copyText(code.textContent, copy));
    code.parentElement.append(copy);
  }
  return root;
}
window.renderMarkdown = renderMarkdown;  // for the tests

async function copyText(text, from) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {  // not a secure context (http on another host): the older way
    const area = document.createElement("textarea");
    area.value = text; document.body.append(area); area.select(); document.execCommand("copy"); area.remove();
  }
  from.textContent = "Copied"; from.dataset.copied = "true";
  setTimeout(() => { from.textContent = "Copy"; }, 1500);
}

// ----- the log -----
function button(label, cls, onClick) {
  const b = document.createElement("button");
  b.type = "button"; b.className = cls; b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}
function span(cls, text) {
  const s = document.createElement("span");
  s.className = cls; s.textContent = text;
  return s;
}
function thoughts(text, open) {  // a reasoning model's thoughts, folded apart (open while it still thinks)
  const box = document.createElement("details"), title = document.createElement("summary"), body = document.createElement("div");
  box.className = "thinking"; box.open = open; title.textContent = "Thinking"; body.textContent = text;
  box.append(title, body);
  return box;
}
function metaText(meta) {
  if (!meta) return "";
  const parts = [`${meta.tokens ?? 0} tokens`];
  if (meta.rate) parts.push(`${meta.rate} tokens/s`);
  if (meta.cached) parts.push(`${meta.cached} cached`);
  parts.push(meta.finish);
  return parts.join(" · ");
}
function fill(el, node) {
  const content = el.querySelector(".content");
  if (node.role === "user") {
    content.textContent = node.content;
  } else {
    const streaming = answer && answer.node === node;
    content.replaceChildren(...(node.reasoning ? [thoughts(node.reasoning, streaming && !node.content)] : []),
                            renderMarkdown(node.content), ...(node.error ? [span("error", node.error)] : []));
    el.dataset.text = node.content;
    if (node.meta) el.dataset.finish = node.meta.finish;
    el.querySelector(".meta").textContent = metaText(node.meta);
  }
}
function messageElement(conv, node) {
  const el = document.createElement("div"), content = document.createElement("div"), tools = document.createElement("div");
  el.className = `message ${node.role}`; el.dataset.id = node.id;
  content.className = "content"; tools.className = "tools";
  const family = siblings(conv, node);
  if (family.length > 1) {
    const at = family.indexOf(node.id);
    const go = (step) => () => { if (!answer) { conv.leaf = deepest(conv, family[at + step]); renderLog(); persist(conv); } };
    const prev = button("‹", "branch-prev", go(-1)), next = button("›", "branch-next", go(1));
    prev.disabled = at === 0; next.disabled = at === family.length - 1;
    tools.append(prev, span("branch", `${at + 1}/${family.length}`), next);
  }
  if (node.role === "user") {
    tools.append(button("Edit", "edit", () => startEdit(conv, node, el)));
  } else {
    tools.append(button("Regenerate", "regenerate", () => { if (ready()) ask(conv, conv.nodes[node.parent]); }),
                 button("Copy", "copy", (e) => copyText(node.content, e.target)), span("meta", ""));
  }
  el.append(content, tools);
  fill(el, node);
  return el;
}
function emptyState() {  // a conversation without messages: what to do, rather than a blank pane
  const box = document.createElement("div"), line = (text) => {
    const p = document.createElement("p");
    p.textContent = text;
    return p;
  };
  box.id = "empty";
  box.append(line(`Ask ${chatSettings.model() || "the model"} something.`),
             line("Enter sends, Shift+Enter starts a new line."), line("Conversations stay in this browser."));
  box.firstChild.className = "ask";
  if (notKept && notKept.conv === current) box.prepend(line(`No conversation "${notKept.id}" is kept in this browser.`));
  return box;
}
function renderLog() {
  log.replaceChildren(...(current && current.leaf ? chain(current, current.leaf).map((n) => messageElement(current, n))
                                                   : [emptyState()]));
  log.scrollTop = log.scrollHeight;
  if (answer && answer.conv === current) answer.el = log.querySelector(`[data-id="${answer.node.id}"]`);
}
function startEdit(conv, node, el) {
  if (answer) return;
  const box = document.createElement("textarea");
  box.className = "edit-box"; box.value = node.content;
  const save = button("Save & send", "save-edit", () => {
    if (box.value.trim() && ready()) ask(conv, addNode(conv, node.parent, "user", box.value));
  });
  el.querySelector(".content").replaceChildren(box);
  el.querySelector(".tools").replaceChildren(save, button("Cancel", "cancel-edit", renderLog));
  box.focus();
}

// ----- the conversation list -----
function renderList() {
  const wanted = $("search").value.trim().toLowerCase();
  const found = conversations.filter((c) => !wanted || c.title.toLowerCase().includes(wanted)
    || Object.values(c.nodes).some((n) => n.content.toLowerCase().includes(wanted)));
  $("conversations").replaceChildren(...found.map((conv) => {
    const li = document.createElement("li");
    li.className = "conversation"; li.dataset.id = conv.id;
    li.setAttribute("aria-current", String(conv === current));
    li.append(button(conv.title, "open", () => openConversation(conv)),
      button("✎", "rename", () => {
        const title = prompt("Rename the conversation", conv.title);
        if (title && title.trim()) { conv.title = title.trim(); persist(conv); }
      }),
      button("✕", "delete", async () => {
        if (answer || !confirm(`Delete "${conv.title}"?`)) return;
        conversations = conversations.filter((c) => c !== conv);
        await store("readwrite", (s) => s.delete(conv.id));
        if (conv === current) openConversation(newConversation(), false); else renderList();
      }));
    li.querySelector(".rename").setAttribute("aria-label", "rename");
    li.querySelector(".delete").setAttribute("aria-label", "delete");
    return li;
  }));
}
// ----- the URL names the conversation shown: #/c/<id> -----
function routedId() {
  const found = /^#\/c\/(.+)$/.exec(location.hash);
  return found ? decodeURIComponent(found[1]) : null;
}
function showInUrl(push) {  // a conversation not yet saved (no message) has no address
  const saved = conversations.includes(current);
  const url = saved ? `#/c/${encodeURIComponent(current.id)}` : location.pathname + location.search;
  if ((saved ? current.id : null) === routedId()) return;
  if (push) history.pushState(null, "", url); else history.replaceState(null, "", url);
}
function openConversation(conv, push = true) {
  if (conv === current) return;
  stopAnswer();  // the answer goes on being recorded in its own conversation until its end
  current = conv;
  document.body.classList.remove("menu-open");
  renderLog(); renderList(); showInUrl(push);
}
function openRouted() {  // the conversation the URL names, else a new one (which says so, if one was named)
  const id = routedId(), found = conversations.find((c) => c.id === id);
  const conv = found || newConversation();
  notKept = id && !found ? { conv, id } : null;
  openConversation(conv, false);
}

// ----- a question: whether it can go now, and its branch's messages -----
function ready() {  // whether a question can go now; if a setting is invalid, says which and shows it
  if (!socket || socket.readyState !== WebSocket.OPEN || answer) return false;
  const bad = chatSettings.invalid();
  if (!bad) return true;
  statusLine.textContent = `not sent: ${bad.text} (Settings)`;
  showSettings(true);
  $(`setting-${bad.name}`).focus();
  return false;
}
function branchMessages(conv, upTo) {
  const messages = chain(conv, upTo).filter((n) => n.role === "user" || !n.error)
    .map((n) => ({ role: n.role, content: n.content })).slice(-MAX_MESSAGES);
  const system = chatSettings.system();
  return system ? [{ role: "system", content: system }, ...messages] : messages;
}

// ----- asking, streaming -----
function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  document.body.dataset.state = busy ? "generating" : "idle";
}
function ask(conv, user) {  // callers check ready() before they add the question
  if (conv.title === "New chat") conv.title = user.content.trim().split("\n")[0].slice(0, 48);
  const node = addNode(conv, user.id, "assistant", "");
  answer = { conv, node, el: null, tokens: 0, started: 0, lastId: null, stopping: false };
  socket.send(JSON.stringify({ type: "history", messages: branchMessages(conv, user.parent) }));
  socket.send(chatSettings.question(user.content));
  setBusy(true);
  renderLog();
  persist(conv);
}
function stopAnswer() {  // as Stop does: the answer ends "cancelled" when its end event comes
  if (!answer || answer.stopping) return;
  answer.stopping = true;
  if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "stop" }));
  else onEnd({ finish_reason: "cancelled", generated_tokens: answer.tokens });  // no socket: ends here, not resumed
}
function rate(a) {
  const seconds = (performance.now() - a.started) / 1000;
  return a.tokens > 1 && seconds > 0 ? ((a.tokens - 1) / seconds).toFixed(1) : "";
}
function onToken(msg) {
  if (!answer) return;
  if (!answer.tokens) answer.started = performance.now();  // the rate counts from the first token
  answer.tokens += msg.token_ids.length;
  answer.lastId = msg.id;  // a socket that drops goes on from here
  answer.node.content += msg.text;
  answer.node.reasoning += msg.reasoning || "";
  if (answer.el) fill(answer.el, answer.node);
  if (answer.conv === current) log.scrollTop = log.scrollHeight;
  statusLine.textContent = `generating… ${answer.tokens} tokens ${rate(answer) ? rate(answer) + " tokens/s" : ""}`;
}
function onEnd(msg) {
  if (!answer) return setBusy(false);
  const { node, conv } = answer, speed = rate(answer);
  node.meta = { finish: msg.finish_reason, tokens: msg.generated_tokens, cached: msg.cached_tokens, rate: speed };
  answer = null;
  renderLog();
  persist(conv);
  statusLine.textContent = `done: ${msg.finish_reason}, ${msg.generated_tokens} tokens` + (speed ? `, ${speed} tokens/s` : "");
  setBusy(false);
}
function onError(msg) {
  const text = `error (${msg.error_type}): ${msg.error}`;
  if (answer) {
    const { node, conv } = answer;
    node.error = text; node.meta = { finish: "error", tokens: answer.tokens };
    answer = null;
    renderLog();
    persist(conv);
  } else {
    log.append(span("error", text));
  }
  statusLine.textContent = "error";
  setBusy(false);
}
function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  socket = new WebSocket(`${scheme}://${location.host}/chat` + (apiKey ? `?api_key=${encodeURIComponent(apiKey)}` : ""));
  socket.onopen = () => {
    statusLine.textContent = "connected";
    if (answer && answer.lastId) {  // the socket dropped mid-answer: the rest of it, from the last event
      socket.send(JSON.stringify({ type: "resume", last_event_id: answer.lastId }));
      setBusy(true);
    } else {
      if (answer) onError({ error_type: "connection", error: "the connection dropped before the answer began" });
      setBusy(false);
    }
  };
  socket.onclose = () => {
    statusLine.textContent = "disconnected: reconnecting…";
    $("send").disabled = true; $("stop").disabled = true;
    setTimeout(connect, 1000);
  };
  socket.onmessage = (event) => {
    const msg = JSON.parse(event.data);
    if (msg.type === "token") onToken(msg);
    else if (msg.type === "end") onEnd(msg);
    else if (msg.type === "error") onError(msg);
  };
}

// ----- the controls -----
function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
  $("hl-dark").disabled = theme !== "dark";
  $("hl-light").disabled = theme === "dark";
}
function showSettings(shown) {
  $("settings").hidden = !shown;
  $("settings-toggle").setAttribute("aria-expanded", String(shown));
}
function wire() {
  $("form").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = promptInput.value;
    if (!text.trim() || !ready()) return;
    promptInput.value = "";
    ask(current, addNode(current, current.leaf, "user", text));
  });
  promptInput.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); $("form").requestSubmit(); }
  });
  $("stop").addEventListener("click", stopAnswer);
  $("new-chat").addEventListener("click", () => openConversation(newConversation()));
  $("search").addEventListener("input", renderList);
  $("menu").addEventListener("click", () => document.body.classList.toggle("menu-open"));
  $("settings-toggle").addEventListener("click", () => showSettings($("settings").hidden));
  chatSettings.wire();
  $("theme").addEventListener("click", () => {
    const theme = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
    localStorage.setItem(THEME_KEY, theme);
    applyTheme(theme);
  });
  $("export").addEventListener("click", () => {
    const blob = new Blob([JSON.stringify({ format: "llm-stream-chat", conversations }, null, 1)], { type: "application/json" });
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob); link.download = "conversations.json"; link.click();
    URL.revokeObjectURL(link.href);
  });
  $("import").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", async (event) => {
    const file = event.target.files[0];
    if (!file) return;
    try {
      const data = JSON.parse(await file.text());
      const found = (data.conversations || []).filter((c) => c && c.id && c.nodes && Array.isArray(c.roots));
      for (const conv of found) {
        conversations = conversations.filter((c) => c.id !== conv.id);
        await persist(conv);
      }
      statusLine.textContent = `imported ${found.length} conversations`;
    } catch (error) {
      statusLine.textContent = `import: ${error.message}`;
    }
    event.target.value = "";
  });
}

async function start() {
  applyTheme(localStorage.getItem(THEME_KEY) || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light"));
  setUpMarkdown();
  wire();
  database = await openDatabase();
  conversations = (await store("readonly", (s) => s.getAll())).sort((a, b) => b.updated - a.updated);
  openRouted();
  addEventListener("hashchange", openRouted);  // the back button, or a link to another conversation
  chatSettings.load(apiKey, query.get("model")).then(() => { if (!current.leaf) renderLog(); })  // it names the model
    .catch(() => {});
  connect();
}
start();
