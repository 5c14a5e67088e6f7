// The router: hash routes (#/page/arg?query) to page modules. Each page renders into <main>
// and may register pollers; leaving the page stops them.
import { api } from "./api.js";
import { h } from "./dom.js";
import { clusterPage } from "./page_cluster.js";
import { topicsPage, topicPage } from "./page_topics.js";
import { recordsPage, producePage } from "./page_records.js";
import { groupsPage, groupPage, shareGroupPage } from "./page_groups.js";
import { operationsPage } from "./page_operations.js";

// How often live pages (cluster, group lag, operations) poll the API.
export const POLL_MS = 2000;

const ROUTES = {
  cluster: clusterPage,
  topics: (ctx) => (ctx.args[0] ? topicPage(ctx) : topicsPage(ctx)),
  records: recordsPage,
  produce: producePage,
  groups: (ctx) => (ctx.args[0] ? groupPage(ctx) : groupsPage(ctx)),
  "share-groups": shareGroupPage,
  operations: operationsPage,
};

let current = null;  // the page context being shown: its timers stop when it is left

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, qs] = raw.split("?", 2);
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || "cluster", args: parts.slice(1), query: new URLSearchParams(qs || "") };
}

export function showError(err) {
  const box = document.getElementById("error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  box.hidden = false;
  box.textContent = err.message || String(err);
}

function makeContext(route) {
  const ctx = {
    ...route,
    view: document.getElementById("view"),
    timers: [],
    live: true,
    // Runs fn now and every POLL_MS while this page is shown; errors go to the error bar.
    poll(fn, everyMs = POLL_MS) {
      let running = false;
      const tick = async () => {
        if (!ctx.live || running) return;
        running = true;
        try { await fn(); showError(null); } catch (err) { if (ctx.live) showError(err); }
        finally { running = false; }
      };
      ctx.timers.push(setInterval(tick, everyMs));
      return tick();
    },
    go(hash) { location.hash = hash; },
  };
  return ctx;
}

async function render() {
  if (current) { current.live = false; current.timers.forEach(clearInterval); }
  const route = parseHash();
  const ctx = makeContext(route);
  current = ctx;
  showError(null);
  for (const a of document.querySelectorAll("#nav a")) {
    const page = route.page === "share-groups" ? "groups" : route.page;
    a.classList.toggle("active", a.dataset.page === page);
  }
  const pageFn = ROUTES[route.page];
  ctx.view.replaceChildren(h("p", { class: "muted" }, "Loading…"));
  if (!pageFn) {
    ctx.view.replaceChildren(h("h1", {}, "Not found"), h("p", {}, `No page ${route.page}.`));
    return;
  }
  try {
    await pageFn(ctx);
  } catch (err) {
    if (ctx.live) { showError(err); ctx.view.replaceChildren(h("h1", {}, route.page)); }
  }
  if (ctx.live) ctx.view.dataset.ready = route.page;  // tests wait for this
}

async function whoami() {
  try {
    const c = await api("GET", "/v1/cluster");
    document.getElementById("whoami").textContent = `broker ${c.node_id} · cluster ${c.cluster_id.slice(0, 8)}`;
  } catch { /* the cluster page shows the error */ }
}

window.addEventListener("hashchange", render);
window.addEventListener("DOMContentLoaded", () => { whoami(); render(); });
