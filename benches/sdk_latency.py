"""Client-side latency as the official Python MCP SDK sees it over stdio, side by side in
one run: the client's floor, codebox warm, codebox in back-to-back bursts, and two peers
when they run here: pydantic's mcp-run-python (Python) and code-executor-mcp (TypeScript).
`cargo xtask bench-sdk` builds and installs what this needs and runs it; by hand:

    PYTHONPATH=target/mcp-pydeps CODEBOX_ROOTFS=target/rootfs /usr/bin/python3 \\
        benches/sdk_latency.py --codebox target/release/codebox \\
        [--rounds 10] [--samples 10] [--bursts 5] [--burst-size 20] [--pool-size 2] \\
        [--peer target/bench-peers/mcp-run-python --deno target/bench-peers/deno/bin/deno] \\
        [--code-executor target/bench-peers/code-executor-mcp \\
         --code-executor-deno target/bench-peers/deno/bin/deno]

Cases, each a `tools/call` timed from the SDK's `call_tool` to its return:
- floor: a no-op tool of a trivial stdio server (the SDK's own MCPServer, this file run
  with --floor-server): what any tool call costs this client, the subtracted floor;
- codebox `execute_python print(1)` and `execute_typescript console.log(1)` on one
  `codebox serve` with a pool of --pool-size per language, each call made once every
  pool is full again (polled with `health`), so every call should be warm;
- mcp-run-python `run_python_code print(1)` (Pyodide in Deno, in-process) if it starts;
- code-executor-mcp `executeTypescript console.log(1)` (a fresh Deno process per call) if
  it starts;
- with --microvm-guest DIR: the same two codebox calls on a second `codebox serve` with
  the microVM backend (that guest; one warm clone per language), each made once its
  clones wait again (polled with `health`).
Every round runs the cases in a new random order, --samples calls each; before every
measured call of any case codebox's pools are full, so no refill runs in the background.

Bursts: --bursts times per language, once the pools are full, --burst-size calls with no
pause; each call's `start` (structuredContent: "cold", or a warm kind) gives a pattern
such as WWcWWc (c cold, else the kind's initial in capitals).

Prints medians and p99, each minus the floor's median ("over floor": what the server adds
to the client's typical cost of a call), and codebox's over-floor figures divided by each
peer's in its language. Results are checked (stdout "1"); timings never are.
"""

import argparse
import collections
import os
import random
import re
import statistics
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.dont_write_bytecode = True  # tests/mcp holds no byte code of ours
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "mcp"))
from helpers import processes_with, server_env  # noqa: E402

WARM_UP = 3
SETTLE_TIMEOUT = 20.0
# A microVM clone is restored in seconds under TCG; a template boots in tens of them.
VM_SETTLE_TIMEOUT = 300.0
START_TIMEOUT = 300.0
LANGS = {"python": ("execute_python", "print(1)"),
         "typescript": ("execute_typescript", "console.log(1)")}


def floor_server():
    """The trivial stdio MCP server: one tool that does nothing."""
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("floor")

    @app.tool()
    def noop() -> str:
        """Returns "ok"."""
        return "ok"

    app.run("stdio")


def pct(samples, q):
    """Nearest-rank quantile, as xtask/src/bench/stats.rs."""
    s = sorted(samples)
    return s[round((len(s) - 1) * q)]


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


class Case:
    """One kind of measured call: a server's session and how to check its result."""

    def __init__(self, label, session, tool, args, check):
        self.label, self.session, self.tool, self.args, self.check = \
            label, session, tool, args, check
        self.samples, self.starts = [], collections.Counter()

    async def call(self):
        t = time.perf_counter()
        r = await self.session.call_tool(self.tool, self.args)
        ms = (time.perf_counter() - t) * 1000
        return ms, self.check(r)


def check_floor(r):
    if r.is_error or text_of(r) != "ok":
        raise RuntimeError(f"floor tool failed: {r}")
    return None


def check_codebox(r):
    sc = r.structured_content or {}
    if r.is_error or sc.get("stdout") != "1\n" or sc.get("exit_code") != 0:
        raise RuntimeError(f"codebox print(1) failed: {text_of(r)[:600]}")
    return sc.get("start", "unreported")


def check_peer(r):
    out = text_of(r)
    if r.is_error or "<status>success</status>" not in out or not re.search(r"(?m)^1$", out):
        raise RuntimeError(f"mcp-run-python print(1) failed: {out[:600]}")
    return None


