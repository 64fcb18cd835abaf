"""Sessions that outlive the server (issue 38, namespace backend), end to end with the
official Python MCP SDK against real `codebox serve` processes sharing one `state_dir`:

- pause_session saves a session and frees it; its next call resumes it with its files
  (a symlink stays a symlink, never followed) and says `state: "files"` (a new
  interpreter) in structuredContent and in the text, once;
- a restart: the paused sessions of an earlier run, and those open when it stopped
  (end of stdin: on_stop = "pause"), resume on the next server under their old ids;
- a closed paused session is gone; without a key the tools are not offered;
- fork_session of a live and of a paused session: the copies diverge both ways;
- two servers at once on one state_dir: a session paused on one resumes on the other;
  both racing to resume it: one wins, the other says who holds it;
- per-client bounds (bytes, count) refuse a pause and leave the session live, its
  interpreter included;
- a disk that fills during a pause (state_dir on a 1 MiB tmpfs, as root) leaves the
  session live as it was, and what the failed pause wrote is removed;
- SIGTERM: the open sessions are paused by the drain and resume on the next server;
- an idle session is paused (on_idle), listed in codebox://sessions and health, and
  resumed by its next call;
- snapshots altered on disk are refused, named, and never half-restored: a flipped byte,
  a truncated part, an older snapshot put back in place of the newer one.

Usage: persist_client.py CODEBOX_BINARY
Prints one line per case and "N passed, M failed".
"""

import os
import shutil
import sys
import tempfile

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from helpers import processes_with, server_env

CODEBOX = sys.argv[1]
KEY = os.urandom(32).hex()


class World:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="codebox-persist-test-")
        os.chmod(self.tmp.name, 0o755)
        self.state = os.path.join(self.tmp.name, "state")
        self.store = os.path.join(self.state, "sessions")
        self.mcp = os.path.join(self.tmp.name, "mcp.json")
        with open(self.mcp, "w") as f:
            f.write('{"mcpServers": {}}')
        # session name -> id, and id -> its slot directory in the store
        self.ids = {}
        self.slots = {}

    def params(self, keep=True):
        env = server_env()
        env.update({
            "CODEBOX_STATE_DIR": self.state,
            "CODEBOX_POOL_SIZE": "0",
        })
        if keep:
            env["CODEBOX_SESSIONS_SNAPSHOT_KEY"] = "env:CODEBOX_TEST_SNAPSHOT_KEY"
            env["CODEBOX_TEST_SNAPSHOT_KEY"] = KEY
        # The config path in the command line tells this test's servers apart.
        return StdioServerParameters(command=CODEBOX, args=["serve", "--mcp-config", self.mcp], env=env)

    def slot_names(self):
        if not os.path.isdir(self.store):
            return set()
        return {n for n in os.listdir(self.store) if os.path.isdir(os.path.join(self.store, n))}

    def snapshot_dir(self, name):
        slot = os.path.join(self.store, self.slots[self.ids[name]])
        snaps = sorted((n for n in os.listdir(slot) if n.startswith("snap.")),
                       key=lambda n: int(n.split(".")[1]))
        assert snaps, os.listdir(slot)
        return os.path.join(slot, snaps[-1])


def text(r):
    return "".join(getattr(c, "text", "") for c in r.content)


async def py(s, code, **extra):
    r = await s.call_tool("execute_python", {"code": code, **extra})
    return r, r.structured_content or {}


async def new_session(s, w, name, code):
    r, sc = await py(s, code, session="new")
    assert not r.is_error and sc.get("exit_code") == 0, (text(r), sc)
    w.ids[name] = sc["session"]["id"]
    return w.ids[name]


async def pause(s, w, name):
    before = w.slot_names()
    r = await s.call_tool("pause_session", {"session": w.ids[name]})
    assert not r.is_error, text(r)
    sc = r.structured_content
    assert sc["paused"] is True and sc["state"] == "files", sc
    assert "state: files" in text(r), text(r)
    new = w.slot_names() - before
    # Its slot (a refused pause may have made it already).
    if w.ids[name] not in w.slots and len(new) == 1:
        w.slots[w.ids[name]] = new.pop()
    return sc


