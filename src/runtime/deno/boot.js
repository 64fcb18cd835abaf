// codebox boot for Deno: receive the program on fd 3 and run it as a TypeScript module.
//
// Protocol (src/runtime/boot.rs): records "<KIND> <n>\n" + n bytes; zero or more FILE
// records ("<path>\0<content>", written under /workspace), then one CODE record.
// Deno has no API for an inherited descriptor, so fd 3 is read through libc over FFI. The
// program is written into the working directory and imported from there, as `deno eval`
// does with its virtual `$deno$eval` module, so its relative imports ("./lib.ts") resolve
// against /workspace. The file is removed when the program ends.
//
// A first record "SESSION 0\n" makes it a keep-alive session, run by session.js (loaded
// only then): the CODE record is the first run, later runs come as `codebox/run`
// notifications on fd 3.

import { prepareEnd } from "./end.js";

const CHANNEL_FD = 3;
const MAIN_PATH = "/workspace/.codebox-main.ts";

const libc = Deno.dlopen("libc.so.6", {
  read: { parameters: ["i32", "buffer", "usize"], result: "isize" },
  write: { parameters: ["i32", "buffer", "usize"], result: "isize" },
  poll: { parameters: ["buffer", "u64", "i32"], result: "i32" },
});

function readInto(buf) {
  for (let attempt = 0; attempt < 100; attempt++) {
    const n = Number(libc.symbols.read(CHANNEL_FD, buf, BigInt(buf.length)));
    if (n >= 0) return n;
  }
  throw new Error("codebox: reading fd 3 failed");
}

class Channel {
  constructor() {
    this.buf = new Uint8Array(0);
  }

  fill() {
    const chunk = new Uint8Array(65536);
    const n = readInto(chunk);
    if (n === 0) throw new Error("codebox: boot frame cut short on fd 3");
    const next = new Uint8Array(this.buf.length + n);
    next.set(this.buf);
    next.set(chunk.subarray(0, n), this.buf.length);
    this.buf = next;
  }

  // One record: "<KIND> <n>\n" then n bytes.
  record() {
    let headerEnd;
    while ((headerEnd = this.buf.indexOf(10)) < 0) {
      if (this.buf.length > 64) throw new Error("codebox: bad boot header");
      this.fill();
    }
    const header = new TextDecoder().decode(this.buf.subarray(0, headerEnd));
    const match = /^(CODE|FILE|SESSION|EPHEMERAL|VALUE|OUTPUTS) (\d+)$/.exec(header);
    if (!match) throw new Error(`codebox: bad boot header ${JSON.stringify(header.slice(0, 64))}`);
    const size = Number(match[2]);
    const payload = new Uint8Array(size);
    const first = this.buf.subarray(headerEnd + 1, headerEnd + 1 + size);
    payload.set(first);
    this.buf = this.buf.slice(headerEnd + 1 + first.length);
    let got = first.length;
    while (got < size) {
      const n = readInto(payload.subarray(got));
      if (n === 0) throw new Error("codebox: boot frame cut short on fd 3");
      got += n;
    }
    return [match[1], payload];
  }
}

// Writes one FILE record ("<path>\0<content>") under /workspace. Paths were validated by
// the supervisor; nothing else runs yet, so refusing existing symlinks is enough. The path
// is decoded as it is: a leading U+FEFF is part of a name (TextDecoder would drop it).
function writeFile(payload) {
  const nul = payload.indexOf(0);
  writeWorkspaceFile(new TextDecoder("utf-8", { ignoreBOM: true }).decode(payload.subarray(0, nul)), payload.subarray(nul + 1));
}

// Writes `content` (bytes) at `relPath` under /workspace, creating parent directories and
// refusing to go through a symlink.
function writeWorkspaceFile(relPath, content) {
  const parts = relPath.split("/");
  let dir = "/workspace";
  for (const [i, part] of parts.entries()) {
    const path = `${dir}/${part}`;
    let info = null;
    try {
      info = Deno.lstatSync(path);
    } catch (e) {
      if (!(e instanceof Deno.errors.NotFound)) throw e;
    }
    if (info?.isSymlink) throw new Error(`codebox: ${path} is a symlink`);
    if (i < parts.length - 1 && !info) Deno.mkdirSync(path);
    dir = path;
  }
  Deno.writeFileSync(dir, content, { mode: 0o644 });
}

