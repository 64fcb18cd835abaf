//! Fixed-size records the sandbox's processes send to the supervisor over pipes.
//!
//! After `clone3` the child must not rely on anything shared with the parent, so failures
//! and the program's exit status travel as small plain records, written with one `write(2)`
//! each (atomic on a pipe), and decoded into rich errors on the supervisor's side.

use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::landlock::LandlockStatus;
use super::plan::MountStep;
use crate::sandbox::child::fds::slot;

/// The setup stage that failed inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Stage {
    ArrangeFds = 1,
    ParentDeathSignal,
    WaitForParent,
    ClearGroups,
    SetGid,
    SetUid,
    RaiseCaps,
    NotDumpable,
    Mount,
    Hostname,
    InitStdio,
    ForkProgram,
    Setsid,
    ProgramStdio,
    CloseFds,
    Rlimit,
    DropCaps,
    NoNewPrivs,
    Chdir,
    Exec,
    Landlock,
    Seccomp,
    CgroupNamespace,
    JoinCgroup,
    LoopbackUp,
    EgressListener,
    ZygoteNamespaces,
    ZygoteFork,
}

impl Stage {
    const ALL: [Stage; 28] = [
        Stage::ArrangeFds,
        Stage::ParentDeathSignal,
        Stage::WaitForParent,
        Stage::ClearGroups,
        Stage::SetGid,
        Stage::SetUid,
        Stage::RaiseCaps,
        Stage::NotDumpable,
        Stage::Mount,
        Stage::Hostname,
        Stage::InitStdio,
        Stage::ForkProgram,
        Stage::Setsid,
        Stage::ProgramStdio,
        Stage::CloseFds,
        Stage::Rlimit,
        Stage::DropCaps,
        Stage::NoNewPrivs,
        Stage::Chdir,
        Stage::Exec,
        Stage::Landlock,
        Stage::Seccomp,
        Stage::CgroupNamespace,
        Stage::JoinCgroup,
        Stage::LoopbackUp,
        Stage::EgressListener,
        Stage::ZygoteNamespaces,
        Stage::ZygoteFork,
    ];

    fn from_u32(v: u32) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| *s as u32 == v)
    }

    fn describe(self) -> &'static str {
        match self {
            Stage::ArrangeFds => "arranging file descriptors in the sandbox init",
            Stage::ParentDeathSignal => "setting the parent-death signal",
            Stage::WaitForParent => "waiting for the supervisor to write the id maps",
            Stage::ClearGroups => "clearing supplementary groups",
            Stage::SetGid => "switching to the sandbox gid",
            Stage::SetUid => "switching to the sandbox uid",
            Stage::RaiseCaps => "keeping capabilities in the user namespace",
            Stage::NotDumpable => "making the sandbox init non-dumpable",
            Stage::Mount => "mounting",
            Stage::Hostname => "setting the hostname",
            Stage::InitStdio => "pointing the init's stdio at /dev/null",
            Stage::ForkProgram => "forking the program process",
            Stage::Setsid => "starting a new session",
            Stage::ProgramStdio => "connecting the program's stdio and fd 3",
            Stage::CloseFds => "closing inherited file descriptors",
            Stage::Rlimit => "setting resource limits",
            Stage::DropCaps => "dropping capabilities",
            Stage::NoNewPrivs => "setting no_new_privs",
            Stage::Chdir => "changing to the working directory",
            Stage::Exec => "executing the program",
            Stage::Landlock => "enforcing the landlock ruleset the profile requires",
            Stage::Seccomp => "installing the seccomp filter",
            Stage::CgroupNamespace => "entering a cgroup namespace rooted at the sandbox cgroup",
            Stage::JoinCgroup => "moving the sandbox init into its v1 cgroup (writing 0 to tasks)",
            Stage::LoopbackUp => "bringing up the loopback interface for the egress proxy",
            Stage::EgressListener => {
                "binding the egress listener on 127.0.0.1 and handing it to the supervisor"
            }
            Stage::ZygoteNamespaces => {
                "unsharing the namespaces of a sandbox forked from the zygote"
            }
            Stage::ZygoteFork => "forking a sandbox from the zygote",
        }
    }
}