# ---------------------------------------------------------------- the first server


async def first_server(s, w):
    names = {t.name for t in (await s.list_tools()).tools}
    assert {"pause_session", "resume_session"} <= names, names
    await new_session(s, w, "one", (
        "import os\n"
        "os.makedirs('data', exist_ok=True)\n"
        "open('data/a.txt', 'w').write('hello')\n"
        "os.symlink('/etc/hostname', 'link')\n"
        "x = 41\n"))
    sc = await pause(s, w, "one")
    assert sc["workspace"]["entries"] >= 3, sc
    # Paused: a second pause says so; the session's next call resumes it.
    r = await s.call_tool("pause_session", {"session": w.ids["one"]})
    assert r.is_error and "is paused" in text(r), text(r)
    r, sc = await py(s, (
        "import os\n"
        "print(open('data/a.txt').read(), os.readlink('link'), os.path.islink('link'))\n"
        "print('x' in globals())\n"), session=w.ids["one"], keep_alive=True)
    assert not r.is_error, text(r)
    assert sc["stdout"] == "hello /etc/hostname True\nFalse\n", sc
    assert sc["session"]["state"] == "files" and sc["session"]["resumed"] is True, sc["session"]
    assert "state: files" in text(r) and "interpreter started afresh" in text(r), text(r)
    # Said once: the next run is an ordinary one (and its interpreter is kept).
    r, sc = await py(s, "y = 1\nprint('again')", session=w.ids["one"], keep_alive=True)
    assert "state" not in sc["session"] and "state: files" not in text(r), (sc["session"], text(r))
    await new_session(s, w, "two", "open('b.txt', 'w').write('open at the stop')")
    for name in ["tampered", "truncated"]:
        await new_session(s, w, name, f"open('{name}.txt', 'w').write('z' * 100000)")
        await pause(s, w, name)
    await new_session(s, w, "closed", "open('c.txt', 'w').write('c')")
    await pause(s, w, "closed")
    r = await s.call_tool("close_session", {"session": w.ids["closed"]})
    assert not r.is_error, text(r)
    r, _ = await py(s, "print(1)", session=w.ids["closed"])
    assert r.is_error and "was closed" in text(r), text(r)
    assert w.slots[w.ids["closed"]] not in w.slot_names() or not any(
        n.startswith("snap.") for n in os.listdir(os.path.join(w.store, w.slots[w.ids["closed"]]))
    ), "a closed session's snapshot is removed"


async def fork_isolation_both_ways(s, w):
    await new_session(s, w, "src", "open('f.txt', 'w').write('base')")
    # A live session's fork: a copy now; the source stays live.
    r = await s.call_tool("fork_session", {"session": w.ids["src"]})
    assert not r.is_error, text(r)
    a = r.structured_content["session"]
    assert a != w.ids["src"] and r.structured_content["forked_from"] == w.ids["src"], r.structured_content
    r, sc = await py(s, "open('f.txt', 'w').write('src'); open('g.txt', 'w').write('g')", session=w.ids["src"])
    assert "state" not in sc["session"], sc["session"]
    r, sc = await py(s, (
        "import os\n"
        "print(open('f.txt').read(), os.path.exists('g.txt'))\n"
        "open('h.txt', 'w').write('a')\n"), session=a)
    assert sc["stdout"] == "base False\n", (text(r), sc)
    assert sc["session"]["state"] == "files", sc["session"]
    r, sc = await py(s, "import os; print(open('f.txt').read(), os.path.exists('h.txt'))", session=w.ids["src"])
    assert sc["stdout"] == "src False\n", (text(r), sc)
    # A paused session's fork: a copy of its snapshot.
    await pause(s, w, "src")
    r = await s.call_tool("fork_session", {"session": w.ids["src"]})
    assert not r.is_error, text(r)
    b = r.structured_content["session"]
    r, sc = await py(s, "print(open('f.txt').read(), open('g.txt').read()); open('f.txt', 'w').write('b')", session=b)
    assert sc["stdout"] == "src g\n", (text(r), sc)
    r, sc = await py(s, "print(open('f.txt').read())", session=w.ids["src"])
    assert sc["stdout"] == "src\n" and sc["session"]["state"] == "files", (text(r), sc)
    r, sc = await py(s, "print(open('f.txt').read())", session=b)
    assert sc["stdout"] == "b\n", (text(r), sc)
    # Someone else's or an unknown session cannot be forked.
    r = await s.call_tool("fork_session", {"session": "cbx_nope"})
    assert r.is_error and "no session" in text(r), text(r)


