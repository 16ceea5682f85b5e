// The review site's behaviour: pan and zoom on the graphs, a click on a state shows it whole,
// and each counterexample steps from the initial state to the violation. No network, no library.
"use strict";

const DATA = JSON.parse(document.getElementById("review-data").textContent);

function text(tag, content, cls) {
  const el = document.createElement(tag);
  el.textContent = content;
  if (cls) el.className = cls;
  return el;
}

function show(value) {
  return typeof value === "string" ? value : JSON.stringify(value);
}

// --- pan and zoom: the SVG's viewBox moves, so text stays sharp -------------------------------
function panZoom(holder) {
  const svg = holder.querySelector("svg");
  if (!svg) return;
  svg.removeAttribute("width");
  svg.removeAttribute("height");
  const start = svg.viewBox.baseVal;
  const home = [start.x, start.y, start.width, start.height];
  let box = home.slice();
  const apply = () => svg.setAttribute("viewBox", box.join(" "));
  const zoom = (factor, cx, cy) => {
    const w = box[2] * factor, h = box[3] * factor;
    box = [cx - (cx - box[0]) * factor, cy - (cy - box[1]) * factor, w, h];
    apply();
  };
  const centre = () => [box[0] + box[2] / 2, box[1] + box[3] / 2];
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = svg.getBoundingClientRect();
    const cx = box[0] + ((ev.clientX - r.left) / r.width) * box[2];
    const cy = box[1] + ((ev.clientY - r.top) / r.height) * box[3];
    zoom(ev.deltaY > 0 ? 1.15 : 1 / 1.15, cx, cy);
  }, { passive: false });
  let drag = null;
  svg.addEventListener("mousedown", (ev) => { drag = [ev.clientX, ev.clientY]; });
  window.addEventListener("mouseup", () => { drag = null; });
  window.addEventListener("mousemove", (ev) => {
    if (!drag) return;
    const r = svg.getBoundingClientRect();
    box[0] -= ((ev.clientX - drag[0]) / r.width) * box[2];
    box[1] -= ((ev.clientY - drag[1]) / r.height) * box[3];
    drag = [ev.clientX, ev.clientY];
    apply();
  });
  const buttons = holder.parentElement.querySelector(".zoom");
  buttons.querySelector("[data-zoom=in]").addEventListener("click", () => zoom(1 / 1.3, ...centre()));
  buttons.querySelector("[data-zoom=out]").addEventListener("click", () => zoom(1.3, ...centre()));
  buttons.querySelector("[data-zoom=reset]").addEventListener("click", () => { box = home.slice(); apply(); });
}

// --- a click on a state shows every variable of the first such state found ------------------
function stateTable(state, changed) {
  const table = document.createElement("table");
  table.className = "state";
  const touched = new Set(Object.keys(changed || {}).map((path) => path.split(/[.[]/)[0]));
  for (const [name, value] of Object.entries(state)) {
    const row = document.createElement("tr");
    row.dataset.variable = name;
    if (touched.has(name)) row.className = "changed";
    row.append(text("th", name), text("td", show(value)));
    table.append(row);
  }
  return table;
}

function clickable(holder) {
  const view = holder.dataset.view;
  const nodes = DATA.views[view];
  const panel = document.getElementById("state-" + view);
  for (const g of holder.querySelectorAll("g.node")) {
    const id = g.querySelector("title").textContent;
    const node = nodes[id];
    if (!node) continue;  // the start point and the legend
    g.classList.add("clickable");
    if (node.stale) g.classList.add("stale");
    g.addEventListener("click", () => {
      for (const other of holder.querySelectorAll("g.node.selected")) other.classList.remove("selected");
      g.classList.add("selected");
      panel.replaceChildren(
        text("h3", node.label),
        text("p", `${node.states.toLocaleString()} model states look like this; the first found (fewest steps):`),
      );
      if (node.stale) {
        panel.append(text("p", "stale: this request's host ids are stale (its newest token is on the device); ends with: " + node.ends_stale.join(", "), "stale-note"));
      }
      panel.append(stateTable(node.state, {}));
    });
  }
}

// --- the counterexample stepper --------------------------------------------------------------
function stepper(box) {
  const cex = DATA.counterexamples[Number(box.dataset.cex)];
  const last = cex.steps.length - 1;
  let at = 0;
  const render = () => {
    const step = cex.steps[at];
    box.querySelector(".where").textContent = `state ${at} of ${last}`;
    const action = box.querySelector(".step-action");
    action.textContent = at === 0 ? "initial state" : `step ${at}: ${step.action}`;
    const changes = Object.entries(step.changed).map(([k, v]) => `${k} = ${show(v)}`);
    if (changes.length) action.append(text("div", "changed: " + changes.join("; "), "changes"));
    box.querySelector("table.state").replaceWith(stateTable(step.state, step.changed));
    const verdict = box.querySelector(".verdict");
    verdict.textContent = at === last ? `Violated: ${cex.violated}. ${cex.violated_text}` : "";
    verdict.className = at === last ? "verdict violated" : "verdict";
  };
  const go = { first: () => 0, prev: () => Math.max(0, at - 1), next: () => Math.min(last, at + 1), last: () => last };
  for (const button of box.querySelectorAll("[data-step]")) {
    button.addEventListener("click", () => { at = go[button.dataset.step](); render(); });
  }
  render();
}

for (const holder of document.querySelectorAll("div.graph[data-view]")) {
  panZoom(holder);
  clickable(holder);
}
for (const box of document.querySelectorAll("[data-cex]")) stepper(box);
