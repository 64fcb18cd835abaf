// How a one-shot TypeScript run ends, and what it reports then (boot.js; the EPHEMERAL
// record of src/runtime/boot.rs).
//
// The end: stdout and stderr closed and `codebox/exit {status, layers, end}` sent on fd
// 3, so that the supervisor answers then and the kernel's teardown of this process
// happens off the request path. `end` says when it was sent:
// - "settled": at the `load` event, which Deno dispatches once the main module has
//   settled and every microtask has run, with nothing pending — no timer, op, dynamic
//   import, unhandled rejection, immediate or tick (`eventLoopHasMoreWork`: the test
//   Deno's event loop ends on) — and nothing else left to run: no listener of the
//   program's for load, beforeunload or unload, and Node not bootstrapped (its
//   `beforeExit` and `exit` listeners run at the end);
// - "unload": otherwise, from the `unload` event (the event loop ran dry, or
//   Deno.exit), unless the program listens for `unload` itself (its listeners run after
//   this one);
// - "exit": after Node's `process.on("exit")` listeners, when there are some (ours is
//   added last). Deno.exit() skips them, and such a run then ends with its process.
// Never while a tool call's line is still being written to fd 3 (the run then ends with
// its process too).
//
// `layers`: the optional parts of Deno the run loaded. Deno's Node compatibility layer
// loads lazily, piece by piece, on first use: the timers behind the `setTimeout` family,
// `Buffer`, and node:process (the `process` global, any `node:` import, npm packages),
// each tens of milliseconds in a sandbox, where Deno has no code cache for them. A run
// that never touches them never pays, and codebox's own code never touches them. The
// globals that load the timers and Buffer are watched (their lazy getters wrapped;
// nothing else changes), and node:process leaves its own mark among Deno's internals.

const CHANNEL_FD = 3;

const libc = Deno.dlopen("libc.so.6", {
  open: { parameters: ["buffer", "i32"], result: "i32" },
  dup2: { parameters: ["i32", "i32"], result: "i32" },
  close: { parameters: ["i32"], result: "i32" },
  send: { parameters: ["i32", "buffer", "usize", "i32"], result: "isize" },
});

const NODE_GLOBALS = {
  setTimeout: "node:timers",
  setInterval: "node:timers",
  clearTimeout: "node:timers",
  clearInterval: "node:timers",
  setImmediate: "node:timers",
  clearImmediate: "node:timers",
  Buffer: "node:buffer",
};
const LAYERS = ["node:timers", "node:buffer", "node:process"];
const LIFECYCLE = ["load", "beforeunload", "unload"];

const internals = Deno[Deno.internal];
const seen = new Set();

// Wraps the lazy getters of the Node-backed globals to note their first use.
function watchNodeGlobals() {
  for (const [name, layer] of Object.entries(NODE_GLOBALS)) {
    const lazy = Object.getOwnPropertyDescriptor(globalThis, name);
    if (typeof lazy?.get !== "function" || !lazy.configurable) continue;
    Object.defineProperty(globalThis, name, {
      get() {
        seen.add(layer);
        return lazy.get.call(this);
      },
      // Assigning the global replaces it with a data property, as Deno's setter does.
      set(value) {
        Object.defineProperty(this, name, { value, writable: true, enumerable: true, configurable: true });
      },
      enumerable: lazy.enumerable,
      configurable: true,
    });
  }
}

/** Whether node:process has been bootstrapped (found out without loading it). */
export function nodeProcessLoaded() {
  return typeof internals?.dispatchProcessExitEvent === "function";
}

/** The optional layers loaded so far, in a fixed order. */
export function loadedLayers() {
  if (nodeProcessLoaded()) seen.add("node:process");
  return LAYERS.filter((l) => seen.has(l));
}

