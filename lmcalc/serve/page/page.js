// lmcalc's page: reads the fields, asks the server (which answers from the Python API), and lays out the answers.
// It computes no figure: every number shown is the server's, and a bar's height is its bytes over the chart's scale.
"use strict";

const DEBOUNCE_MS = 120;
const CHART_PX = 240;
// A part's colour by its key, the same in every chart (a stage's bar sums the model states into one part).
const COLOURS = {
  params: "#3b6ea5", grads: "#6f9fd8", grads_at_peak: "#6f9fd8", master: "#9cc3e6", optimizer: "#c7ddf2",
  states: "#24507f", activations: "#e07b39", framework_buffers: "#f2b134", transient: "#8cbf5f",
  fragmentation: "#b07cc6", context: "#d9d9d9", overhead: "#7f7f7f",
};
const OTHER_COLOUR = "#555";

function colourOf(part) { return COLOURS[part.key] || OTHER_COLOUR; }
const COMMON = ["model", "gpus", "precision", "optimizer", "framework", "method", "seq", "tokens",
  "price_per_gpu_hour"];
const LORA = ["lora_rank", "lora_targets"];
const LAYOUT = ["micro_batch", "tp", "pp", "cp", "ep", "dp", "etp", "zero", "hsdp", "recompute", "sequence_parallel",
  "grad_accum", "mfu"];
const PLAN = ["global_batch"];

const form = document.getElementById("inputs");
const page = { answers: {}, pending: 0, controllers: {}, config: null, timer: null };
window.lmcalcPage = page;  // what the tests read: the answers shown and how many are on their way

// ------------------------------------------------------------------------------------------------ the fields

function field(name) { return form.elements.namedItem(name); }

function fieldValue(name) {
  const input = field(name);
  if (input === null) return "";
  if (input instanceof RadioNodeList) return input.value;
  if (input.type === "checkbox") return input.checked ? "true" : "false";
  return input.value.trim();
}

function mode() { return fieldValue("mode") || "layout"; }

function gpus() { return `${fieldValue("gpu_count") || "1"}x${fieldValue("gpu_type")}`; }

// Each field's value, as the URL and the server take it ("gpus" is made of two).
function state() {
  const found = {};
  for (const input of form.elements) {
    if (!input.name) continue;
    found[input.name] = fieldValue(input.name);
  }
  return found;
}

// The fields a command is asked with: those shown for the mode, the LoRA ones for a LoRA method.
function fieldsFor(command) {
  const names = [...COMMON, ...(mode() === "plan" ? PLAN : LAYOUT)];
  if (["lora", "qlora"].includes(fieldValue("method"))) names.push(...LORA);
  const fields = {};
  for (const name of names) {
    const value = name === "gpus" ? gpus() : fieldValue(name);
    if (value !== "") fields[name] = value;
  }
  if (command === "max-params") {
    fields.like = fields.model;
    delete fields.model;
  }
  if (command === "memory-stages") fields.stages = "true";
  return fields;
}

function questions() {
  const asked = mode() === "plan" ? ["plan", "max-params"] : ["memory", "train-time", "fit", "max-params"];
  if (mode() === "layout" && Number(fieldValue("pp")) > 1) asked.splice(1, 0, "memory-stages");
  return asked;
}

// ------------------------------------------------------------------------------------------- the URL's state

function isDefault(input) {
  if (input.type === "checkbox" || input.type === "radio") return input.checked === input.defaultChecked;
  if (input.tagName === "SELECT") return input.selectedIndex === defaultIndex(input);
  return input.value === input.defaultValue;
}

function defaultIndex(select) {
  const chosen = [...select.options].findIndex((o) => o.defaultSelected);
  return chosen < 0 ? 0 : chosen;
}

function writeUrl() {
  const params = new URLSearchParams();
  for (const input of form.elements) {
    if (!input.name || isDefault(input)) continue;
    if (input.type === "radio" && !input.checked) continue;
    params.set(input.name, fieldValue(input.name));
  }
  const query = params.toString();
  history.replaceState(null, "", query ? `?${query}` : location.pathname);
}

function readUrl() {
  const params = new URLSearchParams(location.search);
  for (const [name, value] of params) {
    const input = field(name);
    if (input === null) continue;
    if (input instanceof RadioNodeList) input.value = value;
    else if (input.type === "checkbox") input.checked = value === "true";
    else input.value = value;
  }
}

// ----------------------------------------------------------------------------------------------- asking

function scheduleUpdate() {
  clearTimeout(page.timer);
  page.timer = setTimeout(update, DEBOUNCE_MS);
}

