//! `codebox setup-cgroups`: rootless codebox on hosts without systemd. Run once by root,
//! it delegates a cgroup directory below its own cgroup in every hierarchy codebox uses
//! (v1, hybrid or v2; from a boot script, the tops of the hierarchies) to a user and prints how to start the user's codebox inside it and how to make
//! that permanent; `--enter -- COMMAND` starts a command inside it (as root: as the user;
//! as the user: the v1 part, which the kernel lets a user join alone); `--remove` undoes
//! it. The work is `codebox::sandbox::cgroup::delegate`; this is arguments, users and
//! words.

use std::ffi::{CString, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use nix::unistd::{Uid, User};

use codebox::sandbox::cgroup::delegate::{
    self, Applied, DelegationError, DelegationPlan, Entered, Removal,
};

use super::out::outln;

#[derive(Debug, Args)]
pub struct SetupCgroupsArgs {
    /// The user who runs codebox rootless (a name or a uid); required as root.
    #[arg(long, value_name = "USER")]
    user: Option<String>,
    /// The delegated directory's name in each hierarchy [default: codebox-delegated-USER].
    #[arg(long, value_name = "DIR")]
    name: Option<String>,
    /// Remove the delegated directories (refused while processes are inside them).
    #[arg(long, conflicts_with = "enter")]
    remove: bool,
    /// Run COMMAND inside the delegation. As root: set it up (quietly), move into it in
    /// every hierarchy, become USER (uid, gid, groups, HOME) and exec COMMAND. As the
    /// user: join the v1 directories you own (moving into v2 needs root) and exec COMMAND.
    #[arg(long, requires = "command")]
    enter: bool,
    /// What --enter runs (after `--`).
    #[arg(last = true, value_name = "COMMAND", requires = "enter")]
    command: Vec<OsString>,
}

/// Errors of `setup-cgroups` itself (the delegation's own are `DelegationError`).
#[derive(Debug, thiserror::Error)]
enum SetupError {
    #[error(
        "setup-cgroups creates and chowns cgroup directories, so it must run as root \
         (`sudo codebox setup-cgroups --user {user}`); as {user}, only `--enter` works"
    )]
    NotRoot { user: String },
    #[error("as root, --user NAME says whom the cgroups are delegated to")]
    NoUser,
    #[error("unknown user {0:?} (no such name or uid in the user database)")]
    UnknownUser(String),
    #[error("cannot look up user {user:?}")]
    Lookup {
        user: String,
        #[source]
        source: nix::Error,
    },
    #[error("--user {0}: root needs no delegated cgroups")]
    RootUser(String),
    #[error("--user {given}: without root you can only enter your own delegation ({own})")]
    OtherUser { given: String, own: String },
    #[error(
        "cannot enter the delegation {name}: {reasons} (has root run `codebox setup-cgroups \
         --user {user}`?)"
    )]
    CannotEnter {
        name: String,
        user: String,
        reasons: String,
    },
    #[error("cannot become {user}: {step} failed")]
    Become {
        user: String,
        step: &'static str,
        #[source]
        source: nix::Error,
    },
    #[error("cannot run {command:?}")]
    Exec {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Delegation(#[from] DelegationError),
}

pub fn run(args: SetupCgroupsArgs) -> anyhow::Result<ExitCode> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(enter_as_user(args)?);
    }
    let user = lookup(args.user.as_deref().ok_or(SetupError::NoUser)?)?;
    if user.uid.is_root() {
        return Err(SetupError::RootUser(user.name).into());
    }
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| delegate::default_name(&user.name));
    // Where: below this process's own cgroup in every hierarchy codebox uses (the
    // administrator's bounds hold for the delegation too); what: plain data, checked whole.
    let roots = delegate::at_roots(Path::new("/proc"), Path::new("/"))?;
    let plan = delegate::plan(&roots.parents, &name, user.uid.as_raw(), user.gid.as_raw())?;
    if args.remove {
        let removed = delegate::remove(&plan)?;
        print_removal(&plan, &removed)?;
        return Ok(ExitCode::SUCCESS);
    }
    let applied = delegate::apply(&plan)?;
    if args.enter {
        // Nothing on stdout: it is the command's (an MCP server's stdio, say).
        delegate::enter_self(&plan, Path::new("/proc"), true)?;
        become_user(&user)?;
        return Ok(exec_failed(exec(&args.command, Some(&user))));
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("codebox"));
    print_setup(&plan, &user.name, &applied, &roots.notes)?;
    let systemd = Path::new("/run/systemd/system").is_dir();
    outln!(
        "\n{}",
        next_steps(&plan, &user.name, args.name.is_some(), &exe, systemd)
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `--enter` without root: join what the kernel lets this user join, then exec.
fn enter_as_user(args: SetupCgroupsArgs) -> Result<ExitCode, SetupError> {
    let uid = nix::unistd::getuid();
    let me = User::from_uid(uid)
        .map_err(|source| SetupError::Lookup {
            user: uid.to_string(),
            source,
        })?
        .ok_or_else(|| SetupError::UnknownUser(uid.to_string()))?;
    if !args.enter {
        return Err(SetupError::NotRoot { user: me.name });
    }
    if let Some(given) = &args.user {
        if *given != me.name && *given != uid.to_string() {
            return Err(SetupError::OtherUser {
                given: given.clone(),
                own: me.name,
            });
        }
    }
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| delegate::default_name(&me.name));
    let roots = delegate::at_roots(Path::new("/proc"), Path::new("/"))?;
    let plan = delegate::plan(&roots.parents, &name, uid.as_raw(), me.gid.as_raw())?;
    match delegate::enter_self(&plan, Path::new("/proc"), false) {
        Ok(entered) => {
            for (dir, e) in entered {
                if let Entered::Skipped(why) = e {
                    tracing::info!(dir = %dir.display(), %why, "not entered; codebox uses the other hierarchies");
                }
            }
        }
        Err(DelegationError::NothingToEnter { reasons }) => {
            return Err(SetupError::CannotEnter {
                name,
                user: me.name,
                reasons: reasons.join("; "),
            });
        }
        Err(e) => return Err(e.into()),
    }
    Ok(exec_failed(exec(&args.command, None)))
}

