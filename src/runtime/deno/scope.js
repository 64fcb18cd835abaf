// Module-scope persistence for keep-alive TypeScript sessions (see boot.js).
//
// Each run of a session is its own ES module, and a module's top-level declarations die
// with it. So before a run is written out, `rewriteRun` finds the names the run declares
// at module scope and wraps the code:
//
//   line 1:  globalThis.__codebox_capture = __codebox_capture_<n>;
//            let { a, b } = globalThis.__codebox_scope; <the user's line 1>
//   ...      the user's code, unchanged, so line N stays line N
//   after:   function __codebox_capture_<n>() { ... return the values of every name ... }
//            import * as __codebox_ns_<n>_<k> from "<each import's specifier>";
//
// `a, b` are the names earlier runs left that this run does not declare itself. After the
// run boot.js calls the registered capture function and merges its result into
// `globalThis.__codebox_scope`. Imported names are read through a namespace import of the
// same module (`"x" in ns`), never by name: the TypeScript emit drops imports it thinks
// are only types, and naming a type-only import as a value would fail to link.
//
// The scanner is a lexer (strings, template literals with nested `${}`, comments, regex
// literals by the usual previous-token heuristic) plus a small parser for declarations at
// brace/paren/bracket depth 0: const/let/var (destructuring patterns, several
// declarators), using, [async] function[*], [abstract] class, enum, namespace, import,
// `export` forms of these; and `var` at any depth outside functions (it is module-scoped).
// Type-only forms (type, interface, declare, import type) declare no value.
//
// Plain JavaScript with no imports, so that `deno test` can run it as it is.

function words(text) {
  return text.split(" ");
}

const REGEX_AFTER_KEYWORDS = new Set(words(
  "return typeof instanceof in of new delete void throw case do else yield await " +
    "default extends",
));

// Identifiers that, at the end of a line, do not end an expression (no ASI after them).
const CONTINUING_KEYWORDS = new Set(words(
  "typeof instanceof in of new delete await yield return throw case extends do else " +
    "export import default let const var as satisfies keyof is",
));

// Identifiers that can continue an expression from the start of a line.
const OPERATOR_KEYWORDS = new Set(["in", "instanceof", "as", "satisfies", "of"]);

const CONTROL_KEYWORDS = new Set(["if", "for", "while", "switch", "catch", "with"]);

// Names that cannot be bound by a declaration in module code (or that we will not shadow).
const RESERVED = new Set(words(
  "break case catch class const continue debugger default delete do else enum export " +
    "extends false finally for function if import in instanceof new null return super " +
    "switch this throw true try typeof var void while with yield let static implements " +
    "interface package private protected public await arguments eval undefined NaN " +
    "Infinity globalThis",
));

const PUNCTUATORS = words(
  ">>>= ... === !== **= <<= >>= >>> &&= ||= ??= => == != <= >= && || ?? ?. ++ -- += -= " +
    "*= /= %= &= |= ^= ** << >>",
);

const OPERATOR_START = new Set(PUNCTUATORS.map((p) => p[0]));

const ID_START = /[\p{ID_Start}$_]/u;
const ID_CONTINUE = /[\p{ID_Continue}$\u200c\u200d]/u;
const NAME = /^[\p{ID_Start}$_][\p{ID_Continue}$\u200c\u200d]*$/u;
const NUMBER =
  /(?:0[xXoObB][0-9a-fA-F_]+|\d[\d_]*\.?[\d_]*(?:[eE][+-]?\d[\d_]*)?|\.\d[\d_]*(?:[eE][+-]?\d[\d_]*)?)n?/y;

function isLineTerminator(c) {
  return c === "\n" || c === "\r" || c === "\u2028" || c === "\u2029";
}

/** Whether `name` can be declared (and so persisted) by a module-scope binding. */
export function isBindableName(name) {
  return typeof name === "string" && NAME.test(name) && !RESERVED.has(name) &&
    !name.startsWith("__codebox_");
}

