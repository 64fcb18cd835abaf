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

import { formatUncaught, rewritten, writeStderr } from "./errors.js";
import { rewriteRun } from "./scope.js";
import { captureLastValue, takeValue, wasParsed } from "./value.js";
import { sendOutputs } from "./outputs.js";
import { adopt, nextControl, notify } from "./client.ts";

const RUN_PREFIX = "/workspace/.codebox-run-";

const encoder = new TextEncoder();

let current = null; // the file of the run in progress
let runFailed = false; // an uncaught error was reported during the current run

/** Prints an uncaught error as Deno does before exiting, and marks the run failed. */
function reportUncaught(err, inPromise) {
  runFailed = true;
  writeStderr(formatUncaught(err, inPromise));
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
  const captured = wantValue ? captureLastValue(source) : { code: source, insert: null };
  const scoped = rewriteRun(captured.code, Object.keys(scope), run);
  const code = scoped.code;
  const path = `${RUN_PREFIX}${run}.ts`;
  // What the rewrites inserted, for errors.js: the scope prologue at the start of line 1,
  // then the value's assignment.
  const prologue = { line: 1, col: 0, text: scoped.prefix };
  rewritten.set(`file://${path}`, { source, inserts: [prologue, captured.insert].filter(Boolean) });
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
      rewritten.set(`file://${path}?as-written`, {
        source,
        inserts: [{ line: 1, col: 0, text: plain.prefix }],
      });
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