/// Reports a failed exec as `env` and `runuser` do: 127 when the command was not found,
/// 126 when it could not be run.
fn exec_failed(e: SetupError) -> ExitCode {
    let not_found = matches!(&e, SetupError::Exec { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
    eprintln!("codebox: {:#}", anyhow::Error::from(e));
    ExitCode::from(if not_found { 127 } else { 126 })
}

/// A user by name, or by uid when the name is a number no user has.
fn lookup(user: &str) -> Result<User, SetupError> {
    let failed = |source| SetupError::Lookup {
        user: user.to_string(),
        source,
    };
    if let Some(found) = User::from_name(user).map_err(failed)? {
        return Ok(found);
    }
    let by_uid = match user.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)).map_err(failed)?,
        Err(_) => None,
    };
    by_uid.ok_or_else(|| SetupError::UnknownUser(user.to_string()))
}

/// Drops root for good: the user's groups, gid, then uid (real, effective and saved).
/// The CLI is single-threaded here, so the change covers the whole process.
fn become_user(user: &User) -> Result<(), SetupError> {
    let fail = |step| {
        let name = user.name.clone();
        move |source| {
            tracing::error!(?source, user = %name, step, "dropping privileges failed");
            SetupError::Become {
                user: name,
                step,
                source,
            }
        }
    };
    let name = CString::new(user.name.as_bytes()).map_err(|_| SetupError::Become {
        user: user.name.clone(),
        step: "initgroups",
        source: nix::Error::EINVAL,
    })?;
    // 1. Supplementary groups from the group database, as a login would have them.
    nix::unistd::initgroups(&name, user.gid).map_err(fail("initgroups"))?;
    // 2. Group before user: once the uid is the user's, the gid can no longer change.
    nix::unistd::setresgid(user.gid, user.gid, user.gid).map_err(fail("setresgid"))?;
    nix::unistd::setresuid(user.uid, user.uid, user.uid).map_err(fail("setresuid"))?;
    // 3. Root must be gone for good (the saved uid too).
    if nix::unistd::setuid(Uid::from_raw(0)).is_ok() || nix::unistd::getegid() != user.gid {
        return Err(fail("the check that root is gone")(nix::Error::EPERM));
    }
    Ok(())
}

/// Replaces this process with `command`; returns only on failure. With `user`, the
/// environment names the user (HOME, USER, LOGNAME) and drops root's XDG directories.
fn exec(command: &[OsString], user: Option<&User>) -> SetupError {
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    if let Some(user) = user {
        cmd.env("HOME", &user.dir)
            .env("USER", &user.name)
            .env("LOGNAME", &user.name);
        for var in [
            "XDG_RUNTIME_DIR",
            "XDG_CACHE_HOME",
            "XDG_CONFIG_HOME",
            "XDG_DATA_HOME",
            "XDG_STATE_HOME",
            "MAIL",
        ] {
            cmd.env_remove(var);
        }
    }
    let source = cmd.exec();
    let command = command[0].to_string_lossy().into_owned();
    tracing::error!(?source, %command, "exec failed");
    SetupError::Exec { command, source }
}

