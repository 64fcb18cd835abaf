// Tests of src/runtime/deno/scope.js, the declaration scanner of keep-alive TypeScript
// sessions. Run with Deno (tests/runtime_scope.rs does, from `cargo test`):
//
//   deno test --no-config --no-lock --allow-read --allow-write src/runtime/tests/scope_test.js
//
// (Kept out of src/runtime/deno/, which is copied into the rootfs as it is.)

import { isBindableName, rewriteRun, scanDeclarations, tokenize } from "../deno/scope.js";

function assertEquals(actual, expected, what = "") {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) throw new Error(`${what}\n  expected ${e}\n  got      ${a}`);
}

const names = (source) => scanDeclarations(source).names;
const sorted = (list) => [...list].sort();

function check(source, expected) {
  assertEquals(sorted(names(source)), sorted(expected), JSON.stringify(source));
}

Deno.test("let, const, var and several declarators", () => {
  check("let x = 41", ["x"]);
  check("const a = 1, b = f(x, y), c = [1, 2], d", ["a", "b", "c", "d"]);
  check("var v = 1; let w; const z = 3;", ["v", "w", "z"]);
  check("let a = 1\nlet b = 2\nconst c = a\n  + b", ["a", "b", "c"]);
  check("let a = (1, 2), b = { x: 1, y: 2 }, c = [3, 4]", ["a", "b", "c"]);
  check("const s = cond\n  ? 1\n  : 2, t = 3", ["s", "t"]);
  check("let\n  spread = 1,\n  over = 2", ["spread", "over"]);
});

Deno.test("destructuring patterns", () => {
  check("const { a, b: c, ...rest } = obj", ["a", "c", "rest"]);
  check("let [x, , y = 2, ...more] = arr", ["x", "y", "more"]);
  check("const { a = { b: 1 }, c: [d, { e, f: g = h }], [key]: k, 'str': s, 1: one } = src", [
    "a",
    "d",
    "e",
    "g",
    "k",
    "s",
    "one",
  ]);
  check("let [[p, q], { r }] = nested, after = 1", ["p", "q", "r", "after"]);
  check("const { default: def, if: cond } = mod", ["def", "cond"]);
});

Deno.test("strings, templates and comments are skipped", () => {
  check(`const s = "{ let no = 1 }", t = '}\\'{', u = 1; let after = 2`, ["s", "t", "u", "after"]);
  check("const tpl = `${ {a: 1}.a } and ${`inner ${ '}' } ${ { b: '{' }.b }`}`; let after = 1", [
    "tpl",
    "after",
  ]);
  check("const t = `line\nlet no = 1\n${x}`\nlet yes = 1", ["t", "yes"]);
  check("// let c1 = 1\n/* let c2 = 2\n let c3 */ let real = 3", ["real"]);
  check("let a = 1 // trailing } comment {\nlet b = 2 /* { */", ["a", "b"]);
  check("#!/usr/bin/env -S deno run\nlet afterHashbang = 1", ["afterHashbang"]);
});

Deno.test("regex literals and division", () => {
  check(`const re = /["'\\/{]+/g; let afterRe = 1;`, ["re", "afterRe"]);
  check("const cls = /[/}]/; let after = 1", ["cls", "after"]);
  check("const d = a / b / c; let afterDiv = 2", ["d", "afterDiv"]);
  check("const e = (a) / 2 / (b); let q = x[1] / y[2] / 3", ["e", "q"]);
  check("const r = x.replace(/'/g, '\"'); let after = 1", ["r", "after"]);
  check("if (/{/.test(s)) {}\nlet after = 1", ["after"]);
  check("if (ok) /[\"'{]/.test(s)\nwhile (x) /`/g.exec(s)\nlet after = 1", ["after"]);
  check("function f() { return /}/ }\nlet after = 1", ["f", "after"]);
  check("const t = typeof /x/; let u = 1", ["t", "u"]);
  check("let i = 0; i++ / 2; let j = 1", ["i", "j"]);
  check("const half = `${a}` / 2; let k = 1", ["half", "k"]);
});

