"use strict";
// The chat page's settings panel (chat.js is the rest of the page, and loads after this file).
// Its fields are the request fields the contract declares, with their defaults and bounds, as
// /chat-ui/settings sends them, narrowed by each model's own server (its max_tokens limit, its stop
// list's), so nothing here names a bound of its own. Each field is checked as it is typed against
// the numbers the server enforces: an invalid one is marked with its bound, is not saved (storage
// keeps its last valid text), and holds back questions until it is fixed. Integers are read and
// sent exactly: a seed goes to 2**64 - 1, past a double's integers.

const chatSettings = (() => {
  const $ = (id) => document.getElementById(id);
  // where the page starts, before the user changes anything: small models stay on track this way
  const PAGE_DEFAULTS = { temperature: "0.2", top_p: "0.9", max_tokens: "256" };
  const SETTINGS_KEY = "llm-stream-chat-settings";
  let fields = [];  // the fields the panel shows, as the server declares them
  let bounds = {};  // each model's own bounds of some fields (max_tokens' limit, the stop list's), by model id
  let kept = {};  // each field's last valid text, the one saved

  function savedSettings() {
    try { return JSON.parse(localStorage.getItem(SETTINGS_KEY)) || {}; } catch { return {}; }
  }
  // a JSON integer past a double's exact ones (the seed's bound, 2**64 - 1) read exactly, from its
  // source text, where the browser passes it (JSON.parse's context argument)
  const exactIntegers = (key, value, context) => (typeof value === "number" && !Number.isSafeInteger(value)
    && context && /^-?\d+$/.test(context.source) ? BigInt(context.source) : value);
  function limitsOf(f) {  // the declared bounds, narrowed by the chosen model's server
    return { ...f, ...((bounds[$("setting-model").value] || {})[f.name] || {}) };
  }
  const lines = (raw) => raw.split("\n").filter((s) => s);
  const big = (x) => (typeof x === "bigint" ? x : BigInt(x));
  function problem(f, text) {  // what is wrong with a setting's text, as the server would say it; "" when nothing
    const raw = text.trim(), b = limitsOf(f);
    if (!raw) return "";  // blank: the server's default
    if (f.type === "list") {
      if (b.max_items !== undefined && lines(raw).length > b.max_items) {
        return `at most ${b.max_items} lines (one sequence a line)`;
      }
      if (b.max_chars !== undefined && lines(raw).some((s) => s.length > b.max_chars)) {
        return `at most ${b.max_chars} characters a line`;
      }
      return "";
    }
    if (f.type === "int" && !/^-?\d+$/.test(raw)) return "must be a whole number";
    if (f.type === "float" && !Number.isFinite(Number(raw))) return "must be a number";
    // integers exactly (a seed goes to 2**64 - 1, past a double's integers), floats as numbers
    const value = f.type === "int" ? BigInt(raw) : Number(raw);
    const bound = (x) => (f.type === "int" ? big(x) : Number(x));
    if (b.ge !== undefined && value < bound(b.ge)) return `must be at least ${b.ge}`;
    if (b.gt !== undefined && value <= bound(b.gt)) return `must be more than ${b.gt}`;
    if (b.le !== undefined && value > bound(b.le)) return `must be at most ${b.le}`;
    if (b.lt !== undefined && value >= bound(b.lt)) return `must be less than ${b.lt}`;
    return "";
  }
  const startText = (f) => {  // where the page starts, unless the server allows less
    const start = PAGE_DEFAULTS[f.name] ?? "";
    return problem(f, start) ? "" : start;
  };
  function checkSetting(f) {  // marks the field: its problem beside it, with the bound; true when it is valid
    const input = $(`setting-${f.name}`), why = problem(f, input.value);
    input.setAttribute("aria-invalid", String(Boolean(why)));
    input.setCustomValidity(why);
    $(`problem-${f.name}`).textContent = why && `${f.name}: ${why}`;
    return !why;
  }
  function save() {  // an invalid field keeps its last valid text in storage
    const saved = { system: $("system-prompt").value, model: $("setting-model").value };
    for (const f of fields) {
      if (checkSetting(f)) kept[f.name] = $(`setting-${f.name}`).value;
      if (kept[f.name] !== undefined) saved[f.name] = kept[f.name];
    }
    localStorage.setItem(SETTINGS_KEY, JSON.stringify(saved));
    $("model").textContent = saved.model;
  }
  function settingInput(f, text) {
    const label = document.createElement("label"), input = document.createElement(f.type === "list" ? "textarea" : "input");
    const why = document.createElement("span");
    why.className = "problem";
    label.title = f.help; label.append(f.name, input, why);
    input.id = `setting-${f.name}`; why.id = `problem-${f.name}`;
    if (f.type === "list") input.placeholder = "one per line";
    else {
      input.type = "text";  // checked here, as typed: a number input would hide what was typed wrong
      input.inputMode = f.type === "int" ? "numeric" : "decimal";
      input.placeholder = f.default === null ? "none" : String(f.default);
    }
    input.value = text;
    return label;
  }
  function build(info, preferred) {  // the panel, from /chat-ui/settings; `preferred`: the model the URL names
    const saved = savedSettings();
    fields = info.fields; bounds = info.bounds || {};
    const select = $("setting-model");
    select.replaceChildren(...info.models.map((id) => new Option(id, id)));
    select.value = preferred || saved.model || info.models[0];
    if (!select.value) select.value = info.models[0];
    $("fields").replaceChildren(...fields.map((f) => settingInput(f, saved[f.name] ?? startText(f))));
    // a saved text the server would refuse (bounds change) stays in view, marked, and leaves storage
    kept = Object.fromEntries(fields.filter((f) => checkSetting(f)).map((f) => [f.name, $(`setting-${f.name}`).value]));
    $("system-prompt").value = saved.system || "";
    save();
  }
  function requestFields() {
    const request = { model: $("setting-model").value || undefined };
    for (const f of fields) {
      const raw = $(`setting-${f.name}`).value.trim();
      if (!raw) continue;  // the server's default
      request[f.name] = f.type === "list" ? lines(raw) : f.type === "int" ? BigInt(raw) : Number(raw);
    }
    if (request.temperature > 0) request.do_sample = true;  // 0: greedy
    return request;
  }
  function messageText(request) {  // JSON, with integers written exactly (JSON.stringify refuses BigInt)
    const exact = Object.entries(request).filter(([, v]) => typeof v === "bigint");
    const text = JSON.stringify(Object.fromEntries(Object.entries(request).filter(([, v]) => typeof v !== "bigint")));
    return exact.length ? text.slice(0, -1) + exact.map(([k, v]) => `,${JSON.stringify(k)}:${v}`).join("") + "}" : text;
  }

  return {
    wire() {  // saved as typed; Defaults puts back where the page starts
      $("settings").addEventListener("input", save);
      $("settings").addEventListener("change", save);
      $("reset-settings").addEventListener("click", () => {
        for (const f of fields) $(`setting-${f.name}`).value = startText(f);
        $("system-prompt").value = "";
        save();
      });
    },
    load(apiKey, preferred) {  // the panel's fields and bounds from the server; settles once it is built
      return fetch("/chat-ui/settings", apiKey ? { headers: { Authorization: `Bearer ${apiKey}` } } : {})
        .then((r) => r.text()).then((text) => build(JSON.parse(text, exactIntegers), preferred));
    },
    invalid() {  // the first field whose text the server would refuse, {name, text}, marked; null if none
      const bad = fields.find((f) => !checkSetting(f));
      return bad ? { name: bad.name, text: $(`problem-${bad.name}`).textContent } : null;
    },
    question: (prompt) => messageText({ prompt, ...requestFields() }),  // a prompt message, as the socket takes it
    model: () => $("setting-model").value,
    system: () => $("system-prompt").value.trim(),
  };
})();
