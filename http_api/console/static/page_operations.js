// Running cluster operations (reassignments, decommissions, voter changes) with progress.
import { api } from "./api.js";
import { h, table, facts, progressBar, fmtNum, fmtTime } from "./dom.js";

export async function operationsPage(ctx) {
  const body = h("div");
  ctx.view.replaceChildren(h("h1", {}, "Operations"), body);
  await ctx.poll(async () => {
    const ops = await api("GET", "/v1/cluster/operations");
    if (!ctx.live) return;
    const v = ops.metadata_voters || {};
    body.replaceChildren(
      h("h2", {}, "Partition reassignments"),
      table([
        ["partition", (r) => `${r.topic}/${r.partition}`],
        ["replicas", (r) => r.replicas.join(", ")],
        ["target", (r) => (r.target || []).join(", ")],
        ["step", (r) => r.step],
        ["progress", (r) => progressBar(r.progress)],
        ["started", (r) => fmtTime(r.started_ms)],
        ["last step", (r) => r.last_step || ""],
      ], ops.reassignments, { id: "reassignments" }),
      h("h2", {}, "Broker decommissions"),
      table([
        ["broker", (d) => h("code", {}, d.broker_id)],
        ["replicas left", (d) => fmtNum(d.replicas_left), { num: true }],
      ], ops.decommissions, { id: "decommissions" }),
      h("h2", {}, "Partition decommissions"),
      table([
        ["partition", (d) => `${d.topic}/${d.partition}`],
        ["status", (d) => d.status],
        ["offsets left", (d) => fmtNum(d.offsets_left), { num: true }],
        ["last step", (d) => d.last_step || ""],
      ], ops.partition_decommissions || [], { id: "partition-decommissions" }),
      h("h2", {}, "Metadata voters"),
      facts([
        ["voters", (v.voters || []).join(", ")],
        ["target", v.target ? v.target.join(", ") : "no change running"],
        ["step", v.step || ""],
        ["progress", progressBar(v.progress)],
      ]),
    );
  });
}