/**
 * Splits `source` into tokens: { t, v, s, e, d, nl, fn }. t is "id", "num", "str", "tpl"
 * (a whole template or its tail), "tplhead" (up to a `${`, opens), "re", "p"
 * (punctuator), "open" or "close" ("{", "(", "[" and their closers; v is the character).
 * d is the bracket depth (an opener and its closer have the depth outside them), nl
 * whether a line break precedes the token, fn whether it lies inside a function body.
 */
export function tokenize(source) {
  const toks = [];
  // Open brackets: { ch, tok: index of the opener, fn: a function body or class body }.
  const stack = [];
  let i = 0;
  let nl = false;
  let prev = null;
  const n = source.length;
  // The depth at which `(params): ReturnType` left a return type open: the next `{` at
  // that depth is taken as the function's body.
  let returnTypeAt = -1;
  if (source.startsWith("#!")) {
    while (i < n && !isLineTerminator(source[i])) i++;
  }
  const inFn = () => stack.some((b) => b.fn);

  const push = (t, v, s, e) => {
    const tok = { t, v, s, e, d: stack.length, nl, fn: inFn() };
    toks.push(tok);
    prev = tok;
    nl = false;
    return tok;
  };

  const regexAllowed = () => {
    if (!prev) return true;
    switch (prev.t) {
      case "id":
        return REGEX_AFTER_KEYWORDS.has(prev.v);
      case "num":
      case "str":
      case "tpl":
      case "re":
        return false;
      case "close": {
        if (prev.v === "}") return true;
        // `if (x) /re/.test(s)`: after the condition of a statement a regex may start
        const before = prev.v === ")" && prev.opener !== undefined ? toks[prev.opener - 1] : null;
        return !!before && before.t === "id" && CONTROL_KEYWORDS.has(before.v) &&
          before.v !== "catch";
      }
      case "p":
        return prev.v !== "++" && prev.v !== "--";
      default:
        return true;
    }
  };

  // Scans template characters from `i` (just after "`" or a substitution's "}"): returns
  // [end index, whether it stopped at "${" rather than the closing backquote].
  const scanTemplate = (from) => {
    let j = from;
    while (j < n) {
      const c = source[j];
      if (c === "\\") {
        j += 2;
      } else if (c === "`") {
        return [j + 1, false];
      } else if (c === "$" && source[j + 1] === "{") {
        return [j + 2, true];
      } else {
        j++;
      }
    }
    return [n, false];
  };

  // Whether the `{` about to open is a function body (or a class body, namespace body,
  // class static block): a `var` inside it is not module-scoped.
  const opensFunction = () => {
    if (!prev) return false;
    if (prev.t === "p" && prev.v === "=>") return true;
    if (prev.t === "id" && prev.v === "static") return true;
    if (returnTypeAt === stack.length) return true;
    if (prev.t === "close" && prev.v === ")") {
      const before = prev.opener === undefined ? undefined : toks[prev.opener - 1];
      if (!before) return false;
      if (before.t === "id" && CONTROL_KEYWORDS.has(before.v)) return false;
      if (before.t === "id" && before.v === "await") {
        const b2 = toks[prev.opener - 2];
        if (b2 && b2.t === "id" && b2.v === "for") return false;
      }
      return true;
    }
    // class X [extends Y] {, namespace A.B {, declare module "m" {, declare global {
    for (let k = toks.length - 1; k >= Math.max(0, toks.length - 16); k--) {
      const t = toks[k];
      if (!(t.t === "id" || t.t === "str" || (t.t === "p" && t.v === "."))) break;
      if (t.t === "id" && ["class", "namespace", "module", "declare"].includes(t.v)) return true;
    }
    return false;
  };

  while (i < n) {
    const c = source[i];
    // whitespace
    if (isLineTerminator(c)) {
      nl = true;
      i++;
      continue;
    }
    if (
      c === " " || c === "\t" || c === "\v" || c === "\f" || c === "\ufeff" || c === "\u00a0" ||
      (c > "\u007f" && /\s/.test(c))
    ) {
      i++;
      continue;
    }
    // comments
    if (c === "/" && source[i + 1] === "/") {
      i += 2;
      while (i < n && !isLineTerminator(source[i])) i++;
      continue;
    }
    if (c === "/" && source[i + 1] === "*") {
      const end = source.indexOf("*/", i + 2);
      const stop = end < 0 ? n : end + 2;
      for (let k = i; k < stop; k++) if (isLineTerminator(source[k])) nl = true;
      i = stop;
      continue;
    }
    const start = i;
    // strings
    if (c === "'" || c === '"') {
      i++;
      while (i < n && source[i] !== c) i += source[i] === "\\" ? 2 : 1;
      i = Math.min(i + 1, n);
      push("str", source.slice(start, i), start, i);
      continue;
    }
    // templates
    if (c === "`") {
      const [end, opens] = scanTemplate(i + 1);
      if (opens) {
        push("tplhead", "`", start, end);
        stack.push({ ch: "${", tok: toks.length - 1, fn: false });
      } else {
        push("tpl", "`", start, end);
      }
      i = end;
      continue;
    }
    // regular expressions
    if (c === "/" && regexAllowed()) {
      let j = i + 1;
      let inClass = false;
      let ok = false;
      while (j < n && !isLineTerminator(source[j])) {
        const ch = source[j];
        if (ch === "\\") {
          j += 2;
          continue;
        }
        if (ch === "[") inClass = true;
        else if (ch === "]") inClass = false;
        else if (ch === "/" && !inClass) {
          ok = true;
          break;
        }
        j++;
      }
      if (ok) {
        j++;
        while (j < n && ID_CONTINUE.test(source[j])) j++;
        push("re", source.slice(start, j), start, j);
        i = j;
        continue;
      }
      // not a regex after all: fall through to the punctuator
    }
    // numbers
    if ((c >= "0" && c <= "9") || (c === "." && source[i + 1] >= "0" && source[i + 1] <= "9")) {
      NUMBER.lastIndex = i;
      const m = NUMBER.exec(source);
      i += m ? Math.max(m[0].length, 1) : 1;
      while (i < n && ID_CONTINUE.test(source[i])) i++; // malformed tails stay in the number
      push("num", source.slice(start, i), start, i);
      continue;
    }
    // identifiers (including #private names and \u escapes)
    const cp = source.codePointAt(i);
    const ch = String.fromCodePoint(cp);
    if (
      ID_START.test(ch) || c === "\\" || (c === "#" && i + 1 < n && ID_START.test(source[i + 1]))
    ) {
      i += ch.length;
      while (i < n) {
        if (source[i] === "\\") {
          i += source[i + 1] === "u" && source[i + 2] === "{" ? source.indexOf("}", i) + 1 || n : 6;
          continue;
        }
        const next = String.fromCodePoint(source.codePointAt(i));
        if (!ID_CONTINUE.test(next)) break;
        i += next.length;
      }
      push("id", source.slice(start, i), start, i);
      continue;
    }
    // brackets
    if (c === "{" || c === "(" || c === "[") {
      const fn = c === "{" ? opensFunction() : false;
      if (c === "{" && returnTypeAt === stack.length) returnTypeAt = -1;
      push("open", c, start, i + 1); // the opener itself is outside: d and fn from before
      stack.push({ ch: c, tok: toks.length - 1, fn });
      i++;
      continue;
    }
    if (c === "}" && stack.length && stack[stack.length - 1].ch === "${") {
      // the end of a template substitution: the template goes on
      const [end, opens] = scanTemplate(i + 1);
      if (opens) {
        // a middle part: still inside the template, nothing to push or pop
        nl = false;
        i = end;
        continue;
      }
      const open = stack.pop();
      push("tpl", "`", start, end).opener = open.tok;
      i = end;
      continue;
    }
    if (c === "}" || c === ")" || c === "]") {
      const open = stack.length ? stack.pop() : null;
      if (returnTypeAt > stack.length) returnTypeAt = -1;
      const tok = push("close", c, start, i + 1);
      tok.opener = open ? open.tok : undefined;
      i++;
      continue;
    }
    // punctuators
    let p = c;
    if (OPERATOR_START.has(c)) {
      for (const candidate of PUNCTUATORS) {
        if (source.startsWith(candidate, i)) {
          p = candidate;
          break;
        }
      }
    }
    if (p === "?." && source[i + 2] >= "0" && source[i + 2] <= "9") p = "?";
    const before = prev;
    push("p", p, start, i + p.length);
    if (p === ":" && before && before.t === "close" && before.v === ")") {
      returnTypeAt = stack.length;
    } else if (returnTypeAt === stack.length && (p === ";" || p === "," || p === "=")) {
      returnTypeAt = -1;
    }
    i += p.length;
  }
  return toks;
}

