// Cluster and brokers: who is live, who votes in the metadata group, who leads what.
import { api } from "./api.js";
import { h, table, facts, fmtBytes, fmtNum } from "./dom.js";

export async function clusterPage(ctx) {
  const body = h("div");
  ctx.view.replaceChildren(h("h1", {}, "Cluster"), body);
  await ctx.poll(async () => {
    // /v1/cluster/status asks every peer; /v1/cluster answers from this broker alone, so
    // the page still shows something while a peer is slow.
    const [cluster, status] = await Promise.all([
      api("GET", "/v1/cluster"),
      api("GET", "/v1/cluster/status").catch(() => null),
    ]);
    if (ctx.live) body.replaceChildren(...renderCluster(cluster, status).filter(Boolean));
  });
}

function renderCluster(cluster, status) {
  const voters = new Set(cluster.metadata_voters);
  const groups = (status && status.groups) || [];
  const leaders = {};
  for (const g of groups) {
    if (g.topic !== null && g.leader) leaders[g.leader] = (leaders[g.leader] || 0) + 1;
  }
  const metadata = groups.find((g) => g.group_id === 0);
  const byId = Object.fromEntries(((status && status.brokers) || []).map((b) => [b.node_id, b]));
  const brokers = cluster.brokers.map((b) => ({ ...b, ...(byId[b.node_id] || {}) }));
  const partitionGroups = groups.filter((g) => g.topic !== null);
  return [
    facts([
      ["cluster id", h("code", {}, cluster.cluster_id)],
      ["this broker", h("code", { id: "this-broker" }, cluster.node_id)],
      ["metadata voters", cluster.metadata_voters.join(", ")],
      ["metadata leader", metadata ? metadata.leader || "none" : "–"],
      ["metadata version", fmtNum(cluster.metadata_version)],
      ["brokers", `${brokers.filter((b) => b.live).length} live of ${brokers.length}`],
      ["partitions", status ? `${partitionGroups.length} (${partitionGroups.filter((g) => !g.leader).length} without a leader)` : "–"],
    ]),
    h("h2", {}, "Brokers"),
    table([
      ["broker", (b) => h("code", {}, b.node_id)],
      ["HTTP", (b) => b.http_addr],
      ["Raft", (b) => b.raft_addr],
      ["live", (b) => h("span", { class: b.live ? "ok" : "bad" }, b.live ? "live" : "down")],
      ["voter", (b) => (voters.has(b.node_id) ? "voter" : "")],
      ["leaders", (b) => fmtNum(leaders[b.node_id] || 0), { num: true }],
      ["storage", (b) => h("span", { class: b.storage === "ok" ? "ok" : "warn" }, b.storage || "–")],
      ["free", (b) => fmtBytes(b.free_bytes), { num: true }],
    ], brokers, { id: "brokers" }),
    h("h2", {}, "Raft groups"),
    status ? table([
      ["group", (g) => (g.topic === null ? "metadata" : `${g.topic}/${g.partition}`)],
      ["leader", (g) => g.leader || h("span", { class: "bad" }, "none")],
      ["term", (g) => fmtNum(g.term), { num: true }],
      ["commit index", (g) => fmtNum(g.commit_index), { num: true }],
      ["replicas (lag)", (g) => (g.replicas || []).map((r) =>
        h("span", { class: "badge" }, `${r.node_id} ${r.lag === null || r.lag === undefined ? "?" : r.lag}`))],
    ], groups.slice(0, 500)) : h("p", { class: "muted" }, "/v1/cluster/status did not answer."),
    groups.length > 500 ? h("p", { class: "muted" }, `first 500 of ${groups.length} groups`) : null,
  ];
}
