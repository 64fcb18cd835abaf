"""The codebox module inside the sandbox: call the tools of upstream MCP servers.

    import codebox
    text = codebox.call_tool("filesystem__read_text_file", {"path": "/data/a.txt"})
    for t in codebox.search_tools("read file", detail="summary"):
        print(t["name"], t.get("description"))

The generated package `servers` wraps every tool in a typed function
(`from servers.filesystem import read_text_file`); both go through `call_tool`.

Protocol (src/proxy/mod.rs): after the boot frame, fd 3 carries newline-delimited
JSON-RPC 2.0; this module sends a request and reads its response. Calls from several
threads are serialised.

In a keep-alive session (src/runtime/boot.rs) boot.py also reads the next run's
`codebox/run` notification through this channel and sends `codebox/done`, so the tool
calls and the session share one read buffer.
"""

import json
import threading
from posix import read, write

CHANNEL_FD = 3

__all__ = ["ToolError", "call_tool", "search_tools", "search_tools_page", "get_tool", "sandbox_info"]


class ToolError(Exception):
    """A tool call failed: denied, unknown tool, upstream error, or the tool's isError."""

    def __init__(self, message, code=None, result=None):
        super().__init__(message)
        self.code = code
        self.result = result


RUN_METHOD = "codebox/run"


class _Channel:
    def __init__(self):
        self._lock = threading.Lock()
        # Read from fd 3 and not taken yet; _buf[:_scanned] holds no newline.
        self._buf = bytearray()
        self._scanned = 0
        self._next_id = 1
        self._closed = None
        # codebox/run notifications read while a tool call waited (session mode).
        self._controls = []

    def adopt(self, data):
        """Takes bytes boot.py read past the boot frame: they come before anything unread."""
        with self._lock:
            self._buf[:0] = data
            self._scanned = 0

    def notify(self, method, params):
        """Sends a JSON-RPC notification (no id, no response)."""
        line = json.dumps({"jsonrpc": "2.0", "method": method, "params": params})
        with self._lock:
            self._write(line.encode() + b"\n")

    def next_control(self):
        """Waits for the next `codebox/run` notification and returns it (a dict); None at
        EOF on fd 3. Every other line is skipped: responses to calls nobody waits for any
        more, other notifications, lines that are not JSON."""
        with self._lock:
            while True:
                if self._controls:
                    return self._controls.pop(0)
                line = self._read_line()
                if line is None:
                    return None
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if _is_run(msg):
                    return msg

    def request(self, method, params):
        with self._lock:
            if self._closed:
                raise ToolError(self._closed)
            id_ = self._next_id
            self._next_id += 1
            line = json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params})
            self._write(line.encode() + b"\n")
            while True:
                msg = self._read_message()
                if msg.get("id") == id_:
                    break
                if _is_run(msg):
                    self._controls.append(msg)
        error = msg.get("error")
        if error:
            raise ToolError(error.get("message", "tool call failed"), code=error.get("code"))
        return msg.get("result")

    def _write(self, data):
        view = memoryview(data)
        while view:
            try:
                view = view[write(CHANNEL_FD, view):]
            except OSError as e:
                self._closed = "codebox: the tool channel (fd 3) is closed (%s)" % e.strerror
                raise ToolError(self._closed) from None

    def _read_line(self):
        """The next line without its newline; None at EOF (the channel is then closed).

        Appends to one bytearray and searches only the bytes not searched yet, so a line
        of n bytes costs O(n) however many reads it takes."""
        while True:
            end = self._buf.find(b"\n", self._scanned)
            if end >= 0:
                break
            self._scanned = len(self._buf)
            chunk = read(CHANNEL_FD, 1 << 20)
            if not chunk:
                self._closed = "codebox: the tool channel (fd 3) closed"
                return None
            self._buf += chunk
        with memoryview(self._buf) as view:  # one copy, not a slice and then bytes()
            line = bytes(view[:end])
        if end + 1 == len(self._buf):
            self._buf = bytearray()  # gives a large buffer back
        else:
            del self._buf[: end + 1]
        self._scanned = 0
        return line

    def _read_message(self):
        line = self._read_line()
        if line is None:
            raise ToolError(self._closed)
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            self._closed = "codebox: malformed message on the tool channel"
            raise ToolError(self._closed)
        return msg


def _is_run(msg):
    return isinstance(msg, dict) and msg.get("method") == RUN_METHOD and "id" not in msg


_channel = _Channel()


def _unwrap(name, result):
    """What a tool result means to code: structuredContent when present; else the text
    (parsed as JSON when it is JSON; several text blocks become a list); other content
    (images, resources) as the content list. isError raises ToolError."""
    content = result.get("content") or []
    texts = [c.get("text", "") for c in content if c.get("type") == "text"]
    if result.get("isError"):
        raise ToolError("%s: %s" % (name, "\n".join(texts) or "the tool reported an error"), result=result)
    if result.get("structuredContent") is not None:
        return result["structuredContent"]
    if len(texts) != len(content):
        return content
    values = []
    for t in texts:
        try:
            values.append(json.loads(t))
        except ValueError:
            values.append(t)
    return values[0] if len(values) == 1 else values


def call_tool(name, args=None):
    """Call an upstream tool by its catalog name (`<server>__<tool>`) with a dict of
    arguments; returns its structured result, parsed JSON text, or text."""
    result = _channel.request("tools/call", {"name": name, "arguments": args or {}})
    return _unwrap(name, result)


def search_tools(query, detail="summary", server=None, limit=None):
    """Find upstream tools by what they do, best match first (BM25 over names,
    descriptions and parameters). detail: "name", "summary" (description and TypeScript
    signature) or "full" (schemas and Python signature). server: only that server's tools.
    Returns the first page; see search_tools_page for more."""
    return search_tools_page(query, detail=detail, server=server, limit=limit)["tools"]


def search_tools_page(query, detail="summary", server=None, limit=None, cursor=None):
    """One page of search results: {"tools": [...], "next_cursor": str | None, "total": int}.
    Pass next_cursor back as cursor for the next page."""
    params = {"query": query, "detail": detail}
    for key, value in (("server", server), ("limit", limit), ("cursor", cursor)):
        if value is not None:
            params[key] = value
    return _channel.request("tools/search", params)


def get_tool(name):
    """One tool's full definition: description, input and output schema, TypeScript and
    Python signatures, and an example call."""
    return _channel.request("tools/get", {"name": name})


def sandbox_info():
    """Basic facts about the sandbox this code runs in."""
    import os
    import socket

    return {"hostname": socket.gethostname(), "uid": os.getuid(), "pid": os.getpid()}
