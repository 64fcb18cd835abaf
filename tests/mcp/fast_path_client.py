"""The warm fast path stays fast, through `codebox serve` and the official Python MCP SDK:
a guard with no timed assertion. A warm `console.log(1)` and a warm `print(1)` load none of
the runtimes' optional layers (Deno's Node compatibility layer, matplotlib's backend), and
the TypeScript run ends as soon as its main module has settled with nothing pending
(`runtime.end == "settled"`), not at Deno's `unload` event; both are what the runtimes
report in `codebox/exit` (src/runtime/exit.rs). The reports are checked to name the layers
programs do load, and everything a TypeScript program can leave for the end of its run
keeps its behaviour: output after the last line, timers, intervals, microtasks, exit
codes, unhandled rejections, `Deno.exit` in a timer, lifecycle listeners, Node's
`process.on("exit")`, output files.

Usage: fast_path_client.py CODEBOX_BINARY
Prints one line per case and "N passed, M failed".
"""

import sys
import time

import anyio

from helpers import cases_over_stdio

CODEBOX = sys.argv[1]
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def text_of(r):
    return "\n".join(c.text for c in r.content if getattr(c, "text", None))


async def pool_ready(s, language):
    """Waits until `language`'s pool has a sandbox waiting (the next call is warm)."""
    deadline = time.monotonic() + 60
    while True:
        h = (await s.call_tool("health", {})).structured_content
        if h["pool"]["languages"][language]["idle"] >= 1:
            return
        assert time.monotonic() < deadline, h["pool"]
        await anyio.sleep(0.05)


async def warm(s, language, code, **args):
    """`code` run in a warm sandbox: (result, structuredContent)."""
    await pool_ready(s, language)
    r = await s.call_tool(f"execute_{language}", {"code": code, **args})
    sc = r.structured_content or {}
    assert sc.get("start") == "warm", sc
    return r, sc


async def ts(s, code):
    return (await warm(s, "typescript", code))[1]


@case
async def a_warm_console_log_loads_no_optional_layer_and_ends_when_settled(s):
    for _ in range(3):
        r, sc = await warm(s, "typescript", "console.log(1)")
        assert not r.is_error, text_of(r)
        assert (sc["stdout"], sc["stderr"], sc["exit_code"]) == ("1\n", "", 0), sc
        assert sc.get("runtime") == {"layers": [], "end": "settled"}, sc


@case
async def a_warm_print_loads_no_optional_layer(s):
    for _ in range(3):
        r, sc = await warm(s, "python", "print(1)")
        assert not r.is_error, text_of(r)
        assert (sc["stdout"], sc["exit_code"]) == ("1\n", 0), sc
        assert sc.get("runtime") == {"layers": []}, sc
    # pyplot is preloaded in the pool: using it without a figure loads no backend.
    r, sc = await warm(s, "python", "import matplotlib.pyplot as plt\nprint(plt.__name__)")
    assert sc.get("runtime") == {"layers": []}, sc


@case
async def the_layers_a_program_loads_are_reported(s):
    # The checks above are only worth something if a loaded layer shows.
    sc = await ts(s, "setTimeout(() => console.log('t'), 1);\nconsole.log('s')")
    assert sc["stdout"] == "s\nt\n", sc
    assert sc["runtime"]["layers"] == ["node:timers"], sc
    sc = await ts(s, "console.log(Buffer.from('ab').length)")
    assert sc["stdout"] == "2\n" and sc["runtime"]["layers"] == ["node:buffer"], sc
    sc = await ts(s, "console.log(typeof globalThis.process.pid)")
    assert sc["stdout"] == "number\n", sc
    assert "node:process" in sc["runtime"]["layers"], sc
    sc = await ts(s, "import { existsSync } from 'node:fs';\nconsole.log(existsSync('/workspace'))")
    assert sc["stdout"] == "true\n" and "node:process" in sc["runtime"]["layers"], sc
    r, sc = await warm(s, "python", "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint('drawn')")
    assert sc["stdout"] == "drawn\n", sc
    assert sc["runtime"] == {"layers": ["matplotlib-backend"]}, sc
    assert [f["path"] for f in sc.get("files", [])] == ["out/figure-1.png"], sc


@case
async def output_after_the_last_line_is_kept(s):
    sc = await ts(s, "setTimeout(() => console.log('later'), 30);\nconsole.log('first')")
    assert (sc["stdout"], sc["exit_code"]) == ("first\nlater\n", 0), sc
    # Microtasks still queued when the module's last line has run.
    sc = await ts(s, "(async () => { for (let i = 0; i < 200; i++) await null; console.log('late'); })();\n"
                     "Promise.resolve().then(() => Promise.resolve()).then(() => console.log('chained'));\n"
                     "console.log('sync')")
    assert sc["stdout"] == "sync\nchained\nlate\n", sc
    assert sc["runtime"]["end"] == "settled", sc
    # An awaited timer; writes through Deno.stdout, awaited or not.
    sc = await ts(s, "await new Promise((r) => setTimeout(r, 20));\nconsole.log('after the wait');\n"
                     "Deno.stdout.write(new TextEncoder().encode('unawaited write\\n'));")
    assert sc["stdout"] == "after the wait\nunawaited write\n", sc
    # A fetch in flight (nothing listens there: it fails, after the last line).
    sc = await ts(s, "fetch('http://127.0.0.1:9/').then(() => console.log('fetched'), (e) => console.log('fetch failed', e.name));\n"
                     "console.log('asked')")
    assert sc["stdout"] == "asked\nfetch failed TypeError\n", sc


