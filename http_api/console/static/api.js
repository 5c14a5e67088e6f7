// The console's only door to the broker: the public /v1 API, through fetch().
// Paths are resolved against the page ("../v1/..." from /ui/), so a reverse proxy that
// serves dmq under a path prefix serves the console and its API calls alike. Cookies and
// HTTP authentication of the same origin go with every request (credentials: same-origin),
// so the console is held to whatever guards /v1. Every call names the console in
// X-Dmq-Client (a custom header: another site's page cannot send it without a CORS
// preflight, which the broker never grants), the browser adds this page's Origin, and
// bodies go as application/json: the broker refuses state-changing requests from
// other origins or with form and text bodies (http_api/request_guard.py).

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

export function apiUrl(path, query) {
  const url = new URL(".." + path, document.baseURI);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, String(v));
  }
  return url;
}

export async function api(method, path, { query, body, contentType } = {}) {
  const init = { method, credentials: "same-origin", headers: { Accept: "application/json", "X-Dmq-Client": "console" } };
  if (body !== undefined) {
    init.headers["Content-Type"] = contentType || "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  const resp = await fetch(apiUrl(path, query), init);
  const text = await resp.text();
  let doc = null;
  try { doc = text ? JSON.parse(text) : null; } catch { doc = null; }
  if (!resp.ok) {
    const err = (doc && doc.error) || {};
    throw new ApiError(resp.status, err.code || "http_error", err.message || text.slice(0, 200),
      err.details);
  }
  return doc;
}

export const enc = encodeURIComponent;
