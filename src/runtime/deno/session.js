// codebox keep-alive sessions for Deno: several programs, one after another, in one
// process, with the module-scope names of each run visible to the next.
//
// Loaded by boot.js only when the boot frame starts with a SESSION record. Protocol
// (src/runtime/boot.rs): after each run, `codebox/done {status: "ok"|"error"}` on fd 3;
// then the next `codebox/run {code, files}` notification is awaited through client.ts's
// reader (so tool calls and the session share one read buffer), its files are written
// under /workspace and its code runs. EOF on fd 3 while waiting ends the process with 0.
//
// Each run is its own module, /workspace/.codebox-run-<n>.ts (removed once it has run),
// rewritten by scope.js so that it sees the names earlier runs declared and hands its own
// on (globalThis.__codebox_scope). An uncaught error is printed on stderr the way Deno
// prints one before exiting, and the run's status is "error"; the session goes on.

import { rewriteRun } from "./scope.js";
import { captureLastValue, takeValue, wasParsed } from "./value.js";
import { sendOutputs } from "./outputs.js";
import { adopt, nextControl, notify } from "./client.ts";

const RUN_PREFIX = "/workspace/.codebox-run-";
const RUN_URL = /file:\/\/\/workspace\/\.codebox-run-(\d+)\.ts(?:\?as-written)?/;
// Frames of the session machinery itself, left out of error reports.
const OWN_FRAMES = [new URL("./boot.js", import.meta.url).href, import.meta.url];
// Longest source line Deno shows under an error message (bytes).
const SOURCE_LINE_MAX = 150;

const encoder = new TextEncoder();

/** run number -> { source: the user's code, prefixLength: what line 1 gained } */
const runs = new Map();
let current = null; // the file of the run in progress
let runFailed = false; // an uncaught error was reported during the current run

function writeStderr(text) {
  const bytes = encoder.encode(text + "\n");
  let off = 0;
  while (off < bytes.length) off += Deno.stderr.writeSync(bytes.subarray(off));
}

// Line 1 of a run starts with the rewrite's prologue: give columns and excerpts of that
// line back in the user's terms.
function fixRunPositions(text) {
  return text.replace(new RegExp(RUN_URL.source + ":1:(\\d+)", "g"), (all, n, col) => {
    const run = runs.get(Number(n));
    const c = Number(col);
    return run && c > run.prefixLength ? all.replace(/:1:\d+$/, `:1:${c - run.prefixLength}`) : all;
  });
}

function fixExcerpts(text) {
  // Deno's syntax-error excerpts: "1 | <line 1>" (long lines cut to "...<part>"), then
  // "  |   ~~~" under it. Cut the prologue (or what is left of it) out of both.
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const m = /^(\s*1 \| )(.*)$/.exec(lines[i]);
    if (!m || !m[2].includes("__codebox_")) continue;
    for (const run of runs.values()) {
      const prefix = run.prefix;
      let cut = -1;
      for (let k = prefix.length; k >= 12 && cut < 0; k--) {
        const at = m[2].indexOf(prefix.slice(prefix.length - k));
        if (at >= 0) cut = at + k;
      }
      if (cut < 0) continue;
      lines[i] = m[1] + m[2].slice(cut);
      const under = /^(\s*\| )(\s*)(.*)$/.exec(lines[i + 1] ?? "");
      if (under && under[2].length >= cut) {
        lines[i + 1] = under[1] + under[2].slice(cut) + under[3];
      }
      break;
    }
  }
  return lines.join("\n");
}

