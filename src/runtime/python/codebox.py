"""The codebox module inside the sandbox: call the tools of upstream MCP servers.

    import codebox
    text = codebox.call_tool("filesystem__read_text_file", {"path": "/data/a.txt"})["content"]
    texts = await asyncio.gather(*(codebox.call_tool_async(n, a) for n, a in calls))
    for t in codebox.search_tools("read file", detail="summary"):
        print(t["name"], t.get("description"))

codebox's own capabilities, for the client running this code (not upstream tools, so
`allowed_tools` does not limit them):

    codebox.save_skill("slugify", code, "URL slugs")   # then: from skills import slugify
    codebox.list_skills()
    codebox.health()

The generated package `servers` wraps every tool in a typed function
(`from servers.filesystem import read_text_file`); both go through `call_tool`.

What a call returns is the tool's value (see `_unwrap`): its structuredContent, else its
text parsed as JSON, else the text. That value is a `ToolResult`, a subclass of the
builtin type it is (`ToolDict` of dict, `ToolList`, `ToolText` of str, `ToolInt`,
`ToolFloat`), so it behaves as before and also carries the call's MCP result: `.text`
(the text content), `.content` (the content blocks), `.structured` (structuredContent)
and `.result` (the whole CallToolResult as a dict). `True`, `False` and `None` cannot
be subclassed and come back plain; `call_tool_result` gives any call's whole result.

Protocol (src/proxy/mod.rs): after the boot frame, fd 3 carries newline-delimited
JSON-RPC 2.0; this module sends requests and reads their responses, matched by id, so
calls from several threads (or `asyncio.gather` over `call_tool_async`) run at once; the
proxy bounds how many run together.

In a keep-alive session (src/runtime/boot.rs) boot.py also reads the next run's
`codebox/run` notification through this channel and sends `codebox/done`, so the tool
calls and the session share one read buffer.
"""

import json
import threading
from posix import read, write

CHANNEL_FD = 3

__all__ = [
    "ToolError",
    "ToolResult",
    "ToolDict",
    "ToolList",
    "ToolText",
    "ToolInt",
    "ToolFloat",
    "call_tool",
    "call_tool_result",
    "call_tool_async",
    "search_tools",
    "search_tools_async",
    "search_tools_page",
    "get_tool",
    "save_skill",
    "list_skills",
    "health",
    "sandbox_info",
    "to_thread",
]


class ToolError(Exception):
    """A tool call failed: denied, unknown tool, upstream error, or the tool's isError."""

    def __init__(self, message, code=None, result=None):
        super().__init__(message)
        self.code = code
        self.result = result


RUN_METHOD = "codebox/run"


