// Keeps the plotly figures in the same box as wide as the box. plotly's widget sizes a
// figure when it is drawn and afterwards follows only window resizes seen by JupyterLab's
// layout; this follows the box itself: a resized window, a notebook narrowed by a side
// panel, a figure shown after being hidden. Loads nothing: plotly's widget bundle has
// already set window.Plotly by the time a figure exists.

function render({ el }) {
  el.classList.add("kvs-fit-width");
  const widths = new WeakMap();  // figure -> the width it was last fitted to
  let timer = null;
  let box = null;
  function fit() {
    timer = null;
    if (!box && el.parentElement) {
      box = el.parentElement;
      // A figure drawn (or shown) later: a change in the box outside plotly's own drawing.
      boxChanges.observe(box, { childList: true, subtree: true, attributes: true, attributeFilter: ["class", "style"] });
    }
    if (!box) return;
    for (const gd of box.querySelectorAll(".js-plotly-plot")) {
      sizes.observe(gd);  // observing twice is a no-op
      const w = gd.clientWidth;
      if (!w || widths.get(gd) === w) continue;
      widths.set(gd, w);
      const P = window.Plotly;
      if (P && P.Plots && typeof P.Plots.resize === "function") P.Plots.resize(gd);
      else if (typeof gd._responsiveChartHandler === "function") gd._responsiveChartHandler();
    }
  }
  const soon = () => { if (timer === null) timer = setTimeout(fit, 60); };
  // `el` is an empty block in the same box: its width is the box's width.
  const sizes = new ResizeObserver(soon);
  sizes.observe(el);
  const boxChanges = new MutationObserver((records) => {
    for (const r of records) {
      const gd = r.target.closest ? r.target.closest(".js-plotly-plot") : null;
      if (!gd || gd === r.target) { soon(); return; }
    }
  });
  soon();
  return () => { sizes.disconnect(); boxChanges.disconnect(); if (timer !== null) clearTimeout(timer); };
}

export default { render };
