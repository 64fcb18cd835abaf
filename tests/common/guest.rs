//! The microVM guest tree the tests use, and whether it fits the binary under test.

use std::path::{Path, PathBuf};

use super::{codebox_bin, sandbox_available, strict};

/// `$CODEBOX_GUEST`, else the checkout's `target/guest` (`cargo xtask guest`).
pub fn guest_dir() -> PathBuf {
    std::env::var_os("CODEBOX_GUEST")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/guest"))
}

/// The GNU build ID of an ELF file: its note is near the start of the file.
fn file_build_id(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = vec![0u8; 1 << 20];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    // namesz 4, descsz 20, type NT_GNU_BUILD_ID (3), "GNU\0"
    let pattern = [4u8, 0, 0, 0, 20, 0, 0, 0, 3, 0, 0, 0, b'G', b'N', b'U', 0];
    let at = head[..n].windows(16).position(|w| w == pattern)? + 16;
    Some(
        head.get(at..at + 20)?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// Whether microVM tests can run here; prints the reason when they cannot.
pub fn microvm_available(test: &str) -> bool {
    if !sandbox_available(test) {
        return false;
    }
    let guest = guest_dir();
    let reason = match std::fs::read_to_string(guest.join("guest.toml")) {
        Err(_) => Some(format!(
            "no guest tree at {} (run `cargo xtask guest`)",
            guest.display()
        )),
        Ok(text) => {
            let want = file_build_id(&codebox_bin());
            match want {
                Some(id) if text.contains(&format!("init_build_id = \"{id}\"")) => None,
                _ => Some(format!(
                    "the guest at {} was built for another codebox binary (run `cargo xtask guest`)",
                    guest.display()
                )),
            }
        }
    };
    match reason {
        None => true,
        Some(r) if strict() => panic!("{test}: required feature missing: {r}"),
        Some(r) => {
            eprintln!("SKIP {test}: {r}");
            false
        }
    }
}
