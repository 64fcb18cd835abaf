// The sandbox's side of the tool proxy, for TypeScript: `/servers/client.ts`.
//
//   import { callMCPTool, resultOf } from "/servers/client.ts";
//   const file = await callMCPTool<{ content: string }>("filesystem__read_text_file", { path: "/data/a.txt" });
//   file.content;             // the structured value, as the tool's outputSchema says
//   resultOf(file)?.text;     // the text content it came with
//
// Protocol (src/proxy/mod.rs): after the boot frame, fd 3 carries newline-delimited
// JSON-RPC 2.0. The sandbox sends requests (`tools/call`, `tools/search`, `tools/get`);
// the supervisor answers each with a response of the same id. Responses may come in any
// order, so several calls can be in flight (Promise.all). fd 3 is read through libc over
// FFI with a non-blocking (threaded) read that is only outstanding while a call waits:
// a program with no call in flight can exit.
//
// Writes never block the event loop: a request goes out with one `send(MSG_DONTWAIT)`
// when nothing is queued, and whatever the socket does not take then waits in an ordered
// queue written by a threaded `write`. The supervisor stops reading fd 3 while the
// answers it queued for us are unread (src/proxy/session.rs); a write that blocked the
// event loop would then keep our reader from ever taking them — a deadlock of
// `Promise.all` over many large calls.
//
// The same file is also /opt/codebox/deno/client.ts; the channel's state lives on
// globalThis, so however many copies are imported there is one reader and one id space.
//
// In a keep-alive session (src/runtime/boot.rs) the boot file waits for the next run's
// `codebox/run` notification through the same reader (`nextControl`) and reports the end
// of each run with `notify`: one read buffer for the tool calls and the session.

const CHANNEL_FD = 3;

type Pending = { resolve: (v: unknown) => void; reject: (e: Error) => void };
type Message = {
  id?: number;
  method?: string;
  params?: unknown;
  result?: unknown;
  error?: { code: number; message: string };
};

type Channel = {
  libc: Deno.DynamicLibrary<{
    read: { parameters: ["i32", "buffer", "usize"]; result: "isize"; nonblocking: true };
    write: { parameters: ["i32", "buffer", "usize"]; result: "isize" };
  }>;
  pending: Map<number, Pending>;
  nextId: number;
  reading: boolean;
  closed: string | null;
  /** Read buffer: `buf[0..len]` is read from fd 3 and not dispatched yet (an
   * incomplete line); the rest is room for the next read. */
  buf: Uint8Array;
  len: number;
  /** `buf[0..scanned]` holds no newline: the next search starts there. */
  scanned: number;
  /** `codebox/run` notifications read before anyone waited for them. */
  controls: Message[];
  /** The session waiting in nextControl, if any. */
  waiter: ((message: Message | null) => void) | null;
  /** fd 3 reached EOF. */
  eof: boolean;
};

const RUN_METHOD = "codebox/run";

const KEY = Symbol.for("codebox.channel");
const g = globalThis as unknown as { [KEY]?: Channel };
const channel: Channel = g[KEY] ??= {
  libc: Deno.dlopen("libc.so.6", {
    read: { parameters: ["i32", "buffer", "usize"], result: "isize", nonblocking: true },
    write: { parameters: ["i32", "buffer", "usize"], result: "isize" },
  } as const),
  pending: new Map(),
  nextId: 1,
  reading: false,
  closed: null,
  buf: new Uint8Array(0),
  len: 0,
  scanned: 0,
  controls: [],
  waiter: null,
  eof: false,
};
// A channel made by an older copy of this file (a rootfs older than the binary) lacks
// the read buffer's length and scan offset.
channel.len ??= channel.buf.length;
channel.scanned ??= 0;
const { libc, pending } = channel;

/** The write side: a non-blocking send, and an ordered queue for what it did not take. */
type Output = {
  lib: Deno.DynamicLibrary<{
    send: { parameters: ["i32", "buffer", "usize", "i32"]; result: "isize" };
    writeThreaded: {
      name: "write";
      parameters: ["i32", "buffer", "usize"];
      result: "isize";
      nonblocking: true;
    };
  }>;
  queue: Uint8Array[];
  busy: boolean;
};
const OUTPUT_KEY = Symbol.for("codebox.channel.output");
const go = globalThis as unknown as { [OUTPUT_KEY]?: Output };
const output: Output = go[OUTPUT_KEY] ??= {
  lib: Deno.dlopen("libc.so.6", {
    send: { parameters: ["i32", "buffer", "usize", "i32"], result: "isize" },
    writeThreaded: {
      name: "write",
      parameters: ["i32", "buffer", "usize"],
      result: "isize",
      nonblocking: true,
    },
  } as const),
  queue: [],
  busy: false,
};
const MSG_DONTWAIT = 0x40;
const MSG_NOSIGNAL = 0x4000;

