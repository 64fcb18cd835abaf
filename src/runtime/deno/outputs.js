// Output files for Deno: what the program left under /workspace/out (and the workspace
// files the call named in `outputs`), sent to the supervisor on fd 3 at the end of a run.
//
// Protocol (src/runtime/boot.rs, OUTPUTS record; the same as _codebox_outputs.py): per
// file, `codebox/file {path, offset, base64}` lines of at most CHUNK bytes each (an empty
// file is one line at offset 0), then one `codebox/files {skipped: [{path, why}],
// omitted}`. The supervisor checks everything again.
//
// Nothing is followed: entries are looked at with lstat, a symlink is reported as
// skipped, and a file is read only if the descriptor opened is the regular file lstat
// saw (same device and inode), so a file swapped for a symlink in between is refused.

import { notify } from "./client.ts";

const CHUNK = 1 << 20;
const OUT_DIR = "out";
const MAX_ENTRIES = 10_000;
const MAX_DEPTH = 16;
const MAX_SKIPPED = 100;

function walkOut(state, rel, depth) {
  let entries;
  try {
    entries = [...Deno.readDirSync(`/workspace/${rel}`)].map((e) => e.name).sort();
  } catch (e) {
    state.skip(rel, `cannot be listed: ${why(e)}`);
    return;
  }
  for (const name of entries) {
    if (++state.entries > MAX_ENTRIES) {
      state.omitted++;
      continue;
    }
    const path = `${rel}/${name}`;
    let info;
    try {
      info = Deno.lstatSync(`/workspace/${path}`);
    } catch (e) {
      state.skip(path, `cannot be looked at: ${why(e)}`);
      continue;
    }
    if (info.isSymlink) state.skip(path, "a symlink (never followed)");
    else if (info.isDirectory) {
      if (depth >= MAX_DEPTH) state.skip(path, `deeper than ${MAX_DEPTH} directories`);
      else walkOut(state, path, depth + 1);
    } else if (info.isFile) state.found.push(path);
    else state.skip(path, "not a regular file");
  }
}

// An error in words without the path (Deno's messages repeat it, and a path may hold
// what must not leave untokenized: the supervisor tokenizes the path it is given).
function why(e) {
  if (e instanceof Deno.errors.NotFound) return "no such file";
  if (e instanceof Deno.errors.PermissionDenied) return "permission denied";
  return e?.code ?? e?.name ?? "unreadable";
}

// The bytes of the regular file at `path` (relative to /workspace) as it is now, or a
// reason it is not sent. No directory on the way may be a symlink either.
function readRegular(path, budget) {
  const parts = path.split("/");
  for (let i = 1; i < parts.length; i++) {
    try {
      if (Deno.lstatSync(`/workspace/${parts.slice(0, i).join("/")}`).isSymlink) {
        return { why: "a symlink on its way (never followed)" };
      }
    } catch (e) {
      return { why: why(e) };
    }
  }
  let before;
  try {
    before = Deno.lstatSync(`/workspace/${path}`);
  } catch (e) {
    return { why: why(e) };
  }
  if (before.isSymlink) return { why: "a symlink (never followed)" };
  if (!before.isFile) return { why: "not a regular file" };
  if (before.size > budget) {
    return { why: `${before.size} bytes: over what is left of the output files' bytes` };
  }
  let file;
  try {
    file = Deno.openSync(`/workspace/${path}`, { read: true });
  } catch (e) {
    return { why: why(e) };
  }
  try {
    const now = file.statSync();
    if (!now.isFile || now.ino !== before.ino || now.dev !== before.dev) {
      return { why: "it changed while being read (a symlink is never followed)" };
    }
    const size = Math.min(now.size, before.size);
    const bytes = new Uint8Array(size);
    let got = 0;
    while (got < size) {
      const n = file.readSync(bytes.subarray(got));
      if (n === null || n === 0) break;
      got += n;
    }
    return { bytes: bytes.subarray(0, got) };
  } finally {
    file.close();
  }
}

/**
 * Sends the output files. `spec`: the OUTPUTS record ({max_files, max_bytes, paths});
 * `seen`: in a session, what the last run returned, so that only files under
 * /workspace/out that are new or changed since go (named paths always); `paths`: the
 * workspace files the call named (null: the record's). Returns what to pass as `seen`
 * next time (each file's inode, size and times).
 */
export function sendOutputs(spec, { seen = null, paths = null } = {}) {
  const marks = new Map();
  const maxFiles = Number(spec.max_files) || 0;
  let budget = Number(spec.max_bytes) || 0;
  const state = {
    found: [],
    skipped: [],
    omitted: 0,
    entries: 0,
    skip(path, why) {
      if (this.skipped.length < MAX_SKIPPED) this.skipped.push({ path, why });
      else this.omitted++;
    },
  };
  let out = null;
  try {
    out = Deno.lstatSync(`/workspace/${OUT_DIR}`);
  } catch {
    // no /workspace/out
  }
  if (out?.isSymlink || (out && !out.isDirectory)) {
    state.skip(OUT_DIR, "not a directory (a symlink is never followed)");
  } else if (out) walkOut(state, OUT_DIR, 1);
  const named = (paths ?? spec.paths ?? []).filter((p) => typeof p === "string");
  const wanted = [...new Set([...named, ...state.found])];
  let sent = 0;
  for (const path of wanted) {
    if (!named.includes(path)) {
      let mark = null;
      try {
        const i = Deno.lstatSync(`/workspace/${path}`);
        mark = `${i.ino} ${i.size} ${i.mtime?.getTime()} ${i.ctime?.getTime()}`;
      } catch {
        // gone: readRegular says so
      }
      marks.set(path, mark);
      if (mark !== null && seen?.get(path) === mark) continue;
    }
    if (sent >= maxFiles) {
      state.omitted++;
      continue;
    }
    const read = readRegular(path, budget);
    if (read.why) {
      state.skip(path, read.why);
      continue;
    }
    for (let offset = 0; offset === 0 || offset < read.bytes.length; offset += CHUNK) {
      const chunk = read.bytes.subarray(offset, offset + CHUNK);
      notify("codebox/file", { path, offset, base64: chunk.toBase64() });
    }
    budget -= read.bytes.length;
    sent++;
  }
  if (state.skipped.length > 0 || state.omitted > 0) {
    notify("codebox/files", { skipped: state.skipped, omitted: state.omitted });
  }
  return marks;
}