def check_code_executor(r):
    sc = r.structured_content or {}
    if r.is_error or sc.get("success") is not True or sc.get("output") != "1\n":
        raise RuntimeError(f"code-executor-mcp console.log(1) failed: {text_of(r)[:600]}")
    return None


def full(pool):
    """Whether a language's pool in `health` has every sandbox idle (its `size` is the
    server's own, so a pool that sizes itself is judged by what it wants now)."""
    return pool.get("size", 0) > 0 and pool.get("idle") == pool.get("size")


async def pools_settled(codebox, langs):
    """Polls codebox's `health` until every language's pool is full and nothing runs;
    returns whether that happened within SETTLE_TIMEOUT."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        h = (await codebox.call_tool("health", {})).structured_content or {}
        pools = h.get("pool", {}).get("languages", {})
        running = h.get("executions", {}).get("running", 0)
        if running == 0 and all(full(pools.get(lang, {})) for lang in langs):
            return True
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.02)


async def clones_waiting(vm, langs):
    """Polls the microVM server's `health` until every language has its warm clones
    waiting and nothing runs; returns whether that happened within VM_SETTLE_TIMEOUT."""
    deadline = time.monotonic() + VM_SETTLE_TIMEOUT
    while True:
        h = (await vm.call_tool("health", {})).structured_content or {}
        warm = (h.get("backend", {}).get("microvm") or {}).get("warm") or {}
        running = h.get("executions", {}).get("running", 0)
        if running == 0 and all(
                warm.get(lang, {}).get("waiting", 0) >= max(1, warm.get(lang, {}).get("target", 1))
                for lang in langs):
            return True
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.05)


def idle_clone_memory():
    """(PSS, USS) in KiB of every QEMU process here (the microVM server's waiting clones:
    the bench starts no other QEMU), from /proc/PID/smaps_rollup."""
    out = []
    for pid in processes_with("qemu-system"):
        try:
            rollup = open(f"/proc/{pid}/smaps_rollup").read()
        except OSError:
            continue
        kib = {line.split(":")[0]: int(line.split()[1]) for line in rollup.splitlines()[1:] if line.endswith("kB")}
        out.append((kib.get("Pss", 0), kib.get("Private_Clean", 0) + kib.get("Private_Dirty", 0)))
    return out


def letter(start):
    return "c" if start == "cold" else start[:1].upper()


async def open_peer(stack, params, log, tool, args, check):
    """Opens a session to a peer and makes one checked call; returns (session, None) or
    (None, why not)."""
    try:
        # Contexts entered outside the timeout's cancel scope: they outlive it.
        read, write = await stack.enter_async_context(stdio_client(params, errlog=log))
        s = await stack.enter_async_context(ClientSession(read, write))
        with anyio.fail_after(START_TIMEOUT):
            await s.initialize()
            check(await s.call_tool(tool, args))
        return s, None
    except Exception as e:  # noqa: BLE001 - any failure is reported, the rest goes on
        log.flush()
        log.seek(0)
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read())
        # Deno's own complaint ("error: ..." up to its source location), else the last line.
        m = re.search(r"\berror: (.+?)(?=\s*at file:|\s*Stack backtrace|\n|$)", text)
        why = m.group(1) if m else (text.strip().splitlines() or [repr(e)])[-1]
        return None, f"{why[:400]} ({type(e).__name__}: {str(e)[:200]})"


def with_deno(deno):
    deno_bin = os.path.dirname(deno)
    return (deno_bin + ":" if deno_bin else "") + os.environ.get("PATH", "")


async def start_peer(stack, args, log):
    """mcp-run-python: (session, None) or (None, why not)."""
    if args.peer_unavailable:
        return None, args.peer_unavailable
    if not args.peer:
        return None, "not requested (no --peer)"
    env = {"PATH": with_deno(args.deno),
           "PYTHONPATH": args.peer, "HOME": os.environ.get("HOME", "/root"),
           "DENO_DIR": args.deno_dir or os.path.join(os.path.dirname(args.peer), "deno-dir"),
           "DENO_NO_UPDATE_CHECK": "1"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_run_python", "stdio"],
                                   env=env, cwd=tempfile.gettempdir())
    return await open_peer(stack, params, log, "run_python_code", {"python_code": "print(1)"},
                           check_peer)


async def start_code_executor(stack, args, log):
    """code-executor-mcp: (session, None) or (None, why not). Its configuration is found in
    $HOME (an MCP client's config file with no servers, made by xtask); its health-check
    HTTP listener is off."""
    if args.code_executor_unavailable:
        return None, args.code_executor_unavailable
    if not args.code_executor:
        return None, "not requested (no --code-executor)"
    home = os.path.join(args.code_executor, "bench-home")
    env = {"PATH": with_deno(args.code_executor_deno), "HOME": home,
           "DENO_PATH": args.code_executor_deno, "MCP_CONFIG_PATH": os.path.join(home, ".claude.json"),
           "ENABLE_HEALTH_CHECK": "false", "DENO_NO_UPDATE_CHECK": "1",
           "DENO_DIR": os.path.join(home, "deno-dir")}
    params = StdioServerParameters(command="node", args=[os.path.join(args.code_executor, "dist", "index.js")],
                                   env=env, cwd=tempfile.gettempdir())
    return await open_peer(stack, params, log, "executeTypescript", {"code": "console.log(1)"},
                           check_code_executor)


async def main(args):
    from contextlib import AsyncExitStack

    cb_env = server_env()
    cb_env["CODEBOX_POOL_SIZE"] = str(args.pool_size)
    floor_params = StdioServerParameters(
        command=sys.executable, args=[os.path.abspath(__file__), "--floor-server"],
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "PATH": os.environ["PATH"]})
    cb_params = StdioServerParameters(command=args.codebox, args=["serve"], env=cb_env)
    servers = [floor_params, cb_params]
    if args.microvm_guest:
        vm_env = {**cb_env, "CODEBOX_BACKEND": "microvm", "CODEBOX_GUEST": args.microvm_guest,
                  "CODEBOX_POOL_SIZE": "1"}
        servers.append(StdioServerParameters(command=args.codebox, args=["serve"], env=vm_env))
    async with AsyncExitStack() as stack:
        sessions = []
        for p in servers:
            read, write = await stack.enter_async_context(stdio_client(p))
            s = await stack.enter_async_context(ClientSession(read, write))
            await s.initialize()
            sessions.append(s)
        floor_s, codebox = sessions[:2]
        vm = sessions[2] if args.microvm_guest else None
        peer_log = stack.enter_context(tempfile.TemporaryFile("w+"))
        peer, peer_why = await start_peer(stack, args, peer_log)
        cem_log = stack.enter_context(tempfile.TemporaryFile("w+"))
        cem, cem_why = await start_code_executor(stack, args, cem_log)

        floor = Case("client floor: no-op tool, SDK MCPServer", floor_s, "noop", {}, check_floor)
        cases = [floor] + [
            Case(f"codebox {tool} {code}, warm", codebox, tool, {"code": code}, check_codebox)
            for tool, code in LANGS.values()]
        if peer:
            cases.append(Case("mcp-run-python run_python_code print(1)", peer,
                              "run_python_code", {"python_code": "print(1)"}, check_peer))
        if cem:
            cases.append(Case("code-executor-mcp executeTypescript console.log(1)", cem,
                              "executeTypescript", {"code": "console.log(1)"}, check_code_executor))
        if vm:
            cases += [Case(f"codebox microvm {tool} {code}, warm", vm, tool, {"code": code},
                           check_codebox) for tool, code in LANGS.values()]
        unsettled = 0
        for rnd in range(WARM_UP + args.rounds):
            order = cases[:]
            random.shuffle(order)
            for case in order:
                for _ in range(args.samples if rnd >= WARM_UP else 1):
                    unsettled += not await pools_settled(codebox, LANGS)
                    if vm:
                        unsettled += not await clones_waiting(vm, LANGS)
                    ms, start = await case.call()
                    if rnd >= WARM_UP:
                        case.samples.append(ms)
                        if start:
                            case.starts[start] += 1
        idle_vms = None
        if vm:
            await clones_waiting(vm, LANGS)
            idle_vms = idle_clone_memory()
        bursts = {}
        for lang, (tool, code) in LANGS.items():
            b = Case(f"codebox {tool}, bursts", codebox, tool, {"code": code}, check_codebox)
            b.patterns = []
            for _ in range(args.bursts):
                unsettled += not await pools_settled(codebox, LANGS)
                pattern = ""
                for _ in range(args.burst_size):
                    ms, start = await b.call()
                    b.samples.append(ms)
                    b.starts[start] += 1
                    pattern += letter(start)
                b.patterns.append(pattern)
            bursts[lang] = b
    report(args, cases, bursts, {"mcp-run-python": peer_why, "code-executor-mcp": cem_why}, unsettled)
    if idle_vms is not None:
        print("microVM clones waiting (their QEMU processes; the template's is gone, its RAM "
              "file shared by its clones through the page cache):")
        for pss, uss in idle_vms:
            print(f"  PSS {pss / 1024:.1f} MiB, private (USS) {uss / 1024:.1f} MiB")


def report(args, cases, bursts, why_not, unsettled):
    floor = cases[0]
    f_med = statistics.median(floor.samples)
    print(f"\ncodebox {args.codebox} serve, pool {args.pool_size} per language; "
          f"{args.rounds} rounds x {args.samples} samples, shuffled; ms")
    print("over floor: the median or p99 minus the floor's median")
    head = f"{'':46} {'median':>7} {'p99':>7} {'over floor':>11} {'p99 over':>9}  starts"
    print(head)

    def row(c):
        med, p99 = statistics.median(c.samples), pct(c.samples, 0.99)
        starts = " ".join(f"{k} {v}" for k, v in sorted(c.starts.items()))
        over = "" if c is floor else f"{med - f_med:11.2f} {p99 - f_med:9.2f}"
        print(f"{c.label:46} {med:7.2f} {p99:7.2f} {over:21}  {starts}")
        return med - f_med, p99 - f_med

    over = {c.label: row(c) for c in cases}
    for b in bursts.values():
        over[b.label] = row(b)
    # Each peer against codebox in its language: (peer, codebox's warm case, its bursts).
    pairs = (("mcp-run-python", cases[1], bursts["python"]),
             ("code-executor-mcp", cases[2], bursts["typescript"]))
    for name, warm, burst in pairs:
        peer = next((c for c in cases if c.label.startswith(name)), None)
        if not peer:
            print(f"{name}: not measured: {why_not[name]}")
            continue
        p_med, p_p99 = over[peer.label]
        for c in (warm, burst):
            med, p99 = over[c.label]
            print(f"{c.label} / {name}, over floor: median {med / p_med:.2f}, p99 {p99 / p_p99:.2f}")
    for lang, b in bursts.items():
        warm = sum(v for k, v in b.starts.items() if k != "cold")
        print(f"bursts {lang}: {args.bursts} x {args.burst_size} back-to-back, "
              f"{100 * warm / len(b.samples):.0f} % warm: {' '.join(b.patterns)}")
    if unsettled:
        print(f"warning: {unsettled} calls started before codebox's pools were full "
              f"(waited {SETTLE_TIMEOUT:.0f} s each)")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--codebox", required=True, help="the codebox binary")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--samples", type=int, default=10, help="calls per case and round")
    p.add_argument("--bursts", type=int, default=5, help="bursts per language")
    p.add_argument("--burst-size", type=int, default=20)
    p.add_argument("--pool-size", type=int, default=2, help="codebox's pool per language")
    p.add_argument("--peer", help="directory mcp-run-python is pip-installed in (--target)")
    p.add_argument("--deno", default="deno", help="the deno binary the peer runs")
    p.add_argument("--deno-dir", help="the peer's DENO_DIR (default: beside --peer)")
    p.add_argument("--peer-unavailable", metavar="REASON",
                   help="why the peer is not measured (its install failed), for the report")
    p.add_argument("--code-executor", help="directory code-executor-mcp is built in (dist/index.js)")
    p.add_argument("--code-executor-deno", default="deno", help="the deno binary it runs")
    p.add_argument("--code-executor-unavailable", metavar="REASON",
                   help="why code-executor-mcp is not measured (its build failed)")
    p.add_argument("--microvm-guest", metavar="DIR",
                   help="also measure a microVM-backend server with this guest (built for --codebox)")
    args = p.parse_args()
    if args.peer:  # the peer runs in a scratch directory: no relative paths
        args.peer = os.path.abspath(args.peer)
        if os.sep in args.deno:
            args.deno = os.path.abspath(args.deno)
    if args.deno_dir:
        args.deno_dir = os.path.abspath(args.deno_dir)
    if args.microvm_guest:
        args.microvm_guest = os.path.abspath(args.microvm_guest)
    if args.code_executor:
        args.code_executor = os.path.abspath(args.code_executor)
        if os.sep in args.code_executor_deno:
            args.code_executor_deno = os.path.abspath(args.code_executor_deno)
    for name in ("rounds", "samples", "bursts", "burst_size", "pool_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


if __name__ == "__main__":
    if sys.argv[1:] == ["--floor-server"]:
        floor_server()
    else:
        anyio.run(main, parse())