fn print_setup(
    plan: &DelegationPlan,
    user: &str,
    applied: &[Applied],
    notes: &[String],
) -> anyhow::Result<()> {
    outln!(
        "codebox setup-cgroups: cgroups delegated to {user} (uid {}, gid {}) as {}",
        plan.uid,
        plan.gid,
        plan.name
    )?;
    let (width, dir_width) = widths(plan);
    for (d, a) in plan.dirs.iter().zip(applied) {
        let mut what = vec![if a.created {
            "created".to_string()
        } else {
            "already there, owner set again".to_string()
        }];
        if !a.enabled.is_empty() {
            what.push(format!(
                "enabled {} in {}",
                names(&a.enabled),
                d.parent.join("cgroup.subtree_control").display()
            ));
        }
        if d.version == 2 {
            what.push(if d.controllers.is_empty() {
                "no v2 controllers here: used for cgroup.kill and CLONE_INTO_CGROUP".to_string()
            } else {
                format!("offers {}", names(&d.controllers))
            });
        }
        outln!(
            "  {:width$}  {:dir_width$}  {}",
            d.hierarchy(),
            d.dir.display().to_string(),
            what.join("; ")
        )?;
    }
    for note in notes {
        outln!("  skipped: {note}")?;
    }
    Ok(())
}

fn print_removal(plan: &DelegationPlan, removed: &[(PathBuf, Removal)]) -> anyhow::Result<()> {
    if removed.iter().all(|(_, r)| *r == Removal::Absent) {
        outln!(
            "codebox setup-cgroups: nothing to remove: {} exists in no hierarchy",
            plan.name
        )?;
        return Ok(());
    }
    outln!(
        "codebox setup-cgroups: removed the delegation {}",
        plan.name
    )?;
    let (width, dir_width) = widths(plan);
    for (d, (dir, r)) in plan.dirs.iter().zip(removed) {
        let what = match r {
            Removal::Absent => "was not there".to_string(),
            Removal::Removed { below: 0 } => "removed".to_string(),
            Removal::Removed { below } => format!("removed, with {below} cgroup(s) below it"),
        };
        outln!(
            "  {:width$}  {:dir_width$}  {what}",
            d.hierarchy(),
            dir.display().to_string()
        )?;
    }
    Ok(())
}

/// Column widths of the hierarchy names and the directories.
fn widths(plan: &DelegationPlan) -> (usize, usize) {
    let max = |f: &dyn Fn(&delegate::PlannedDir) -> usize| plan.dirs.iter().map(f).max();
    (
        max(&|d| d.hierarchy().len()).unwrap_or(2),
        max(&|d| d.dir.display().to_string().len()).unwrap_or(0),
    )
}

fn names(cs: &[codebox::sandbox::cgroup::Controller]) -> String {
    cs.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
}

