// Types for `tsc --noEmit` over the panels' JavaScript (tests/widgets/test_js_types.py); no
// code. The panels run as plain ES modules with _schema.js, _panels.js and _common.js
// prepended (widgets/_base.py bundle_esm), so those files' declarations are globals here.

/** What anywidget hands a panel's render(): the widget model (Python's traitlets, synced). */
interface KvsModel {
  get(name: string): any;
  set(name: string, value: any): void;
  on(event: string, handler: (...args: any[]) => void): void;
  off(event?: string | null, handler?: ((...args: any[]) => void) | null): void;
  send(content: object, callbacks?: any, buffers?: any[]): void;
  save_changes(): void;
}

/** A bytes trait as it arrives: a DataView (ipywidgets 8), an ArrayBuffer or a typed array (_common.js kvsArray). */
type KvsBytes = DataView | ArrayBuffer | ArrayBufferView;

/** A panel's model, its state's fields typed (widgets/_panel_states.d.ts, generated from its Python TypedDicts);
 * a field its state does not declare (a trait outside the parts, such as `link_group`) stays `any`. */
interface KvsModelOf<S> extends KvsModel {
  get<K extends keyof S & string>(name: K): S[K];
  get(name: string): any;
}

/** anywidget's render({model, el}). */
interface KvsRenderContext {
  model: KvsModel;
  el: HTMLElement;
}

/** render({model, el}) of the panel whose state is `S` (KvsPanelStates["blocks"], ...). */
interface KvsRenderContextOf<S> {
  model: KvsModelOf<S>;
  el: HTMLElement;
}

/** A linked-highlighting focus (_common.js kvsLink). */
interface KvsFocus {
  source: string;
  blocks: number[] | null;
  requests: string[] | null;
  tokens?: Array<[string, number]> | null;
}

/** One Dashboard's channel (_common.js kvsLinkBus): linked highlighting, and a hold on redraws. */
interface KvsLinkBus {
  hover: KvsFocus | null;
  pinned: KvsFocus | null;
  listeners: Set<(f: KvsFocus | null) => void>;
  /** The step the panels are held at (the Follow panel's Pause, before the kernel heard it), or null. */
  held: number | null;
  /** The step the panels drew last. */
  shown?: number;
  /** Redraws that came while held: run once, when released. */
  deferred: Set<() => void>;
}

interface Window {
  /** The channels of every Dashboard on the page, by link_group. */
  __kvsLinks?: Map<string, KvsLinkBus>;
  /** An export page's decoded steps and host, for tests (explorer/export/host.js). */
  kvsExport?: object;
}