function update() {
  showMode();
  writeUrl();
  for (const slot of document.querySelectorAll(".error")) slot.textContent = "";
  for (const controller of Object.values(page.controllers)) controller.abort();
  page.controllers = {};
  page.answers = {};
  const asked = questions();
  renderCommands(asked);
  if (!asked.includes("memory-stages")) {
    document.getElementById("chart-stages").replaceChildren();
    document.getElementById("stages-legend").replaceChildren();
  }
  for (const command of asked) ask(command);
}

async function ask(command) {
  const controller = new AbortController();
  page.controllers[command] = controller;
  page.pending += 1;
  document.body.dataset.busy = "1";
  const body = { command: command === "memory-stages" ? "memory" : command, fields: fieldsFor(command) };
  if (page.config !== null) body.config = page.config;
  try {
    const response = await fetch("/api/answer", {
      method: "POST", body: JSON.stringify(body), signal: controller.signal,
      headers: { "Content-Type": "application/json" },
    });
    const found = await readAnswer(response, command);
    if (controller.signal.aborted) return;
    if (found.error !== undefined) showError(command, found);
    else show(command, found);
  } catch (error) {
    if (error.name !== "AbortError") showError(command, { error: `no answer: ${error.message}` });
  } finally {
    page.pending -= 1;
    if (page.pending === 0) document.body.dataset.busy = "0";
  }
}

// An answer, or a plan's lines: how far the search has gone, then the answer.
async function readAnswer(response, command) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let last = null;
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    const lines = buffer.split("\n");
    buffer = done ? "" : lines.pop();
    for (const line of lines.filter((l) => l.trim())) {
      const message = JSON.parse(line);
      if (message.progress !== undefined && message.json === undefined) showProgress(command, message);
      else last = message;
    }
    if (done) break;
  }
  return last || { error: `empty answer (HTTP ${response.status})` };
}

function showProgress(command, message) {
  if (command !== "plan") return;
  const bar = document.getElementById("plan-progress");
  bar.hidden = false;
  bar.value = message.progress;
  card("plan").querySelector(".headline").textContent = message.waiting
    ? "waiting for another search to end…"
    : `searching: ${message.layouts.toLocaleString()} layouts so far…`;
}

// ----------------------------------------------------------------------------------------------- showing

function card(command) { return document.getElementById(`card-${command}`); }

function showError(command, found) {
  const slot = found.field && document.querySelector(`.error[data-for="${CSS.escape(found.field)}"]`);
  if (slot) slot.textContent = found.error;
  const shown = card(command === "memory-stages" ? "memory" : command);
  if (shown === null) return;
  shown.classList.add("failed");
  shown.querySelector(".headline").textContent = found.error;
  if (command === "memory") {
    document.getElementById("verdict").textContent = "";
    document.getElementById("chart-memory").replaceChildren();
  }
  if (command === "plan") document.getElementById("plan-progress").hidden = true;
  const line = document.querySelector(`#command-list [data-command="${command}"] code`);
  if (line) line.textContent = "(no answer: see the error)";
}

function show(command, found) {
  page.answers[command] = found;
  const line = document.querySelector(`#command-list [data-command="${command}"] code`);
  if (line) line.textContent = found.command;
  if (command === "memory-stages") {
    drawBars(document.getElementById("chart-stages"), found.view.bars, "stage");
    const states = found.view.bars[0].parts.find((part) => part.key === "states");
    if (states) document.getElementById("stages-legend").replaceChildren(legendItem({ ...states, text: "" }));
    return;
  }
  const shown = card(command);
  shown.classList.remove("failed");
  shown.querySelector(".headline").textContent = found.view.headline.join(" ");
  if (command === "memory") {
    const verdict = document.getElementById("verdict");
    verdict.textContent = found.view.verdict;
    verdict.className = `verdict ${found.view.verdict.replaceAll(" ", "-")}`;
    drawBars(document.getElementById("chart-memory"), found.view.bars, "gpu");
    drawLegend(found.view.bars[0].parts);
  }
  if (command === "plan") {
    document.getElementById("plan-progress").hidden = true;
    drawGrid(found.view);
    return;
  }
  drawFigures(shown.querySelector(".figures"), found.view);
}

function figureButton(term) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "figure";
  button.textContent = term.text;
  button.dataset.key = term.key;
  button.dataset.value = term.value;
  button.title = derivation(term).join("\n");
  button.addEventListener("click", () => openWork(term));
  return button;
}