/// How to start the user's codebox inside the delegation, make it permanent, and undo it.
fn next_steps(plan: &DelegationPlan, user: &str, named: bool, exe: &Path, systemd: bool) -> String {
    let exe = exe.display();
    let name_arg = if named {
        format!(" --name {}", plan.name)
    } else {
        String::new()
    };
    let mut text = format!(
        "Start {user}'s codebox inside it, as root (this sets the delegation up if needed, \
         moves into every directory above, becomes {user} and runs the command):\n  \
         {exe} setup-cgroups --user {user}{name_arg} --enter -- {exe} serve\n"
    );
    let v1: Vec<_> = plan.dirs.iter().filter(|d| d.version == 1).collect();
    if !v1.is_empty() {
        text.push_str(&format!(
            "or as {user}, without root (the v1 directories only: moving into a v2 cgroup \
             needs root{}):\n  {exe} setup-cgroups --enter{name_arg} -- {exe} serve\n",
            if plan.dirs.iter().any(|d| d.version == 2) {
                "; codebox then uses the v1 hierarchies alone"
            } else {
                ""
            }
        ));
        // cgexec (cgroup-tools) names cgroups relative to each hierarchy's root.
        let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
        for d in v1 {
            let names = d.controllers.iter().map(|c| c.name());
            match groups.iter_mut().find(|(path, _)| *path == d.cgroup_path) {
                Some((_, cs)) => cs.extend(names),
                None => groups.push((d.cgroup_path.clone(), names.collect())),
            }
        }
        let args: Vec<String> = groups
            .iter()
            .map(|(path, cs)| format!("-g {}:{path}", cs.join(",")))
            .collect();
        text.push_str(&format!(
            "  cgexec {} {exe} serve    (cgexec is in cgroup-tools)\n",
            args.join(" ")
        ));
    }
    if systemd {
        text.push_str(&format!(
            "\nThis host runs systemd, which manages the cgroup tree: prefer running {user}'s \
             codebox as a systemd service with Delegate=yes (deploy/codebox.service), or \
             `systemd-run --user --scope -p Delegate=yes {exe} serve`; see the book, docs/src/operations/service.md, \"Running \
             rootless\".\n"
        ));
    } else {
        text.push_str(&format!(
            "\nCgroup directories do not survive a reboot. To make this permanent, have every \
             boot run, as root, before {user}'s codebox starts (/etc/rc.local, or an init \
             script):\n  {exe} setup-cgroups --user {user}{name_arg}\nor start {user}'s \
             codebox at boot with the --enter line above, which sets it up by itself. (The \
             delegation goes below the cgroups of whoever runs the command: from a boot \
             script, the top of each hierarchy.)\n"
        ));
    }
    text.push_str(&format!(
        "\nUndo (once nothing runs inside): {exe} setup-cgroups --user {user}{name_arg} --remove"
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use codebox::sandbox::cgroup::delegate::ParentDir;
    use codebox::sandbox::cgroup::Controller;

    fn hybrid_plan(name: &str) -> DelegationPlan {
        let parent = |version, dir: &str, controllers: &[Controller]| ParentDir {
            version,
            controllers: controllers.to_vec(),
            enabled: vec![],
            dir: PathBuf::from(dir),
            cgroup_path: "/".into(),
            read_only: false,
            with_cpuset: false,
        };
        let parents = [
            parent(2, "/sys/fs/cgroup/unified", &[]),
            parent(1, "/sys/fs/cgroup/memory", &[Controller::Memory]),
            parent(1, "/sys/fs/cgroup/pids", &[Controller::Pids]),
            parent(
                1,
                "/sys/fs/cgroup/cpu,cpuacct",
                &[Controller::Cpu, Controller::CpuAcct],
            ),
        ];
        delegate::plan(&parents, name, 1001, 1001).unwrap()
    }

    #[test]
    fn next_steps_without_systemd() {
        let plan = hybrid_plan("codebox-delegated-alice");
        let text = next_steps(&plan, "alice", false, Path::new("/usr/bin/codebox"), false);
        for line in [
            "/usr/bin/codebox setup-cgroups --user alice --enter -- /usr/bin/codebox serve",
            "/usr/bin/codebox setup-cgroups --enter -- /usr/bin/codebox serve",
            "cgexec -g memory,pids,cpu,cpuacct:/codebox-delegated-alice /usr/bin/codebox serve",
            "codebox then uses the v1 hierarchies alone",
            "/etc/rc.local",
            "\n  /usr/bin/codebox setup-cgroups --user alice\n",
            "/usr/bin/codebox setup-cgroups --user alice --remove",
        ] {
            assert!(text.contains(line), "{line:?} missing from:\n{text}");
        }
        assert!(!text.contains("Delegate=yes"), "{text}");
    }

    #[test]
    fn next_steps_name_the_directory_and_systemd() {
        let plan = hybrid_plan("team");
        let text = next_steps(&plan, "alice", true, Path::new("codebox"), true);
        assert!(
            text.contains("--user alice --name team --enter --"),
            "{text}"
        );
        assert!(text.contains("--user alice --name team --remove"), "{text}");
        assert!(
            text.contains("cgexec -g memory,pids,cpu,cpuacct:/team"),
            "{text}"
        );
        assert!(text.contains("Delegate=yes"), "{text}");
        assert!(!text.contains("rc.local"), "{text}");
    }

    #[test]
    fn pure_v2_has_no_user_side_line() {
        let parents = [ParentDir {
            version: 2,
            controllers: vec![Controller::Memory],
            enabled: vec![],
            dir: PathBuf::from("/sys/fs/cgroup"),
            cgroup_path: "/".into(),
            read_only: false,
            with_cpuset: false,
        }];
        let plan = delegate::plan(&parents, "d", 1001, 1001).unwrap();
        let text = next_steps(&plan, "alice", true, Path::new("codebox"), false);
        assert!(!text.contains("cgexec"), "{text}");
        assert!(!text.contains("without root"), "{text}");
        assert!(text.contains("--enter -- codebox serve"), "{text}");
    }
}
