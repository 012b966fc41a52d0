// Runs a Python script in Pyodide under Node, with the project's re-run files on its path (the
// zip explorer/export/rerun_site.py builds for a docs page), and writes what its last expression
// returns (a str):  node pyodide_run.cjs PYODIDE_DIR KVSCOPE_ZIP SCRIPT_PY INPUT OUTPUT
// INPUT's text is the script's global INPUT.
"use strict";
const fs = require("fs");
const path = require("path");

const [pyodideDir, zipPath, scriptPath, inputPath, outputPath] = process.argv.slice(2);
const { loadPyodide } = require(path.resolve(pyodideDir, "pyodide.js"));

(async () => {
  const t0 = performance.now();
  const py = await loadPyodide({
    indexURL: path.resolve(pyodideDir) + "/",
    stdout: () => {},
    stderr: (t) => process.stderr.write(t + "\n"),
  });
  py.unpackArchive(new Uint8Array(fs.readFileSync(zipPath)), "zip", { extractDir: "/kvscope" });
  py.runPython("import sys\nsys.path.insert(0, '/kvscope')");
  const loaded = performance.now() - t0;
  py.globals.set("INPUT", fs.readFileSync(inputPath, "utf8"));
  const out = py.runPython(fs.readFileSync(scriptPath, "utf8"));
  fs.writeFileSync(outputPath, String(out));
  process.stderr.write(`pyodide ${py.version}: loaded in ${(loaded / 1000).toFixed(2)} s\n`);
})().catch((err) => {
  process.stderr.write(String((err && err.stack) || err) + "\n");
  process.exit(1);
});
