// @ts-check
// Queues panel: three columns of request cards, redrawn from the `queues` trait. Each
// column is as wide as its cards need (an empty one stays narrow). Linked: hovering a card
// lights the request's blocks, table and tokens in the other panels (kvsLink), and a card
// lights up when another panel points at its request.

// The traits this panel reads (explorer/ui/views.py queues_state; typed by KvsPanelStates["queues"],
// generated from widgets/queues.py): `queues` holds three lists of KvsQueueRowDict, `finished_total`
// counts every finished request (the list keeps the latest), and `selected` is the linked request's id.

/** The KV progress bar of a card. @param {KvsQueueRowDict} row */
function progress(row) {
  // Known tokens = prompt + outputs; of those, how many have KV (cached hits first).
  const known = row.num_prompt_tokens + row.num_output_tokens;
  const pct = (/** @type {number} */ n) => `${known ? ((100 * n) / known).toFixed(1) : 0}%`;
  const cached = Math.min(row.num_cached_tokens, row.num_computed_tokens);
  const bar = kvsEl(
    "div",
    {
      class: "kvs-bar",
      title: `KV for ${row.num_computed_tokens} of ${known} tokens (${cached} from the prefix cache)`,
    },
    [
      kvsEl("div", { class: "kvs-bar-cached", style: { width: pct(cached) } }),
      kvsEl("div", { class: "kvs-bar-computed", style: { width: pct(row.num_computed_tokens - cached) } }),
    ],
  );
  return kvsEl("div", { class: "kvs-progress" }, [
    bar,
    kvsEl("span", {
      class: "kvs-muted",
      text: `computed ${row.num_computed_tokens}/${known} \u00b7 cached ${row.num_cached_tokens} \u00b7 out ${row.num_output_tokens}/${row.max_tokens ?? "?"}`,
    }),
  ]);
}

// A chat-template prompt shows the user's words; the template's own tokens (ChatML's
// <|im_start|>role ... <|im_end|>, the system turn) fold into one dimmed chip, whose title
// (and a click) shows the whole prompt with those tokens dimmed.
const TEMPLATE_TOKEN = /(<\|[^|<>\s]{1,40}\|>)/g;
const CHATML_USER = /<\|im_start\|>user\n([\s\S]*?)<\|im_end\|>/g;

/** @param {string} text @returns {{user: string, wrapped: boolean}} the last user turn of a ChatML prompt, else the text. */
function userWords(text) {
  const turns = [...String(text || "").matchAll(CHATML_USER)];
  if (!turns.length) return { user: String(text || ""), wrapped: false };
  return { user: turns[turns.length - 1][1], wrapped: true };
}

/** @param {string} text */
function dimmedTemplate(text) {
  return String(text)
    .split(TEMPLATE_TOKEN)
    .map((part, k) => (k % 2 ? kvsEl("span", { class: "kvs-tmpl-tok", text: part }) : part));
}

/** @param {KvsQueueRowDict} row */
function promptText(row) {
  const { user, wrapped } = userWords(row.prompt_text);
  const out = kvsEl("span", { class: "kvs-prompt-text", title: row.prompt_text });
  if (!wrapped) {
    out.append(...dimmedTemplate(user));
    return out;
  }
  const chip = kvsEl("span", {
    class: "kvs-tmpl-chip",
    "data-testid": "kvs-tmpl-chip",
    role: "button",
    title: `in the model's chat template (click to show it):\n${row.prompt_text}`,
    text: "chat \u25b8",
  });
  const words = kvsEl("span", { class: "kvs-user-words", "data-testid": "kvs-user-words", text: user });
  chip.addEventListener("click", (/** @type {MouseEvent} */ ev) => {
    ev.stopPropagation();
    const open = out.classList.toggle("kvs-tmpl-open");
    chip.textContent = open ? "chat \u25be" : "chat \u25b8";
    out.replaceChildren(chip, ...(open ? dimmedTemplate(row.prompt_text) : [words]));
  });
  out.append(chip, words);
  return out;
}

/** @param {KvsQueueScheduledDict|null} s */
function scheduledBadge(s) {
  if (!s) return null;
  const text = s.is_prefill
    ? `prefill chunk ${kvsChunkNumber(s.chunk_index)} \u00b7 ${s.num_tokens} tok` +
      (s.num_cached_tokens ? ` (${s.num_cached_tokens} cached)` : "")
    : `decode \u00b7 ${s.num_tokens} tok`;
  return kvsEl("span", {
    class: `kvs-chip kvs-sched ${s.is_prefill ? "kvs-prefill" : "kvs-decode"}`,
    "data-testid": "kvs-scheduled",
    text,
    title: s.is_prefill ? kvsChunkTitle(s.chunk_index) : null,
  });
}

