// Consumer groups and share groups: members, per-partition position and lag, and a lag
// chart sampled by polling while the page is open (the broker keeps no lag history).
import { api, enc } from "./api.js";
import { h, table, facts, link, fmtNum, fmtTime } from "./dom.js";
import { lineChart, Sampler, topSeries } from "./chart.js";

// A share group's backlog per partition needs the partition's high watermark: one offsets
// request per partition, for at most this many partitions per poll.
export const SHARE_OFFSET_LOOKUPS_MAX = 64;

export async function groupsPage(ctx) {
  const [groups, shares] = await Promise.all([
    api("GET", "/v1/groups"), api("GET", "/v1/share-groups")]);
  ctx.view.replaceChildren(
    h("h1", {}, "Consumer groups"),
    table([
      ["group", (g) => link(`#/groups/${enc(g.group)}`, g.group)],
      ["state", (g) => g.state],
      ["generation", (g) => fmtNum(g.generation), { num: true }],
      ["assignor", (g) => g.assignor],
      ["members", (g) => fmtNum(g.member_count), { num: true }],
    ], groups.groups, { id: "groups" }),
    h("h1", {}, "Share groups"),
    table([
      ["group", (g) => link(`#/share-groups/${enc(g.group)}`, g.group)],
      ["members", (g) => fmtNum(g.member_count), { num: true }],
      ["lock", (g) => `${fmtNum(g.lock_duration_ms)} ms`, { num: true }],
      ["max deliveries", (g) => fmtNum(g.max_delivery_attempts), { num: true }],
      ["dead-letter topic", (g) => g.dead_letter_topic],
    ], shares.share_groups, { id: "share-groups" }),
  );
}

export async function groupPage(ctx) {
  const name = ctx.args[0];
  const sampler = new Sampler();
  const body = h("div");
  ctx.view.replaceChildren(h("h1", {}, "Consumer group ", h("span", { id: "group-name" }, name)), body);
  await ctx.poll(async () => {
    const g = await api("GET", `/v1/groups/${enc(name)}`);
    const lags = {};
    for (const p of g.partitions) lags[`${p.topic}/${p.partition}`] = p.lag || 0;
    const total = Object.values(lags).reduce((s, v) => s + v, 0);
    sampler.add(topSeries(lags));
    if (!ctx.live) return;
    body.replaceChildren(
      facts([
        ["state", g.state], ["generation", fmtNum(g.generation)], ["assignor", g.assignor],
        ["members", fmtNum(g.member_count)],
        ["total lag", h("span", { id: "total-lag" }, fmtNum(total))],
      ]),
      h("h2", {}, "Lag per partition"),
      lineChart(sampler.samples, { title: "lag (records)" }),
      table([
        ["topic", (p) => link(`#/topics/${enc(p.topic)}`, p.topic)],
        ["partition", (p) => fmtNum(p.partition), { num: true }],
        ["member", (p) => p.member_id || h("span", { class: "muted" }, "unassigned")],
        ["committed", (p) => fmtNum(p.committed_offset), { num: true }],
        ["high watermark", (p) => fmtNum(p.high_watermark), { num: true }],
        ["lag", (p) => fmtNum(p.lag), { num: true }],
        ["", (p) => link(`#/records?topic=${enc(p.topic)}&partition=${p.partition}`
          + `&offset=${p.committed_offset === null ? "earliest" : p.committed_offset}`, "browse from here")],
      ], g.partitions, { id: "group-partitions" }),
      h("h2", {}, "Members"),
      table([
        ["member", (m) => h("code", {}, m.member_id)],
        ["instance", (m) => m.instance_id || ""],
        ["subscription", (m) => m.topic_pattern ? `/${m.topic_pattern}/` : (m.topics || []).join(", ")],
        ["assignment", (m) => m.assignment.map((a) => h("span", { class: "badge" }, `${a.topic}/${a.partition}`))],
        ["revoking", (m) => m.revoking.map((a) => h("span", { class: "badge" }, `${a.topic}/${a.partition}`))],
        ["session", (m) => `${fmtNum(m.session_timeout_ms)} ms`, { num: true }],
      ], g.members),
    );
  });
}

export async function shareGroupPage(ctx) {
  const name = ctx.args[0];
  const sampler = new Sampler();
  const body = h("div");
  ctx.view.replaceChildren(h("h1", {}, "Share group ", h("span", { id: "group-name" }, name)), body);
  await ctx.poll(async () => {
    const g = await api("GET", `/v1/share-groups/${enc(name)}`);
    await Promise.all(g.partitions.slice(0, SHARE_OFFSET_LOOKUPS_MAX).map(async (p) => {
      try {
        const o = await api("GET", `/v1/topics/${enc(p.topic)}/partitions/${p.partition}/offsets`);
        p.high_watermark = o.high_watermark;
        // Records not yet done with: from the share-partition's start to the high watermark.
        p.lag = Math.max(0, o.high_watermark - p.start_offset);
      } catch { p.high_watermark = null; p.lag = null; }
    }));
    const lags = {};
    for (const p of g.partitions) if (p.lag !== null && p.lag !== undefined) lags[`${p.topic}/${p.partition}`] = p.lag;
    sampler.add(topSeries(lags));
    if (!ctx.live) return;
    body.replaceChildren(
      facts([
        ["members", fmtNum(g.member_count)],
        ["lock duration", `${fmtNum(g.lock_duration_ms)} ms`],
        ["max delivery attempts", fmtNum(g.max_delivery_attempts)],
        ["dead-letter topic", g.dead_letter_topic],
        ["max in-flight records", fmtNum(g.max_in_flight_records)],
        ["total lag", h("span", { id: "total-lag" }, fmtNum(Object.values(lags).reduce((s, v) => s + v, 0)))],
      ]),
      h("h2", {}, "Lag per partition (high watermark − start offset)"),
      lineChart(sampler.samples, { title: "lag (records)" }),
      table([
        ["topic", (p) => link(`#/topics/${enc(p.topic)}`, p.topic)],
        ["partition", (p) => fmtNum(p.partition), { num: true }],
        ["start", (p) => fmtNum(p.start_offset), { num: true }],
        ["end", (p) => fmtNum(p.end_offset), { num: true }],
        ["high watermark", (p) => fmtNum(p.high_watermark), { num: true }],
        ["lag", (p) => fmtNum(p.lag), { num: true }],
        ["in flight", (p) => fmtNum(p.in_flight), { num: true }],
        ["acquired", (p) => fmtNum(p.acquired), { num: true }],
        ["available", (p) => fmtNum(p.available), { num: true }],
        ["accepted", (p) => fmtNum(p.accepted), { num: true }],
        ["archived", (p) => fmtNum(p.archived), { num: true }],
        ["dead-lettered", (p) => fmtNum(p.dead_lettered), { num: true }],
      ], g.partitions, { id: "group-partitions" }),
      h("h2", {}, "Members"),
      table([
        ["member", (m) => h("code", {}, m.member_id)],
        ["topics", (m) => (m.topics || []).join(", ")],
        ["joined", (m) => fmtTime(m.joined_ms)],
      ], g.members),
    );
  });
}
