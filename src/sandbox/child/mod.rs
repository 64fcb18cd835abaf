//! The child's side of a sandbox, between `clone3` and `execve`: each file a linear,
//! commented procedure (the init, the mounts and `pivot_root`, the network namespace's
//! loopback, descriptors, the program's last steps) using only async-signal-safe calls.

pub(crate) mod fds;
pub(crate) mod init;
pub(crate) mod mounts;
pub(crate) mod netns;
pub(crate) mod program;
pub(crate) mod syscalls;