function derivation(term) {
  const lines = [];
  if (term.formula) lines.push(`= ${term.formula}`);
  if (term.substituted && term.substituted !== term.formula && term.substituted !== term.text) {
    lines.push(`= ${term.substituted}`);
  }
  lines.push(`= ${term.text}`);
  if (term.source) lines.push(`source: ${term.source}`);
  if (term.note) lines.push(`note: ${term.note}`);
  return lines;
}

function openWork(term) {
  const work = document.getElementById("work");
  document.getElementById("work-label").textContent = term.label;
  document.getElementById("work-lines").textContent = derivation(term).join("\n");
  work.hidden = false;
}

function drawFigures(where, view) {
  const parts = [];
  for (const section of view.sections) {
    const block = document.createElement("div");
    block.className = "section";
    const title = document.createElement("h3");
    title.textContent = section.title;
    const list = document.createElement("dl");
    for (const term of section.terms) {
      const label = document.createElement("dt");
      label.textContent = term.label;
      const value = document.createElement("dd");
      value.append(figureButton(term));
      list.append(label, value);
    }
    block.append(title, list);
    parts.push(block);
  }
  if (view.notes.length) {
    const notes = document.createElement("ul");
    notes.className = "notes";
    for (const note of view.notes) {
      const item = document.createElement("li");
      item.textContent = note;
      notes.append(item);
    }
    parts.push(notes);
  }
  where.replaceChildren(...parts);
}

// Stacked columns, one per row of the answer, against the GPU's capacity: each part's height is its bytes over
// the chart's scale (the larger of the capacity and the tallest column).
function drawBars(chart, bars, kind) {
  const capacity = bars[0].capacity;
  const totals = bars.map((bar) => bar.parts.reduce((sum, part) => sum + part.value, 0));
  const scale = Math.max(capacity, ...totals) * 1.05;
  const columns = bars.map((bar, index) => {
    const column = document.createElement("div");
    column.className = `column ${kind}`;
    column.dataset.total = totals[index];
    const stack = document.createElement("div");
    stack.className = "stack";
    stack.style.height = `${CHART_PX}px`;
    bar.parts.forEach((part) => {
      const segment = figureButton(part);
      segment.className = "segment";
      segment.textContent = "";
      segment.dataset.bytes = part.value;
      segment.style.height = `${(part.value / scale) * CHART_PX}px`;
      segment.style.background = colourOf(part);
      segment.title = `${part.label}: ${part.text}\n${segment.title}`;
      segment.setAttribute("aria-label", `${part.label}: ${part.text}`);
      stack.append(segment);
    });
    const caption = document.createElement("div");
    caption.className = "caption";
    caption.textContent = bar.label;
    column.append(stack, caption);
    return column;
  });
  const line = document.createElement("div");
  line.className = "capacity";
  line.dataset.bytes = capacity;
  line.style.bottom = `${(capacity / scale) * CHART_PX + 22}px`;
  line.textContent = `capacity ${(capacity / 1e9).toFixed(1)} GB`;
  chart.replaceChildren(...columns, line);
}

function drawLegend(parts) {
  document.getElementById("legend").replaceChildren(...parts.map(legendItem));
}

function legendItem(part) {
  const item = document.createElement("li");
  const swatch = document.createElement("span");
  swatch.className = "swatch";
  swatch.style.background = colourOf(part);
  item.append(swatch, `${part.label} `);
  if (part.text) item.append(figureButton(part));
  else item.append("(the stages' bars: the four parts above, summed)");
  return item;
}

// The ranked layouts as a table a click on a heading sorts (by the figures' values, not their text).
function drawGrid(view) {
  const table = document.getElementById("plan-table");
  if (!view.sections.length) {
    table.replaceChildren();
    return;
  }
  const heads = ["layout", ...view.sections[0].terms.map((t) => (t.unit ? `${t.label} (${t.unit})` : t.label))];
  const header = document.createElement("tr");
  heads.forEach((text, column) => {
    const cell = document.createElement("th");
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = text;
    button.addEventListener("click", () => sortBy(table, column));
    cell.append(button);
    header.append(cell);
  });
  const rows = view.sections.map((section, rank) => {
    const row = document.createElement("tr");
    row.dataset.rank = rank + 1;
    const code = document.createElement("td");
    code.className = "code";
    code.textContent = section.title;
    code.dataset.value = rank;
    row.append(code);
    for (const term of section.terms) {
      const cell = document.createElement("td");
      cell.dataset.value = term.value;
      cell.append(figureButton(term));
      row.append(cell);
    }
    return row;
  });
  const head = document.createElement("thead");
  head.append(header);
  const body = document.createElement("tbody");
  body.append(...rows);
  table.replaceChildren(head, body);
}