// The source line at a frame's location, as Deno shows it under the message.
function sourceLine(url, line, col) {
  let text = null;
  const m = RUN_URL.exec(url);
  if (m && url === m[0]) {
    text = runs.get(Number(m[1]))?.source ?? null;
  } else if (url.startsWith("file://")) {
    try {
      text = Deno.readTextFileSync(new URL(url));
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

// "Name: message" and the "    at ..." frames of an error's stack, the runtime's frames
// left out.
function splitStack(err) {
  const stack = fixExcerpts(fixRunPositions(String(err.stack)));
  let head;
  const title = (() => {
    try {
      return fixExcerpts(fixRunPositions(`${err.name}: ${err.message}`));
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

/** Prints an uncaught error as Deno does before exiting, and marks the run failed. */
function reportUncaught(err, inPromise) {
  runFailed = true;
  let text;
  try {
    text = formatError(err, true);
  } catch {
    text = describe(err);
  }
  writeStderr(`error: Uncaught ${inPromise ? "(in promise) " : ""}${text}`);
}

function forgetRun() {
  if (current === null) return;
  try {
    Deno.removeSync(current);
  } catch {
    // already gone
  }
  current = null;
}

// A macrotask turn: rejections left unhandled by the run are reported before its `done`.
function tick() {
  return new Promise((resolve) => setTimeout(resolve, 0));
}

async function runOne(source, run, scope, wantValue, outputs) {
  const captured = wantValue ? captureLastValue(source) : { code: source, linePrefix: "" };
  const rewritten = rewriteRun(captured.code, Object.keys(scope), run);
  const code = rewritten.code;
  const prefix = rewritten.prefix + captured.linePrefix;
  runs.set(run, { source, prefix, prefixLength: prefix.length });
  const path = `${RUN_PREFIX}${run}.ts`;
  try {
    Deno.removeSync(path); // never write through whatever the program left there
  } catch {
    // not there
  }
  try {
    Deno.writeFileSync(path, encoder.encode(code), { mode: 0o600, createNew: true });
  } catch (e) {
    writeStderr(`codebox: cannot write ${path}: ${e?.message ?? e}`);
    return "error";
  }
  current = path;
  runFailed = false;
  globalThis.__codebox_scope = scope; // in case the program replaced it
  globalThis.__codebox_capture = undefined;
  try {
    try {
      await import("file://" + path);
    } catch (err) {
      // A value rewrite that broke the run (it never ran: its marker import did not):
      // the run as written, without a value.
      if (captured.code === source || wasParsed()) throw err;
      const plain = rewriteRun(source, Object.keys(scope), run);
      runs.set(run, { source, prefix: plain.prefix, prefixLength: plain.prefix.length });
      Deno.writeFileSync(path, encoder.encode(plain.code), { mode: 0o600 });
      await import("file://" + path + "?as-written");
    }
  } catch (err) {
    reportUncaught(err, true);
  } finally {
    forgetRun();
  }
  const capture = globalThis.__codebox_capture;
  globalThis.__codebox_capture = undefined;
  if (typeof capture === "function") {
    try {
      Object.assign(scope, capture());
    } catch {
      // nothing to keep
    }
  }
  await tick();
  const value = takeValue();
  if (value !== null && !runFailed) {
    try {
      notify("codebox/value", { repr: value });
    } catch {
      // nobody is listening any more; done() ends the process
    }
  }
  if (outputs.spec) {
    try {
      outputs.seen = sendOutputs(outputs.spec, { seen: outputs.seen, paths: outputs.paths });
    } catch (e) {
      writeStderr(`codebox: sending the output files failed: ${e?.message ?? e}`);
    }
  }
  return runFailed ? "error" : "ok";
}

function done(status) {
  try {
    notify("codebox/done", { status });
  } catch {
    Deno.exit(0); // nobody is listening any more
  }
}

// Writes a codebox/run message's files; an error message or null.
function writeFiles(files, writeFile) {
  if (files === undefined || files === null) return null;
  if (typeof files !== "object" || Array.isArray(files)) {
    return "codebox: malformed codebox/run message (files)";
  }
  for (const [path, content] of Object.entries(files)) {
    // Bytes that are not UTF-8 come as {"base64": ...} (runtime/boot.rs).
    let bytes;
    if (typeof content === "string") bytes = encoder.encode(content);
    else if (typeof content?.base64 === "string") {
      try {
        bytes = Uint8Array.from(atob(content.base64), (c) => c.charCodeAt(0));
      } catch {
        return `codebox: malformed codebox/run message (file ${path})`;
      }
    } else return `codebox: malformed codebox/run message (file ${path})`;
    try {
      writeFile(path, bytes);
    } catch (e) {
      return `codebox: cannot write ${path}: ${e?.message ?? e}`;
    }
  }
  return null;
}

/** Runs the session: `code` (bytes) first, then every codebox/run; never returns. */
export async function runSession({ code, rest, writeFile, makeOutDir, wantValue, outputs: spec }) {
  // The first run's named outputs are in the record; later runs name their own.
  const outputs = { spec, paths: null, seen: null };
  adopt(rest);
  const scope = Object.create(null);
  globalThis.__codebox_scope = scope;
  globalThis.addEventListener("unload", forgetRun);
  // Errors nothing catches would end the process; in a session they fail the run.
  globalThis.addEventListener("unhandledrejection", (event) => {
    event.preventDefault();
    reportUncaught(event.reason, true);
  });
  globalThis.addEventListener("error", (event) => {
    event.preventDefault();
    reportUncaught(event.error, false);
  });
  let source = new TextDecoder().decode(code);
  for (let run = 1;; run++) {
    makeOutDir();
    done(await runOne(source, run, scope, wantValue, outputs));
    for (;;) {
      const message = await nextControl();
      if (message === null) Deno.exit(0); // EOF on fd 3: the session is over
      const params = message.params && typeof message.params === "object" ? message.params : {};
      let problem = writeFiles(params.files, writeFile);
      if (problem === null && typeof params.code !== "string") {
        problem = "codebox: malformed codebox/run message (no code)";
      }
      if (problem === null) {
        source = params.code;
        outputs.paths = Array.isArray(params.outputs) ? params.outputs : [];
        break;
      }
      writeStderr(problem);
      done("error");
    }
  }
}