/// A decoded setup failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupFailure {
    pub stage: Stage,
    /// For [`Stage::Mount`], the plan step that failed.
    pub mount_step: Option<MountStep>,
    /// The stage's detail word: the mount step's index, the v1 hierarchy's index for
    /// [`Stage::JoinCgroup`], or which of several calls of a stage failed.
    pub detail: u32,
    pub errno: i32,
}

impl fmt::Display for SetupFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.stage.describe())?;
        if let Some(step) = &self.mount_step {
            write!(f, " ({step})")?;
        }
        if self.stage == Stage::JoinCgroup {
            write!(f, " (v1 hierarchy #{})", self.detail)?;
        }
        Ok(())
    }
}

/// The raw failure record: stage, detail (mount step index), errno.
pub const FAILURE_LEN: usize = 12;

/// Encodes a failure record.
pub fn encode_failure(stage: Stage, detail: u32, errno: i32) -> [u8; FAILURE_LEN] {
    let mut b = [0u8; FAILURE_LEN];
    b[0..4].copy_from_slice(&(stage as u32).to_le_bytes());
    b[4..8].copy_from_slice(&detail.to_le_bytes());
    b[8..12].copy_from_slice(&errno.to_le_bytes());
    b
}

/// Decodes a failure record, resolving the mount step index against the plan.
pub fn decode_failure(b: &[u8; FAILURE_LEN], plan: &[MountStep]) -> Option<SetupFailure> {
    let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let stage = Stage::from_u32(word(0))?;
    let detail = word(4);
    Some(SetupFailure {
        stage,
        mount_step: (stage == Stage::Mount)
            .then(|| plan.get(detail as usize).cloned())
            .flatten(),
        detail,
        errno: word(8) as i32,
    })
}

/// Info records share the failure records' size and pipe; their first word is this tag.
const INFO_LANDLOCK: u32 = 0x100;

/// An informational record: setup went on after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Info {
    Landlock(LandlockStatus),
}

pub fn encode_info(info: Info) -> [u8; FAILURE_LEN] {
    let Info::Landlock(status) = info;
    let mut b = [0u8; FAILURE_LEN];
    b[0..4].copy_from_slice(&INFO_LANDLOCK.to_le_bytes());
    b[4..8].copy_from_slice(&status.code().to_le_bytes());
    b
}

pub fn decode_info(b: &[u8; FAILURE_LEN]) -> Option<Info> {
    let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    (word(0) == INFO_LANDLOCK)
        .then(|| LandlockStatus::from_code(word(4)).map(Info::Landlock))
        .flatten()
}

/// Writes an info record; losing it only loses the report.
pub fn info(fd: BorrowedFd<'_>, info: Info) {
    let record = encode_info(info);
    // SAFETY: `record` is a valid buffer of FAILURE_LEN bytes; `fd` is open.
    unsafe { libc::write(fd.as_raw_fd(), record.as_ptr().cast(), record.len()) };
}

/// Writes a failure record and ends the calling (child) process with status 127.
pub fn fail(fd: BorrowedFd<'_>, stage: Stage, detail: u32, errno: i32) -> ! {
    let record = encode_failure(stage, detail, errno);
    // SAFETY: `record` is a valid buffer of FAILURE_LEN bytes and `fd` is a borrowed open
    // descriptor; a short or failed write only loses the diagnosis, not memory safety.
    unsafe { libc::write(fd.as_raw_fd(), record.as_ptr().cast(), record.len()) };
    // SAFETY: _exit is async-signal-safe and ends this child without running the parent's
    // atexit handlers or destructors copied into it by the fork.
    unsafe { libc::_exit(127) }
}

/// The errors pipe, as both sandbox processes keep it ([`slot::ERRORS`]) until they exec
/// or exit.
pub fn errors_fd() -> BorrowedFd<'static> {
    // SAFETY: the init and the program keep slot::ERRORS open (close-on-exec in the
    // program) for as long as they run setup code that calls this.
    unsafe { BorrowedFd::borrow_raw(slot::ERRORS) }
}

/// In a sandbox process: the value of `r`, or a failure record and `_exit(127)`.
pub fn check<T, E: Into<std::io::Error>>(r: Result<T, E>, stage: Stage, detail: u32) -> T {
    match r {
        Ok(v) => v,
        Err(e) => {
            let errno = e.into().raw_os_error().unwrap_or(libc::EIO);
            fail(errors_fd(), stage, detail, errno)
        }
    }
}