function sortBy(table, column) {
  const body = table.tBodies[0];
  const ascending = table.dataset.sorted !== `${column}:up`;
  const rows = [...body.rows].sort((a, b) => {
    const x = Number(a.cells[column].dataset.value);
    const y = Number(b.cells[column].dataset.value);
    return ascending ? x - y : y - x;
  });
  table.dataset.sorted = `${column}:${ascending ? "up" : "down"}`;
  body.append(...rows);
}

// ------------------------------------------------------------------------------------------------ commands

function renderCommands(asked) {
  const rows = asked.map((command) => {
    const row = document.createElement("div");
    row.className = "command";
    row.dataset.command = command;
    const code = document.createElement("code");
    code.textContent = "…";
    const copy = copyButton("Copy as command", () => page.answers[command]?.command);
    const json = copyButton("Copy JSON", () => {
      const found = page.answers[command];
      return found && `${JSON.stringify(found.json, null, 2)}\n`;
    });
    row.append(code, copy, json);
    return row;
  });
  document.getElementById("command-list").replaceChildren(...rows);
}

function copyButton(text, what) {
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = text;
  button.addEventListener("click", async () => {
    const copied = what();
    if (!copied) return;
    try {
      await navigator.clipboard.writeText(copied);
      button.dataset.copied = "1";
    } catch {
      const area = Object.assign(document.createElement("textarea"), { value: copied });
      document.body.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
  });
  return button;
}

// The plan's layout of a rank as a framework's config (plan --emit), saved as a file.
async function downloadConfig() {
  const slot = document.querySelector('.error[data-for="emit"]');
  slot.textContent = "";
  const body = {
    command: "plan", fields: fieldsFor("plan"), emit: document.getElementById("emit-kind").value,
    rank: Number(document.getElementById("emit-rank").value) || 1,
  };
  if (page.config !== null) body.config = page.config;
  const response = await fetch("/api/emit", {
    method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" },
  });
  const found = await response.json();
  if (found.error !== undefined) {
    slot.textContent = found.error;
    return;
  }
  page.emitted = found;
  document.getElementById("emit-command").textContent = found.command;
  const link = Object.assign(document.createElement("a"), {
    href: URL.createObjectURL(new Blob([found.text], { type: "text/plain" })), download: found.name,
  });
  document.body.append(link);
  link.click();
  link.remove();
}

// --------------------------------------------------------------------------------------------- the page

function showMode() {
  document.body.dataset.mode = mode();
  document.body.dataset.lora = ["lora", "qlora"].includes(fieldValue("method")) ? "1" : "0";
}

function fill(select, options, chosen) {
  for (const option of options) {
    const name = typeof option === "string" || typeof option === "number" ? String(option) : option.name;
    const label = typeof option === "object" && option.label ? `${name} (${option.label})` : name;
    const element = new Option(label, name, name === chosen, name === chosen);
    select.append(element);
  }
}

async function start() {
  const choices = await (await fetch("/api/choices")).json();
  const models = document.getElementById("models");
  for (const model of choices.models) models.append(new Option(model.label, model.name));
  fill(field("gpu_type"), choices.hardware, "h100-sxm");
  fill(field("precision"), choices.precisions, "bf16-mixed");
  fill(field("optimizer"), choices.optimizers, "adamw");
  fill(field("framework"), choices.frameworks, "");
  fill(field("method"), choices.methods, "full");
  fill(field("zero"), choices.zero, "0");
  fill(field("recompute"), choices.recompute, "none");
  if (choices.hub) field("model").placeholder = "a preset, or a Hub id such as Qwen/Qwen3-8B";
  readUrl();
  form.addEventListener("input", scheduleUpdate);
  form.addEventListener("change", scheduleUpdate);
  form.addEventListener("submit", (event) => event.preventDefault());
  document.getElementById("config").addEventListener("input", (event) => setConfig(event.target.value, "config.json"));
  document.getElementById("config-file").addEventListener("change", async (event) => {
    const file = event.target.files[0];
    if (file) setConfig(await file.text(), file.name);
  });
  document.getElementById("config-clear").addEventListener("click", () => {
    document.getElementById("config").value = "";
    setConfig("", "");
  });
  document.getElementById("emit-download").addEventListener("click", downloadConfig);
  document.getElementById("work-close").addEventListener("click", () => { document.getElementById("work").hidden = true; });
  update();
}

function setConfig(text, name) {
  page.config = text.trim() ? { text, name } : null;
  field("model").disabled = page.config !== null;
  scheduleUpdate();
}

start();