// ---------------------------------------------------------------------------------------

// The value of a string literal token, or null when it has escapes (rare in import names).
function unquote(raw) {
  const body = raw.slice(1, -1);
  return body.includes("\\") ? null : body;
}

function isId(tok, v) {
  return tok !== undefined && tok.t === "id" && (v === undefined || tok.v === v);
}

function isP(tok, v) {
  return tok !== undefined && (tok.t === "p" || tok.t === "open" || tok.t === "close") &&
    tok.v === v;
}

// Whether `prev` can end an expression, so that a line break after it may end a statement.
export function endsExpression(prev) {
  switch (prev.t) {
    case "id":
      return !CONTINUING_KEYWORDS.has(prev.v);
    case "num":
    case "str":
    case "tpl":
    case "re":
    case "close":
      return true;
    case "p":
      return ["++", "--", ">", ">>", ">>>", "!"].includes(prev.v);
    default:
      return false;
  }
}

function isStatementStart(tok, prev) {
  if (!prev) return true;
  if (prev.t === "p" && prev.v === ";") return true;
  if (prev.t === "close" && prev.v === "}") return true;
  return tok.nl && endsExpression(prev);
}

/**
 * The module-scope value bindings `source` declares:
 * { names: [...] (let/const/var/using/function/class/enum/namespace/import-equals),
 *   imports: [{ local, imported ("default", a name, or "*"), specifier (source text of
 *   the string), attributes (source text of `with {...}` or "") }] }.
 */