/** A tool call that failed: denied, unknown, upstream error or `isError` result. */
export class ToolError extends Error {
  constructor(
    message: string,
    /** The JSON-RPC error code, or undefined when the tool itself reported isError. */
    readonly code?: number,
    /** The tool's result when it reported isError. */
    readonly result?: unknown,
  ) {
    super(message);
    this.name = "ToolError";
  }
}

const encoder = new TextEncoder();

/** Blocking write of a whole message; only when nothing is queued (see `enqueue`). */
function writeAll(bytes: Uint8Array) {
  let off = 0;
  let failures = 0;
  while (off < bytes.length) {
    const n = Number(libc.symbols.write(CHANNEL_FD, bytes.subarray(off), BigInt(bytes.length - off)));
    if (n > 0) {
      off += n;
    } else if (++failures > 100) {
      throw new ToolError("codebox: the tool channel (fd 3) is closed");
    }
  }
}

/** Sends a whole message without ever blocking the event loop; messages keep their order. */
function enqueue(bytes: Uint8Array) {
  if (!output.busy && output.queue.length === 0) {
    const n = Number(
      output.lib.symbols.send(CHANNEL_FD, bytes, BigInt(bytes.length), MSG_DONTWAIT | MSG_NOSIGNAL),
    );
    if (n === bytes.length) return;
    if (n > 0) bytes = bytes.subarray(n);
  }
  output.queue.push(bytes);
  if (!output.busy) flushQueue();
}

// Writes the queue in order on a worker thread; the event loop (and our reader) runs on.
async function flushQueue() {
  output.busy = true;
  let failures = 0;
  try {
    while (output.queue.length > 0) {
      const head = output.queue[0];
      const n = Number(await output.lib.symbols.writeThreaded(CHANNEL_FD, head, BigInt(head.length)));
      if (n === head.length) output.queue.shift();
      else if (n > 0) output.queue[0] = head.subarray(n);
      else if (++failures > 100) {
        output.queue.length = 0;
        failAll("codebox: the tool channel (fd 3) is closed");
      }
    }
  } finally {
    output.busy = false;
  }
}

function failAll(why: string) {
  channel.closed = why;
  for (const p of pending.values()) p.reject(new ToolError(why));
  pending.clear();
}

const decoder = new TextDecoder();

function dispatch(line: Uint8Array) {
  let msg: Message | null = null;
  try {
    msg = JSON.parse(decoder.decode(line));
  } catch {
    // reported below
  }
  if (msg === null || typeof msg !== "object") {
    // While a call waits this breaks the channel; a session waiting for its next run
    // skips the line.
    if (pending.size > 0) failAll("codebox: malformed message on the tool channel");
    return;
  }
  if (msg.id === undefined) {
    if (msg.method === RUN_METHOD) {
      const waiter = channel.waiter;
      channel.waiter = null;
      if (waiter) waiter(msg);
      else channel.controls.push(msg);
    }
    return;
  }
  const p = pending.get(msg.id);
  if (!p) return; // a response nobody waits for any more
  pending.delete(msg.id!);
  if (msg.error) p.reject(new ToolError(msg.error.message, msg.error.code));
  else p.resolve(msg.result);
}

// The read buffer grows by doubling and each line is scanned for its newline once, so a
// line of n bytes costs O(n) however many reads it takes (appending every read to a fresh
// copy and searching from the start again was quadratic: 26 s for 50 MB).
const READ_ROOM = 1 << 20;
/** A buffer grown past this is given back once it holds no partial line of that size. */
const KEEP_BUFFER = 4 << 20;

/** Makes room for `more` bytes after `len`. */
function reserve(more: number) {
  const { buf, len } = channel;
  if (buf.length - len >= more) return;
  const next = new Uint8Array(Math.max(buf.length * 2, len + more));
  next.set(buf.subarray(0, len));
  channel.buf = next;
}

function append(bytes: Uint8Array, before = false) {
  reserve(bytes.length);
  const { buf, len } = channel;
  if (before) {
    buf.copyWithin(bytes.length, 0, len);
    buf.set(bytes, 0);
    channel.scanned = 0;
  } else {
    buf.set(bytes, len);
  }
  channel.len = len + bytes.length;
}

// Dispatches every complete line in the buffer.
function drain() {
  const { buf, len } = channel;
  let start = 0;
  let from = channel.scanned;
  let nl;
  while ((nl = buf.subarray(0, len).indexOf(10, from)) >= 0) {
    dispatch(buf.subarray(start, nl));
    start = nl + 1;
    from = start;
  }
  const rest = len - start;
  if (start > 0) {
    if (buf.length > KEEP_BUFFER && rest < KEEP_BUFFER / 2) {
      // Give a large buffer back (its copy of the last line is no longer needed).
      const next = new Uint8Array(Math.max(READ_ROOM * 2, rest * 2));
      next.set(buf.subarray(start, len));
      channel.buf = next;
    } else {
      buf.copyWithin(0, start, len);
    }
  }
  channel.len = rest;
  channel.scanned = rest;
}