// The program's source (bytes), whether this is a session, and the bytes read past the
// frame.
function receive() {
  const channel = new Channel();
  let session = false;
  let ephemeral = false;
  let wantValue = false;
  let outputs = null;
  for (let first = true; ; first = false) {
    const [kind, payload] = channel.record();
    if (kind === "CODE") {
      return { code: payload, session, ephemeral, wantValue, outputs, rest: channel.buf };
    }
    if (kind === "VALUE") {
      wantValue = true;
    } else if (kind === "OUTPUTS") {
      // `<max_files> <max_bytes>\n` then a path per line.
      const [head, ...paths] = new TextDecoder().decode(payload).split("\n");
      const [maxFiles, maxBytes] = head.split(" ").map(Number);
      outputs = { max_files: maxFiles, max_bytes: maxBytes, paths: paths.filter((p) => p) };
    } else if (kind === "EPHEMERAL") {
      // What Deno's exit costs (~3 ms) is the kernel tearing down its address space: an
      // `_exit` saves nothing, but the supervisor need not wait for it (end.js).
      ephemeral = true;
    } else if (kind === "SESSION") {
      if (!first) throw new Error("codebox: bad boot header \"SESSION\"");
      session = true;
    } else {
      writeFile(payload);
    }
  }
}

// Every run starts with /workspace/out there, so `Deno.writeFileSync("/workspace/out/a.csv",
// …)` works as written, whatever the workspace; one that cannot take it (read-only, full)
// is left as it is and the program's own write reports why. Returns whether it made it.
function makeOutDir() {
  try {
    Deno.mkdirSync("/workspace/out");
    return true;
  } catch {
    return false; // there already, or refused
  }
}

// A bound host directory keeps no empty out/ it did not have (removing a directory the
// program filled fails, and it stays).
function forgetOutDir() {
  try {
    Deno.removeSync("/workspace/out");
  } catch {
    // filled, or gone
  }
}

function forgetFile(path) {
  try {
    Deno.removeSync(path);
  } catch {
    // already gone
  }
}

const forgetMain = () => forgetFile(MAIN_PATH);

// Tells the supervisor that everything before the code is done: a pooled sandbox is
// handed out only after this line.
function announceReady() {
  let line = new TextEncoder().encode('{"jsonrpc":"2.0","method":"codebox/ready"}\n');
  while (line.length > 0) {
    const n = Number(libc.symbols.write(CHANNEL_FD, line, BigInt(line.length)));
    if (n < 0) throw new Error("codebox: writing fd 3 failed");
    line = line.subarray(n);
  }
}

// Whether the boot frame has (begun to) arrive on fd 3: poll(2) with no wait.
function codeWaiting() {
  const pollfd = new Uint8Array(8); // struct pollfd { int fd; short events, revents; }
  const view = new DataView(pollfd.buffer);
  view.setInt32(0, CHANNEL_FD, true);
  view.setInt16(4, 1 /* POLLIN */, true);
  return Number(libc.symbols.poll(pollfd, 1n, 0)) !== 0;
}

/** What to say when a write failed because a session's workspace is at its quota. */
function fullHint(e) {
  const full = e?.code === "ENOSPC" || String(e?.message ?? "").includes("os error 28");
  return full
    ? " (the session's workspace is full: TypeScript needs room there for its entry module; delete files, e.g. with execute_python)"
    : "";
}

// A module of codebox's own, by a computed specifier: the module graph of a cold run does
// not include it unless it is used.
const own = (name) => import(new URL(`./${name}`, import.meta.url).href);

// The program is written under /workspace to a module of this name, imported, and removed
// before the code arrives (warmUp).
const WARM_PATH = "/workspace/.codebox-warm-up.ts";
const WARM_MODULE = `import "data:application/javascript,globalThis[Symbol.for('codebox.warm')]%3D1";
const n: number = 1; let s = "a" + 'b' + \`c\${n}\`; /x+/g.test(s);
export function f(o?: { v: number[] }) { return o?.v.map((x) => x * 2) ?? [0x1f, 1.5e3]; }
class C<T> { #p = n; get p(): number { return this.#p; } }
export default f({ v: [new C<number>().p] });
`;

// Before the code arrives, a pooled sandbox does once what its run will do, on stand-ins,
// so that the run finds it compiled and initialised: the value's lexer (its Unicode
// regular expressions compile when first used), importing a TypeScript module from
// /workspace (and the data: URL module that marks a rewritten one as parsed), the file
// system calls (their bindings compile on first call), the time zone (the first Date, in
// a stat). Nothing of it remains: the stand-in file is removed, and a module of that name
// is never the program's.
async function warmUp(value) {
  value.captureLastValue(WARM_MODULE + "f();\n");
  value.wasParsed();
  try {
    Deno.writeFileSync(WARM_PATH, new TextEncoder().encode(WARM_MODULE), { mode: 0o600 });
    await import("file://" + WARM_PATH);
  } catch {
    // a workspace that takes no file: the run will say so
  } finally {
    forgetFile(WARM_PATH);
  }
  delete globalThis[Symbol.for("codebox.warm")];
  try {
    Deno.mkdirSync("/workspace"); // there: the call and its error
  } catch {
    // as expected
  }
  try {
    Deno.lstatSync("/workspace");
    Deno.readDirSync("/workspace").next();
  } catch {
    // no workspace to look at
  }
}

