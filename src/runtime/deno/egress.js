// codebox egress, for Deno in proxy mode: a fetch whose refused tunnel says why.
//
// The egress proxy answers a refused CONNECT with "403 codebox: egress to host:port
// denied (reason)", but Deno reports a failed tunnel only as "unsuccessful tunnel". When
// that happens, this fetch asks the proxy for its last refusal of that target (a request
// the proxy answers itself, see src/egress/why.rs) and throws a TypeError that carries it,
// with the original error as its cause. Everything else passes through unchanged.

const WHY = "http://egress.codebox.invalid/why?target=";

function targetOf(input) {
  const href = input instanceof Request ? input.url : String(input?.href ?? input);
  const url = new URL(href);
  const port = url.port || (url.protocol === "http:" ? "80" : "443");
  return `${url.hostname}:${port}`;
}

function refusedTunnel(e) {
  return e instanceof TypeError &&
    /unsuccessful tunnel/.test(String(e.cause?.message ?? e.cause ?? ""));
}

export function install() {
  const original = globalThis.fetch;
  async function fetch(input, init) {
    try {
      return await original(input, init);
    } catch (e) {
      if (!refusedTunnel(e)) throw e;
      let why;
      try {
        const answer = await original(WHY + encodeURIComponent(targetOf(input)));
        if (answer.ok) why = (await answer.text()).trim();
        else await answer.body?.cancel();
      } catch {
        // no answer: the original error stands
      }
      if (!why) throw e;
      throw new TypeError(`fetch failed: ${why}`, { cause: e });
    }
  }
  globalThis.fetch = fetch;
}
