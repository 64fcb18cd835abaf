//! `codebox doctor`: what this host gives, layer by layer.

use super::out::outln;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use codebox::doctor::{self, Status};
use codebox::profile::Profile;
use codebox::rootfs;
use codebox::sandbox::idmap::DEFAULT_ROOT_HOST_ID;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The profile whose hard requirements decide the exit status.
    #[arg(long, default_value = "default", value_name = "NAME|PATH")]
    profile: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// The rootfs [default: $CODEBOX_ROOTFS, else ../share/codebox/rootfs from the
    /// binary's directory, else a checkout's target/rootfs].
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let profile = Profile::load(&args.profile)?;
    let rootfs_dir = rootfs::locate(args.rootfs.as_deref()).ok();
    let report = doctor::run(&profile, rootfs_dir.as_deref(), DEFAULT_ROOT_HOST_ID);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        outln!("codebox doctor (profile {})\n", report.profile)?;
        let width = report
            .checks
            .iter()
            .map(|c| c.layer.len())
            .max()
            .unwrap_or(10);
        for c in &report.checks {
            let status = match c.status {
                Status::Ok => "ok",
                Status::Degraded => "degraded",
                Status::Missing => "MISSING",
            };
            let req = if c.required { "" } else { " (optional)" };
            outln!("  {:width$}  {status:8}  {}{req}", c.layer, c.detail)?;
            if let Some(fix) = &c.fix {
                outln!("  {:width$}  {:8}  fix: {fix}", "", "")?;
            }
        }
        outln!(
            "\n{}",
            if report.ready {
                "ready: every hard requirement of the profile is met"
            } else {
                "NOT READY: a hard requirement of the profile is missing (see fix lines)"
            }
        )?;
    }
    Ok(if report.ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