/// A libc return value (`-1` and errno on failure) as an `io::Result`.
pub fn errno_result(r: libc::c_int) -> std::io::Result<()> {
    if r == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A caps-crate error as an `io::Error` for [`check`].
pub fn caps_io(e: caps::errors::CapsError) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// How the program ended, as reported by the sandbox init.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramStatus {
    Exited(i32),
    Signaled(i32),
}

pub const STATUS_LEN: usize = 8;

pub fn encode_status(status: ProgramStatus) -> [u8; STATUS_LEN] {
    let (kind, value) = match status {
        ProgramStatus::Exited(c) => (1u32, c),
        ProgramStatus::Signaled(s) => (2u32, s),
    };
    let mut b = [0u8; STATUS_LEN];
    b[0..4].copy_from_slice(&kind.to_le_bytes());
    b[4..8].copy_from_slice(&value.to_le_bytes());
    b
}

pub fn decode_status(b: &[u8; STATUS_LEN]) -> Option<ProgramStatus> {
    let kind = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let value = i32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    match kind {
        1 => Some(ProgramStatus::Exited(value)),
        2 => Some(ProgramStatus::Signaled(value)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_round_trips_with_mount_step() {
        let plan = vec![
            MountStep::MakeRootPrivate,
            MountStep::Proc {
                target: "/r/proc".into(),
            },
        ];
        let rec = encode_failure(Stage::Mount, 1, libc::EPERM);
        let f = decode_failure(&rec, &plan).unwrap();
        assert_eq!(f.stage, Stage::Mount);
        assert_eq!(f.mount_step, Some(plan[1].clone()));
        assert_eq!(f.errno, libc::EPERM);
        assert_eq!(f.to_string(), "mounting (proc on /r/proc)");
    }

    #[test]
    fn every_stage_round_trips() {
        for s in Stage::ALL {
            let f = decode_failure(&encode_failure(s, 0, 1), &[]).unwrap();
            assert_eq!(f.stage, s);
        }
        assert!(decode_failure(&encode_failure(Stage::Exec, 0, 1).map(|_| 0xff), &[]).is_none());
    }

    #[test]
    fn info_is_not_a_failure() {
        let rec = encode_info(Info::Landlock(LandlockStatus::PartiallyEnforced));
        assert_eq!(
            decode_info(&rec),
            Some(Info::Landlock(LandlockStatus::PartiallyEnforced))
        );
        assert_eq!(decode_failure(&rec, &[]), None);
        assert_eq!(decode_info(&encode_failure(Stage::Mount, 2, 1)), None);
    }

    #[test]
    fn the_zygote_numbers_its_stages_as_this_enum_does() {
        // The zygote's fork path (C) writes these records itself.
        let source = include_str!("../runtime/zygote/fork.c");
        let start = source.find("enum stage {").expect("the stage enum") + "enum stage {".len();
        let end = start + source[start..].find("};").expect("its end");
        let names: Vec<&str> = source[start..end]
            .split(',')
            .map(|n| n.trim().trim_end_matches(" = 1"))
            .filter(|n| !n.is_empty())
            .collect();
        let ours: Vec<String> = Stage::ALL.iter().map(|s| format!("{s:?}")).collect();
        assert_eq!(names, ours);
        assert!(source.contains("ArrangeFds = 1,"));
        assert!(source.contains(&format!("#define FAILURE_LEN {FAILURE_LEN}\n")));
        assert!(source.contains(&format!("#define INFO_LANDLOCK {INFO_LANDLOCK:#x}\n")));
        for (i, stage) in Stage::ALL.iter().enumerate() {
            assert_eq!(*stage as u32, i as u32 + 1);
        }
    }

    #[test]
    fn status_round_trips() {
        for s in [
            ProgramStatus::Exited(0),
            ProgramStatus::Exited(3),
            ProgramStatus::Signaled(9),
        ] {
            assert_eq!(decode_status(&encode_status(s)), Some(s));
        }
        assert_eq!(decode_status(&[0; STATUS_LEN]), None);
    }
}
