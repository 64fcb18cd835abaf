"""The codebox module inside the sandbox.

Code run by codebox can `import codebox`. Tool calls through the fd-3 proxy arrive with the
proxy; for now this module reports what sandbox it is running in.
"""

CHANNEL_FD = 3


def sandbox_info():
    """Return basic facts about the sandbox this code runs in."""
    import os
    import socket

    return {"hostname": socket.gethostname(), "uid": os.getuid(), "pid": os.getpid()}