// Reads while calls or a session wait; stops when none does.
async function readLoop() {
  channel.reading = true;
  try {
    drain();
    while (pending.size > 0 || channel.waiter) {
      // Read straight into the buffer's free room: no copy per read.
      reserve(READ_ROOM);
      const [target, at] = [channel.buf, channel.len];
      const room = target.subarray(at);
      const n = Number(await libc.symbols.read(CHANNEL_FD, room, BigInt(room.length)));
      if (n <= 0) {
        channel.eof = true;
        failAll("codebox: the tool channel (fd 3) closed");
        const waiter = channel.waiter;
        channel.waiter = null;
        waiter?.(null);
        return;
      }
      if (channel.buf === target && channel.len === at) channel.len += n;
      else append(room.subarray(0, n)); // the buffer changed during the read (adopt)
      drain();
    }
  } finally {
    channel.reading = false;
  }
}

/** Session mode: takes bytes the boot file read past its boot frame (they come first). */
export function adopt(bytes: Uint8Array) {
  append(bytes, true);
}

/**
 * Session mode: the next `codebox/run` notification, or null at EOF on fd 3. Other lines
 * (late responses to abandoned calls, other notifications) are skipped.
 */
export function nextControl(): Promise<Message | null> {
  const queued = channel.controls.shift();
  if (queued) return Promise.resolve(queued);
  if (channel.eof) return Promise.resolve(null);
  return new Promise((resolve) => {
    channel.waiter = resolve;
    if (!channel.reading) readLoop();
  });
}

/** Sends a JSON-RPC notification (no id, no response) over fd 3. */
export function notify(method: string, params: Record<string, unknown>) {
  const bytes = encoder.encode(JSON.stringify({ jsonrpc: "2.0", method, params }) + "\n");
  // Behind queued requests when there are any (a line must not interleave with another);
  // otherwise at once, so a closed channel throws here.
  if (output.busy || output.queue.length > 0) enqueue(bytes);
  else writeAll(bytes);
}