// Why its prompt hit or missed the prefix cache (explorer/why), in a few words: the biggest
// miss class, in that class's colour; the why panel says the rest.
/** @param {KvsQueueRowDict["why"]} why */
function whyChip(why) {
  if (!why || !why.cls) return null;
  const color = KVS_WHY_LOOKS[why.cls] || "#999";
  return kvsEl("span", {
    class: "kvs-chip kvs-why-chip",
    "data-testid": "kvs-why-chip",
    "data-class": why.cls,
    style: { borderColor: color, background: kvsMix(color, "#ffffff", 0.8) },
    title: `why (prompt tokens at admission): ${why.text}`,
    text: why.text,
  });
}

/**
 * @param {KvsQueueRowDict} row @param {string|null} selected @param {(c: {action: string, request_id: string}) => void} act
 * @param {ReturnType<typeof kvsLink>} link
 */
function card(row, selected, act, link) {
  const rid = row.request_id;
  const head = kvsEl("div", { class: "kvs-card-head" }, [
    // The request's short label ("#17" for a long vLLM id, as the captions say it); its id on hover.
    kvsEl("span", {
      class: "kvs-chip kvs-rid",
      style: { background: kvsColor(rid, true), borderColor: kvsColor(rid) },
      text: row.label || `#${rid}`,
      title: `request ${rid}`,
    }),
    kvsEl("span", {
      class: `kvs-status-${row.status}`,
      text: row.status + (row.finish_reason ? ` (${row.finish_reason})` : ""),
    }),
    scheduledBadge(row.scheduled),
    row.num_preemptions
      ? kvsEl("span", {
          class: "kvs-chip kvs-preempt",
          title: "times preempted",
          text: `preempted \u00d7${row.num_preemptions}`,
        })
      : null,
    whyChip(row.why),
    row.status !== "finished"
      ? kvsEl("button", {
          class: "kvs-abort",
          "data-testid": "kvs-abort",
          title: "Abort this request",
          text: "\u00d7",
          onclick: (/** @type {MouseEvent} */ e) => {
            e.stopPropagation();
            act({ action: "abort", request_id: rid });
          },
        })
      : null,
  ]);
  const text = kvsEl("div", { class: "kvs-text" }, [
    promptText(row),
    kvsEl("span", { class: "kvs-output-text", text: row.output_text }),
  ]);
  return kvsEl(
    "div",
    {
      class: `kvs-card${rid === selected ? " kvs-selected" : ""}${row.scheduled ? " kvs-was-scheduled" : ""}`,
      "data-testid": `kvs-req-${rid}`,
      "data-request-id": rid,
      style: { borderLeftColor: kvsColor(rid) },
      onclick: () => {
        link.pin({ source: "queues", blocks: null, requests: [rid], tokens: null });
        act({ action: "select", request_id: rid });
      },
      onmouseenter: () => link.hover({ source: "queues", blocks: null, requests: [rid], tokens: null }),
      onmouseleave: () => link.leave("queues"),
    },
    [head, text, progress(row)],
  );
}

/** @param {KvsRenderContextOf<KvsPanelStates["queues"]>} ctx */
function render({ model, el }) {
  const root = kvsRoot(el, model, "kvs-queues");
  const sender = kvsSender(model);
  const act = (/** @type {{action: string, request_id: string}} */ c) => sender.send(c);
  const title = kvsEl("div", { class: "kvs-title" }, ["Queues"]);
  const cols = kvsEl("div", { class: "kvs-cols" });
  root.append(title, cols);
  /** @type {KvsFocus|null} */
  let focus = null;
  const link = kvsLink(model, (f) => {
    focus = f;
    light();
  });
  function light() {
    const want = new Set((focus && focus.requests) || []);
    for (const c of cols.querySelectorAll(".kvs-card")) c.classList.toggle("kvs-lit", want.has(c.dataset.requestId));
  }
  function draw() {
    /** @type {Partial<KvsQueueCardsDict>} */
    const q = model.get("queues") || {};
    const selected = model.get("selected");
    cols.replaceChildren();
    /** @type {Array<keyof KvsQueueCardsDict>} */
    const names = ["waiting", "running", "finished"];
    // Columns sized to their content: an empty queue takes only its heading's width.
    cols.style.gridTemplateColumns = names
      .map((n) => ((q[n] || []).length ? "minmax(0, 1fr)" : "max-content"))
      .join(" ");
    for (const name of names) {
      const rows = q[name] || [];
      const total = name === "finished" ? Math.max(model.get("finished_total"), rows.length) : rows.length;
      const more = total > rows.length ? ` (latest ${rows.length})` : "";
      cols.append(
        kvsEl(
          "div",
          { class: `kvs-queue kvs-queue-${name}`, "data-testid": `kvs-queue-${name}`, "data-count": total },
          [
            kvsEl("div", { class: "kvs-queue-head", text: `${name} \u00b7 ${total}${more}` }),
            ...rows.map((r) => card(r, selected, act, link)),
          ],
        ),
      );
    }
    light();
  }
  kvsOnChange(model, KVS_PANELS.queues.draw, draw, ["selected"]);
  focus = link.current();
  draw();
  return () => {
    sender.dispose();
    link.dispose();
  };
}

export default { render };
