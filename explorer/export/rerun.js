// @ts-check
/* kvscope: a docs chapter's recorded run, re-run at other settings in this page. Pyodide runs the
   project's own Python (explorer/export/rerun.py: kvscope's scheduler, KV cache manager and block
   pool, fed the recorded tokens) and returns the run as the one-file export page, shown below the
   form. Nothing but this file loads with the page: the first Run loads Pyodide and the Python
   files (explorer/export/rerun_site.py writes them as scripts, since a page opened from file://
   may neither fetch() nor import a module), and serves Pyodide's binaries to its loader. */
(function () {
  const w = /** @type {any} */ (window);
  if (w.kvsRerun) return;
  const RUNTIME_FILES = [
    "pyodide.js",
    "pyodide.asm.js",
    "pyodide.asm.wasm.js",
    "python_stdlib.zip.js",
    "pyodide-lock.json.js",
    "kvscope.zip.js",
    "assets.js",
  ];
  /** @type {Map<string, Promise<void>>} */
  const scripts = new Map();
  /** @type {Promise<{py: any, seconds: number}> | null} */
  let booting = null;

  /** @param {string} src */
  function script(src) {
    let p = scripts.get(src);
    if (!p) {
      p = new Promise((resolve, reject) => {
        const s = document.createElement("script");
        s.src = src;
        s.onload = () => resolve();
        s.onerror = () => reject(new Error("could not load " + src));
        document.head.appendChild(s);
      });
      scripts.set(src, p);
    }
    return p;
  }

  /** The bytes a runtime script handed over (gunzipped where it was gzipped).
   * @param {string} name @returns {Promise<Uint8Array<ArrayBuffer>>} */
  async function file(name) {
    const f = w.KVS_RERUN_FILES[name];
    const bin = atob(f.b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    if (!f.gzip) return bytes;
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  /** Pyodide with the project's Python files on its path. @param {string} runtime */
  async function boot(runtime) {
    const t0 = performance.now();
    for (const f of RUNTIME_FILES) await script(runtime + f);
    /** @type {Record<string, [string, Uint8Array<ArrayBuffer>]>} */
    const served = {
      "pyodide.asm.wasm": ["application/wasm", await file("pyodide.asm.wasm")],
      "python_stdlib.zip": ["application/zip", await file("python_stdlib.zip")],
    };
    const realFetch = window.fetch;
    // Pyodide's loader fetches these two by URL: served from memory while it loads.
    window.fetch = (input, init) => {
      const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
      const hit = served[url.split("/").pop() || ""];
      return hit
        ? Promise.resolve(new Response(hit[1], { headers: { "Content-Type": hit[0] } }))
        : realFetch(input, init);
    };
    let py;
    try {
      const lock = JSON.parse(new TextDecoder().decode(await file("pyodide-lock.json")));
      py = await w.loadPyodide({
        indexURL: new URL(runtime, location.href).href,
        lockFileContents: lock,
        stdout: () => {},
        stderr: (/** @type {string} */ t) => console.warn(t),
      });
    } finally {
      window.fetch = realFetch;
    }
    py.unpackArchive(await file("kvscope.zip"), "zip", { extractDir: "/kvscope" });
    py.runPython("import sys\nsys.path.insert(0, '/kvscope')\nfrom explorer.export.rerun import rerun_page_json");
    py.globals.set("KVS_ASSETS", new TextDecoder().decode(await file("assets.json")));
    return { py, seconds: (performance.now() - t0) / 1000 };
  }

  /** @param {HTMLElement} parent @param {string} tag @param {string} text @param {string} [cls] */
  function add(parent, tag, text, cls) {
    const el = document.createElement(tag);
    el.textContent = text;
    if (cls) el.className = cls;
    parent.appendChild(el);
    return el;
  }

  /** @param {HTMLFormElement} form @param {any} out @param {number} ms */
  function show(form, out, ms) {
    const result = /** @type {HTMLElement} */ (form.querySelector(".kvs-rerun-result"));
    result.replaceChildren();
    result.hidden = false;
    add(result, "p", `Re-run with ${out.label}: ${ms.toFixed(0)} ms in this page.`, "kvs-rerun-label");
    const parting = add(result, "p", out.parting, "kvs-rerun-parting");
    parting.dataset.testid = "kvs-rerun-parting";
    if (out.stopped) add(result, "p", out.stopped, "kvs-rerun-stopped");
    for (const note of out.notes) add(result, "p", note, "kvs-rerun-note");
    const table = document.createElement("table");
    table.className = "kvs-rerun-table";
    table.dataset.testid = "kvs-rerun-table";
    const rows = [
      ["", "recorded", "re-run"],
      ["steps", "steps"],
      ["preemptions", "preemptions"],
      ["prefix-hit tokens", "hit_tokens"],
      ["finished requests", "finished"],
    ];
    for (const [i, row] of rows.entries()) {
      const tr = document.createElement("tr");
      const cells = i === 0 ? row : [row[0], String(out.summary.recorded[row[1]]), String(out.summary.rerun[row[1]])];
      for (const c of cells) add(tr, i === 0 ? "th" : "td", c);
      table.appendChild(tr);
    }
    result.appendChild(table);
    add(result, "p", out.exact, "kvs-rerun-exact");
    const frame = document.createElement("iframe");
    frame.className = "kvs-replay";
    frame.dataset.testid = "kvs-rerun-replay";
    frame.title = `Re-run with ${out.label}`;
    frame.srcdoc = out.html;
    result.appendChild(frame);
  }

  /** @param {HTMLFormElement} form */
  async function run(form) {
    const status = /** @type {HTMLElement} */ (form.querySelector(".kvs-rerun-status"));
    const button = /** @type {HTMLButtonElement} */ (form.querySelector("button"));
    /** @type {Record<string, number | boolean>} */
    const settings = {};
    for (const input of form.querySelectorAll("input")) {
      settings[input.name] = input.type === "checkbox" ? input.checked : Number(input.value);
    }
    button.disabled = true;
    status.textContent = booting ? "Running ..." : "Loading Python in this page (once) ...";
    try {
      booting = booting || boot(form.dataset.runtime || "");
      const { py, seconds } = await booting;
      await script(form.dataset.workload || "");
      const t0 = performance.now();
      py.globals.set("KVS_WORKLOAD", JSON.stringify(w.KVS_RERUN_WORKLOADS[form.dataset.key || ""]));
      py.globals.set("KVS_SETTINGS", JSON.stringify(settings));
      const out = JSON.parse(py.runPython("rerun_page_json(KVS_WORKLOAD, KVS_SETTINGS, KVS_ASSETS)"));
      const ms = performance.now() - t0;
      if (out.error) {
        status.textContent = `Not run: ${out.error}`;
        return;
      }
      show(form, out, ms);
      status.textContent = `Done (Python loaded in ${seconds.toFixed(1)} s, once).`;
      form.dataset.ready = "1";
    } catch (err) {
      booting = booting && err instanceof Error && /could not load/.test(err.message) ? null : booting;
      status.textContent = `The re-run failed: ${err instanceof Error ? err.message : String(err)}`;
      console.error(err);
    } finally {
      button.disabled = false;
    }
  }

  w.kvsRerun = run;
  document.addEventListener("submit", (e) => {
    const form = /** @type {HTMLElement} */ (e.target);
    if (form instanceof HTMLFormElement && form.classList.contains("kvs-rerun")) {
      e.preventDefault();
      run(form);
    }
  });
})();
