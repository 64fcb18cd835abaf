"""What the MCP client scripts share: the server's environment and process lookups."""

import os


def server_env():
    """The environment a test starts `codebox serve` with: CODEBOX_*, HOME and PATH."""
    return {k: v for k, v in os.environ.items() if k.startswith(("CODEBOX_", "HOME", "PATH"))}


def processes_with(marker):
    """Pids (other than ours) whose command line contains `marker`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if marker in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"):
                found.append(int(pid))
        except OSError:
            pass
    return found
