// The record browser (one partition, from an offset or a timestamp) and a test producer.
// Opened without an offset it shows the newest records and follows the partition (live tail).
import { api, enc, ApiError } from "./api.js";
import { h, replace, table, link, fmtTime, fmtNum, removedText } from "./dom.js";

// Records per page of the browser (the fetch's max_records; the broker's max_bytes default,
// 1 MiB, bounds it too). "Next page" reads on from the answer's next_offset. The live tail
// keeps this many newest records on the page.
export const RECORDS_PAGE = 50;

// The live tail is a long-poll loop: each fetch waits up to this long on the broker for new
// records (below the broker's fetch_wait_ms_max), so an idle tail costs one request per wait.
export const TAIL_WAIT_MS = 5000;

let pagesShown = 0;  // the number of the page being shown: an older page's tail stops

async function topicNames() {
  return (await api("GET", "/v1/topics")).topics.map((t) => t.name);
}

function topicSelect(names, selected) {
  return h("select", { name: "topic", required: true },
    names.map((n) => h("option", { value: n, selected: n === selected }, n)));
}

export async function recordsPage(ctx) {
  const q = ctx.query;
  const names = await topicNames();
  const topic = q.get("topic") || names[0] || "";
  const partition = q.get("partition") || "0";
  const mode = q.has("timestamp") ? "timestamp" : q.get("offset") || "newest";
  const fromInput = h("input", { name: "offset", type: "number", min: 0,
    value: /^\d+$/.test(mode) ? mode : "", placeholder: "offset" });
  const tsInput = h("input", { name: "timestamp", type: "datetime-local", step: 1,
    value: q.has("timestamp") ? toLocalInput(Number(q.get("timestamp"))) : "" });
  const modeSelect = h("select", { name: "mode" },
    [["earliest", "the oldest"], ["newest", `the newest ${RECORDS_PAGE}`], ["offset", "an offset"],
      ["timestamp", "a time"]]
      .map(([v, t]) => h("option", { value: v, selected: v === (/^\d+$/.test(mode) ? "offset" : mode) }, t)));
  const form = h("form", { class: "panel", id: "browse" },
    h("label", {}, "topic", topicSelect(names, topic)),
    h("label", {}, "partition", h("input", { name: "partition", type: "number", min: 0, value: partition })),
    h("label", {}, "from", modeSelect),
    h("label", {}, "offset", fromInput),
    h("label", {}, "time (browser's zone)", tsInput),
    h("button", { type: "submit" }, "Read"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const p = new URLSearchParams({ topic: f.get("topic"), partition: f.get("partition") || "0" });
    if (f.get("mode") === "offset") p.set("offset", f.get("offset") || "0");
    else if (f.get("mode") === "timestamp") p.set("timestamp", String(new Date(f.get("timestamp")).getTime() || 0));
    else p.set("offset", f.get("mode"));
    const hash = `#/records?${p}`;
    if (location.hash === hash) recordsPage(ctx); else ctx.go(hash);
  });
  const results = h("div", { id: "records" });
  ctx.view.replaceChildren(h("h1", {}, "Records"), form, results);
  if (topic) {
    await showPage(ctx, results, topic, partition, q.has("timestamp")
      ? { timestamp: q.get("timestamp") } : { offset: q.get("offset") || "newest" });
  } else {
    results.replaceChildren(h("p", { class: "muted" }, "No topics yet."));
  }
}

function toLocalInput(ms) {
  const d = new Date(ms - new Date(ms).getTimezoneOffset() * 60000);
  return isNaN(d.getTime()) ? "" : d.toISOString().slice(0, 19);
}

async function fetchPage(topic, partition, from, waitMs = 0) {
  const path = `/v1/topics/${enc(topic)}/partitions/${enc(partition)}/records`;
  if (from.offset === "newest") {  // the last page: up to RECORDS_PAGE before the high watermark
    const o = await api("GET", `/v1/topics/${enc(topic)}/partitions/${enc(partition)}/offsets`);
    from = { offset: Math.max(o.log_start_offset, o.high_watermark - RECORDS_PAGE) };
  }
  const query = { ...from, max_records: RECORDS_PAGE, wait_ms: waitMs || null };
  try {
    return { encoding: "string", doc: await api("GET", path, { query }) };
  } catch (err) {
    // 406: a key, value or header is not UTF-8; read the page again as base64.
    if (!(err instanceof ApiError) || err.status !== 406) throw err;
    return { encoding: "base64", doc: await api("GET", path, { query: { ...query, value_encoding: "base64" } }) };
  }
}

async function showPage(ctx, results, topic, partition, from) {
  const number = ++pagesShown;
  results.replaceChildren(h("p", { class: "muted" }, "Reading…"));
  let page;
  try {
    page = await fetchPage(topic, partition, from);
  } catch (err) {
    const start = err instanceof ApiError ? err.details.log_start_offset : undefined;
    replace(results, h("p", { class: "bad" }, err.message), removedNote(start));
    return;
  }
  const view = { topic, partition, doc: page.doc, encodings: new Set([page.encoding]),
    records: page.doc.records, follow: from.offset === "newest" };
  const draw = (note) => replace(results, renderPage(ctx, results, view), note);
  draw();
  // Not awaited: the page is ready (data-ready) while its tail goes on.
  if (view.follow) tail(ctx, number, view, draw);
}