export function scanDeclarations(source) {
  const toks = tokenize(source);
  const names = [];
  const imports = [];
  const add = (tok) => {
    if (tok && tok.t === "id" && isBindableName(tok.v)) names.push(tok.v);
  };
  const len = toks.length;

  // Skips to the first token at index >= k with depth `d` that is "," or a closer of
  // depth d - 1 (the end of the element list of the bracket opened at depth d - 1).
  const skipElement = (k, d) => {
    while (k < len) {
      const t = toks[k];
      if (t.d === d && isP(t, ",")) return k;
      if (t.d < d) return k;
      k++;
    }
    return k;
  };

  // A binding target at k: a name, or an object or array pattern. Adds its names;
  // returns the index after it, or -1 when there is none.
  const bindingTarget = (k) => {
    const t = toks[k];
    if (!t) return -1;
    if (t.t === "id") {
      if (RESERVED.has(t.v)) return -1;
      add(t);
      return k + 1;
    }
    if (isP(t, "{") || isP(t, "[")) {
      const inner = t.d + 1;
      const object = t.v === "{";
      k++;
      while (k < len && toks[k].d >= inner) {
        let u = toks[k];
        if (isP(u, ",")) {
          k++;
          continue;
        }
        if (isP(u, "...")) {
          const after = bindingTarget(k + 1);
          k = skipElement(after < 0 ? k + 1 : after, inner);
          continue;
        }
        if (object) {
          // key: name, string, number or [computed]
          const key = u;
          if (isP(u, "[")) {
            k++;
            while (k < len && toks[k].d > key.d) k++;
            k++; // the "]"
          } else {
            k++;
          }
          u = toks[k];
          if (isP(u, ":")) {
            const after = bindingTarget(k + 1);
            k = skipElement(after < 0 ? k + 1 : after, inner);
          } else {
            if (key.t === "id") add(key);
            k = skipElement(k, inner);
          }
        } else {
          const after = bindingTarget(k);
          k = skipElement(after < 0 ? k + 1 : after, inner);
        }
      }
      // k is at the closer
      return k + 1;
    }
    return -1;
  };

  // Whether k starts another declarator after a "," (`let a = 1, b` but not the comma
  // of type arguments in `new Map<string, number>()`).
  const declaratorStart = (k) => {
    const t = toks[k];
    if (!t) return false;
    if (isP(t, "{") || isP(t, "[")) return true;
    if (t.t !== "id") return false;
    const u = toks[k + 1];
    return u === undefined || u.nl || ["=", ",", ";", ":", "!"].some((v) => isP(u, v)) ||
      (u.t === "close" && u.d < t.d) || isId(u, "of") || isId(u, "in");
  };

  // Declarators after var/let/const/using at k; returns the index where scanning goes on.
  const declarators = (k) => {
    const base = toks[k - 1].d;
    for (;;) {
      const after = bindingTarget(k);
      if (after < 0) return k;
      k = after;
      let prev = toks[k - 1];
      let more = false;
      while (k < len) {
        const t = toks[k];
        if (t.d < base) return k; // the end of an enclosing bracket: for (var i ...)
        if (t.d === base) {
          if (isP(t, ";")) return k + 1;
          if (isP(t, ",") && declaratorStart(k + 1)) {
            k++;
            more = true;
            break;
          }
          if (
            base === 0 && t.t === "id" && !OPERATOR_KEYWORDS.has(t.v) && isStatementStart(t, prev)
          ) {
            return k;
          }
          if (base > 0 && (isId(t, "in") || isId(t, "of"))) return k;
          prev = t;
        }
        k++;
      }
      if (!more) return k;
    }
  };

  // import declaration at k ("import"); returns the index to go on from.
  const importDeclaration = (k) => {
    let j = k + 1;
    const t = toks[j];
    if (!t || isP(t, "(") || isP(t, ".")) return k + 1; // import(...), import.meta
    if (t.t === "str") return j + 1;
    if (isId(t, "type")) {
      const u = toks[j + 1];
      if (!(isId(u, "from") || isP(u, ",") || isP(u, "="))) return j + 1; // import type ...
    }
    const bindings = [];
    if (t.t === "id") {
      if (isP(toks[j + 1], "=")) {
        add(t); // import x = require("...") / import x = N.M
        return j + 2;
      }
      bindings.push({ local: t.v, imported: "default" });
      j++;
      if (isP(toks[j], ",")) j++;
    }
    if (isP(toks[j], "*") && isId(toks[j + 1], "as") && isId(toks[j + 2])) {
      bindings.push({ local: toks[j + 2].v, imported: "*" });
      j += 3;
    } else if (isP(toks[j], "{")) {
      const inner = toks[j].d + 1;
      j++;
      while (j < len && toks[j].d >= inner) {
        const u = toks[j];
        if (u.d !== inner || isP(u, ",")) {
          j++;
          continue;
        }
        // `type T` / `type T as U` are type-only; `type`, `type as x` import the name
        // "type"; `type as` / `type as as x` import the name "as", type-only.
        let spec = j;
        let typeOnly = false;
        const v = toks[j + 1];
        if (isId(u, "type") && v && (v.t === "id" || v.t === "str") && v.d === inner) {
          const w = toks[j + 2];
          if (!isId(v, "as") || isP(w, ",") || isP(w, "}") || isId(w, "as")) {
            typeOnly = true;
            spec = j + 1;
          }
        }
        const name = toks[spec];
        const imported = name.t === "str" ? unquote(name.v) : name.v;
        let local = name.t === "str" ? null : name.v;
        j = spec + 1;
        if (isId(toks[j], "as") && isId(toks[j + 1]) && toks[j + 1].d === inner) {
          local = toks[j + 1].v;
          j += 2;
        }
        if (!typeOnly && local !== null && imported !== null) bindings.push({ local, imported });
        j = skipElement(j, inner);
      }
      j++; // "}"
    }
    if (!isId(toks[j], "from") || toks[j + 1]?.t !== "str") return j;
    const specifier = toks[j + 1].v;
    j += 2;
    let attributes = "";
    const w = toks[j];
    if ((isId(w, "with") || (isId(w, "assert") && !w.nl)) && isP(toks[j + 1], "{")) {
      let e = j + 2;
      while (e < len && toks[e].d > w.d) e++;
      if (e < len) {
        attributes = source.slice(w.s, toks[e].e);
        j = e + 1;
      }
    }
    for (const b of bindings) {
      if (isBindableName(b.local)) imports.push({ ...b, specifier, attributes });
    }
    return j;
  };

  // A declaration at k (a statement start, `export` and decorators already skipped);
  // returns the index to go on from (k + 1 when it is no declaration).
  const declaration = (k) => {
    const t = toks[k];
    const u = toks[k + 1];
    if (!isId(t)) return k + 1;
    switch (t.v) {
      case "var":
      case "let":
      case "const":
        if (t.v === "const" && isId(u, "enum")) {
          add(toks[k + 2]);
          return k + 3;
        }
        if (!(isId(u) || isP(u, "{") || isP(u, "["))) return k + 1;
        if (t.v === "let" && isId(u) && (OPERATOR_KEYWORDS.has(u.v))) return k + 1;
        return declarators(k + 1);
      case "using":
        if (isId(u) && !u.nl && isP(toks[k + 2], "=")) return declarators(k + 1);
        return k + 1;
      case "await":
        if (isId(u, "using") && isId(toks[k + 2]) && isP(toks[k + 3], "=")) {
          return declarators(k + 2);
        }
        return k + 1;
      case "async":
        if (isId(u, "function") && !u.nl) return declaration(k + 1);
        return k + 1;
      case "function": {
        let j = k + 1;
        if (isP(toks[j], "*")) j++;
        if (isId(toks[j])) add(toks[j]);
        return j + 1;
      }
      case "abstract":
        if (isId(u, "class") && !u.nl) return declaration(k + 1);
        return k + 1;
      case "class":
        if (isId(u) && u.v !== "extends" && u.v !== "implements") add(u);
        return k + 2;
      case "enum":
        if (isId(u) && !u.nl) add(u);
        return k + 2;
      case "namespace":
      case "module":
        if (isId(u) && !u.nl && (isP(toks[k + 2], "{") || isP(toks[k + 2], "."))) add(u);
        return k + 2;
      case "import":
        return importDeclaration(k);
      case "declare":
        // declare const/let/var/function/class/enum/namespace/module/global: no value
        return isId(u) && !u.nl ? k + 2 : k + 1;
      default:
        return k + 1;
    }
  };

  // decorators: @a.b.c or @a(...), possibly several
  const skipDecorators = (k) => {
    while (isP(toks[k], "@")) {
      k++;
      while (isId(toks[k]) && isP(toks[k + 1], ".")) k += 2;
      if (isId(toks[k])) k++;
      if (isP(toks[k], "(")) {
        const d = toks[k].d;
        k++;
        while (k < len && toks[k].d > d) k++;
        k++;
      }
    }
    return k;
  };

  const statement = (k) => {
    k = skipDecorators(k);
    if (isId(toks[k], "export")) {
      let j = skipDecorators(k + 1);
      if (isId(toks[j], "default")) {
        j = skipDecorators(j + 1);
        const t = toks[j];
        if (
          isId(t, "function") || isId(t, "class") || isId(t, "abstract") ||
          (isId(t, "async") && isId(toks[j + 1], "function"))
        ) {
          return declaration(j);
        }
        return j;
      }
      if (isId(toks[j], "import") && isId(toks[j + 1]) && isP(toks[j + 2], "=")) {
        add(toks[j + 1]);
        return j + 3;
      }
      if (isId(toks[j], "type") && (isP(toks[j + 1], "{") || isP(toks[j + 1], "*"))) return j + 1;
      if (!isId(toks[j])) return j; // export { ... }, export * from, export =
      k = j;
    }
    return declaration(k);
  };

  let prevTop = null;
  // Goes on at `next` after a construct that began at i.
  const skipTo = (i, next) => {
    next = Math.max(next, i + 1);
    for (let k = Math.min(next, len) - 1; k >= i; k--) {
      if (toks[k].d === 0) {
        prevTop = toks[k];
        break;
      }
    }
    return next;
  };
  let i = 0;
  while (i < len) {
    const tok = toks[i];
    const start = tok.d === 0 && isStatementStart(tok, prevTop) &&
      (tok.t === "id" || isP(tok, "@"));
    if (start) {
      i = skipTo(i, statement(i));
    } else if (
      isId(tok, "var") && !tok.fn && !isP(toks[i - 1], ".") && !isP(toks[i - 1], "?.") &&
      (isId(toks[i + 1]) || isP(toks[i + 1], "{") || isP(toks[i + 1], "["))
    ) {
      // `var` anywhere outside functions is module-scoped: `for (var i ...)`, `{ var x }`
      i = skipTo(i, declarators(i + 1));
    } else {
      if (tok.d === 0) prevTop = tok;
      i++;
    }
  }
  return { names: [...new Set(names)], imports };
}

