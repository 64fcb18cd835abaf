// The codebox module inside the sandbox, for TypeScript.
//
// Code run by codebox can `import * as codebox from "/opt/codebox/deno/codebox.ts"`.
// Tool calls through the fd-3 proxy arrive with the proxy; for now this module reports
// what sandbox it is running in.

export const CHANNEL_FD = 3;

/** Basic facts about the sandbox this code runs in. */
export function sandboxInfo(): { hostname: string; pid: number } {
  return { hostname: Deno.hostname(), pid: Deno.pid };
}
