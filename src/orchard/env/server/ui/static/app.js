// The Orchard dashboard: plain JS over the REST API with a session token (docs/dashboard.md).
// The token lives in this closure only: no cookie, no localStorage, never in a URL.
// Everything from the API is put into the page as text (textContent), never as HTML.
"use strict";
(() => {
  const POLL_MS = 2000;
  let token = null;
  let selected = null; // the sandbox id whose detail is shown
  let timer = null;
  let term = null; // { xterm, sid, pid, abort, queue }
  const $ = (sel) => document.querySelector(sel);

  class ApiError extends Error {
    constructor(status, code, message) { super(message); this.status = status; this.code = code; }
  }

  async function api(method, path, body, raw = false, signal = undefined) {
    const headers = { Authorization: "Bearer " + token };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const r = await fetch(path, {
      method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!r.ok) {
      let code = "http_" + r.status, message = r.statusText;
      try { const j = await r.json(); code = j.error.code; message = j.error.message; } catch (_) { /* not JSON */ }
      if (r.status === 401 && token) endSession("Session expired or invalid: log in again.");
      throw new ApiError(r.status, code, message);
    }
    if (raw) return r;
    return r.status === 204 ? null : r.json();
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function row(cells) {
    const tr = document.createElement("tr");
    for (const c of cells) tr.append(c instanceof Node ? wrap(c) : el("td", c));
    return tr;
  }
  function wrap(node) { const td = document.createElement("td"); td.append(node); return td; }
  function fill(tbody, rows, empty) {
    tbody.replaceChildren(...rows);
    if (!rows.length) { const tr = row([empty]); tr.firstChild.colSpan = 9; tr.className = "muted"; tbody.append(tr); }
  }
  function bytes(n) {
    if (n === null || n === undefined) return "—";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n) + " " + u[i];
  }
  function dur(s) {
    s = Math.max(0, Math.round(s));
    if (s < 120) return s + "s";
    if (s < 7200) return Math.round(s / 60) + "m";
    if (s < 172800) return Math.round(s / 3600) + "h";
    return Math.round(s / 86400) + "d";
  }
  const since = (iso) => dur((Date.now() - Date.parse(iso)) / 1000);
  const until = (iso) => dur((Date.parse(iso) - Date.now()) / 1000);
  function egress(net) {
    return net.egress === "allow" ? "allow: " + net.allow.join(", ") : net.egress;
  }
  function showError(e) { $("#error").textContent = e ? (e.message || String(e)) : ""; }

  // ------------------------------------------------------------------ session
  async function login(ev) {
    ev.preventDefault();
    const input = $("#api-key");
    $("#login-error").textContent = "";
    let r;
    try {
      r = await fetch("/ui/session", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ api_key: input.value }),
      });
    } catch (e) { $("#login-error").textContent = "Cannot reach the service: " + e; return; }
    input.value = ""; // the key is not kept, not even in the form
    if (!r.ok) {
      $("#login-error").textContent = r.status === 401
        ? "That API key is not valid for this service." : "Login failed (HTTP " + r.status + ").";
      return;
    }
    const s = await r.json();
    token = s.token;
    $("#who").textContent = s.owner; $("#who").hidden = false; $("#logout").hidden = false;
    $("#login").hidden = true; $("#app").hidden = false;
    refresh();
  }

  function endSession(message) {
    token = null; selected = null; closeTerminal();
    clearTimeout(timer); timer = null;
    $("#app").hidden = true; $("#detail").hidden = true;
    $("#login").hidden = false; $("#who").hidden = true; $("#logout").hidden = true;
    $("#login-error").textContent = message || "";
  }

  async function logout() {
    const t = token;
    endSession("Logged out.");
    try {
      await fetch("/ui/session", { method: "DELETE", headers: { Authorization: "Bearer " + t } });
    } catch (_) { /* gone anyway */ }
  }

  // ------------------------------------------------------------------ lists
  async function refresh() {
    clearTimeout(timer);
    if (!token) return;
    try {
      const [sbs, usage, pools, snaps, vols] = await Promise.all([
        api("GET", "/v1/sandboxes"), api("GET", "/v1/usage"), api("GET", "/v1/pools"),
        api("GET", "/v1/snapshots"), api("GET", "/v1/volumes"),
      ]);
      renderSandboxes(sbs.sandboxes); renderUsage(usage); renderPools(pools.pools);
      renderSnapshots(snaps.snapshots); renderVolumes(vols.volumes);
      if (selected) await renderDetail(sbs.sandboxes.find((s) => s.id === selected));
      $("#refreshed").textContent = "updated " + new Date().toLocaleTimeString();
      showError(null);
    } catch (e) {
      if (!token) return;
      showError(e);
    }
    if (token) timer = setTimeout(refresh, POLL_MS);
  }

  function renderSandboxes(list) {
    fill($("#sandboxes"), list.map((s) => {
      const tr = row([
        el("code", s.id), el("span", s.status, "status " + s.status), s.image,
        s.resources.cpu ?? "—", bytes(s.resources.memory_bytes), since(s.created_at),
        until(s.expires_at), egress(s.network),
      ]);
      tr.dataset.id = s.id;
      if (s.id === selected) tr.classList.add("selected");
      tr.addEventListener("click", () => select(s.id));
      return tr;
    }), "no sandboxes");
  }

  function renderUsage(u) {
    const lim = (k) => (u.limits[k] === null || u.limits[k] === undefined ? "no limit" : u.limits[k]);
    const memLim = u.limits.max_memory;
    fill($("#usage"), [
      row(["owner", u.owner]),
      row(["sandboxes", u.sandboxes + " (creating " + u.creating + ") of " + lim("max_sandboxes")]),
      row(["cpu", u.cpu + " of " + lim("max_cpu")]),
      row(["memory", bytes(u.memory_bytes) + " of " + (memLim ? bytes(memLim) : "no limit")]),
      ...Object.entries(u.limits).map(([k, v]) => row(["limit " + k, v === null ? "none" : v])),
    ], "");
  }

  function renderPools(list) {
    fill($("#pools"), list.map((p) => row([
      p.name, p.settings.image, p.size, p.ready, p.creating, p.failed, p.claimed,
    ])), "no pools");
  }
  function renderSnapshots(list) {
    fill($("#snapshots"), list.map((s) => row([
      el("code", s.id), s.name ?? "", el("code", s.source), s.image, bytes(s.size_bytes),
      until(s.expires_at),
    ])), "no snapshots");
  }
  function renderVolumes(list) {
    fill($("#volumes"), list.map((v) => row([
      v.name, bytes(v.size_bytes), v.mounted_by.join(", "), since(v.created_at) + " ago",
    ])), "no volumes");
  }

  // ------------------------------------------------------------------ one sandbox
  function select(id) {
    if (selected !== id) { closeTerminal(); $("#process-output").hidden = true; }
    selected = id;
    $("#detail").hidden = false;
    $("#files-path").value = "/";
    listFiles();
    refresh();
  }

  async function renderDetail(s) {
    if (!s) { // deleted (here or elsewhere)
      selected = null; closeTerminal(); $("#detail").hidden = true; return;
    }
    $("#detail-id").textContent = s.id;
    const st = $("#detail-status"); st.textContent = s.status; st.className = "status " + s.status;
    $("#btn-pause").disabled = s.status !== "ready";
    $("#btn-resume").disabled = s.status !== "paused";
    $("#btn-terminal").disabled = s.status !== "ready";
    const r = s.resources;
    fill($("#detail-info"), [
      row(["image", s.image]), row(["cpu", r.cpu ?? "—"]), row(["memory", bytes(r.memory_bytes)]),
      row(["pids", r.pids_limit ?? "—"]), row(["disk", bytes(r.disk_bytes)]),
      row(["egress", egress(s.network)]), row(["created", since(s.created_at) + " ago"]),
      row(["expires in", until(s.expires_at)]),
      row(["idle timeout", s.idle_timeout_s ? dur(s.idle_timeout_s) : "—"]),
      row(["volumes", Object.entries(s.volumes).map(([t, v]) => t + " ← " + v).join(", ") || "—"]),
      row(["labels", Object.entries(s.labels).map(([k, v]) => k + "=" + v).join(", ") || "—"]),
      ...(s.error ? [row(["error", s.error])] : []),
    ], "");
    if (s.status !== "ready") { fill($("#processes"), [], "processes: only while ready"); return; }
    const procs = await api("GET", `/v1/sandboxes/${s.id}/processes`);
    fill($("#processes"), procs.processes.map((p) => {
      const show = el("button", "output"); show.type = "button";
      show.addEventListener("click", () => showOutput(s.id, p.id));
      return row([el("code", p.id), Array.isArray(p.cmd) ? p.cmd.join(" ") : p.cmd,
        p.status, p.exit_code ?? "", show]);
    }), "no processes");
  }

  async function showOutput(sid, pid) {
    const pre = $("#process-output");
    try {
      const [out, err] = await Promise.all(["stdout", "stderr"].map((st) =>
        api("GET", `/v1/sandboxes/${sid}/processes/${pid}/output?stream=${st}&limit=65536`)));
      pre.textContent = out.data + (err.data ? "\n--- stderr ---\n" + err.data : "");
      pre.hidden = false;
    } catch (e) { showError(e); }
  }

  async function act(path, body) {
    const sid = selected;
    try { await api("POST", `/v1/sandboxes/${sid}/${path}`, body); } catch (e) { showError(e); }
    refresh();
  }

  async function remove() {
    const sid = selected;
    if (!sid || !confirm("Delete sandbox " + sid + "?")) return;
    try { await api("DELETE", `/v1/sandboxes/${sid}`); } catch (e) { showError(e); }
    refresh();
  }

  // ------------------------------------------------------------------ files
  async function listFiles() {
    const sid = selected, path = $("#files-path").value || "/";
    try {
      const res = await api("GET", `/v1/sandboxes/${sid}/files/list?path=${encodeURIComponent(path)}`);
      $("#files-path").value = res.path;
      fill($("#files"), res.entries.map((f) => {
        const a = el("a", f.name + (f.type === "dir" ? "/" : ""), f.type === "dir" ? "dir" : "file");
        a.addEventListener("click", () => (f.type === "dir" ? openDir(f.path) : download(sid, f)));
        return row([a, f.type, f.type === "dir" ? "" : bytes(f.size),
          new Date(f.mtime * 1000).toLocaleString()]);
      }), "empty");
    } catch (e) { fill($("#files"), [], "cannot list: " + e.message); }
  }
  function openDir(path) { $("#files-path").value = path; listFiles(); }
  function up() {
    const p = $("#files-path").value.replace(/\/+$/, "");
    openDir(p.slice(0, p.lastIndexOf("/")) || "/");
  }
  async function download(sid, f) {
    try { // fetched with the token in a header, handed to the browser as a blob
      const r = await api("GET", `/v1/sandboxes/${sid}/files?path=${encodeURIComponent(f.path)}`, undefined, true);
      const url = URL.createObjectURL(await r.blob());
      const a = el("a"); a.href = url; a.download = f.name; document.body.append(a); a.click(); a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) { showError(e); }
  }

  // ------------------------------------------------------------------ terminal
  // A PTY process (POST /processes with pty), its follow stream read with fetch, keys as
  // stdin writes: the same calls `orchard sandbox shell` makes, so no extra route.
  const b64encode = (s) => btoa(String.fromCharCode(...new TextEncoder().encode(s)));
  const b64decode = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));

  async function openTerminal() {
    closeTerminal();
    const sid = selected;
    $("#terminal-panel").hidden = false;
    const xterm = new Terminal({ cols: 100, rows: 24, fontFamily: "DejaVu Sans Mono, monospace" });
    xterm.open($("#terminal"));
    const me = { xterm, sid, pid: null, abort: new AbortController(), queue: Promise.resolve() };
    term = me;
    try {
      const p = await api("POST", `/v1/sandboxes/${sid}/processes`, {
        cmd: ["/bin/sh"], pty: true, rows: 24, cols: 100, tag: "dashboard-terminal",
        env: { TERM: "xterm-256color" },
      });
      me.pid = p.id;
    } catch (e) { xterm.write("\r\n[cannot start a shell: " + e.message + "]\r\n"); return; }
    xterm.onData((d) => {
      me.queue = me.queue.then(() => api("POST", `/v1/sandboxes/${sid}/processes/${me.pid}/stdin`,
        { data: b64encode(d), encoding: "base64" })).catch(() => {});
    });
    xterm.focus();
    follow(me);
  }

  async function follow(me) {
    const path = `/v1/sandboxes/${me.sid}/processes/${me.pid}/follow?encoding=base64`;
    try {
      const r = await api("GET", path, undefined, true, me.abort.signal);
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl); buf = buf.slice(nl + 1);
          if (!line.trim()) continue;
          const ev = JSON.parse(line);
          if ((ev.type === "stdout" || ev.type === "stderr") && ev.data) me.xterm.write(b64decode(ev.data));
          else if (ev.type === "exit") me.xterm.write("\r\n[exited " + ev.exit_code + "]\r\n");
          else if (ev.type === "error") me.xterm.write("\r\n[" + (ev.message || "error") + "]\r\n");
        }
      }
    } catch (e) {
      if (e.name !== "AbortError") me.xterm.write("\r\n[disconnected: " + e.message + "]\r\n");
    }
  }

  function closeTerminal() {
    const me = term;
    term = null;
    $("#terminal-panel").hidden = true;
    if (!me) return;
    me.abort.abort();
    if (me.pid && token) api("DELETE", `/v1/sandboxes/${me.sid}/processes/${me.pid}`).catch(() => {});
    me.xterm.dispose();
  }

  // ------------------------------------------------------------------ wiring
  $("#login-form").addEventListener("submit", login);
  $("#logout").addEventListener("click", logout);
  $("#btn-pause").addEventListener("click", () => act("pause"));
  $("#btn-resume").addEventListener("click", () => act("resume"));
  $("#btn-snapshot").addEventListener("click", () => act("snapshot", { name: "dashboard" }));
  $("#btn-delete").addEventListener("click", remove);
  $("#btn-terminal").addEventListener("click", openTerminal);
  $("#btn-terminal-close").addEventListener("click", closeTerminal);
  $("#files-go").addEventListener("click", listFiles);
  $("#files-up").addEventListener("click", up);
  $("#files-path").addEventListener("keydown", (e) => { if (e.key === "Enter") listFiles(); });
})();