Deno.test("functions and their locals", () => {
  check("function outer() { var hidden = 1; let h2 = 2; function inner() {} }", ["outer"]);
  check("async function af() { const x = 1 }\nfunction* gen() { let y }\nasync function* ag() {}", [
    "af",
    "gen",
    "ag",
  ]);
  check("const f = (a, b) => { let inner = 1; return a }\nlet g = 2", ["f", "g"]);
  check("const h = async (x) => x * 2, k = 1", ["h", "k"]);
  check("const fe = function named() { var v = 1 }\nconst arrow = x => { var w }", ["fe", "arrow"]);
  check("const o = { m() { var inObj = 1 }, get g() { var inGet } }", ["o"]);
  check("function typed(a: number): { r: number } { return { r: a } }\nlet after = 1", [
    "typed",
    "after",
  ]);
  check("function gen<T>(a: T): Promise<T> { var local = 1; return a }", ["gen"]);
});

Deno.test("classes, enums and namespaces", () => {
  check("class K { m() { var no = 1 } static { var no2 } field = 1 }", ["K"]);
  check("class Point {\n  constructor(public n: number) {}\n}\nlet p = new Point(1)", [
    "Point",
    "p",
  ]);
  check("class A extends B implements C<D> {}\nabstract class Abs {}", ["A", "Abs"]);
  check("enum Color { Red, Green }\nconst enum Dir { Up }", ["Color", "Dir"]);
  check("namespace NS { export const inner = 1; var inNs = 2 }\nlet after = 1", ["NS", "after"]);
  check("@decorator class Decorated {}\n@dec() export class D2 {}\n@a.b\nclass D3 {}", [
    "Decorated",
    "D2",
    "D3",
  ]);
});

Deno.test("top-level blocks: let stays in, var comes out", () => {
  check("for (let i = 0; i < 3; i++) { let inLoop = i }", []);
  check("for (const x of xs) {}\nfor (const k in obj) {}", []);
  check("for (var j = 0, n = 2; j < n; j++) {}", ["j", "n"]);
  check("for (var key in obj) {}\nfor (var [a, b] of pairs) {}", ["key", "a", "b"]);
  check("{ var blockVar = 1; let blockLet = 2; function blockFn() {} }", ["blockVar"]);
  check("if (x) { var inIf = 1 } else { let no }\nif (y) var bare = 2;", ["inIf", "bare"]);
  check("try { var t1 = 1 } catch (e) { var t2 } finally { let t3 }", ["t1", "t2"]);
  check("label: for (const q of qs) { break label }", []);
  check("const o = { var: 1 }; o.var = 2; class V { var = 3 }", ["o", "V"]);
});

Deno.test("imports", () => {
  const { names: n, imports } = scanDeclarations(
    'import def, { a as b, c, type T, "x-y" as xy } from "./m.ts";\n' +
      'import * as ns from "npm:foo";\n' +
      'import type { Q } from "./q.ts";\n' +
      'import type Default from "./d.ts";\n' +
      'import { type R, type as t2, type } from "./r.ts";\n' +
      "import j from './d.json' with { type: 'json' };\n" +
      'import "./side.ts";\n' +
      'const dyn = await import("./z.ts");\n' +
      "console.log(import.meta.url);\n" +
      "import {\n  multi,\n  line as renamed,\n} from './ml.ts'",
  );
  assertEquals(n, ["dyn"], "names");
  assertEquals(
    imports.map((b) => [b.local, b.imported, b.specifier, b.attributes]),
    [
      ["def", "default", '"./m.ts"', ""],
      ["b", "a", '"./m.ts"', ""],
      ["c", "c", '"./m.ts"', ""],
      ["xy", "x-y", '"./m.ts"', ""],
      ["ns", "*", '"npm:foo"', ""],
      ["t2", "type", '"./r.ts"', ""],
      ["type", "type", '"./r.ts"', ""],
      ["j", "default", "'./d.json'", "with { type: 'json' }"],
      ["multi", "multi", "'./ml.ts'", ""],
      ["renamed", "line", "'./ml.ts'", ""],
    ],
    "imports",
  );
});

