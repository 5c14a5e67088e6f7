// A small line chart in inline SVG (no library): series of numbers sampled by polling.
import { h } from "./dom.js";

const COLORS = ["#1f4e79", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#0a7ea4", "#bf3989", "#57606a"];
export const SERIES_MAX = COLORS.length;  // more series than this are summed into "others"

// samples: [{t: ms, values: {name: number}}], oldest first.
export function lineChart(samples, { width = 640, height = 180, title = "" } = {}) {
  const pad = { l: 48, r: 8, t: 16, b: 20 };
  const names = [...new Set(samples.flatMap((s) => Object.keys(s.values)))];
  const maxV = Math.max(1, ...samples.flatMap((s) => Object.values(s.values)));
  const t0 = samples.length ? samples[0].t : 0;
  const t1 = samples.length ? samples[samples.length - 1].t : 1;
  const x = (t) => pad.l + (t1 === t0 ? 0 : ((t - t0) / (t1 - t0)) * (width - pad.l - pad.r));
  const y = (v) => pad.t + (1 - v / maxV) * (height - pad.t - pad.b);
  const svg = h("svg:svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`,
    role: "img", "aria-label": title },
    h("svg:line", { class: "axis", x1: pad.l, y1: y(0), x2: width - pad.r, y2: y(0) }),
    h("svg:line", { class: "axis", x1: pad.l, y1: pad.t, x2: pad.l, y2: y(0) }),
    h("svg:text", { x: pad.l - 4, y: pad.t + 4, "text-anchor": "end" }, String(maxV)),
    h("svg:text", { x: pad.l - 4, y: y(0), "text-anchor": "end" }, "0"),
    h("svg:text", { x: pad.l, y: height - 4 }, samples.length
      ? `${((t1 - t0) / 1000).toFixed(0)} s, ${samples.length} samples` : "no samples yet"),
    title ? h("svg:text", { x: width - pad.r, y: 11, "text-anchor": "end" }, title) : null);
  names.forEach((name, i) => {
    const color = COLORS[i % COLORS.length];
    const had = samples.filter((s) => name in s.values);
    const pts = had.map((s) => `${x(s.t).toFixed(1)},${y(s.values[name]).toFixed(1)}`).join(" ");
    svg.append(h("svg:polyline", { points: pts, fill: "none", stroke: color,
      "stroke-width": 2, "data-series": name }));
    const last = had[had.length - 1];  // a dot on the newest sample: visible from the first
    svg.append(h("svg:circle", { cx: x(last.t).toFixed(1), cy: y(last.values[name]).toFixed(1),
      r: 3, fill: color }));
  });
  const legend = h("div", { class: "legend" }, names.map((name, i) =>
    h("span", {}, h("i", { style: { background: COLORS[i % COLORS.length] } }), name)));
  return h("div", {}, svg, legend);
}

// Keeps at most `max` samples: the chart shows the last max × POLL_MS of history.
export class Sampler {
  constructor(max = 90) { this.max = max; this.samples = []; }
  add(values) {
    this.samples.push({ t: Date.now(), values });
    if (this.samples.length > this.max) this.samples.shift();
  }
}

// Per-partition values as chart series: the largest SERIES_MAX - 1 kept, the rest summed.
export function topSeries(values) {
  const entries = Object.entries(values).sort((a, b) => b[1] - a[1]);
  if (entries.length <= SERIES_MAX) return Object.fromEntries(entries);
  const kept = entries.slice(0, SERIES_MAX - 1);
  const rest = entries.slice(SERIES_MAX - 1).reduce((s, [, v]) => s + v, 0);
  return Object.fromEntries([...kept, ["others", rest]]);
}
