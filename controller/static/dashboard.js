// burstctl dashboard (docs/dashboard.md): polls the REST API once a second, draws
// the stacked throughput per job with uPlot, shows the job table and switches the
// policy. Plain JavaScript, no build step. Throughput is computed here, from the
// change of each job's bytes_moved between two polls, and kept for WINDOW_S.
"use strict";

(() => {
  const POLL_MS = 1000;
  const WINDOW_S = 300;
  // one bounded page, highest rate first: a table of 20,000 jobs is never one answer
  const JOBS_PATH = "/v1/jobs?order=rate&limit=100";
  const MIB = 1024 * 1024;
  const TOKEN_KEY = "burstctl.adminToken";
  // Colour-blind-safe first (Okabe–Ito), then more distinct hues.
  const PALETTE = [
    "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442",
    "#332288", "#44aa99", "#882255", "#999933", "#aa4499",
  ];

  const $ = (id) => document.getElementById(id);
  const el = {
    status: $("status"),
    replica: $("replica"),
    policyName: $("policy-name"),
    policyParams: $("policy-params"),
    policyMeta: $("policy-meta"),
    policyForm: $("policy-form"),
    select: $("policy-select"),
    paramsInput: $("policy-params-input"),
    apply: $("policy-apply"),
    description: $("policy-description"),
    tokenForm: $("token-form"),
    tokenInput: $("token-input"),
    tokenCancel: $("token-cancel"),
    error: $("policy-error"),
    ok: $("policy-ok"),
    chart: $("chart"),
    tbody: document.querySelector("#jobs-table tbody"),
    jobsCount: $("jobs-count"),
    patterns: $("patterns"),
    patternsPanel: $("patterns-panel"),
    bufferPanel: $("buffer-panel"),
    bufferSummary: $("buffer-summary"),
    bufferUsed: $("buffer-used"),
    bufferFill: $("buffer-fill"),
    bufferWaiting: $("buffer-waiting"),
    bufferBody: document.querySelector("#buffer-table tbody"),
    rulesPanel: $("rules-panel"),
    rulesSummary: $("rules-summary"),
    rulesBody: document.querySelector("#rules-table tbody"),
  };

  const state = {
    samples: [], // {t: seconds, moved: Map(job_id -> bytes_moved)}, oldest first
    colors: new Map(), // job_id -> colour, stable for the page's life
    policies: [],
    policy: null,
    chart: null,
    chartKey: null, // the job ids the chart was built for
    series: [], // [{job_id, color, values}] of the last render (raw, not stacked)
    polls: 0,
    schedules: [], // GET /v1/schedules of the last poll
    capacity: null, // GET /v1/capacity of the last poll
    rules: null, // GET /v1/rules of the last poll
    selectDirty: false, // the user picked something: polling must not reset the select
    applyAfterToken: false,
  };

  class ApiError extends Error {
    constructor(status, body) {
      super(`${status}: ${formatDetail(body)}`);
      this.status = status;
    }
  }

  function formatDetail(body) {
    const detail = body && body.detail !== undefined ? body.detail : body;
    if (Array.isArray(detail)) {
      return detail
        .map((d) => {
          const loc = (d.loc || []).filter((p) => p !== "body").join(".");
          return loc ? `${loc}: ${d.msg}` : d.msg;
        })
        .join("\n");
    }
    return typeof detail === "string" ? detail : JSON.stringify(detail);
  }

  async function api(method, path, body, onHeaders) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = response.statusText;
    }
    if (!response.ok) throw new ApiError(response.status, data);
    if (onHeaders) onHeaders(response.headers);
    return data;
  }

  // ---- formatting -------------------------------------------------------------

  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
  }

  const mibs = (v) => (v == null ? "–" : (v / MIB).toFixed(2));

  function colorOf(jobId) {
    if (!state.colors.has(jobId)) {
      state.colors.set(jobId, PALETTE[state.colors.size % PALETTE.length]);
    }
    return state.colors.get(jobId);
  }

  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  // ---- periodic patterns (GET /v1/schedules) --------------------------------------

  const SVG = "http://www.w3.org/2000/svg";

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }

  // One row per job: its windows over one period (a window past the end wraps to the
  // start), their height proportional to the rate, and a line where the job is now.
  function renderSchedules(schedules) {
    state.schedules = schedules;
    el.patternsPanel.hidden = schedules.length === 0;
    el.patterns.replaceChildren();
    const peak = Math.max(1, ...schedules.flatMap((s) => s.windows.map((w) => w.rate)));
    for (const s of schedules) {
      const row = document.createElement("div");
      row.className = "pattern";
      const label = document.createElement("span");
      label.className = "pattern-label";
      label.textContent = `${s.job_id} · ${s.period_s.toFixed(2)} s`;
      row.appendChild(label);
      const width = 600;
      const height = 28;
      const box = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "pattern-bar" });
      box.appendChild(svg("rect", { x: 0, y: 0, width, height, class: "pattern-period" }));
      const x = (t) => (t / s.period_s) * width;
      for (const w of s.windows) {
        const h = Math.max(2, (w.rate / peak) * height);
        const parts = w.end_s <= s.period_s
          ? [[w.start_s, w.end_s]]
          : [[w.start_s, s.period_s], [0, w.end_s - s.period_s]];
        for (const [a, b] of parts) {
          const r = svg("rect", {
            x: x(a), y: height - h, width: Math.max(1, x(b) - x(a)), height: h,
            fill: colorOf(s.job_id),
          });
          const tip = svg("title", {});
          tip.textContent = `${w.start_s.toFixed(3)}–${w.end_s.toFixed(3)} s at ${mibs(w.rate)} MiB/s`;
          r.appendChild(tip);
          box.appendChild(r);
        }
      }
      box.appendChild(svg("line", {
        x1: x(s.phase_s), x2: x(s.phase_s), y1: 0, y2: height, class: "pattern-now",
      }));
      row.appendChild(box);
      el.patterns.appendChild(row);
    }
  }

  // ---- the burst buffer (GET /v1/capacity) -----------------------------------------

  // The fill bar (used of S), and per job what is on the buffer, what waits to drain, the
  // drain's rate, what it copied and why it does not drain. Hidden while there is neither
  // a capacity nor a job with bytes or a drain.
  function renderCapacity(cap) {
    state.capacity = cap;
    el.bufferPanel.hidden = cap.size == null && cap.jobs.length === 0;
    const fraction = cap.size ? Math.min(1, cap.used / cap.size) : 0;
    el.bufferUsed.style.width = `${(fraction * 100).toFixed(1)}%`;
    el.bufferUsed.classList.toggle("full", fraction >= 0.95);
    el.bufferFill.setAttribute("aria-valuenow", String(Math.round(fraction * 100)));
    el.bufferFill.hidden = cap.size == null;
    el.bufferSummary.textContent = cap.size == null
      ? `(no capacity set; drain ${mibs(cap.drain_rate)} MiB/s)`
      : `(${mibs(cap.used)} of ${mibs(cap.size)} MiB used, ${(fraction * 100).toFixed(0)} %; ` +
        `drain ${mibs(cap.drain_rate)} MiB/s)`;
    el.bufferWaiting.textContent = cap.waiting.length
      ? `waiting for space: ${cap.waiting.join(", ")}`
      : "";
    el.bufferBody.replaceChildren();
    for (const j of cap.jobs) {
      const tr = document.createElement("tr");
      const name = cell(tr, "");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = colorOf(j.job_id);
      name.append(swatch, j.job_id);
      cell(tr, mibs(j.resident), "num");
      cell(tr, mibs(j.pending), "num");
      cell(tr, mibs(j.drain_rate), "num");
      cell(tr, mibs(j.drained), "num");
      cell(tr, j.drain_error, j.drain_error ? "error" : "");
      el.bufferBody.appendChild(tr);
    }
  }

  // ---- operator rules (GET /v1/rules, docs/rules.md) ------------------------------

  // A job's rule: its name, "limited" while its limit holds it back, "reservation unmet".
  function ruleText(j) {
    if (!j.rule) return "–";
    if (j.limited_by) return `${j.rule} (limited)`;
    if (j.reservation_met === false) return `${j.rule} (reservation unmet)`;
    return j.rule;
  }

  // Each rule: what it matches and sets, the jobs it binds here and their rate, and whether
  // its limit binds or its reservation is unmet. Hidden while there is no rule.
  function renderRules(got) {
    state.rules = got;
    el.rulesPanel.hidden = got.rules.length === 0;
    el.rulesSummary.textContent = got.overcommitted
      ? `(the reservations sum to ${mibs(got.overcommitted)} MiB/s, above the capacity: ` +
        "scaled down to it)"
      : "";
    el.rulesBody.replaceChildren();
    for (const r of got.rules) {
      const tr = document.createElement("tr");
      tr.dataset.rule = r.name;
      cell(tr, r.name);
      cell(tr, Object.entries(r.match).map(([k, v]) => `${k}=${v}`).join(" "));
      cell(tr, r.limit ? mibs(r.limit) : "–", "num");
      cell(tr, r.reservation ? mibs(r.reservation) : "–", "num");
      cell(tr, String(r.weight), "num");
      cell(tr, r.metadata_ops ? String(r.metadata_ops) : "–", "num");
      cell(tr, String(r.jobs.length), "num");
      cell(tr, mibs(r.rate), "num");
      const now = r.limited ? "limit binds" : r.reservation_met === false ? "reservation unmet" : "";
      cell(tr, now, now ? "throttled" : "");
      el.rulesBody.appendChild(tr);
    }
  }

  // ---- throughput ring and chart ------------------------------------------------

  function record(jobs) {
    const t = Date.now() / 1000;
    state.samples.push({ t, moved: new Map(jobs.map((j) => [j.job_id, j.bytes_moved])) });
    // one extra sample before the window: the first point inside it needs a predecessor
    while (state.samples.length > 2 && state.samples[1].t < t - WINDOW_S) state.samples.shift();
  }

  // Bytes/s of every job seen in the window, per interval between two polls.
  function throughput() {
    const s = state.samples;
    const ids = new Set();
    s.forEach((x) => x.moved.forEach((_, id) => ids.add(id)));
    const jobIds = [...ids].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
    const times = [];
    const values = jobIds.map(() => []);
    for (let k = 1; k < s.length; k += 1) {
      const dt = s[k].t - s[k - 1].t;
      if (dt <= 0) continue;
      times.push(s[k].t);
      jobIds.forEach((id, i) => {
        const now = s[k].moved.get(id);
        const before = s[k - 1].moved.get(id);
        // absent on either side (new or gone) or a reset counter: nothing moved that we know of
        const delta = now === undefined || before === undefined ? 0 : Math.max(0, now - before);
        values[i].push(delta / dt);
      });
    }
    return { times, jobIds, values };
  }

  function chartSize() {
    return { width: Math.max(320, el.chart.clientWidth), height: 320 };
  }

  function alpha(hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
  }

  function buildChart(jobIds) {
    if (state.chart) state.chart.destroy();
    const series = [
      {
        label: "time",
        value: (u, v, sidx, idx) =>
          idx == null ? "latest" : new Date(v * 1000).toLocaleTimeString(),
      },
    ];
    const bands = [];
    jobIds.forEach((id, i) => {
      const color = colorOf(id);
      series.push({
        label: id,
        stroke: color,
        fill: alpha(color, 0.35),
        width: 1.5,
        points: { show: false },
        // the legend shows the job's own throughput, not the stacked sum; the latest
        // one while the cursor is not over the chart
        value: (u, v, sidx, idx) => {
          const values = state.series[sidx - 1] ? state.series[sidx - 1].values : [];
          return mibs(values[idx == null ? values.length - 1 : idx]);
        },
      });
      // fill each job's area down to the job below it, not to zero
      if (i > 0) bands.push({ series: [i + 1, i] });
    });
    const opts = {
      ...chartSize(),
      series,
      bands,
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
      axes: [{}, { label: "MiB/s", size: 60 }],
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
    };
    state.chart = new uPlot(opts, [[], ...jobIds.map(() => [])], el.chart);
    state.chartKey = jobIds.join("\u0000");
  }

  function renderChart() {
    const { times, jobIds, values } = throughput();
    state.series = jobIds.map((id, i) => ({ job_id: id, color: colorOf(id), values: values[i] }));
    if (state.chart === null || state.chartKey !== jobIds.join("\u0000")) buildChart(jobIds);
    // stack: each series holds the sum of itself and the ones below it (in MiB/s)
    const acc = times.map(() => 0);
    const stacked = values.map((v) => v.map((x, k) => (acc[k] += x / MIB)));
    state.chart.setData([times, ...stacked]);
  }

  // ---- job table -----------------------------------------------------------------

  // Declared (w, vol_io) and learned (T, w, vol_io, confidence) periods; "▸" marks the one
  // the policies use.
  function periodText(j) {
    const parts = [];
    if (j.w != null) {
      const mark = j.period_used === "declared" ? "▸ " : "";
      parts.push(`${mark}declared w ${j.w.toFixed(3)} s, ${bytes(j.vol_io)}`);
    }
    const l = j.learned;
    if (l) {
      const mark = j.period_used === "learned" ? "▸ " : "";
      const what = `T ${l.period.toFixed(3)} s, w ${l.w.toFixed(3)} s, ${bytes(l.vol_io)}`;
      parts.push(`${mark}learned ${what} (${l.confidence.toFixed(2)}, ${l.samples} phases)`);
    }
    return parts.length ? parts.join(" · ") : "–";
  }

  function renderJobs(jobs, total) {
    const latest = new Map(state.series.map((s) => [s.job_id, s.values[s.values.length - 1]]));
    const rows = jobs.map((j) => {
      const tr = document.createElement("tr");
      tr.dataset.jobId = j.job_id;
      const stateText = j.in_io ? "in I/O" : j.active ? "active" : j.registered ? "registered" : "idle";
      if (!j.active) tr.className = "idle";
      const first = cell(tr, "");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = colorOf(j.job_id);
      first.append(swatch, document.createTextNode(j.job_id));
      first.className = "job-id";
      cell(tr, j.user);
      cell(tr, j.group);
      cell(tr, String(j.nodes), "num");
      cell(tr, stateText, "state");
      cell(tr, mibs(j.rate), "num");
      cell(tr, mibs(latest.get(j.job_id)), "num");
      cell(tr, bytes(j.bytes_read), "num");
      cell(tr, bytes(j.bytes_written), "num");
      cell(tr, j.yield == null ? "–" : j.yield.toFixed(3), "num");
      cell(tr, periodText(j), "period");
      cell(tr, j.wait_seconds.toFixed(1), "num");
      cell(tr, ruleText(j), j.limited_by || j.reservation_met === false ? "rule throttled" : "rule");
      return tr;
    });
    el.tbody.replaceChildren(...rows);
    const active = jobs.filter((j) => j.active).length;
    el.jobsCount.textContent =
      total > jobs.length
        ? `(${jobs.length} of ${total} with the highest rate, ${active} of them active)`
        : `(${jobs.length}, ${active} active)`;
  }

  // ---- policy --------------------------------------------------------------------

  function ensureOption(name) {
    if (![...el.select.options].some((o) => o.value === name)) {
      // a sharing spec such as group>user>size: valid, but not a registry name
      el.select.add(new Option(name, name));
    }
  }

  function showPolicy(policy) {
    state.policy = policy;
    el.policyName.textContent = policy.name;
    el.policyParams.textContent = JSON.stringify(policy.params);
    el.policyMeta.textContent =
      `version ${policy.version}, since ${new Date(policy.since).toLocaleString()}`;
    el.replica.textContent = `replica ${policy.replica_id}`;
    if (!state.selectDirty && el.select.options.length) {
      ensureOption(policy.name);
      el.select.value = policy.name;
      describeSelected();
    }
  }

  async function loadPolicies() {
    const policies = await api("GET", "/v1/policies");
    state.policies = policies;
    el.select.replaceChildren(...policies.map((p) => new Option(`${p.name} (${p.family})`, p.name)));
    if (state.policy) {
      ensureOption(state.policy.name);
      el.select.value = state.policy.name;
    }
    describeSelected();
  }

  function describeSelected() {
    const p = state.policies.find((x) => x.name === el.select.value);
    el.description.textContent = p ? p.description : "";
  }

  function showMessage(target, text) {
    for (const m of [el.error, el.ok]) {
      m.hidden = m !== target || !text;
      m.textContent = m === target ? text : "";
    }
  }

  function askToken(thenApply, reason) {
    state.applyAfterToken = thenApply;
    el.tokenForm.hidden = false;
    el.tokenInput.value = "";
    el.tokenInput.focus();
    if (reason) showMessage(el.error, reason);
  }

  async function applyPolicy() {
    showMessage(null, "");
    const name = el.select.value;
    let params = {};
    const raw = el.paramsInput.value.trim();
    if (raw) {
      try {
        params = JSON.parse(raw);
      } catch (e) {
        showMessage(el.error, `params: not JSON (${e.message})`);
        return;
      }
      if (params === null || typeof params !== "object" || Array.isArray(params)) {
        showMessage(el.error, "params: must be a JSON object such as {\"delta\": 0.5}");
        return;
      }
    }
    if (!sessionStorage.getItem(TOKEN_KEY)) {
      askToken(true);
      return;
    }
    el.apply.disabled = true;
    try {
      const policy = await api("PUT", "/v1/policy", { name, params });
      state.selectDirty = false;
      showPolicy(policy);
      showMessage(el.ok, `switched to ${policy.name} (version ${policy.version})`);
    } catch (e) {
      if (e.status === 401 || e.status === 403) {
        sessionStorage.removeItem(TOKEN_KEY);
        askToken(true, `${e.message}: enter the admin token`);
      } else {
        showMessage(el.error, e.message);
      }
    } finally {
      el.apply.disabled = false;
    }
  }

  el.select.addEventListener("change", () => {
    state.selectDirty = true;
    describeSelected();
  });
  el.policyForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    applyPolicy();
  });
  el.tokenForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const token = el.tokenInput.value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    el.tokenForm.hidden = true;
    el.tokenInput.value = "";
    showMessage(null, "");
    if (state.applyAfterToken) applyPolicy();
  });
  el.tokenCancel.addEventListener("click", () => {
    el.tokenForm.hidden = true;
    state.applyAfterToken = false;
  });
  window.addEventListener("resize", () => state.chart && state.chart.setSize(chartSize()));

  // ---- polling -------------------------------------------------------------------

  function setStatus(text, stale) {
    el.status.textContent = text;
    el.status.classList.toggle("stale", Boolean(stale));
  }

  async function poll() {
    const started = performance.now();
    try {
      if (!state.policies.length) await loadPolicies();
      let total = null;
      const [jobs, policy, schedules, capacity, rules] = await Promise.all([
        api("GET", JOBS_PATH, undefined, (h) => (total = Number(h.get("X-Total-Count")))),
        api("GET", "/v1/policy"),
        api("GET", "/v1/schedules"),
        api("GET", "/v1/capacity"),
        api("GET", "/v1/rules"),
      ]);
      record(jobs);
      renderChart();
      renderJobs(jobs, total);
      renderSchedules(schedules);
      renderCapacity(capacity);
      renderRules(rules);
      showPolicy(policy);
      setStatus(`updated ${new Date().toLocaleTimeString()}`, false);
    } catch (e) {
      if ((e.status === 401 || e.status === 403) && el.tokenForm.hidden) {
        // protect_reads is on: reads need the token too
        sessionStorage.removeItem(TOKEN_KEY);
        askToken(false, `${e.message}: reads need the admin token`);
      }
      setStatus(`not updated: ${e.message}`, true);
    }
    state.polls += 1;
    setTimeout(poll, Math.max(0, POLL_MS - (performance.now() - started)));
  }

  // For tests and the curious: what the chart shows right now.
  window.dashboard = {
    polls: () => state.polls,
    samples: () => state.samples.length,
    policy: () => state.policy,
    schedules: () => state.schedules.map((s) => ({ job_id: s.job_id, windows: s.windows.length })),
    capacity: () => state.capacity,
    rules: () => state.rules,
    series: () =>
      state.series.map((s) => ({
        job_id: s.job_id,
        color: s.color,
        points: s.values.length,
        last: s.values.length ? s.values[s.values.length - 1] : null,
        max: s.values.length ? Math.max(...s.values) : null,
      })),
  };

  poll();
})();
