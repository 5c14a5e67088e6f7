// DOM helpers. Every text the API returns (topic names, keys, values, headers) goes into the
// page as textContent, never as markup: a record cannot inject script or style.

export function h(tag, attrs = {}, ...children) {
  const svg = tag.startsWith("svg:");
  const el = svg
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "style") Object.assign(el.style, value);  // CSSOM: allowed by the CSP
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

// el's children replaced by these; null, undefined and false are left out, as in h().
// (The DOM's own replaceChildren writes a null child as the text "null".)
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// A table: columns are [title, cell(row) -> node|text, {num: true}?].
export function table(columns, rows, attrs = {}) {
  return h("table", attrs,
    h("thead", {}, h("tr", {}, columns.map(([title, , opt]) =>
      h("th", { class: opt && opt.num ? "num" : null }, title)))),
    h("tbody", {}, rows.length === 0
      ? h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, "none"))
      : rows.map((row) => h("tr", {}, columns.map(([, cell, opt]) =>
          h("td", { class: opt && opt.num ? "num" : null }, cell(row)))))));
}

export function facts(pairs) {
  return h("dl", { class: "facts" }, pairs.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

export function progressBar(fraction) {
  const pct = Math.max(0, Math.min(1, Number(fraction) || 0)) * 100;
  return h("span", {},
    h("span", { class: "progress", role: "progressbar", "aria-valuenow": pct.toFixed(0) },
      h("span", { style: { width: pct.toFixed(1) + "%" } })),
    " " + pct.toFixed(0) + "%");
}

export function link(hash, text) {
  return h("a", { href: hash }, text);
}

export function fmtTime(ms) {
  if (ms === null || ms === undefined) return "";
  const d = new Date(Number(ms));
  return isNaN(d.getTime()) ? String(ms) : d.toISOString().replace("T", " ").replace("Z", " UTC");
}

export function fmtNum(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
}

// Why a partition's records start above offset 0: said wherever records are shown, so that
// a partition with few or no records left is not taken for data loss.
export function removedText(logStartOffset) {
  return `records before offset ${fmtNum(logStartOffset)} were removed by retention or `
    + "compaction (the topic's retention_ms, retention_bytes and cleanup_policy)";
}
