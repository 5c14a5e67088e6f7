// Topics: the list, a create form, and one topic's partitions, replicas, offsets and config.
import { api, enc } from "./api.js";
import { h, replace, table, facts, link, fmtNum, removedText } from "./dom.js";

// Partition offsets this broker does not hold are asked of their leaders (one request per
// partition), for at most this many partitions per page load.
export const OFFSET_LOOKUPS_MAX = 64;

export async function topicsPage(ctx) {
  const { topics } = await api("GET", "/v1/topics");
  ctx.view.replaceChildren(
    h("h1", {}, "Topics"),
    table([
      ["name", (t) => link(`#/topics/${enc(t.name)}`, t.name)],
      ["partitions", (t) => fmtNum(t.partitions), { num: true }],
      ["replication factor", (t) => fmtNum(t.replication_factor), { num: true }],
      ["", (t) => [link(`#/records?topic=${enc(t.name)}`, "browse"), " ",
        link(`#/produce?topic=${enc(t.name)}`, "produce")]],
    ], topics, { id: "topics" }),
    h("h2", {}, "Create a topic"),
    createForm(ctx),
  );
}

function createForm(ctx) {
  const out = h("div");
  const form = h("form", { class: "panel", id: "create-topic" },
    h("label", {}, "name", h("input", { name: "name", required: true, maxlength: 249, size: 30 })),
    h("label", {}, "partitions", h("input", { name: "partitions", type: "number", min: 1, placeholder: "broker default" })),
    h("label", {}, "replication factor", h("input", { name: "replication_factor", type: "number", min: 1, placeholder: "broker default" })),
    h("br"),
    h("label", {}, "config (JSON object, optional)",
      h("textarea", { name: "config", rows: 2, placeholder: '{"retention_ms": 86400000}' })),
    h("br"),
    h("button", { type: "submit" }, "Create"),
    out);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const body = { name: f.get("name") };
    for (const k of ["partitions", "replication_factor"]) if (f.get(k)) body[k] = Number(f.get(k));
    try {
      if (f.get("config").trim()) body.config = JSON.parse(f.get("config"));
      const created = await api("POST", "/v1/topics", { body });
      ctx.go(`#/topics/${enc(created.name)}`);
    } catch (err) {
      out.replaceChildren(h("p", { class: "bad" }, err.message));
    }
  });
  return form;
}

export async function topicPage(ctx) {
  const name = ctx.args[0];
  const d = await api("GET", `/v1/topics/${enc(name)}`);
  await fillOffsets(name, d.partitions);
  const totalRecords = d.partitions.reduce(
    (s, p) => s + (p.high_watermark === null ? 0 : p.high_watermark - p.log_start_offset), 0);
  replace(ctx.view,
    h("h1", {}, "Topic ", h("span", { id: "topic-name" }, d.name)),
    facts([
      ["partitions", fmtNum(d.partitions.length)],
      ["replication factor", fmtNum(d.replication_factor)],
      ["records (high watermark − log start)", fmtNum(totalRecords)],
    ]),
    h("p", {}, link(`#/produce?topic=${enc(d.name)}`, "Produce a test record"), " · ",
      link(`#/records?topic=${enc(d.name)}`, "Browse records")),
    h("h2", {}, "Partitions"),
    table([
      ["partition", (p) => fmtNum(p.partition), { num: true }],
      ["leader", (p) => p.leader || h("span", { class: "bad" }, "none")],
      ["replicas", (p) => p.replicas.map((r) => h("span", { class: "badge" }, r))],
      ["status", (p) => p.status],
      ["log start", (p) => fmtNum(p.log_start_offset), { num: true }],
      ["high watermark", (p) => fmtNum(p.high_watermark), { num: true }],
      ["log end", (p) => fmtNum(p.log_end_offset), { num: true }],
      ["", (p) => link(`#/records?topic=${enc(d.name)}&partition=${p.partition}`, "browse")],
    ], d.partitions, { id: "partitions" }),
    d.partitions.some((p) => p.log_end_offset === null)
      ? h("p", { class: "muted" }, "–: this broker holds no replica of the partition; its "
        + "leader gave the log start and high watermark, the log end is known on replicas only.")
      : null,
    removedNote(d.partitions),
    h("h2", {}, "Config"),
    table([["key", ([k]) => h("code", {}, k)], ["value", ([, v]) => configText(v)]],
      Object.entries(d.config).sort(), { id: "config" }),
  );
}

// GET /v1/topics/{t} gives offsets only where this broker holds a replica; the offsets
// route is relayed to each partition's leader.
async function fillOffsets(topic, partitions) {
  const missing = partitions.filter((p) => p.high_watermark === null).slice(0, OFFSET_LOOKUPS_MAX);
  await Promise.all(missing.map(async (p) => {
    try {
      const o = await api("GET", `/v1/topics/${enc(topic)}/partitions/${p.partition}/offsets`);
      p.log_start_offset = o.log_start_offset;
      p.high_watermark = o.high_watermark;
    } catch { /* no leader now: left blank */ }
  }));
}

// Config values are JSON scalars (numbers, booleans, strings): shown as typed, unquoted.
function configText(v) {
  return v === null || v === undefined ? "–" : typeof v === "object" ? JSON.stringify(v) : String(v);
}

// A log start above 0: retention or compaction removed the records before it (dom.js).
function removedNote(partitions) {
  const trimmed = partitions.filter((p) => p.log_start_offset > 0);
  if (trimmed.length === 0) return null;
  return h("div", { class: "muted", id: "removed-note" }, trimmed.map((p) =>
    h("div", {}, `Partition ${p.partition}: ${removedText(p.log_start_offset)}.`)));
}