/**
 * Rewrites one run of a session (see the top of this file). `persisted`: the names
 * earlier runs left in globalThis.__codebox_scope; `run`: the run's number (unique in
 * the process). Returns { code, prefix (what was put before the user's line 1),
 * declared (the names this run declares, imports included), prologue (the persisted
 * names it receives) }.
 */
export function rewriteRun(source, persisted = [], run = 1) {
  const { names, imports } = scanDeclarations(source);
  const declared = new Set([...names, ...imports.map((b) => b.local)]);
  const prologue = [...new Set(persisted)].filter((n) => isBindableName(n) && !declared.has(n));
  const capture = `__codebox_capture_${run}`;
  let prefix = `globalThis.__codebox_capture = ${capture};`;
  if (prologue.length) prefix += ` let { ${prologue.join(", ")} } = globalThis.__codebox_scope;`;
  prefix += " ";

  const captured = [...prologue, ...names.filter((n) => !imports.some((b) => b.local === n))];
  const lines = captured.map((n) => `try { __codebox_o.${n} = ${n}; } catch {}`);
  const namespaces = new Map();
  const importLines = [];
  for (const b of imports) {
    if (b.imported === "*") {
      lines.push(`try { __codebox_o.${b.local} = ${b.local}; } catch {}`);
      continue;
    }
    const key = `${b.specifier} ${b.attributes}`;
    let ns = namespaces.get(key);
    if (!ns) {
      ns = `__codebox_ns_${run}_${namespaces.size}`;
      namespaces.set(key, ns);
      const attributes = b.attributes ? ` ${b.attributes}` : "";
      importLines.push(`import * as ${ns} from ${b.specifier}${attributes};`);
    }
    const name = JSON.stringify(b.imported);
    lines.push(`try { if (${name} in ${ns}) __codebox_o.${b.local} = ${ns}[${name}]; } catch {}`);
  }
  let body = source;
  if (body.startsWith("#!")) body = "//" + body.slice(2); // a hashbang is only valid first
  const trailer =
    `\n;function ${capture}() { const __codebox_o = {}; ${
      lines.join(" ")
    } return __codebox_o; }\n` +
    importLines.join("\n") + (importLines.length ? "\n" : "");
  return { code: prefix + body + trailer, prefix, declared: [...declared], prologue };
}
