// A panel's bundle (widgets/_base.py's bundle_esm: _schema.js + _common.js + the panel's
// file), evaluated in a fresh V8 context without a browser, so its pure functions can be
// tested with node's own runner. Top-level `function` declarations become the context's
// properties; the module's `export default` line is the only thing left out.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import vm from "node:vm";

const WIDGETS = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "widgets");

export function loadPanel(name) {
  const source = ["_schema.js", "_common.js", name]
    .map((f) => readFileSync(join(WIDGETS, f), "utf8"))
    .join("\n")
    .replace(/^export default .*$/m, "");
  const context = vm.createContext({ console, Math, Number, String, Array, Object, Map, Set, JSON });
  vm.runInContext(source, context, { filename: name });
  return context;
}
