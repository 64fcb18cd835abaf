// codebox boot for Deno: receive the program on fd 3 and run it as a TypeScript module.
//
// Protocol: the header "CODE <n>\n" then n bytes of UTF-8 source (see src/runtime/mod.rs).
// Deno has no API for an inherited descriptor, so fd 3 is read through libc over FFI. The
// program is written to the sandbox's private /tmp and imported, so its own imports of
// absolute paths (e.g. "/workspace/lib.ts") resolve normally.

const CHANNEL_FD = 3;
const MAIN_PATH = "/tmp/.codebox/main.ts";

const libc = Deno.dlopen("libc.so.6", {
  read: { parameters: ["i32", "buffer", "usize"], result: "isize" },
});

function readInto(buf) {
  for (let attempt = 0; attempt < 100; attempt++) {
    const n = Number(libc.symbols.read(CHANNEL_FD, buf, BigInt(buf.length)));
    if (n >= 0) return n;
  }
  throw new Error("codebox: reading fd 3 failed");
}

function receive() {
  const chunks = [];
  let total = 0;
  let headerEnd = -1;
  let all = new Uint8Array(0);
  while (headerEnd < 0) {
    const buf = new Uint8Array(65536);
    const n = readInto(buf);
    if (n === 0) throw new Error("codebox: no program received on fd 3");
    const next = new Uint8Array(all.length + n);
    next.set(all);
    next.set(buf.subarray(0, n), all.length);
    all = next;
    headerEnd = all.indexOf(10);
  }
  const header = new TextDecoder().decode(all.subarray(0, headerEnd));
  const match = /^CODE (\d+)$/.exec(header);
  if (!match) throw new Error(`codebox: bad boot header ${JSON.stringify(header.slice(0, 64))}`);
  const size = Number(match[1]);
  const first = all.subarray(headerEnd + 1);
  chunks.push(first);
  total = first.length;
  while (total < size) {
    const buf = new Uint8Array(Math.min(1 << 20, size - total));
    const n = readInto(buf);
    if (n === 0) throw new Error("codebox: program cut short on fd 3");
    chunks.push(buf.subarray(0, n));
    total += n;
  }
  const code = new Uint8Array(size);
  let off = 0;
  for (const c of chunks) {
    const take = Math.min(c.length, size - off);
    code.set(c.subarray(0, take), off);
    off += take;
  }
  return code;
}

const code = receive();
Deno.mkdirSync("/tmp/.codebox", { recursive: true });
Deno.writeFileSync(MAIN_PATH, code);
await import("file://" + MAIN_PATH);
