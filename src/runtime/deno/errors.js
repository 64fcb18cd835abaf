// Uncaught errors printed the way Deno prints one before exiting, in the program's own
// terms: codebox rewrites what it runs (session.js's scope prologue on a run's first line;
// value.js's `globalThis[Symbol.for("codebox.value")] = (` before the last expression),
// and Deno would show the rewritten line, shifted columns and the frames of codebox's own
// modules. Here a position on a rewritten line is moved back by what the rewrite
// inserted, the source line under the message is the program's, and codebox's frames are
// left out.
//
// Loaded by session.js, and by boot.js only when a one-shot program failed.

const encoder = new TextEncoder();
// Frames of codebox's own modules, left out of error reports.
const OWN_FRAMES = [
  new URL("./boot.js", import.meta.url).href,
  new URL("./session.js", import.meta.url).href,
  import.meta.url,
];
// Longest source line Deno shows under an error message (bytes).
const SOURCE_LINE_MAX = 150;

/**
 * The modules codebox rewrote: their URL (with its query, if any) → { source: the program
 * as written, inserts: [{ line (1-based), col (0-based, in the program's own text), text }]
 * in the order they sit on their line }.
 */
export const rewritten = new Map();

/** Writes `text` and a newline to stderr, whole. */
export function writeStderr(text) {
  const bytes = encoder.encode(text + "\n");
  let off = 0;
  while (off < bytes.length) off += Deno.stderr.writeSync(bytes.subarray(off));
}

// A 1-based column `col` of line `line` of the rewritten module, in the program's terms
// (a column inside inserted text is where the insertion was).
function programColumn(r, line, col) {
  let shift = 0;
  for (const ins of r.inserts) {
    if (ins.line !== line) continue;
    const start = ins.col + shift; // 0-based, in the rewritten line
    if (col > start + ins.text.length) {
      shift += ins.text.length;
    } else if (col > start) {
      return ins.col + 1;
    } else {
      break;
    }
  }
  return col - shift;
}

// `file:///…:L:C` of a rewritten module: the program's own column, and its URL without
// the query codebox imported it with (`?as-written`).
function fixPositions(text) {
  return text.replace(/(file:\/\/\/[^\s():?]+)(\?[^\s():]*)?:(\d+):(\d+)/g, (all, bare, query, l, c) => {
    const r = rewritten.get(bare + (query ?? ""));
    return r ? `${bare}:${l}:${programColumn(r, Number(l), Number(c))}` : all;
  });
}

// Deno's syntax-error excerpts: "N | <line N>" (long lines cut to "...<part>"), then
// "  |   ~~~" under it. Cut each insertion (or what is left of it) out of both.
function fixExcerpts(text) {
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const m = /^(\s*(\d+) \| )(.*)$/.exec(lines[i]);
    if (!m || !m[3].includes("codebox")) continue;
    for (const r of rewritten.values()) {
      for (const ins of r.inserts) {
        if (ins.line !== Number(m[2])) continue;
        let at = -1;
        let len = 0;
        for (let k = ins.text.length; k >= 12; k--) {
          const found = m[3].indexOf(ins.text.slice(ins.text.length - k));
          if (found >= 0) {
            [at, len] = [found, k];
            break;
          }
        }
        if (at < 0) continue;
        m[3] = m[3].slice(0, at) + m[3].slice(at + len);
        lines[i] = m[1] + m[3];
        const under = /^(\s*\| )(\s*)(.*)$/.exec(lines[i + 1] ?? "");
        if (under && under[2].length >= at + len) {
          lines[i + 1] = under[1] + under[2].slice(len) + under[3];
        }
      }
    }
  }
  return lines.join("\n");
}

// The source line at a frame's location, as Deno shows it under the message.
function sourceLine(url, line, col) {
  let text = rewritten.get(url)?.source ?? null;
  if (text === null && url.startsWith("file://")) {
    try {
      text = Deno.readTextFileSync(new URL(url.replace(/\?.*$/, "")));
    } catch {
      text = null;
    }
  }
  if (text === null) return null;
  const src = text.split(/\r?\n/)[line - 1];
  if (!src || encoder.encode(src).length > SOURCE_LINE_MAX || col > src.length) return null;
  const caret = [...src.slice(0, col - 1)].map((c) => (c === "\t" ? "\t" : " ")).join("");
  return `${src}\n${caret}^`;
}

// "Name: message" and the "    at ..." frames of an error's stack, codebox's frames left
// out.
function splitStack(err) {
  const stack = fixExcerpts(fixPositions(String(err.stack)));
  let head;
  const title = (() => {
    try {
      return fixExcerpts(fixPositions(`${err.name}: ${err.message}`));
    } catch {
      return null;
    }
  })();
  let rest;
  if (title !== null && (stack === title || stack.startsWith(title + "\n"))) {
    head = title;
    rest = stack.slice(title.length + 1);
  } else {
    const lines = stack.split("\n");
    const first = lines.findIndex((l) => /^ {4}at /.test(l));
    head = (first < 0 ? lines : lines.slice(0, first)).join("\n");
    rest = first < 0 ? "" : lines.slice(first).join("\n");
  }
  const frames = rest.split("\n").filter((l) => l !== "" && !OWN_FRAMES.some((u) => l.includes(u)));
  return { head, frames };
}

function describe(value) {
  if (typeof value === "string") return JSON.stringify(value);
  try {
    return Deno.inspect(value, { colors: false });
  } catch {
    return String(value);
  }
}

function formatError(err, withSource) {
  if (!(err instanceof Error) || typeof err.stack !== "string") return describe(err);
  const { head, frames } = splitStack(err);
  let out = head;
  if (withSource) {
    for (const frame of frames) {
      const m = /((?:file|https?|npm|jsr):[^\s()]*):(\d+):(\d+)\)?$/.exec(frame);
      if (!m) continue;
      const source = sourceLine(m[1], Number(m[2]), Number(m[3]));
      if (source) out += "\n" + source;
      break;
    }
  }
  if (frames.length) out += "\n" + frames.join("\n");
  if (err.cause !== undefined) out += "\nCaused by: " + formatError(err.cause, false);
  return out;
}

/** An uncaught error as Deno prints it before exiting (`error: Uncaught ...`). */
export function formatUncaught(err, inPromise) {
  let text;
  try {
    text = formatError(err, true);
  } catch {
    text = describe(err);
  }
  return `error: Uncaught ${inPromise ? "(in promise) " : ""}${text}`;
}
