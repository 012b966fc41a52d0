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

/** anywidget's render({model, el}). */
interface KvsRenderContext {
  model: KvsModel;
  el: HTMLElement;
}

/** A linked-highlighting focus (_common.js kvsLink). */
interface KvsFocus {
  source: string;
  blocks: number[] | null;
  requests: string[] | null;
  tokens?: Array<[string, number]> | null;
}

interface Window {
  /** The linked-highlighting channels of every Dashboard on the page, by link_group. */
  __kvsLinks?: Map<string, { hover: KvsFocus | null; pinned: KvsFocus | null; listeners: Set<(f: KvsFocus | null) => void> }>;
  /** An export page's decoded steps and host, for tests (explorer/export/host.js). */
  kvsExport?: object;
}
