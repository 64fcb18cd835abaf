// The value of a TypeScript program's last expression, as a REPL shows it.
//
// When the supervisor asks for it (a VALUE record, src/runtime/boot.rs), the program's
// last top-level statement, if it is an expression statement, is rewritten in place:
//
//   <the program up to it>globalThis[Symbol.for("codebox.value")] = (<the expression>
//   );<whatever followed it: a semicolon, comments>
//
// so that after the module has run (top-level `await` included) boot.js or session.js
// reads the value and sends `Deno.inspect` of it. Lines before it keep their numbers and
// columns; only the statement's first line shifts right. A side-effect import of a data:
// URL at the end sets PARSED_KEY when the module has parsed and linked (imports evaluate
// before the body): a rewritten module that fails without it never ran, and is imported
// again as the program wrote it (`wasParsed`).
//
// Statements are found with scope.js's lexer and JavaScript's own rule for where a line
// break ends one: a line that starts with a token that can continue an expression (`.`,
// `(`, `[`, a template, a binary operator...) continues the statement before it. The
// check is conservative: whatever it does not recognise as an expression statement is
// left alone, and the program then simply has no value; a wrong rewrite would break it.
//
// Plain JavaScript with no imports but scope.js, so that `deno test` can run it as it is.

import { endsExpression, tokenize } from "./scope.js";

/** Where the value lands; boot.js and session.js read and delete it. */
export const VALUE_KEY = Symbol.for("codebox.value");
const ASSIGN = 'globalThis[Symbol.for("codebox.value")] = (';

// Keywords that begin a statement which is not an expression statement (declarations,
// control flow, modules). `async` too: `async function` is a declaration, and an
// `async` arrow at the very end of a program is rare enough to go without a value.
const STATEMENT_KEYWORDS = new Set(
  ("abstract async break case catch class const continue debugger declare default do " +
    "else enum export finally for function if interface let module namespace return " +
    "static switch throw try type using var while with yield " +
    // They continue a declaration's header on a new line (`class C\n  extends B {}`,
    // `import { a }\n  from "m"`).
    "extends implements from").split(" "),
);

/** Set by the marker import once the rewritten module parsed. */
const PARSED_KEY = Symbol.for("codebox.parsed");
// Each capture's marker is its own module (a module is evaluated once per process).
let markers = 0;
const parsedMarker = () =>
  '\nimport "data:application/javascript,' +
  encodeURIComponent(`globalThis[Symbol.for("codebox.parsed")] = true; // ${++markers}`) +
  '";\n';

// Statement keywords whose parenthesised head is followed by a body that may be a single
// statement on the next line: that line is not a statement of its own.
const CONTROL_HEADS = new Set(["if", "for", "while", "with"]);

// Punctuators that may begin an expression statement.
const EXPRESSION_PUNCTUATORS = new Set(["!", "~", "+", "-", "++", "--", "(", "["]);

// Tokens that, first on a line, continue the statement of the line before (no automatic
// semicolon before them). `++`/`--` are not among them: after a line break they are
// prefix operators of a new statement.
function continues(tok) {
  switch (tok.t) {
    case "open":
      return tok.v === "(" || tok.v === "[";
    case "close":
      return true;
    case "tpl":
    case "tplhead":
      return true;
    case "p":
      // After a line break these only ever begin a statement: prefix operators, a
      // decorator, a private name.
      return !["++", "--", "!", "~", "@", "#", "..."].includes(tok.v);
    case "id":
      return ["in", "instanceof", "as", "satisfies", "of"].includes(tok.v);
    default:
      return false;
  }
}

function isPunct(tok, v) {
  return tok !== undefined && (tok.t === "p" || tok.t === "open" || tok.t === "close") &&
    tok.v === v;
}

/**
 * The span { start, end } (offsets in `source`) of the expression of the program's last
 * top-level statement when that is an expression statement, else null.
 */