Deno.test("exports", () => {
  check("export const ex = 1; export let el; export var ev;", ["ex", "el", "ev"]);
  check("export function ef() {}\nexport async function eaf() {}\nexport class EC {}", [
    "ef",
    "eaf",
    "EC",
  ]);
  check("export default class DC {}\nexport default function df() {}", ["DC", "df"]);
  check("export default function () {}\nexport default 42\nlet after = 1", ["after"]);
  check("export { a as b }; export * from './w.ts'; export { c } from './c.ts'", []);
  check("export enum EE { A }\nexport namespace EN {}\nexport abstract class EA {}", [
    "EE",
    "EN",
    "EA",
  ]);
  check("export const { d1, d2: [d3] } = obj", ["d1", "d3"]);
});

Deno.test("type-only declarations are not values", () => {
  check("interface I { x: number; let: string }\ntype T = { y: string }\ntype U<A> = A[]", []);
  check(
    "declare const dc: number;\ndeclare function df(): void;\ndeclare class DC {}\ndeclare enum DE {}",
    [],
  );
  check("declare module 'm' { export const inMod: number }\ndeclare global { var g: number }", []);
  check("export type ET = string;\nexport interface EI {}\nexport declare const edc: number;", []);
  check("export type { A } from './a.ts'\nexport type * from './b.ts'", []);
  check("let type = 1; type = 2;", ["type"]);
});

Deno.test("type annotations", () => {
  check("let a: Array<number>\nlet b = 2", ["a", "b"]);
  check("let m: Map<string, number> = new Map(), two = 2", ["m", "two"]);
  check("const m2 = new Map<string, number>(), three = 3", ["m2", "three"]);
  check("let cb: () => void\nlet y = 1", ["cb", "y"]);
  check("let u: string | undefined\nlet d!: number; const o: { a: number, b: string } = x", [
    "u",
    "d",
    "o",
  ]);
  check("const f = <T,>(x: T): T => x, g = 1", ["f", "g"]);
  check("const v = x as const, w = y satisfies Z", ["v", "w"]);
  check("using res = open(), other = open()\nawait using ares = aopen()", ["res", "other", "ares"]);
});

Deno.test("expressions are not declarations", () => {
  check("x = a\nlet z = 1", ["z"]);
  check("const fnExpr = function notDeclared() {}", ["fnExpr"]);
  check("const c = class NotDeclared {}", ["c"]);
  check("foo(function notEither() {}); (class Nor {});", []);
  check("let v = a\n  instanceof B", ["v"]);
  check("module.exports = 1; namespace.x = 2; let let2 = 1", ["let2"]);
});

Deno.test("tokenize: depth and function bodies", () => {
  const toks = tokenize("a({ b: [c] }); function f() { var x }");
  const x = toks.find((t) => t.v === "x");
  assertEquals([x.d, x.fn], [1, true], "x inside f");
  const c = toks.find((t) => t.v === "c");
  assertEquals([c.d, c.fn], [3, false], "c inside the call");
  assertEquals(toks.at(-1).d, 0, "balanced");
});

Deno.test("isBindableName", () => {
  for (const ok of ["x", "$", "_a1", "ünï", "café"]) assertEquals(isBindableName(ok), true, ok);
  for (
    const bad of [
      "if",
      "let",
      "await",
      "eval",
      "arguments",
      "1a",
      "a-b",
      "",
      "__codebox_o",
      "globalThis",
    ]
  ) {
    assertEquals(isBindableName(bad), false, bad);
  }
});

Deno.test("rewriteRun keeps line numbers and builds the prologue", () => {
  const source = "import { a } from './m.ts';\nconsole.log(x)\nlet y = 1";
  const { code, prefix, prologue, declared } = rewriteRun(source, ["x", "y", "a", "if"], 3);
  assertEquals(prologue, ["x"], "prologue: persisted names not declared here, valid ones");
  assertEquals(sorted(declared), ["a", "y"], "declared");
  assertEquals(
    prefix,
    "globalThis.__codebox_capture = __codebox_capture_3; let { x } = globalThis.__codebox_scope; ",
  );
  const lines = code.split("\n");
  assertEquals(lines.slice(0, 3), [
    prefix + "import { a } from './m.ts';",
    "console.log(x)",
    "let y = 1",
  ], "lines");
  if (!code.includes("function __codebox_capture_3()")) throw new Error(code);
  if (!code.includes("import * as __codebox_ns_3_0 from './m.ts';")) throw new Error(code);
  const first = rewriteRun("let q = 1", [], 1);
  assertEquals(first.prefix, "globalThis.__codebox_capture = __codebox_capture_1; ");
  assertEquals(
    rewriteRun("#!/bin/deno\nlet h = 1", [], 2).code.split("\n")[0],
    "globalThis.__codebox_capture = __codebox_capture_2; ///bin/deno",
  );
});