/** Sends one JSON-RPC request over fd 3 and waits for its response. */
export function request(method: string, params: Record<string, unknown>): Promise<unknown> {
  if (channel.closed) return Promise.reject(new ToolError(channel.closed));
  const id = channel.nextId++;
  const promise = new Promise<unknown>((resolve, reject) => pending.set(id, { resolve, reject }));
  enqueue(encoder.encode(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n"));
  if (!channel.reading) readLoop();
  return promise;
}

/** One block of a tool result's content (`text`, `image`, `resource`, ...). */
export type ContentBlock = { type: string; text?: string; [key: string]: unknown };

/** A tool call's whole MCP result (CallToolResult), as the server sent it. */
export type CallToolResult<T = unknown> = {
  content?: ContentBlock[];
  structuredContent?: T;
  isError?: boolean;
  [key: string]: unknown;
};

/** What a value a tool call returned came with: see `resultOf`. */
export interface ToolResult<T = unknown> {
  /** The text content, its blocks joined by newlines ("" without any). */
  readonly text: string;
  /** The content blocks. */
  readonly content: ContentBlock[];
  /** The structuredContent, undefined without one. */
  readonly structured: T | undefined;
  /** The whole CallToolResult. */
  readonly result: CallToolResult<T>;
}

// Values (objects and arrays) → the result they came from. On globalThis, as the channel:
// every copy of this file sees the same.
const RESULTS_KEY = Symbol.for("codebox.results");
const gr = globalThis as unknown as { [RESULTS_KEY]?: WeakMap<object, CallToolResult> };
const results: WeakMap<object, CallToolResult> = gr[RESULTS_KEY] ??= new WeakMap();

function textOf(content: ContentBlock[]): string {
  return content.filter((c) => c?.type === "text").map((c) => c.text ?? "").join("\n");
}

/**
 * The MCP result an object or array value of a tool call came with: its text, content
 * blocks, structuredContent and the whole result; undefined for anything else (a string,
 * number, boolean or null has no identity to look up: `callMCPToolResult` gives any
 * call's whole result).
 *
 *   const file = await readTextFile({ path: "/a.txt" });  // { content: "..." }
 *   resultOf(file)?.text;                                  // the text it came with
 */
export function resultOf<T = unknown>(value: unknown): ToolResult<T> | undefined {
  if (typeof value !== "object" || value === null) return undefined;
  const result = results.get(value) as CallToolResult<T> | undefined;
  if (result === undefined) return undefined;
  const content = result.content ?? [];
  return { text: textOf(content), content, structured: result.structuredContent, result };
}

function remembered<T>(value: T, result: CallToolResult): T {
  if (typeof value === "object" && value !== null) results.set(value, result);
  return value;
}

/**
 * What a tool result means to code: its structuredContent when present; else its text
 * (parsed as JSON when it is JSON; several text blocks become an array); other content
 * (images, resources) as the content array. A result with isError throws ToolError.
 *
 * A structuredContent is returned as it is, also when it only mirrors the text, as
 * server-filesystem's `{ content: "<the text>" }` does: it is what the tool's
 * outputSchema declares and the generated types say. An object or array value keeps
 * its whole result for `resultOf`.
 */
export function unwrap(name: string, result: CallToolResult): unknown {
  const content = result.content ?? [];
  const texts = content.filter((c) => c.type === "text").map((c) => c.text ?? "");
  if (result.isError) {
    throw new ToolError(`${name}: ${texts.join("\n") || "the tool reported an error"}`, undefined, result);
  }
  if (result.structuredContent !== undefined && result.structuredContent !== null) {
    return remembered(result.structuredContent, result);
  }
  if (texts.length !== content.length) return remembered(content, result);
  const values = texts.map((t) => {
    try {
      return JSON.parse(t);
    } catch {
      return t;
    }
  });
  return remembered(values.length === 1 ? values[0] : values, result);
}

/**
 * Calls an upstream tool by its catalog name (`<server>__<tool>`): its structured
 * value, parsed JSON text, or text (see `unwrap`; `resultOf` gives what an object value
 * came with). Throws ToolError when the call fails or the tool reports isError.
 */
export async function callMCPTool<T = unknown>(
  name: string,
  args: Record<string, unknown> = {},
): Promise<T> {
  const result = await request("tools/call", { name, arguments: args });
  return unwrap(name, result as CallToolResult) as T;
}

/**
 * Calls an upstream tool by its catalog name and gives its whole MCP result, unread: a
 * result with isError is returned, not thrown. Throws ToolError when the call fails
 * (denied, unknown tool, the server unreachable).
 */
export async function callMCPToolResult<T = unknown>(
  name: string,
  args: Record<string, unknown> = {},
): Promise<CallToolResult<T>> {
  return (await request("tools/call", { name, arguments: args })) as CallToolResult<T>;
}

type SearchOptions = {
  detail?: "name" | "summary" | "full";
  server?: string;
  limit?: number;
  cursor?: string;
};

/** One page of search results; pass `nextCursor` back as `cursor` for the next. */
export async function searchToolsPage(
  query: string,
  options: SearchOptions = {},
): Promise<{ tools: unknown[]; nextCursor: string | null; total: number }> {
  const page = (await request("tools/search", { query, ...options })) as {
    tools: unknown[];
    next_cursor: string | null;
    total: number;
  };
  return { tools: page.tools, nextCursor: page.next_cursor, total: page.total };
}

/**
 * Finds upstream tools by what they do, best match first (BM25 over names, descriptions
 * and parameters): the first page. detail "summary" (default) adds the description and
 * the TypeScript and Python signatures, "full" the schemas and TypeScript declarations.
 */
export async function searchTools(query: string, options: SearchOptions = {}): Promise<unknown[]> {
  return (await searchToolsPage(query, options)).tools;
}

/** One tool's full definition: schemas, TypeScript and Python signatures, an example. */
export async function getTool(name: string): Promise<unknown> {
  return await request("tools/get", { name });
}

/** A skill to save: `language` defaults to "typescript". */
export type SkillToSave = {
  name: string;
  code: string;
  description: string;
  language?: "python" | "typescript";
  usage?: string;
};

/**
 * Saves a skill of the client running this program, as the save_skill tool does (name
 * and size checks, a syntax check, an audit record); later programs import it
 * ("/skills/<name>/skill.ts", `from skills import <name>`). Throws ToolError when it is
 * not saved. codebox's own capability, not an upstream tool: allowed_tools does not
 * limit it.
 */
export async function saveSkill(
  skill: SkillToSave,
): Promise<{ name: string; language: string; import: string }> {
  const params = { language: "typescript", ...skill };
  return (await request("codebox/save_skill", params)) as {
    name: string;
    language: string;
    import: string;
  };
}

/** Your skills and the shared ones, optionally those matching every word of `query`. */
export async function listSkills(query?: string): Promise<unknown[]> {
  const params = query === undefined ? {} : { query };
  return ((await request("codebox/list_skills", params)) as { skills: unknown[] }).skills;
}

/** What codebox's health tool shows: version, layers, load, limits, network, upstreams. */
export async function health(): Promise<Record<string, unknown>> {
  return (await request("codebox/health", {})) as Record<string, unknown>;
}