export function lastExpression(source) {
  let toks;
  try {
    toks = tokenize(source);
  } catch {
    return null;
  }
  // Top-level tokens only; trailing empty statements (`;`) are not statements of note.
  let last = toks.length - 1;
  while (last >= 0 && toks[last].d === 0 && isPunct(toks[last], ";")) last--;
  if (last < 0 || toks[last].d !== 0) return null;
  // An unterminated string or template at the end: the program's own syntax error, to be
  // reported as it is, not inside a rewrite.
  const end = toks[last];
  if (end.t === "str" || end.t === "tpl") {
    const raw = source.slice(end.s, end.e);
    const quote = end.t === "str" ? raw[0] : "`";
    let escapes = 0;
    while (raw[raw.length - 2 - escapes] === "\\") escapes++;
    if (raw.length < 2 || raw[raw.length - 1] !== quote || escapes % 2 === 1) return null;
  }
  let start = -1;
  for (let k = 0; k <= last; k++) {
    const tok = toks[k];
    if (tok.d !== 0) continue;
    const prev = toks[k - 1];
    if (prev === undefined || isPunct(prev, ";")) {
      if (!isPunct(tok, ";")) start = k;
    } else if (tok.nl && !continues(tok) && (isPunct(prev, "}") || endsExpression(prev))) {
      // Not the body of `if (...)`, `for (...)`, `while (...)` on the next line.
      if (isPunct(prev, ")") && prev.opener !== undefined) {
        const head = toks[prev.opener - 1];
        const head2 = toks[prev.opener - 2];
        if (
          head?.t === "id" &&
          (CONTROL_HEADS.has(head.v) || (head.v === "await" && head2?.v === "for"))
        ) {
          continue;
        }
      }
      start = k;
    }
  }
  if (start < 0) return null;
  const first = toks[start];
  const second = toks[start + 1];
  switch (first.t) {
    case "id":
      if (STATEMENT_KEYWORDS.has(first.v)) return null;
      // `import("m")` and `import.meta` are expressions; `import x from` is not.
      if (first.v === "import" && !(isPunct(second, "(") || isPunct(second, "."))) return null;
      // A label.
      if (isPunct(second, ":")) return null;
      break;
    case "p":
    case "open":
      if (!EXPRESSION_PUNCTUATORS.has(first.v)) return null;
      break;
    case "num":
    case "str":
    case "tpl":
    case "tplhead":
    case "re":
      break;
    default:
      return null;
  }
  return { start: first.s, end: toks[last].e };
}

/**
 * `source` with its last expression's value captured (see the top): { code, linePrefix },
 * where linePrefix is what line 1 gained at its start ("" unless the expression is the
 * very beginning of the program), for error positions.
 */
export function captureLastValue(source) {
  const span = lastExpression(source);
  if (span === null) return { code: source, linePrefix: "", insert: null };
  const code = source.slice(0, span.start) + ASSIGN + source.slice(span.start, span.end) +
    "\n)" + source.slice(span.end) + parsedMarker();
  delete globalThis[PARSED_KEY];
  // Where the assignment went, for errors.js to give positions back in the program's
  // terms (line 1-based, column 0-based, both the program's own).
  const before = source.slice(0, span.start);
  const line = before.split("\n").length;
  const col = span.start - (before.lastIndexOf("\n") + 1);
  return { code, linePrefix: span.start === 0 ? ASSIGN : "", insert: { line, col, text: ASSIGN } };
}

/**
 * Whether the last rewritten module parsed and linked (its marker import ran). A module
 * that failed without it never ran a line: it can be imported again unrewritten.
 */
export function wasParsed() {
  const parsed = globalThis[PARSED_KEY] === true;
  delete globalThis[PARSED_KEY];
  return parsed;
}

/**
 * Takes the captured value off globalThis: its text as a REPL shows it (strings quoted),
 * or null when there is none or it is undefined. At most `max` characters.
 */
export function takeValue(max = 200_000) {
  if (!(VALUE_KEY in globalThis)) return null;
  const value = globalThis[VALUE_KEY];
  delete globalThis[VALUE_KEY];
  if (value === undefined) return null;
  let text;
  try {
    text = typeof value === "string"
      ? JSON.stringify(value)
      : Deno.inspect(value, { colors: false, depth: 4, iterableLimit: 100 });
  } catch (e) {
    text = `<inspect failed: ${e?.message ?? e}>`;
  }
  if (text.length > max) text = text.slice(0, max) + `…[${text.length - max} more characters]`;
  return text;
}