// The end of a one-shot run (end.js): its listeners come before any other, and the
// Node-backed globals are watched, before anything else runs.
const runEnd = prepareEnd();
// codebox's own lifecycle listeners (not the program's: end.js tells them apart).
const listen = EventTarget.prototype.addEventListener.bind(globalThis);
// A sandbox that waits for its code (a pooled one) first loads the modules its run may
// need and warms up (warmUp): the first TypeScript import sets up Deno's module loader,
// transpiler and caches, which would otherwise happen after the code arrives, on the
// request path. A cold run, whose code is already there, loads them only when used.
let preloaded = null;
if (!codeWaiting()) {
  await import("./codebox.ts");
  preloaded = {
    value: await own("value.js"),
    outputs: await own("outputs.js"),
    client: await own("client.ts"),
    errors: await own("errors.js"),
  };
  await warmUp(preloaded.value);
}
// Proxy mode: a refused tunnel's reason reaches the program's error (see egress.js).
if (Deno.env.get("HTTPS_PROXY")) (await import("./egress.js")).install();
announceReady();
const { code, session, ephemeral, wantValue, outputs, rest } = receive();
// A microVM clone restored from a template shares this process's memory with every other
// clone, its Web Crypto generator included (rand's ThreadRng: ChaCha, reseeded from the
// kernel after every 64 KiB it produces). Drawing 64 KiB here makes its next draw reseed
// from the kernel, whose pool the host reseeded before the code was sent. Math.random's
// state (V8's, per isolate) cannot be reseeded from here: see microvm/template.rs.
{
  const burn = new Uint8Array(65536);
  crypto.getRandomValues(burn);
}
// Output files (outputs.js), loaded only when asked for.
const outputsJs = outputs ? (preloaded?.outputs ?? await own("outputs.js")) : null;
if (session) {
  const { runSession } = await own("session.js");
  await runSession({ code, rest, writeFile: writeWorkspaceFile, makeOutDir, wantValue, outputs });
  Deno.exit(0); // not reached: a session ends with the process
}
// The last expression's value (value.js), loaded only when asked for.
const valueJs = wantValue ? (preloaded?.value ?? await own("value.js")) : null;
let main = code;
// Where the value's rewrite inserted its assignment (errors.js gives positions back).
let insert = null;
if (valueJs) {
  const source = new TextDecoder().decode(code);
  const captured = valueJs.captureLastValue(source);
  if (captured.code !== source) {
    main = new TextEncoder().encode(captured.code);
    insert = captured.insert;
  }
}
try {
  Deno.writeFileSync(MAIN_PATH, main, { mode: 0o600 });
} catch (e) {
  console.error(`codebox: cannot write ${MAIN_PATH}: ${e?.message ?? e}${fullHint(e)}`);
  Deno.exit(1);
}
listen("unload", forgetMain);
let outputsSent = !outputsJs;
const sendOutputsOnce = () => {
  if (outputsSent) return;
  outputsSent = true;
  outputsJs.sendOutputs(outputs);
};
if (ephemeral) runEnd.arm(sendOutputsOnce);
// A workspace that outlives the run and whose output files nobody collects (no OUTPUTS
// record: `codebox run --workspace DIR`): an out/ made here that is still empty goes at
// the end (`unload`). A session's workspace keeps it.
if (makeOutDir() && !ephemeral && !outputs) listen("unload", forgetOutDir);
let failed = false;
try {
  try {
    await import("file://" + MAIN_PATH);
  } catch (e) {
    // A rewrite that broke a program (it never ran: its marker import did not): run the
    // program as written, without a value; its own error, if any, is then the one shown.
    if (main === code || valueJs.wasParsed()) throw e;
    Deno.writeFileSync(MAIN_PATH, code, { mode: 0o600 });
    await import("file://" + MAIN_PATH + "?as-written");
  }
} catch (e) {
  // Printed as Deno prints an uncaught error, in the program's terms (errors.js): its own
  // line and columns, not the value's rewrite, and none of codebox's frames. The output
  // files written before it still go (below), then the run ends as Deno would, status 1.
  failed = true;
  const errors = preloaded?.errors ?? await own("errors.js");
  const source = new TextDecoder().decode(code);
  errors.rewritten.set("file://" + MAIN_PATH, { source, inserts: insert ? [insert] : [] });
  errors.rewritten.set("file://" + MAIN_PATH + "?as-written", { source, inserts: [] });
  errors.writeStderr(errors.formatUncaught(e, true));
} finally {
  forgetMain();
}
const value = failed ? null : (valueJs?.takeValue() ?? null);
if (value !== null) {
  // Through client.ts's writer: behind any tool call's line still queued, never inside it.
  const { notify } = preloaded?.client ?? await own("client.ts");
  try {
    notify("codebox/value", { repr: value });
  } catch {
    // the supervisor is gone
  }
}
try {
  sendOutputsOnce();
} catch {
  // the supervisor is gone
}
// A failed program ends here, as Deno ends one whose module threw: nothing it left pending
// (timers, promises) runs on.
if (failed) Deno.exit(1);
