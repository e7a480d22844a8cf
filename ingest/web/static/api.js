// Every request of the page goes through api(): it adds the read token, when one is stored,
// as "Authorization: Bearer <token>", and turns the server's error shape into an ApiError.

const TOKEN_KEY = "fleetlog.token";

export function getToken() {
  try {
    return localStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return "";
  }
}

export function setToken(token) {
  try {
    if (token) localStorage.setItem(TOKEN_KEY, token);
    else localStorage.removeItem(TOKEN_KEY);
  } catch {
    // storage refused (private mode): the token lasts until the page is reloaded
  }
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Accept: "application/json" };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, { method, headers, body, signal, cache: "no-store" });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, `cannot reach the server (${e.message})`);
  }
  let doc = null;
  try {
    doc = await response.json();
  } catch {
    doc = null;
  }
  if (!response.ok) {
    const message = doc && typeof doc.error === "string" ? doc.error : `${response.status} ${response.statusText}`;
    const hint = response.status === 401 ? " (set the token above)" : response.status === 403 ? " (this needs another token: verdicts need the admin token)" : "";
    throw new ApiError(response.status, `${method} ${path.split("?")[0]}: ${message}${hint}`);
  }
  return doc;
}

// A constant as a SQL string literal ('' escaping). Data goes in as a $param, never this way.
export function sqlString(value) {
  return "'" + String(value).replace(/'/g, "''") + "'";
}

// POST /api/v1/query with DuckDB named parameters ($name), rows as objects keyed by column name.
export async function sql(query, { params, signal } = {}) {
  const body = params ? { sql: query, params } : { sql: query };
  const doc = await api("/api/v1/query", { method: "POST", body, signal });
  return doc.rows.map((row) => Object.fromEntries(doc.columns.map((c, i) => [c, row[i]])));
}

export function path(...parts) {
  return parts.map((p) => encodeURIComponent(String(p))).join("/");
}

export function minRate() {
  const meta = document.querySelector('meta[name="fleetlog-min-rate"]');
  const value = meta ? parseFloat(meta.content) : NaN;
  return Number.isFinite(value) ? value : null;
}