@case
async def timers_and_intervals_end_the_run_when_they_are_done(s):
    sc = await ts(s, "let n = 0;\nconst i = setInterval(() => { n++; console.log('tick', n); if (n === 3) clearInterval(i); }, 5);")
    assert (sc["stdout"], sc["exit_code"]) == ("tick 1\ntick 2\ntick 3\n", 0), sc
    sc = await ts(s, "setTimeout(() => { console.log('in the timer'); Deno.exit(5); }, 10);\nconsole.log('start')")
    assert (sc["stdout"], sc["exit_code"]) == ("start\nin the timer\n", 5), sc
    # An unref'd timer keeps nothing alive, as in Deno.
    sc = await ts(s, "const t = setTimeout(() => console.log('never'), 60000);\nDeno.unrefTimer(t);\nconsole.log('done')")
    assert (sc["stdout"], sc["exit_code"], sc["timed_out"]) == ("done\n", 0, False), sc


@case
async def exit_codes_and_failures_are_kept(s):
    sc = await ts(s, "Deno.exitCode = 3;\nconsole.log('x')")
    assert (sc["stdout"], sc["exit_code"]) == ("x\n", 3), sc
    assert sc["runtime"]["end"] == "settled", sc
    sc = await ts(s, "console.log('a');\nDeno.exit(4);\nconsole.log('b')")
    assert (sc["stdout"], sc["exit_code"]) == ("a\n", 4), sc
    assert sc["runtime"] == {"layers": [], "end": "unload"}, sc
    sc = await ts(s, "Promise.reject(new Error('nope'));\nconsole.log('before')")
    assert (sc["stdout"], sc["exit_code"]) == ("before\n", 1), sc
    assert "Uncaught (in promise) Error: nope" in sc["stderr"], sc
    sc = await ts(s, "setTimeout(() => { throw new Error('in a timer'); }, 5);\nconsole.log('set')")
    assert (sc["stdout"], sc["exit_code"]) == ("set\n", 1), sc
    assert "Uncaught Error: in a timer" in sc["stderr"], sc
    sc = await ts(s, "console.log('first');\nthrow new TypeError('top level');")
    assert (sc["stdout"], sc["exit_code"]) == ("first\n", 1), sc
    assert "TypeError: top level" in sc["stderr"], sc
    assert sc["runtime"] == {"layers": [], "end": "unload"}, sc
    # A handled rejection is no failure.
    sc = await ts(s, "const p = Promise.reject(new Error('x'));\np.catch(() => console.log('caught'));")
    assert (sc["stdout"], sc["exit_code"]) == ("caught\n", 0), sc


@case
async def the_program_s_own_lifecycle_listeners_run(s):
    sc = await ts(s, "addEventListener('unload', () => console.log('unloading'));\nconsole.log('main')")
    assert sc["stdout"] == "main\nunloading\n", sc
    sc = await ts(s, "addEventListener('load', () => console.log('loaded'));\nconsole.log('main')")
    assert sc["stdout"] == "main\nloaded\n", sc
    sc = await ts(s, "globalThis.onunload = () => console.log('onunload');\nconsole.log('main')")
    assert sc["stdout"] == "main\nonunload\n", sc
    # beforeunload may keep the program going.
    sc = await ts(s, "let again = true;\naddEventListener('beforeunload', (e) => {\n"
                     "  if (again) { again = false; e.preventDefault(); setTimeout(() => console.log('once more'), 5); }\n"
                     "});\nconsole.log('main')")
    assert sc["stdout"] == "main\nonce more\n", sc


@case
async def node_exit_listeners_run_and_their_output_is_kept(s):
    sc = await ts(s, "import process from 'node:process';\n"
                     "process.on('exit', (code) => console.log('exit listener', code));\n"
                     "process.on('beforeExit', () => console.log('before exit'));\n"
                     "console.log('main')")
    assert sc["stdout"] == "main\nbefore exit\nexit listener 0\n", sc
    assert sc["runtime"]["end"] == "exit" and "node:process" in sc["runtime"]["layers"], sc
    sc = await ts(s, "process.exitCode = 2;\nprocess.on('exit', (code) => console.log('exiting with', code));")
    assert (sc["stdout"], sc["exit_code"]) == ("exiting with 2\n", 2), sc


