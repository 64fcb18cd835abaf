"""The README's quick start, run as it is written: its `.mcp.json`, `client.py` and
`tasks.py` blocks (each after a `<!-- quickstart: NAME -->` marker) are taken from
README.md, and run in a scratch directory with the official Python SDK against the
codebox binary under test. Two substitutions only: the binary's path for
`target/release/codebox`, and the filesystem server from the test fixtures for `npx -y
@modelcontextprotocol/server-filesystem` (no download during tests).

Usage: readme_client.py CODEBOX_BINARY UPSTREAMS_DIR README
Prints one line per case and "N passed, M failed".
"""

import json
import os
import re
import subprocess
import sys
import tempfile

CODEBOX = os.path.abspath(sys.argv[1])
UPSTREAMS = os.path.abspath(sys.argv[2])
README = sys.argv[3]
FILESYSTEM = os.path.join(UPSTREAMS, "node/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")


def blocks():
    """{name: text} of the fenced blocks that follow `<!-- quickstart: name -->`."""
    text = open(README, encoding="utf-8").read()
    found = {}
    for m in re.finditer(r"<!-- quickstart: (\S+) -->\n```\w*\n(.*?)\n```", text, re.S):
        found[m.group(1)] = m.group(2) + "\n"
    return found


def run(script, cwd, timeout=300):
    env = {k: v for k, v in os.environ.items() if k.startswith(("CODEBOX_", "HOME", "PATH", "PYTHONPATH"))}
    return subprocess.run(["/usr/bin/python3", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def main():
    b = blocks()
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="codebox-readme-") as tmp:
        os.chmod(tmp, 0o755)
        config = json.loads(b[".mcp.json"])
        fs = config["mcpServers"]["filesystem"]
        assert fs["command"] == "npx" and fs["args"][:2] == ["-y", "@modelcontextprotocol/server-filesystem"], fs
        fs["command"], fs["args"] = "node", [FILESYSTEM, *fs["args"][2:]]
        with open(os.path.join(tmp, ".mcp.json"), "w") as f:
            json.dump(config, f)
        client = b["client.py"].replace('"target/release/codebox"', repr(CODEBOX))
        assert repr(CODEBOX) in client, "the client names target/release/codebox"
        cases = [
            ("the_code_mode_client_runs_as_written", client,
             ["list_directory", "entries in /tmp", "['text', 'image']", "exit 0 in"]),
            ("the_tasks_client_runs_as_written", client.replace("anyio.run(main)\n", "") + b["tasks.py"],
             ["0\n1\n2\n", "still running:"]),
        ]
        for name, script, expected in cases:
            out = run(script, tmp)
            missing = [e for e in expected if e not in out.stdout]
            if out.returncode == 0 and not missing:
                print(f"ok      {name}", flush=True)
                passed += 1
            else:
                print(f"FAILED  {name}: exit {out.returncode}, missing {missing}\n"
                      f"--- stdout ---\n{out.stdout[-3000:]}\n--- stderr ---\n{out.stderr[-3000:]}", flush=True)
                failed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


main()
