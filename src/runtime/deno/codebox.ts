// The codebox module inside the sandbox, for TypeScript:
//
//   import { callMCPTool, searchTools, getTool } from "/opt/codebox/deno/codebox.ts";
//   import { saveSkill, listSkills, health } from "/opt/codebox/deno/codebox.ts";
//
// The same API as /servers/client.ts (which the generated tool wrappers import).

export * from "./client.ts";

/** Basic facts about the sandbox this code runs in. */
export function sandboxInfo(): { hostname: string; pid: number } {
  return { hostname: Deno.hostname(), pid: Deno.pid };
}
