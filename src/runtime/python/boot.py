"""codebox boot for Python: receive the program on fd 3 and run it as __main__.

Protocol: the header b"CODE <n>\\n" then n bytes of UTF-8 source (see src/runtime/mod.rs).
Runs with -I -S -B, so this file sets up what `python -c` would have: sys.path with the
working directory first, exit()/quit(), and a clean __main__ module.
"""

import builtins
import sys
from posix import read  # built in; `os` would cost ~2 ms of imports

CHANNEL_FD = 3
MAIN_FILENAME = "/codebox/main.py"


def _receive():
    buf = b""
    while b"\n" not in buf:
        chunk = read(CHANNEL_FD, 65536)
        if not chunk:
            raise SystemExit("codebox: no program received on fd 3")
        buf += chunk
    header, _, rest = buf.partition(b"\n")
    kind, _, size = header.partition(b" ")
    if kind != b"CODE" or not size.isdigit():
        raise SystemExit("codebox: bad boot header %r" % header[:64])
    size = int(size)
    parts, got = [rest], len(rest)
    while got < size:
        chunk = read(CHANNEL_FD, min(1 << 20, size - got))
        if not chunk:
            raise SystemExit("codebox: program cut short on fd 3")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)[:size].decode("utf-8")


class _SourceLoader:
    """Lets tracebacks show lines of the program (linecache asks __loader__)."""

    def __init__(self, source):
        self._source = source

    def get_source(self, name):
        return self._source


def _install_site_builtins():
    import _sitebuiltins

    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")


def main():
    source = _receive()
    sys.path[:0] = ["/workspace"]
    sys.path.append("/opt/codebox/python")
    sys.argv = [MAIN_FILENAME]
    _install_site_builtins()
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    module = type(sys)("__main__")
    module.__loader__ = _SourceLoader(source)
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    code = compile(source, MAIN_FILENAME, "exec")
    try:
        exec(code, module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        # Report as `python -c` would, without this file's frame. The pure-Python printer
        # reads source lines through linecache, which asks the module's __loader__.
        import traceback

        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        traceback.print_exception(type(exc), exc.with_traceback(tb), tb)
        sys.exit(1)


main()
