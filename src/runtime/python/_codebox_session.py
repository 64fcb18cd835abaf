"""Keep-alive sessions for Python: several programs, one after another, in one __main__.

Started by boot.py when the boot frame begins with a SESSION record. Protocol
(src/runtime/boot.rs): after each run, stdout and stderr are flushed and
`codebox/done {"status": "ok" | "error"}` goes out on fd 3; then the next `codebox/run`
notification is awaited (other lines are skipped), its files are written as FILE records
are, and its code runs in the same module dict. SystemExit (sys.exit, exit()) ends the
process and so the session; EOF on fd 3 while waiting ends it with status 0.

fd 3 is read through codebox._channel, the tool calls' JSON-RPC channel: one read buffer
(and lock) for both. Each run gets its own filename, /codebox/main.py for the first and
/codebox/run-<n>.py after, with its lines in linecache, so tracebacks through functions of
earlier runs show their source.
"""

import linecache
import sys

RUN_FILENAME = "/codebox/run-%d.py"


class _NoSource:
    """__main__'s loader: linecache asks it for files it does not hold, and it knows no
    run's source (returning one would show the wrong run's lines)."""

    def get_source(self, name):
        return None


def _flush_output():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass


def _run(source, filename, namespace, boot):
    """Runs one program in `namespace` with boot.py's runner (which reports the last
    expression's value): "ok", or "error" after printing the traceback as the one-shot
    mode does. SystemExit propagates: it ends the process."""
    run_program, print_program_exception = boot[:2]
    # An mtime of None: linecache.checkcache keeps the entry. Every line ends with a
    # newline, as linecache's own reads do (a last line without one shifts the carets
    # under it by a column).
    lines = source.splitlines(True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[filename] = (len(source), None, lines, filename)
    try:
        run_program(source, filename, namespace)
    except SystemExit:
        raise
    except BaseException as exc:
        print_program_exception(exc, filename)
        return "error"
    return "ok"


def _write_files(files, write_file):
    """Writes a codebox/run message's files as FILE records are; an error message or None."""
    if not isinstance(files, dict):
        return "codebox: malformed codebox/run message (files)"
    for path, content in files.items():
        try:
            if isinstance(content, dict):
                # Bytes that are not UTF-8 come as {"base64": ...} (runtime/boot.rs).
                import binascii

                data = binascii.a2b_base64(content["base64"])
            else:
                data = content.encode("utf-8")
            write_file(path.encode("utf-8") + b"\0" + data)
        except (OSError, AttributeError, KeyError, TypeError, UnicodeError, ValueError) as e:
            return "codebox: cannot write %s: %s" % (path, getattr(e, "strerror", None) or e)
    return None


def _done(channel, status, tool_error):
    _flush_output()
    try:
        channel.notify("codebox/done", {"status": status})
    except tool_error:
        raise SystemExit(0)  # nobody is listening any more


def run(channel, module, source, rest, write_file, main_filename, boot):
    """The session: `source` first, then every codebox/run; ends only with the process.
    `rest`: bytes boot.py read past the boot frame; `write_file`: boot.py's FILE writer;
    `boot`: boot.py's (run_program, print_program_exception, capture_figures,
    send_outputs): after each run, its figures and the output files it changed go out
    before `codebox/done`."""
    from codebox import ToolError

    channel.adopt(rest)
    module.__loader__ = _NoSource()
    namespace = module.__dict__
    filename = main_filename
    runs = 1
    capture_figures, send_outputs = boot[2:]
    outputs = None  # the first run's are in the boot frame
    seen = None  # the output files as the last run left them
    while True:
        status = _run(source, filename, namespace, boot)
        capture_figures()
        _flush_output()
        seen = send_outputs(seen, outputs)
        _done(channel, status, ToolError)
        while True:
            try:
                message = channel.next_control()
            except OSError:
                message = None
            if message is None:
                raise SystemExit(0)  # EOF on fd 3: the session is over
            runs += 1
            filename = RUN_FILENAME % runs
            params = message.get("params")
            params = params if isinstance(params, dict) else {}
            source = params.get("code")
            outputs = params.get("outputs")
            if not isinstance(outputs, list):
                outputs = []
            problem = _write_files(params.get("files") or {}, write_file)
            if problem is None and not isinstance(source, str):
                problem = "codebox: malformed codebox/run message (no code)"
            if problem is None:
                break
            print(problem, file=sys.stderr)
            _done(channel, "error", ToolError)
