//! The microVM backend's lines of the report: the guest tree, the accelerator and why,
//! and (when the profile's backend is `microvm`) a real run in a real VM.

use std::time::Instant;

use super::{Check, Status};
use crate::execution::{ExecutionRequest, Host};
use crate::microvm::{self, accel, image, qemu::Accel, Backend};
use crate::profile::Profile;
use crate::runtime::Language;
use crate::sandbox;

/// The checks; `guest`: the tree named by the operator, if any.
pub fn checks(host: &Host, profile: &Profile, guest: Option<&std::path::Path>) -> Vec<Check> {
    let required = profile.backend == Backend::Microvm;
    let mut out = Vec::new();
    let image = match image::locate(guest).and_then(|dir| image::load(&dir)) {
        Ok(img) => img,
        Err(e) => {
            out.push(
                Check::new("microvm guest", Status::Missing, e.to_string(), required)
                    .fix("build it with `cargo xtask guest` (a release ships share/codebox/guest)"),
            );
            return out;
        }
    };
    let d = &image.description;
    match image.check_build() {
        Ok(_) => out.push(Check::new(
            "microvm guest",
            Status::Ok,
            format!(
                "{}: kernel {} ({}), {} modules, rootfs image of manifest {}…, {}, {} verification",
                image.dir.display(),
                d.kernel_release,
                d.kernel_version,
                d.modules.len(),
                &d.rootfs_manifest_sha256[..12.min(d.rootfs_manifest_sha256.len())],
                d.qemu,
                image.verification
            ),
            required,
        )),
        Err(e) => {
            out.push(
                Check::new("microvm guest", Status::Missing, e.to_string(), required)
                    .fix("rebuild the guest with `cargo xtask guest`"),
            );
            return out;
        }
    }
    let choice = match accel::choose(
        host,
        &image,
        accel::AccelMode::Auto,
        crate::rootfs::default_stamp_dir().as_deref(),
    ) {
        Ok(c) => c,
        Err(e) => {
            out.push(Check::new(
                "microvm accelerator",
                Status::Missing,
                e.to_string(),
                required,
            ));
            return out;
        }
    };
    let mut line = Check::new(
        "microvm accelerator",
        match choice.accel {
            Accel::Kvm => Status::Ok,
            Accel::Tcg => Status::Degraded,
        },
        format!(
            "{}: {}{}",
            choice.accel.name(),
            choice.reason,
            match (choice.accel, super::super::microvm::tsc::host_khz()) {
                (Accel::Tcg, Some(khz)) => format!("; guest TSC {khz} kHz given"),
                (Accel::Tcg, None) =>
                    "; the host's TSC is not invariant: the guest must calibrate it".into(),
                _ => String::new(),
            }
        ),
        false,
    );
    if let Some(fix) = &choice.fix {
        line = line.fix(fix.clone());
    }
    out.push(line);
    if required {
        out.push(boot_check(host, profile, &image, choice.accel));
    }
    out
}

/// `print` of Python's version in a fresh microVM.
fn boot_check(host: &Host, profile: &Profile, image: &image::GuestImage, accel: Accel) -> Check {
    let layer = "python in microvm";
    let request = ExecutionRequest {
        language: Language::Python,
        code: "import sys; print('Python', sys.version.split()[0])".into(),
        files: Default::default(),
        workspace: None,
        limits: profile.limits.clone(),
        policy: profile.policy.clone(),
        egress: None,
        zygote: false,
    };
    let started = Instant::now();
    match microvm::run::execute(host, image, accel, &request, &mut sandbox::Discard) {
        Ok((r, ending)) if !r.failed() && ending.end.is_normal() => Check::new(
            layer,
            Status::Ok,
            format!(
                "{} in {:.1} s (boot and run, {}), landlock {:?} in the guest",
                r.stdout.trim(),
                started.elapsed().as_secs_f64(),
                accel.name(),
                r.landlock
            ),
            true,
        ),
        Ok((r, ending)) => Check::new(
            layer,
            Status::Missing,
            format!("{}; {}", r.ending(), ending.end.describe()),
            true,
        ),
        Err(e) => Check::new(layer, Status::Missing, e.to_string(), true),
    }
}