// The live tail: fetch from the end, waiting on the broker, while this page is the one shown.
async function tail(ctx, number, view, draw) {
  const current = () => ctx.live && number === pagesShown;
  let offset = view.doc.next_offset;
  while (current()) {
    let page;
    try {
      page = await fetchPage(view.topic, view.partition, { offset }, TAIL_WAIT_MS);
    } catch (err) {
      if (current()) draw(h("p", { class: "bad", id: "tail-stopped" }, `Live tail stopped: ${err.message}`));
      return;
    }
    if (!current()) return;
    offset = page.doc.next_offset;
    if (page.doc.records.length === 0) continue;
    view.doc = page.doc;
    view.encodings.add(page.encoding);
    view.records = [...view.records, ...page.doc.records].slice(-RECORDS_PAGE);
    draw();
  }
}

function renderPage(ctx, results, view) {
  const { topic, partition, doc, records } = view;
  const next = h("button", { type: "button", class: "secondary", id: "next-page",
    onclick: () => showPage(ctx, results, topic, partition, { offset: doc.next_offset }) },
    `Next page (from offset ${doc.next_offset})`);
  return [
    h("p", {}, `${topic} / partition ${doc.partition}: log start ${fmtNum(doc.log_start_offset)}, `
      + `high watermark ${fmtNum(doc.high_watermark)}, ${records.length} `
      + `record${records.length === 1 ? "" : "s"} shown`
      + encodingNote(view.encodings),
    " ", view.follow ? h("span", { class: "badge", id: "live-tail" }, "live: new records appear as they arrive")
      : records.length ? next : null),
    removedNote(doc.log_start_offset),
    table([
      ["offset", (r) => fmtNum(r.offset), { num: true }],
      ["timestamp", (r) => h("span", { title: String(r.timestamp) }, fmtTime(r.timestamp))],
      ["key", (r) => valueCell(r.key)],
      ["value", (r) => valueCell(r.value)],
      ["headers", (r) => (r.headers || []).map((hd) =>
        h("div", {}, h("code", {}, hd.key), ": ", valueCell(hd.value, "span")))],
    ], records, { class: "records" }),
  ];
}

// A page with a key, value or header that is not UTF-8 is read whole in base64; the live
// tail may add such a page to text ones.
function encodingNote(encodings) {
  if (!encodings.has("base64")) return "";
  return encodings.has("string")
    ? " (the fetches that met bytes not UTF-8 are shown in base64: keys, values and headers)"
    : " (keys, values and headers in base64: not UTF-8)";
}

function removedNote(logStartOffset) {
  return logStartOffset > 0
    ? h("p", { class: "muted", id: "removed-note" }, `Note: ${removedText(logStartOffset)}.`)
    : null;
}

// A JSON object or array is pretty-printed; anything else shown as it is.
// A missing key, value or header value (JSON null) is a muted "none", not the word "null",
// which a string value may hold.
function valueCell(v, tag = "pre") {
  if (v === null || v === undefined) return h("span", { class: "muted", title: "no value (null)" }, "none");
  const s = String(v);
  if (tag === "pre" && /^\s*[{[]/.test(s)) {
    try { return h("pre", { class: "json" }, JSON.stringify(JSON.parse(s), null, 2)); } catch { /* not JSON */ }
  }
  return h(tag, {}, s);
}

export async function producePage(ctx) {
  const names = await topicNames();
  const out = h("div", { id: "produced" });
  const form = h("form", { class: "panel", id: "produce" },
    h("label", {}, "topic", topicSelect(names, ctx.query.get("topic"))),
    h("label", {}, "partition", h("input", { name: "partition", type: "number", min: 0, placeholder: "by key" })),
    h("label", {}, "key", h("input", { name: "key", size: 24, placeholder: "none" })),
    h("br"),
    h("label", {}, "value", h("textarea", { name: "value", rows: 5, placeholder: '{"hello": "world"}' })),
    h("label", {}, "headers (one name: value a line)", h("textarea", { name: "headers", rows: 5 })),
    h("br"),
    h("button", { type: "submit" }, "Produce"),
    out);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const record = { value: f.get("value") };
    if (f.get("key")) record.key = f.get("key");
    if (f.get("partition") !== "") record.partition = Number(f.get("partition"));
    const headers = f.get("headers").split("\n").filter((l) => l.trim()).map((line) => {
      const i = line.indexOf(":");
      return i < 0 ? { key: line.trim(), value: "" } : { key: line.slice(0, i).trim(), value: line.slice(i + 1).trim() };
    });
    if (headers.length) record.headers = headers;
    try {
      const res = await api("POST", `/v1/topics/${enc(f.get("topic"))}/records`, { body: { records: [record] } });
      const o = res.offsets[0];
      out.replaceChildren(h("p", { class: "notice" },
        `Produced to partition ${o.partition} at offset ${o.offset}. `,
        link(`#/records?topic=${enc(f.get("topic"))}&partition=${o.partition}&offset=${o.offset}`, "Show it")));
    } catch (err) {
      out.replaceChildren(h("p", { class: "bad" }, err.message));
    }
  });
  ctx.view.replaceChildren(h("h1", {}, "Produce a test record"),
    names.length ? form : h("p", { class: "muted" }, "No topics yet: create one first."));
}