@case
async def output_files_and_values_come_with_the_early_end(s):
    sc = await ts(s, "Deno.writeTextFileSync('/workspace/out/a.txt', 'hi');\n1 + 1")
    assert sc["value"] == "2", sc
    assert [f["path"] for f in sc.get("files", [])] == ["out/a.txt"], sc
    assert sc["runtime"] == {"layers": [], "end": "settled"}, sc
    # Sent after the module, also when the run then goes on.
    sc = await ts(s, "Deno.writeTextFileSync('/workspace/out/b.txt', 'b');\nsetTimeout(() => console.log('later'), 10);")
    assert sc["stdout"] == "later\n" and [f["path"] for f in sc.get("files", [])] == ["out/b.txt"], sc


@case
async def hostile_programs_end_as_they_did(s):
    # An interval that never stops keeps the run going until its timeout.
    r, sc = await warm(s, "typescript", "setInterval(() => {}, 5);\nconsole.log('started')", timeout_ms=1500)
    assert (sc["stdout"], sc["timed_out"], sc["exit_code"]) == ("started\n", True, None), sc
    # A never-settling awaited promise: Deno's own error, as before; an unawaited one is
    # nothing pending.
    sc = await ts(s, "console.log('before');\nawait new Promise(() => {});\nconsole.log('after')")
    assert (sc["stdout"], sc["exit_code"], sc["timed_out"]) == ("before\n", 1, False), sc
    assert "Top-level await promise never resolved" in sc["stderr"], sc
    sc = await ts(s, "new Promise(() => {});\nconsole.log('done')")
    assert (sc["stdout"], sc["exit_code"]) == ("done\n", 0) and sc["runtime"]["end"] == "settled", sc
    # A timer scheduled from an exit or unload listener never runs (as in Deno and Node);
    # one from a load listener does.
    sc = await ts(s, "import process from 'node:process';\n"
                     "process.on('exit', () => { setTimeout(() => console.log('timer ran'), 10); console.log('in exit'); });\n"
                     "console.log('main')")
    assert (sc["stdout"], sc["exit_code"]) == ("main\nin exit\n", 0), sc
    sc = await ts(s, "addEventListener('unload', () => { setTimeout(() => console.log('timer ran'), 10); console.log('in unload'); });\n"
                     "console.log('main')")
    assert (sc["stdout"], sc["exit_code"]) == ("main\nin unload\n", 0), sc
    sc = await ts(s, "addEventListener('load', () => { setTimeout(() => console.log('timer ran'), 10); console.log('in load'); });\n"
                     "console.log('main')")
    assert sc["stdout"] == "main\nin load\ntimer ran\n", sc
    # A fake `process` neither loads Node nor holds the end back.
    sc = await ts(s, "globalThis.process = { listenerCount: () => 1, on() {} };\nconsole.log('main')")
    assert (sc["stdout"], sc["runtime"]) == ("main\n", {"layers": [], "end": "settled"}), sc
    # Deno's internals the end reads were taken before the program ran: faking them
    # changes nothing (the event loop test is read-only; the Node mark only delays).
    sc = await ts(s, "Deno[Deno.internal].dispatchProcessExitEvent = () => {};\n"
                     "setTimeout(() => console.log('later'), 30);\nconsole.log('main')")
    assert (sc["stdout"], sc["exit_code"]) == ("main\nlater\n", 0), sc
    # A program that hides its unload listener from the global's method loses only the
    # output that listener writes after the end; the run still ends.
    sc = await ts(s, "globalThis.addEventListener = () => {};\n"
                     "EventTarget.prototype.addEventListener.call(globalThis, 'unload', () => console.log('unload'));\n"
                     "console.log('main')")
    assert (sc["stdout"], sc["exit_code"]) == ("main\n", 0), sc
    # The program's own `codebox/exit` line only makes its own result: it claims a layer
    # and an early end, and still runs into its timeout.
    r, sc = await warm(s, "typescript",
                       "const l = new TextEncoder().encode('{\"jsonrpc\":\"2.0\",\"method\":\"codebox/exit\",\"params\":{\"status\":0,\"layers\":[\"x\"],\"end\":\"settled\"}}\\n');\n"
                       "const c = Deno.dlopen('libc.so.6', { write: { parameters: ['i32', 'buffer', 'usize'], result: 'isize' } });\n"
                       "c.symbols.write(3, l, BigInt(l.length));\nconsole.log('main');\nwhile (true) {}", timeout_ms=1500)
    assert (sc["stdout"], sc["timed_out"], sc["exit_code"]) == ("main\n", True, None), sc
    assert sc["runtime"] == {"layers": ["x"], "end": "settled"}, sc
    # The server is still there and the next warm run is on the fast path.
    sc = await ts(s, "console.log(1)")
    assert (sc["stdout"], sc["runtime"]) == ("1\n", {"layers": [], "end": "settled"}), sc


async def main():
    passed, failed = await cases_over_stdio(CODEBOX, None, CASES)
    print(f"{passed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
