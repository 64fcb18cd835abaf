"""Makes pydantic's mcp-run-python start on a machine that reaches only the package
registries (PyPI, npm), for `cargo xtask bench-sdk` (idempotent). Nothing of the peer is
kept in this repository: it is pip-installed at bench time; this file only patches that
copy.

    mrp_offline.py PEER DENO DENO_DIR

PEER: the directory mcp-run-python was pip-installed into (`--target`); DENO: the deno
binary it runs; DENO_DIR: its Deno cache. Upstream, `mcp-run-python stdio` needs three
things such a machine cannot fetch:
  1. `jsr:@std/cli` (JSR) -> an import-map entry to std_cli_parse_args.ts beside this file
     (written for the benchmark), used only to parse the server's own command line;
  2. Pyodide's `micropip`, `pydantic`, `typing_extensions` and `annotated_types` wheels from
     Pyodide's own package host -> the same versions from PyPI, put where Pyodide looks first
     (the pyodide npm package's directory in the Deno cache; Pyodide does not hash-check
     local files under Deno);
  3. `pydantic_core` built for wasm32 (on no reachable registry) -> a pure-Python stand-in
     wheel whose `to_json` is json.dumps. mcp-run-python uses only `pydantic_core.to_json`,
     and only to serialise a non-None return value, never on the print(1) path the
     benchmark times: do not benchmark return values with it.
Prints where the patched Pyodide is; exits non-zero with the reason when a step fails.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

peer, deno, deno_dir = (os.path.abspath(a) for a in sys.argv[1:4])
here = os.path.dirname(os.path.abspath(__file__))
pkg = os.path.join(peer, "mcp_run_python", "deno")
if not os.path.isdir(pkg):
    sys.exit(f"{pkg} is missing: pip-install mcp-run-python into {peer} first")

# 1. The import map.
cfg_path = os.path.join(pkg, "deno.jsonc")
cfg = open(cfg_path).read()
if "@std/cli/parse-args" not in cfg:
    if '"imports": {' not in cfg:
        sys.exit(f"{cfg_path} has no import map to extend")
    cfg = cfg.replace('"imports": {', '"imports": {\n    "@std/cli/parse-args": "./src/_std_cli_parse_args.ts",', 1)
    open(cfg_path, "w").write(cfg)
shutil.copy(os.path.join(here, "std_cli_parse_args.ts"), os.path.join(pkg, "src", "_std_cli_parse_args.ts"))

# The npm packages (pyodide, the MCP SDK, zod) into Deno's cache, from the npm registry.
env = {**os.environ, "DENO_DIR": deno_dir, "DENO_NO_UPDATE_CHECK": "1"}
with tempfile.TemporaryDirectory() as tmp:
    shutil.copytree(pkg, os.path.join(tmp, "d"), ignore=shutil.ignore_patterns("node_modules"))
    r = subprocess.run([deno, "cache", "--node-modules-dir=auto", "src/main.ts"], cwd=os.path.join(tmp, "d"),
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        sys.exit(f"deno cache failed:\n{r.stdout}")
locks = glob.glob(os.path.join(deno_dir, "npm", "*", "pyodide", "*", "pyodide-lock.json"))
if not locks:
    sys.exit(f"no pyodide-lock.json under {deno_dir}/npm after `deno cache`")
pyodide_dir = os.path.dirname(locks[0])
lock = json.load(open(locks[0]))["packages"]

# 2. Pure-Python wheels from PyPI, exactly the versions Pyodide's lock names.
want = {}
for name in ("micropip", "pydantic", "typing-extensions", "annotated-types"):
    p = lock[name]
    want[p["file_name"]] = f'{p["name"]}=={p["version"]}'
missing = [spec for fn, spec in want.items() if not os.path.exists(os.path.join(pyodide_dir, fn))]
if missing:
    with tempfile.TemporaryDirectory() as dl:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--only-binary=:all:", "--python-version", "3.13", "-d", dl, *missing],
                       check=True)
        for f in os.listdir(dl):
            shutil.copy(os.path.join(dl, f), os.path.join(pyodide_dir, f))

# 3. The pydantic_core stand-in, under the file name the lock expects.
pc = lock["pydantic-core"]
fn = os.path.join(pyodide_dir, pc["file_name"])
if not os.path.exists(fn) or os.path.getsize(fn) > 100_000:
    ver = pc["version"]
    init = ('"""Stand-in for pydantic_core (benchmark only): to_json via json.dumps."""\n'
            "import json\n__version__ = %r\n"
            "def to_json(value, *, indent=None, **_):\n"
            "    return json.dumps(value, indent=indent, default=str, separators=None if indent else (',', ':')).encode()\n" % ver)
    di = f"pydantic_core-{ver}.dist-info"
    files = {"pydantic_core/__init__.py": init,
             f"{di}/METADATA": f"Metadata-Version: 2.1\nName: pydantic_core\nVersion: {ver}\n",
             f"{di}/WHEEL": "Wheel-Version: 1.0\nGenerator: codebox-bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{di}/top_level.txt": "pydantic_core\n"}
    record = "".join(f"{k},,\n" for k in files) + f"{di}/RECORD,,\n"
    with zipfile.ZipFile(fn, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr(f"{di}/RECORD", record)
print("mcp-run-python offline patch ready:", pyodide_dir)
