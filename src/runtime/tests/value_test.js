// Tests of src/runtime/deno/value.js, the last-expression capture of TypeScript runs.
// Run with Deno (tests/runtime_scope.rs does, from `cargo test`).

import { captureLastValue, lastExpression, takeValue, wasParsed } from "../deno/value.js";

function assertEquals(actual, expected, what = "") {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) throw new Error(`${what}\n  expected ${e}\n  got      ${a}`);
}

// The text of the last expression `lastExpression` finds, or null.
function found(source) {
  const span = lastExpression(source);
  return span === null ? null : source.slice(span.start, span.end);
}

Deno.test("the last expression statement is found", () => {
  assertEquals(found("1 + 1"), "1 + 1");
  assertEquals(found("const x = 20\nx * 2 + 2"), "x * 2 + 2");
  assertEquals(found("let a = 1; a;"), "a");
  assertEquals(found("let a = 1; a;;\n// done\n"), "a");
  assertEquals(found("const o = {a: 1}\no"), "o");
  assertEquals(found("f()\n  .then(g)\n  .catch(h)"), "f()\n  .then(g)\n  .catch(h)");
  assertEquals(found("let a = 1\na\n  + 2 // comment"), "a\n  + 2");
  assertEquals(found("await Promise.resolve(7)"), "await Promise.resolve(7)");
  assertEquals(found("x\n++y"), "++y");
  assertEquals(found("'str'"), "'str'");
  assertEquals(found("`t ${1} u`"), "`t ${1} u`");
  assertEquals(found("import('./m.ts')"), "import('./m.ts')");
  assertEquals(found("value as number"), "value as number");
  assertEquals(found("[1, 2].map((n) => n * 2)"), "[1, 2].map((n) => n * 2)");
  assertEquals(found("!done"), "!done");
  assertEquals(found("a = 1;\n/re/.test(s)"), "/re/.test(s)");
  assertEquals(found("if (x) { y }\nz"), "z");
  // After a line break `!`, `~` and `@` begin a statement (TypeScript's non-null `!`
  // cannot follow one).
  assertEquals(found("console.log('start')\n!function () {}()"), "!function () {}()");
  assertEquals(found("console.log(1)\n~5"), "~5");
  assertEquals(found("m.get('a')\n!0"), "!0");
  assertEquals(found("if (ok)\n  report()\nsummary"), "summary");
});

Deno.test("declarations, control flow and anything unclear have none", () => {
  for (
    const source of [
      "",
      "// only a comment",
      "const x = 1",
      "let x = 1;",
      "function f() { return 1 }",
      "class A {}",
      "if (true) { 5 }",
      "for (const x of xs) f(x)",
      "export const a = 1",
      "import x from './x.ts'",
      "type T = number",
      "interface I { a: number }",
      "enum E { A }",
      "namespace N { export const a = 1 }",
      "declare const d: number",
      "label: for (;;) break label",
      "{ 1 }",
      "return",
      "throw new Error('x')",
      "try { f() } finally { g() }",
      "async function f() {}",
      // After a declaration's closing brace a line starting with "(" or "[" would, by
      // JavaScript's rule, continue nothing; the finder does not tell, so no value.
      "function f() { return 3 }\n[1, 2].map(f)",
      // The review's: a statement that continues on the next line.
      "class Base {}\nconsole.log('ok')\nclass Child\n  extends Base {}",
      "import { assert }\n  from 'jsr:@std/assert'",
      "let t = 0\nfor (const x of [1, 2])\n  t += x",
      "if (ok)\n  report()",
      "while (more())\n  step()",
      // Unterminated: the program's own syntax error, never a rewrite's.
      "'abc",
      "x + `abc",
      "<T>x",
    ]
  ) {
    assertEquals(found(source), null, JSON.stringify(source));
  }
});

Deno.test("a captured program keeps its lines and gives the value", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const cases = [
      ["const x = 20\nx * 2 + 2", 42],
      ["let a = 1; a;", 1],
      ["const o = { a: [1, 2] }\no.a\n  .map((n) => n * 10)", [10, 20]],
      ["await Promise.resolve('done') // trailing comment", "done"],
      ["const n: number = 3\nn satisfies number", 3],
      ["let y = 0\ny++", 0],
      ["1, 2", 2],
    ];
    for (const [i, [source, expected]] of cases.entries()) {
      const { code, linePrefix } = captureLastValue(source);
      // Every line before the expression's is untouched.
      const before = source.slice(0, lastExpression(source).start);
      assertEquals(code.startsWith(before), true, source);
      assertEquals(linePrefix !== "", lastExpression(source).start === 0, source);
      const path = `${dir}/m${i}.ts`;
      await Deno.writeTextFile(path, code);
      await import("file://" + path);
      assertEquals(wasParsed(), true, source);
      const shown = takeValue();
      assertEquals(
        shown,
        typeof expected === "string" ? JSON.stringify(expected) : Deno.inspect(expected),
        source,
      );
      assertEquals(takeValue(), null, "taken once");
    }
    // A rewrite that would break a program is caught: its marker never ran.
    const broken = `${dir}/broken.ts`;
    await Deno.writeTextFile(broken, captureLastValue("const a = (1").code);
    let failed = false;
    try {
      await import("file://" + broken);
    } catch {
      failed = true;
    }
    assertEquals([failed, wasParsed()], [true, false]);
    // No expression: the program is left exactly as it was.
    assertEquals(captureLastValue("const x = 1\n").code, "const x = 1\n");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a value that is undefined, or too long, or hostile to inspect", () => {
  globalThis[Symbol.for("codebox.value")] = undefined;
  assertEquals(takeValue(), null);
  globalThis[Symbol.for("codebox.value")] = "x".repeat(300_000);
  const long = takeValue(1_000);
  assertEquals(long.length < 1_100 && long.endsWith("more characters]"), true);
  globalThis[Symbol.for("codebox.value")] = new Proxy({}, {
    get() {
      throw new Error("no");
    },
    ownKeys() {
      throw new Error("no keys");
    },
  });
  const hostile = takeValue();
  assertEquals(typeof hostile, "string");
});