class _Channel:
    """Requests multiplexed by id: any number of threads may wait for their answers at
    once. No thread of its own: a waiting caller whose answer has not come takes the
    reader's turn when nobody holds it, reads one line, hands it to whoever it is for,
    and lets the others look again. Writes go whole, under their own lock, never while
    holding the state's (a write can block while the supervisor's answer queue is full,
    which only a reader drains)."""

    def __init__(self):
        # Guards everything below but the read buffer, which only the reader touches.
        self._state = threading.Condition(threading.Lock())
        self._wlock = threading.Lock()
        # Read from fd 3 and not taken yet; _buf[:_scanned] holds no newline.
        self._buf = bytearray()
        self._scanned = 0
        self._reading = False
        self._next_id = 1
        self._closed = None
        # id -> the response, None until it came.
        self._answers = {}
        # codebox/run notifications not yet taken (session mode).
        self._controls = []

    def adopt(self, data):
        """Takes bytes boot.py read past the boot frame: they come before anything unread."""
        with self._state:
            self._buf[:0] = data
            self._scanned = 0

    def notify(self, method, params):
        """Sends a JSON-RPC notification (no id, no response)."""
        line = json.dumps({"jsonrpc": "2.0", "method": method, "params": params})
        self._write(line.encode() + b"\n")

    def next_control(self):
        """Waits for the next `codebox/run` notification and returns it (a dict); None at
        EOF on fd 3. Lines for nobody are skipped: responses to calls nobody waits for any
        more, other notifications, lines that are not JSON."""
        with self._state:
            while True:
                if self._controls:
                    return self._controls.pop(0)
                if self._closed:
                    return None
                self._read_turn()

    def request(self, method, params):
        with self._state:
            if self._closed:
                raise ToolError(self._closed)
            id_ = self._next_id
            self._next_id += 1
            self._answers[id_] = None
        line = json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params})
        try:
            self._write(line.encode() + b"\n")
        except ToolError:
            with self._state:
                self._answers.pop(id_, None)
            raise
        with self._state:
            while self._answers.get(id_) is None:
                if self._closed:
                    self._answers.pop(id_, None)
                    raise ToolError(self._closed)
                self._read_turn()
            msg = self._answers.pop(id_)
        error = msg.get("error")
        if error:
            raise ToolError(error.get("message", "tool call failed"), code=error.get("code"))
        return msg.get("result")

    def _read_turn(self):
        """With the state held: reads and hands out one line if no other thread is reading,
        else waits until something changed."""
        if self._reading:
            self._state.wait()
            return
        self._reading = True
        self._state.release()
        try:
            line = self._read_line()
        except OSError as e:
            line = None
            self._closed = "codebox: reading the tool channel (fd 3) failed (%s)" % e.strerror
        finally:
            self._state.acquire()
            self._reading = False
            self._state.notify_all()
        self._deliver(line)

    def _deliver(self, line):
        """With the state held: gives one line to whoever waits for it."""
        if line is None:
            self._closed = self._closed or "codebox: the tool channel (fd 3) closed"
            return
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            if any(v is None for v in self._answers.values()):
                self._closed = "codebox: malformed message on the tool channel"
            return
        if _is_run(msg):
            self._controls.append(msg)
            return
        id_ = msg.get("id")
        if isinstance(id_, int) and id_ in self._answers and self._answers[id_] is None:
            self._answers[id_] = msg

    def _write(self, data):
        with self._wlock:
            view = memoryview(data)
            while view:
                try:
                    view = view[write(CHANNEL_FD, view):]
                except OSError as e:
                    with self._state:
                        self._closed = "codebox: the tool channel (fd 3) is closed (%s)" % e.strerror
                        self._state.notify_all()
                    raise ToolError(self._closed) from None

    def _read_line(self):
        """The next line without its newline; None at EOF. Only the reader calls it.

        Appends to one bytearray and searches only the bytes not searched yet, so a line
        of n bytes costs O(n) however many reads it takes."""
        while True:
            end = self._buf.find(b"\n", self._scanned)
            if end >= 0:
                break
            self._scanned = len(self._buf)
            chunk = read(CHANNEL_FD, 1 << 20)
            if not chunk:
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


def _is_run(msg):
    return isinstance(msg, dict) and msg.get("method") == RUN_METHOD and "id" not in msg


_channel = _Channel()


class ToolResult:
    """What a tool call's value carries besides itself: the call's MCP result.

    The values `call_tool` and the `servers.*` functions return are instances of a
    subclass of this and of the builtin type they are (`ToolDict(dict)`, `ToolList(list)`,
    `ToolText(str)`, `ToolInt(int)`, `ToolFloat(float)`): they compare, print, index and
    serialise as that type, and also have

        .text        the text content, its blocks joined by newlines ("" without any)
        .content     the content blocks (dicts with "type", "text", "data", ...)
        .structured  the structuredContent (None without one)
        .result      the whole CallToolResult as a dict

    so `read_text_file("/a.txt")["content"]` is the structured field and
    `read_text_file("/a.txt").text` the text it came with."""

    @property
    def result(self):
        return self.__dict__["_result"]

    @property
    def content(self):
        return self.__dict__["_result"].get("content") or []

    @property
    def text(self):
        return "\n".join(
            c.get("text", "") for c in self.content if isinstance(c, dict) and c.get("type") == "text"
        )

    @property
    def structured(self):
        return self.__dict__["_result"].get("structuredContent")


class ToolDict(ToolResult, dict):
    """A tool's value that is a JSON object (see ToolResult)."""


class ToolList(ToolResult, list):
    """A tool's value that is a JSON array, or several text blocks, or content that is
    not all text (see ToolResult)."""


class ToolText(ToolResult, str):
    """A tool's value that is text (see ToolResult)."""


class ToolInt(ToolResult, int):
    """A tool's value that is a whole number (see ToolResult)."""


class ToolFloat(ToolResult, float):
    """A tool's value that is a number (see ToolResult)."""


# bool is an int: it is looked up first and stays plain (it cannot be subclassed).
_RESULT_TYPES = ((bool, None), (dict, ToolDict), (list, ToolList), (str, ToolText), (int, ToolInt), (float, ToolFloat))