async def paused_sessions_are_listed(s, w):
    import json
    listing = json.loads((await s.read_resource("codebox://sessions")).contents[0].text)
    paused = {p["id"]: p for p in listing["paused"]}
    for name in ["tampered", "truncated"]:
        assert w.ids[name] in paused, (name, listing)
        assert paused[w.ids[name]]["state"] == "files" and paused[w.ids[name]]["bytes"] > 0, paused
    assert listing["paused_count"] == len(paused) and listing["max_paused"] == 16, listing
    assert listing["keep_paused_for_s"] == 7 * 86400, listing
    health = (await s.call_tool("health", {})).structured_content
    store = health["sessions"]["paused"]
    assert store["totals"]["paused"] >= 2 and store["on_idle"] == "pause", store


def alter_snapshots(w):
    # A flipped byte in the middle of the workspace part; a part cut short.
    part = os.path.join(w.snapshot_dir("tampered"), "workspace")
    with open(part, "r+b") as f:
        f.seek(os.path.getsize(part) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    part = os.path.join(w.snapshot_dir("truncated"), "workspace")
    os.truncate(part, os.path.getsize(part) - 100)


# ---------------------------------------------------------------- the second server


async def second_server(s, w):
    # Paused by pause_session on the earlier run, and open when it stopped.
    r = await s.call_tool("resume_session", {"session": w.ids["one"]})
    assert not r.is_error, text(r)
    assert r.structured_content["resumed"] is True and r.structured_content["state"] == "files", r.structured_content
    assert "state: files" in text(r), text(r)
    r, sc = await py(s, "print(open('data/a.txt').read(), 'y' in globals())", session=w.ids["one"])
    assert sc["stdout"] == "hello False\n", (text(r), sc)
    r, sc = await py(s, "print(open('b.txt').read())", session=w.ids["two"])
    assert not r.is_error and sc["stdout"] == "open at the stop\n", text(r)
    assert sc["session"]["state"] == "files", sc["session"]
    # Closed on the earlier run: said so on this one too.
    r, _ = await py(s, "print(1)", session=w.ids["closed"])
    assert r.is_error and "was closed" in text(r) and "start a new one" in text(r), text(r)
    # Altered snapshots: refused with their reason, every time (nothing half-restored).
    for name, why in [("tampered", "altered"), ("truncated", "truncated")]:
        for _ in range(2):
            r, _ = await py(s, "print(open(f'{n}.txt').read())".replace("{n}", name), session=w.ids[name])
            assert r.is_error and why in text(r) and "cannot be resumed" in text(r), (name, text(r))
    # An older snapshot put back in place of the newer one (all of it: manifest and parts).
    old = os.path.join(w.tmp.name, "old-snapshot")
    shutil.copytree(w.snapshot_dir("one"), old)
    await pause(s, w, "one")
    newer = w.snapshot_dir("one")
    shutil.rmtree(newer)
    shutil.copytree(old, newer)
    r, _ = await py(s, "print(open('data/a.txt').read())", session=w.ids["one"])
    assert r.is_error and "older snapshot was put back" in text(r), text(r)


async def without_a_key(s, w):
    names = {t.name for t in (await s.list_tools()).tools}
    assert not {"pause_session", "resume_session"} & names, names
    r, _ = await py(s, "print(1)", session=w.ids["two"])
    assert r.is_error and "restarted" in text(r), text(r)


async def idle_sessions_pause_and_resume(s, w):
    # session_ttl is 1 s on this server: an idle session is paused, not closed.
    import json
    await new_session(s, w, "idle", "open('i.txt', 'w').write('idle')")
    for _ in range(400):
        listing = json.loads((await s.read_resource("codebox://sessions")).contents[0].text)
        # Paused and freed (the listing may fall between the two).
        if w.ids["idle"] in {p["id"] for p in listing["paused"]} and w.ids["idle"] not in {
            x["id"] for x in listing["sessions"]
        }:
            break
        await anyio.sleep(0.05)
    else:
        raise AssertionError(f"the idle session was not paused: {listing}")
    r, sc = await py(s, "print(open('i.txt').read())", session=w.ids["idle"])
    assert sc["stdout"] == "idle\n" and sc["session"]["state"] == "files", (text(r), sc)


async def sigterm_drain_pauses(s, w):
    import signal
    await new_session(s, w, "drained", "open('d.txt', 'w').write('drained')")
    ours = [p for p in processes_with(w.mcp) if parent_of(p) == os.getpid()]
    assert len(ours) == 1, ours
    os.kill(ours[0], signal.SIGTERM)
    for _ in range(600):
        if not os.path.exists(f"/proc/{ours[0]}") or parent_of(ours[0]) != os.getpid() or zombie(ours[0]):
            break
        await anyio.sleep(0.05)
    else:
        raise AssertionError("the server did not stop on SIGTERM")


async def drained_session_resumes(s, w):
    r, sc = await py(s, "print(open('d.txt').read())", session=w.ids["drained"])
    assert not r.is_error and sc["stdout"] == "drained\n", text(r)
    assert sc["session"]["state"] == "files", sc["session"]


async def two_servers_share_the_store(w):
    """Two servers at once on one state_dir: a session paused on one resumes on the
    other; both racing to resume it: one wins, the other names the holder."""
    async with stdio_client(w.params()) as (r1, w1), stdio_client(w.params()) as (r2, w2):
        async with ClientSession(r1, w1) as a, ClientSession(r2, w2) as b:
            await a.initialize()
            await b.initialize()
            await new_session(a, w, "shared", "open('s.txt', 'w').write('shared')")
            await pause(a, w, "shared")
            r, sc = await py(b, "print(open('s.txt').read())", session=w.ids["shared"])
            assert not r.is_error and sc["stdout"] == "shared\n", text(r)
            assert sc["session"]["state"] == "files", sc["session"]
            await pause(b, w, "shared")
            answers = {}

            async def resume(name, s):
                answers[name] = await s.call_tool("resume_session", {"session": w.ids["shared"]})

            async with anyio.create_task_group() as tg:
                tg.start_soon(resume, "a", a)
                tg.start_soon(resume, "b", b)
            won = [n for n, r in answers.items() if not r.is_error]
            lost = [n for n, r in answers.items() if r.is_error]
            assert len(won) == 1 and len(lost) == 1, {n: text(r) for n, r in answers.items()}
            assert "live on another codebox server" in text(answers[lost[0]]), text(answers[lost[0]])
            winner = a if won[0] == "a" else b
            r, sc = await py(winner, "print(open('s.txt').read())", session=w.ids["shared"])
            assert sc["stdout"] == "shared\n", text(r)


async def bounds_refuse_and_leave_the_session_live(s, w):
    # max_paused_bytes_per_client = "1M", max_paused_per_client = 1 (the config file).
    sid = await new_session(s, w, "big", "import os\nx = 7\nopen('big', 'wb').write(os.urandom(2_000_000))")
    await py(s, "x = 7", session=sid, keep_alive=True)
    r = await s.call_tool("pause_session", {"session": sid})
    assert r.is_error and "max_paused_bytes_per_client" in text(r), text(r)
    # Refused: the session is live as it was, interpreter included.
    r, sc = await py(s, "import os; print(x, os.path.getsize('big'))", session=sid, keep_alive=True)
    assert sc["stdout"] == "7 2000000\n" and "state" not in sc["session"], (text(r), sc)
    await py(s, "os.remove('big')", session=sid, keep_alive=True)
    await pause(s, w, "big")
    other = await new_session(s, w, "second", "open('x', 'w').write('x')")
    r = await s.call_tool("pause_session", {"session": other})
    assert r.is_error and "max_paused_per_client" in text(r), text(r)
    r, sc = await py(s, "print(open('x').read())", session=other)
    assert sc["stdout"] == "x\n", text(r)


async def a_full_disk_leaves_the_session_live(s, w):
    # state_dir is a 1 MiB tmpfs in the server's own mount namespace.
    sid = await new_session(s, w, "full", "import os\nopen('big', 'wb').write(os.urandom(3_000_000))")
    await py(s, "x = 5", session=sid, keep_alive=True)
    r = await s.call_tool("pause_session", {"session": sid})
    assert r.is_error and "cannot be paused, and stays live" in text(r) and "No space left" in text(r), text(r)
    r, sc = await py(s, "import os; print(x, os.path.getsize('big'))", session=sid, keep_alive=True)
    assert sc["stdout"] == "5 3000000\n" and "state" not in sc["session"], (text(r), sc)
    # What the failed pause wrote is gone: a smaller one fits.
    await py(s, "os.remove('big'); open('small', 'w').write('s')", session=sid, keep_alive=True)
    await pause(s, w, "full")
    r, sc = await py(s, "print(open('small').read())", session=sid)
    assert sc["stdout"] == "s\n" and sc["session"]["state"] == "files", (text(r), sc)


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def run(w, passed_failed, fns, keep=True, extra=None):
    params = w.params(keep)
    params.env.update(extra or {})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            for fn in fns:
                try:
                    with anyio.fail_after(120):
                        await fn(s, w)
                    print(f"ok   {fn.__name__}", flush=True)
                    passed_failed[0] += 1
                except Exception as e:  # noqa: BLE001 - report every failure and go on
                    import traceback
                    traceback.print_exc()
                    print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
                    passed_failed[1] += 1


async def main():
    w = World()
    counts = [0, 0]
    await run(w, counts, [first_server, fork_isolation_both_ways, paused_sessions_are_listed])
    alter_snapshots(w)
    await run(w, counts, [second_server])
    await run(w, counts, [without_a_key], keep=False)
    await run(w, counts, [idle_sessions_pause_and_resume], extra={"CODEBOX_SESSION_TTL": "1s"})
    try:
        await run(w, counts, [sigterm_drain_pauses])
    except Exception as e:  # noqa: BLE001 - the server went away under the client, as asked
        print(f"(the client saw the server stop: {type(e).__name__})", flush=True)
    await run(w, counts, [drained_session_resumes])
    bounded = World()
    config = os.path.join(bounded.tmp.name, "codebox.toml")
    with open(config, "w") as f:
        f.write('[sessions]\nsnapshot_key = "env:CODEBOX_TEST_SNAPSHOT_KEY"\n'
                'max_paused_bytes_per_client = "1M"\nmax_paused_per_client = 1\n')
    await run(bounded, counts, [bounds_refuse_and_leave_the_session_live], keep=False,
              extra={"CODEBOX_CONFIG": config, "CODEBOX_TEST_SNAPSHOT_KEY": KEY})
    if os.geteuid() == 0 and shutil.which("unshare"):
        full = World()
        os.makedirs(full.state)
        params = full.params()
        params.args = ["-m", "--propagation", "private", "sh", "-c",
                       'mount -t tmpfs -o size=1m tmpfs "$0" && exec "$@"', full.state,
                       CODEBOX, *params.args]
        params.command = shutil.which("unshare")
        full.params = lambda keep=True, p=params: p
        await run(full, counts, [a_full_disk_leaves_the_session_live])
    else:
        print("SKIP a_full_disk_leaves_the_session_live: needs root and unshare(1) for a tmpfs of its own", flush=True)
    try:
        with anyio.fail_after(120):
            await two_servers_share_the_store(w)
        print("ok   two_servers_share_the_store", flush=True)
        counts[0] += 1
    except Exception as e:  # noqa: BLE001 - report and go on
        import traceback
        traceback.print_exc()
        print(f"FAIL two_servers_share_the_store: {type(e).__name__}: {e}", flush=True)
        counts[1] += 1
    print(f"{counts[0]} passed, {counts[1]} failed")
    return 1 if counts[1] else 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
