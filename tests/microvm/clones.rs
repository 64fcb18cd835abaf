//! Warm clones from templates, in this process: their randomness, at both stages.

use std::time::Instant;

use libtest_mimic::Failed;

use super::cost;
use crate::common::guest::*;
use crate::common::*;

/// What the warm tests share: one template per language, booted once per test binary.
struct Warm {
    host: codebox::execution::Host,
    image: codebox::microvm::image::GuestImage,
    rt: tokio::runtime::Runtime,
    build_id: String,
    templates:
        std::collections::HashMap<(&'static str, Stage), codebox::microvm::template::Template>,
}

thread_local! {
    static WARM: std::cell::RefCell<Option<Warm>> = const { std::cell::RefCell::new(None) };
}

fn language(name: &str) -> codebox::runtime::Language {
    match name {
        "python" => codebox::runtime::Language::Python,
        _ => codebox::runtime::Language::TypeScript,
    }
}

use codebox::microvm::template::Stage;

/// The template of `lang` at `stage`, made on first use (every VM of this process is
/// launched from this, its only thread).
fn with_template<T>(
    lang: &'static str,
    stage: Stage,
    f: impl FnOnce(&Warm, &codebox::microvm::template::Template) -> T,
) -> T {
    use codebox::microvm::{image, qemu::Accel, run, template};
    WARM.with(|cell| {
        let mut warm = cell.borrow_mut();
        if warm.is_none() {
            let rootfs = codebox::rootfs::verify(&rootfs_dir(), None).expect("rootfs");
            let host = codebox::execution::Host::new(
                rootfs,
                codebox::sandbox::IdMapping::for_current_process(
                    codebox::sandbox::idmap::DEFAULT_ROOT_HOST_ID,
                ),
            );
            let image = image::load(&guest_dir()).expect("guest tree");
            let build_id = image.description.init_build_id.clone();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            *warm = Some(Warm {
                host,
                image,
                rt,
                build_id,
                templates: Default::default(),
            });
        }
        let w = warm.as_mut().unwrap();
        if !w.templates.contains_key(&(lang, stage)) {
            let profile = codebox::profile::Profile::load("default").unwrap();
            let mut spec =
                run::run_spec(language(lang), &profile.limits, &profile.policy).unwrap();
            if lang == "python" && stage == Stage::Interpreter {
                // Seeded while the template waits: what the boot frame must reseed.
                spec.env.push(format!("{}=random,numpy", codebox::runtime::PRELOAD_ENV));
            }
            let started = Instant::now();
            let (jailed, ram) = template::launch(&w.host, &w.image, Accel::Tcg, &spec).unwrap();
            let t = w
                .rt
                .block_on(template::make(
                    jailed,
                    ram,
                    &w.build_id,
                    language(lang),
                    spec,
                    stage,
                    started,
                ))
                .unwrap_or_else(|e| panic!("{lang} template: {e}"));
            println!(
                "cost: {lang} {stage:?} template: {:.1} s (boot {:.2} s, to ready {:.2} s, snapshot {:.3} s, device state {} KiB)",
                started.elapsed().as_secs_f64(),
                t.figures.boot.as_secs_f64(),
                t.figures.ready.as_secs_f64(),
                t.figures.snapshot.as_secs_f64(),
                t.figures.state_bytes / 1024
            );
            w.templates.insert((lang, stage), t);
        }
        let w = warm.as_ref().unwrap();
        f(w, &w.templates[&(lang, stage)])
    })
}

/// One run of `code` on a fresh clone of `lang`'s template: (result, restore time).
fn run_clone(
    lang: &'static str,
    stage: Stage,
    code: &str,
) -> (codebox::execution::ExecutionResult, std::time::Duration) {
    use codebox::microvm::run;
    with_template(lang, stage, |w, t| {
        let launched = Instant::now();
        let jailed = t.launch_clone(&w.host, &w.image).unwrap();
        let (sb, restore) =
            w.rt.block_on(t.restore(jailed, launched, std::time::Duration::from_secs(120)))
                .unwrap_or_else(|e| panic!("{lang} clone: {e}"));
        let frame = codebox::runtime::ephemeral(codebox::runtime::boot_frame(code));
        let (outcome, ending) =
            w.rt.block_on(run::capture(
                sb,
                frame,
                None,
                (t.spec.limits.stdout_cap, t.spec.limits.stderr_cap),
                t.spec.limits.timeout,
                std::future::pending::<()>(),
                |_, _| {},
            ))
            .unwrap();
        assert!(
            ending.end.is_normal(),
            "{:?}: {}",
            ending.end,
            ending.console
        );
        let mut r = codebox::execution::result_from(language(lang), None, true, outcome);
        r.backend = codebox::microvm::Backend::Microvm;
        (r, restore)
    })
}

/// The four values of `PY` and the three of `TS` in two clones' output.
const PY: &str = r#"
import os, random, uuid
print(os.urandom(16).hex(), random.random(), uuid.uuid4(), hash("codebox"))
"#;
const TS: &str = "const b = new Uint8Array(16); crypto.getRandomValues(b); \
     console.log(Array.from(b).join(','), Math.random(), crypto.randomUUID());";

fn two_clones(lang: &'static str, stage: Stage, code: &str, n: usize) -> [Vec<String>; 2] {
    let run = || {
        let (r, restore) = run_clone(lang, stage, code);
        println!(
            "cost: {lang} {stage:?} clone restored in {:.2} s",
            restore.as_secs_f64()
        );
        assert_eq!(r.exit_code, Some(0), "{r:?}");
        let f: Vec<String> = r.stdout.split_whitespace().map(String::from).collect();
        assert_eq!(f.len(), n, "{}", r.stdout);
        f
    };
    [run(), run()]
}

/// Two clones of a kernel-stage template share no randomness at all: the kernel's pool is
/// reseeded from the host before each starts its own interpreter, which draws its hash
/// seed (Python) and seeds Math.random (V8) itself.
pub fn kernel_stage_clones_share_no_randomness() -> Result<(), Failed> {
    if !microvm_available("kernel_stage_clones_share_no_randomness") {
        return Ok(());
    }
    let started = Instant::now();
    let [a, b] = two_clones("python", Stage::Kernel, PY, 4);
    for (i, what) in ["os.urandom", "random", "uuid4", "hash seed"]
        .iter()
        .enumerate()
    {
        assert_ne!(a[i], b[i], "two clones share {what}: {a:?} / {b:?}");
    }
    let [a, b] = two_clones("typescript", Stage::Kernel, TS, 3);
    for (i, what) in ["crypto.getRandomValues", "Math.random", "crypto.randomUUID"]
        .iter()
        .enumerate()
    {
        assert_ne!(a[i], b[i], "two clones share {what}: {a:?} / {b:?}");
    }
    cost("kernel_stage_clones_share_no_randomness", started, 4);
    Ok(())
}

/// Two clones of an interpreter-stage template (the interpreter started in the template)
/// draw their own os.urandom, random, uuid4 and crypto.getRandomValues (kernel pool
/// reseeded, runtime generators reseeded at the boot frame); what the interpreter drew
/// at its start — Python's hash seed, V8's Math.random state — is the template's, in
/// every clone, as documented in microvm/template.rs. This test holds the documentation
/// to the truth both ways.
pub fn interpreter_stage_clones_share_only_what_is_documented() -> Result<(), Failed> {
    if !microvm_available("interpreter_stage_clones_share_only_what_is_documented") {
        return Ok(());
    }
    let started = Instant::now();
    // random and numpy were imported (and seeded) in the template, before the snapshot.
    let code = format!("{PY}\nimport numpy\nprint(numpy.random.random())");
    let [a, b] = two_clones("python", Stage::Interpreter, &code, 5);
    for (i, what) in ["os.urandom", "random", "uuid4"].iter().enumerate() {
        assert_ne!(a[i], b[i], "two clones share {what}: {a:?} / {b:?}");
    }
    assert_ne!(
        a[4], b[4],
        "two clones share numpy's global generator: {a:?} / {b:?}"
    );
    assert_eq!(a[3], b[3], "the hash seed is shared, as documented");
    let [a, b] = two_clones("typescript", Stage::Interpreter, TS, 3);
    assert_ne!(a[0], b[0], "crypto.getRandomValues: {a:?} / {b:?}");
    assert_ne!(a[2], b[2], "crypto.randomUUID: {a:?} / {b:?}");
    assert_eq!(a[1], b[1], "Math.random's state is shared, as documented");
    cost(
        "interpreter_stage_clones_share_only_what_is_documented",
        started,
        4,
    );
    Ok(())
}