// Deno keeps duplicates of stdout and stderr (behind Deno.stdout and Deno.stderr) until
// the process ends: the supervisor sees the pipes' end only once those are gone too.
// `[1, 2, ...the duplicates]`.
function outputFds() {
  const fds = [1, 2];
  try {
    const pipes = new Set();
    for (const fd of fds) {
      const target = Deno.readLinkSync(`/proc/self/fd/${fd}`);
      if (target.startsWith("pipe:")) pipes.add(target);
    }
    for (const entry of Deno.readDirSync("/proc/self/fd")) {
      const fd = Number(entry.name);
      if (!(fd > CHANNEL_FD)) continue;
      try {
        if (pipes.has(Deno.readLinkSync(`/proc/self/fd/${fd}`))) fds.push(fd);
      } catch {
        // closed since (the directory's own descriptor)
      }
    }
  } catch {
    // no /proc: the pipes end with the process
  }
  return fds;
}

/**
 * Gets the end of a one-shot run ready: to be called before the program and before any
 * other listener for the lifecycle events, so that the program's own come after.
 * Nothing happens at the end until `arm(sendOutputs)` says this run is one-shot
 * (`sendOutputs`: what sends the output files, once).
 */
export function prepareEnd() {
  watchNodeGlobals();
  const outputs = outputFds();
  const encoder = new TextEncoder();
  const devNullPath = encoder.encode("/dev/null\0");
  // Which lifecycle events the program listens for (through the global's method).
  const listened = new Set();
  const add = EventTarget.prototype.addEventListener;
  globalThis.addEventListener = function (type, ...rest) {
    if (LIFECYCLE.includes(type) && (this === undefined || this === globalThis)) listened.add(type);
    return add.call(this ?? globalThis, type, ...rest);
  };
  const programListens = (types) => types.some((t) => listened.has(t) || globalThis[`on${t}`]);
  const busy = () => {
    const out = globalThis[Symbol.for("codebox.channel.output")];
    return out && (out.busy || out.queue.length > 0);
  };
  const moreWork = internals?.core?.eventLoopHasMoreWork;
  let armed = false;
  let sendOutputs = null;
  let told = false;

  // Points stdout, stderr and Deno's duplicates at /dev/null: the pipes end now, and
  // nothing written later can land in a file that took a closed descriptor's number.
  const closeOutput = () => {
    const devNull = libc.symbols.open(devNullPath, 0o2000001 /* O_WRONLY | O_CLOEXEC */);
    for (const fd of outputs) {
      if (devNull < 0 || libc.symbols.dup2(devNull, fd) < 0) libc.symbols.close(fd);
    }
    if (devNull >= 0) libc.symbols.close(devNull);
  };
  const tell = (end) => {
    if (told || busy()) return;
    told = true;
    // Deno.exit() before the end of the module: the output files still go.
    try {
      sendOutputs?.();
    } catch {
      // the supervisor is gone
    }
    const params = JSON.stringify({ status: Deno.exitCode, layers: loadedLayers(), end });
    const line = encoder.encode(`{"jsonrpc":"2.0","method":"codebox/exit","params":${params}}\n`);
    closeOutput();
    // MSG_DONTWAIT | MSG_NOSIGNAL: never block or die here; a short write is an
    // unreadable line the supervisor ignores (it then waits for the exit as before).
    libc.symbols.send(CHANNEL_FD, line, BigInt(line.length), 0x40 | 0x4000);
  };
  add.call(globalThis, "load", () => {
    if (!armed || programListens(LIFECYCLE) || nodeProcessLoaded()) return;
    if (typeof moreWork !== "function" || moreWork()) return;
    tell("settled");
  });
  add.call(globalThis, "unload", () => {
    if (!armed || told || programListens(["unload"])) return;
    if (nodeProcessLoaded()) {
      // Loaded already: reading `process` costs nothing now.
      const proc = globalThis.process;
      if (typeof proc?.listenerCount !== "function") return;
      if (proc.listenerCount("exit") > 0) {
        proc.on("exit", () => tell("exit"));
        return;
      }
    }
    tell("unload");
  });
  return {
    arm(send) {
      armed = true;
      sendOutputs = send;
    },
  };
}