def _carrying(value, result):
    """`value` as the ToolResult subclass of its type, carrying `result`; True, False
    and None as they are."""
    for base, kind in _RESULT_TYPES:
        if isinstance(value, base):
            if kind is None:
                return value
            out = kind(value)
            out.__dict__["_result"] = result
            return out
    return value


def _unwrap(name, result):
    """What a tool result means to code: structuredContent when present; else the text
    (parsed as JSON when it is JSON; several text blocks become a list); other content
    (images, resources) as the content list. isError raises ToolError.

    A structuredContent is returned as it is, also when it only mirrors the text, as
    server-filesystem's `{"content": "<the text>"}` does: it is what the tool's
    outputSchema declares and what the TypeScript types and the search_tools signatures
    promise, and code written against it (`["content"]`) keeps working. `.text` has the
    text either way (see ToolResult)."""
    content = result.get("content") or []
    texts = [c.get("text", "") for c in content if c.get("type") == "text"]
    if result.get("isError"):
        raise ToolError("%s: %s" % (name, "\n".join(texts) or "the tool reported an error"), result=result)
    if result.get("structuredContent") is not None:
        return _carrying(result["structuredContent"], result)
    if len(texts) != len(content):
        return _carrying(content, result)
    values = []
    for t in texts:
        try:
            values.append(json.loads(t))
        except ValueError:
            values.append(t)
    return _carrying(values[0] if len(values) == 1 else values, result)


def call_tool(name, args=None):
    """Call an upstream tool by its catalog name (`<server>__<tool>`) with a dict of
    arguments; returns its structured result, parsed JSON text, or text, as a
    ToolResult (`.text`, `.content`, `.structured`, `.result`). Raises ToolError when the
    call fails or the tool reports isError."""
    result = _channel.request("tools/call", {"name": name, "arguments": args or {}})
    return _unwrap(name, result)


def call_tool_result(name, args=None):
    """Call an upstream tool by its catalog name and return its whole MCP result as a
    dict ("content", "structuredContent", "isError", ...) without reading it: a result
    with isError is returned, not raised. Raises ToolError when the call fails (denied,
    unknown tool, the server unreachable)."""
    return _channel.request("tools/call", {"name": name, "arguments": args or {}})


_executor = None
_executor_lock = threading.Lock()


async def to_thread(function, /, *args, **kwargs):
    """Runs a blocking call (a tool call, a generated `servers.*` function) on one of
    codebox's worker threads, so `asyncio.gather` runs several at once (up to 32 here;
    the supervisor bounds how many tool calls run together)."""
    import asyncio
    import functools

    global _executor
    with _executor_lock:
        if _executor is None:
            from concurrent.futures import ThreadPoolExecutor

            _executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="codebox-call")
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor, functools.partial(function, *args, **kwargs))


async def call_tool_async(name, args=None):
    """`call_tool` as a coroutine: `await asyncio.gather(call_tool_async(a), ...)`."""
    return await to_thread(call_tool, name, args)


async def search_tools_async(query, detail="summary", server=None, limit=None):
    """`search_tools` as a coroutine."""
    return await to_thread(search_tools, query, detail=detail, server=server, limit=limit)


def search_tools(query, detail="summary", server=None, limit=None):
    """Find upstream tools by what they do, best match first (BM25 over names,
    descriptions and parameters). detail: "name", "summary" (description, TypeScript
    and Python signatures) or "full" (schemas, TypeScript declarations). server: only
    that server's tools.
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


def save_skill(name, code, description, language="python", usage=None):
    """Save `code` as a skill of the client running this program, as the save_skill tool
    does (name and size checks, a syntax check, an audit record); later programs import
    it (`from skills import <name>`, "/skills/<name>/skill.ts"). Returns {"name",
    "language", "import"}; raises ToolError when it is not saved."""
    params = {"name": name, "code": code, "description": description, "language": language}
    if usage is not None:
        params["usage"] = usage
    return _channel.request("codebox/save_skill", params)


def list_skills(query=None):
    """Your skills and the shared ones (name, description, language, origin), optionally
    those matching every word of `query`."""
    return _channel.request("codebox/list_skills", {} if query is None else {"query": query})["skills"]


def health():
    """What codebox's health tool shows: version, isolation layers, load, limits,
    network policy, upstream servers."""
    return _channel.request("codebox/health", {})


def sandbox_info():
    """Basic facts about the sandbox this code runs in."""
    import os
    import socket

    return {"hostname": socket.gethostname(), "uid": os.getuid(), "pid": os.getpid()}