// Runs sources one after another as boot.js does (rewritten, imported, captured).
async function session(sources, files = {}) {
  const dir = await Deno.makeTempDir({ prefix: "codebox-scope-test-" });
  const scope = Object.create(null);
  globalThis.__codebox_scope = scope;
  const results = [];
  try {
    for (const [name, text] of Object.entries(files)) {
      await Deno.writeTextFile(`${dir}/${name}`, text);
    }
    for (const [i, source] of sources.entries()) {
      const run = sessionRuns++;
      const { code } = rewriteRun(source, Object.keys(scope), run);
      const path = `${dir}/run-${run}.ts`;
      await Deno.writeTextFile(path, code);
      globalThis.__codebox_capture = undefined;
      const printed = [];
      globalThis.__codebox_log = (...values) => printed.push(values);
      let error = null;
      try {
        await import("file://" + path);
      } catch (e) {
        error = e;
      }
      const capture = globalThis.__codebox_capture;
      if (typeof capture === "function") Object.assign(scope, capture());
      results.push({ run: i, out: printed, error });
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  return results;
}
let sessionRuns = 1;
const out = "globalThis.__codebox_log";

Deno.test("rewritten runs share their module scope", async () => {
  const r = await session([
    "let x = 41\nconst { a, b: [c] } = { a: 1, b: [2] }\nfunction f() { return 'f' }\nclass K { v = 7 }\nenum E { A = 5 }",
    `${out}(x + 1, a + c, f(), new K().v, E.A)\nx = 100`,
    `${out}(x)\nconst x2 = 'shadowed'\nlet a = 'again'`,
    `${out}(x2, a)`,
  ]);
  assertEquals(r.map((e) => e.error && String(e.error)), [null, null, null, null], "no errors");
  assertEquals(r.map((e) => e.out), [[], [[42, 3, "f", 7, 5]], [[100]], [["shadowed", "again"]]]);
});

Deno.test("a run that throws keeps what it defined before the error", async () => {
  const r = await session([
    "let before = 1\nthrow new Error('early')\nlet after = 2",
    `${out}(before, typeof after)`,
  ]);
  assertEquals(String(r[0].error), "Error: early");
  assertEquals(r[1].error, null);
  // `after` stayed in its temporal dead zone: not captured, so not declared in run 2
  assertEquals(r[1].out, [[1, "undefined"]]);
});

Deno.test("imports persist, type-only imports do not break linking", async () => {
  const r = await session(
    [
      "import { double } from './lib.ts'\nimport { Shape, VERSION } from './types.ts'\nimport * as lib from './lib.ts'\nimport data from './d.json' with { type: 'json' }\nconst s: Shape = { a: VERSION }",
      `${out}(double(s.a), lib.double(1), data.k, typeof Shape)`,
    ],
    {
      "lib.ts": "export const double = (n: number) => n * 2;\n",
      "types.ts": "export interface Shape { a: number }\nexport const VERSION = 3;\n",
      "d.json": '{"k": "json"}',
    },
  );
  assertEquals(r.map((e) => e.error && String(e.error)), [null, null], "no errors");
  assertEquals(r[1].out, [[6, 2, "json", "undefined"]]);
});

Deno.test("a top-level for (var ...) in a later run does not clash with an earlier let", async () => {
  const r = await session([
    "let i = 10",
    `for (var i = 0; i < 3; i++) {}\n${out}(i)`,
    `${out}(i)`,
  ]);
  assertEquals(r.map((e) => e.error && String(e.error)), [null, null, null], "no errors");
  assertEquals(r.map((e) => e.out), [[], [[3]], [[3]]]);
});
