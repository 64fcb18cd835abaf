//! Reading what an ELF file asks of the dynamic loader: its interpreter (`PT_INTERP`), the
//! libraries it needs (`DT_NEEDED`) and where it says to look for them (`DT_RPATH`,
//! `DT_RUNPATH`). Parsed from the file itself, never by running `ldd`.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};
use goblin::container::Ctx;
use goblin::elf::dynamic::{Dynamic, DT_NEEDED, DT_RPATH, DT_RUNPATH};
use goblin::elf::program_header::{ProgramHeader, PT_INTERP};
use goblin::elf::Elf;
use goblin::strtab::Strtab;

const MAGIC: [u8; 4] = *b"\x7fELF";

/// Class, byte order and machine: the loader only accepts a library whose kind equals the
/// kind of the object that needs it, and skips other files of the right name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    pub class: u8,
    pub data: u8,
    pub machine: u16,
}

/// The dynamic-loading facts of one ELF file.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Deps {
    pub interp: Option<String>,
    pub needed: Vec<String>,
    /// `DT_RPATH` entries, split at `:`.
    pub rpath: Vec<String>,
    /// `DT_RUNPATH` entries, split at `:`.
    pub runpath: Vec<String>,
}

/// Does the file start with the ELF magic? Unreadable files are an error, short ones are not ELF.
pub fn is_elf(path: &Path) -> Result<bool> {
    let mut head = [0u8; 4];
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    match file.read_exact(&mut head) {
        Ok(()) => Ok(head == MAGIC),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The kind of an ELF file, from its first 20 bytes; `None` if it is not ELF (or unreadable,
/// which the loader treats the same way: it goes on searching).
pub fn kind(path: &Path) -> Option<Kind> {
    let mut head = [0u8; 20];
    File::open(path).ok()?.read_exact(&mut head).ok()?;
    kind_of(&head)
}

fn kind_of(head: &[u8]) -> Option<Kind> {
    if head.len() < 20 || head[..4] != MAGIC {
        return None;
    }
    let machine = [head[18], head[19]];
    let machine = match head[5] {
        1 => u16::from_le_bytes(machine),
        2 => u16::from_be_bytes(machine),
        _ => return None,
    };
    Some(Kind {
        class: head[4],
        data: head[5],
        machine,
    })
}

/// Read the kind and dynamic dependencies of the ELF file at `path`.
pub fn read(path: &Path) -> Result<(Kind, Deps)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&bytes).with_context(|| format!("unreadable ELF file {}", path.display()))
}

/// Only the header, the program headers and the dynamic segment are looked at; symbol tables
/// and relocations (large in a 100 MB `deno`) are not.
fn parse(bytes: &[u8]) -> Result<(Kind, Deps)> {
    let Some(kind) = kind_of(bytes) else {
        bail!("not an ELF file")
    };
    let header = Elf::parse_header(bytes)?;
    let ctx = Ctx::new(header.container()?, header.endianness()?);
    let phdrs = ProgramHeader::parse(bytes, header.e_phoff as usize, header.e_phnum as usize, ctx)?;

    let mut deps = Deps::default();
    if let Some(ph) = phdrs.iter().find(|ph| ph.p_type == PT_INTERP) {
        let start = ph.p_offset as usize;
        let raw = start
            .checked_add(ph.p_filesz as usize)
            .and_then(|end| bytes.get(start..end))
            .context("PT_INTERP lies outside the file")?;
        let raw = raw.split(|&b| b == 0).next().unwrap_or_default();
        deps.interp = Some(String::from_utf8(raw.to_vec()).context("PT_INTERP is not UTF-8")?);
    }

    let Some(dynamic) = Dynamic::parse(bytes, &phdrs, ctx)? else {
        return Ok((kind, deps)); // statically linked
    };
    let strtab = Strtab::parse(bytes, dynamic.info.strtab, dynamic.info.strsz, 0)?;
    for d in &dynamic.dyns {
        let list = match d.d_tag {
            DT_NEEDED => &mut deps.needed,
            DT_RPATH => &mut deps.rpath,
            DT_RUNPATH => &mut deps.runpath,
            _ => continue,
        };
        let s = strtab.get_at(d.d_val as usize).with_context(|| {
            format!("dynamic tag {:#x} points outside the string table", d.d_tag)
        })?;
        if d.d_tag == DT_NEEDED {
            list.push(s.to_owned());
        } else {
            list.extend(s.split(':').map(str::to_owned));
        }
    }
    Ok((kind, deps))
}

/// A minimal ELF writer for tests: a 64-bit little-endian x86-64 shared object with just
/// `PT_INTERP`, `PT_LOAD`, `PT_DYNAMIC` and a string table. Enough for [`read`] and for the
/// loader search in `ldso`.
#[cfg(test)]
pub mod fake {
    use super::Deps;

    const EHDR: usize = 64;
    const PHDR: usize = 56;

    pub fn build(deps: &Deps) -> Vec<u8> {
        // String table: offset 0 is the empty string.
        let mut strtab = vec![0u8];
        let mut add = |s: &str| {
            let off = strtab.len() as u64;
            strtab.extend_from_slice(s.as_bytes());
            strtab.push(0);
            off
        };
        let mut dyns: Vec<(u64, u64)> = Vec::new();
        for n in &deps.needed {
            dyns.push((1, add(n)));
        }
        if !deps.rpath.is_empty() {
            dyns.push((15, add(&deps.rpath.join(":"))));
        }
        if !deps.runpath.is_empty() {
            dyns.push((29, add(&deps.runpath.join(":"))));
        }
        let interp = deps.interp.as_ref().map(|i| {
            let mut v = i.as_bytes().to_vec();
            v.push(0);
            v
        });

        let phnum = 2 + usize::from(interp.is_some());
        let interp_off = EHDR + phnum * PHDR;
        let interp_len = interp.as_ref().map_or(0, Vec::len);
        let strtab_off = interp_off + interp_len;
        let dyn_off = (strtab_off + strtab.len()).next_multiple_of(8);
        dyns.push((5, strtab_off as u64)); // DT_STRTAB (vaddr == offset)
        dyns.push((10, strtab.len() as u64)); // DT_STRSZ
        dyns.push((0, 0)); // DT_NULL
        let dyn_len = dyns.len() * 16;
        let total = dyn_off + dyn_len;

        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(b"\x7fELF");
        out.extend_from_slice(&[2, 1, 1, 0]); // 64-bit, little-endian, version 1, SysV
        out.extend_from_slice(&[0; 8]);
        let u16le = |v: u16| v.to_le_bytes();
        out.extend_from_slice(&u16le(3)); // ET_DYN
        out.extend_from_slice(&u16le(62)); // EM_X86_64
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes()); // e_entry
        out.extend_from_slice(&(EHDR as u64).to_le_bytes()); // e_phoff
        out.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
        out.extend_from_slice(&0u32.to_le_bytes()); // e_flags
        out.extend_from_slice(&u16le(EHDR as u16));
        out.extend_from_slice(&u16le(PHDR as u16));
        out.extend_from_slice(&u16le(phnum as u16));
        out.extend_from_slice(&u16le(64)); // e_shentsize
        out.extend_from_slice(&u16le(0)); // e_shnum
        out.extend_from_slice(&u16le(0)); // e_shstrndx

        let mut phdr = |p_type: u32, flags: u32, off: usize, len: usize| {
            out.extend_from_slice(&p_type.to_le_bytes());
            out.extend_from_slice(&flags.to_le_bytes());
            for v in [off, off, off, len, len, 8] {
                out.extend_from_slice(&(v as u64).to_le_bytes());
            }
        };
        if interp.is_some() {
            phdr(3, 4, interp_off, interp_len); // PT_INTERP
        }
        phdr(1, 4, 0, total); // PT_LOAD of the whole file at vaddr 0
        phdr(2, 6, dyn_off, dyn_len); // PT_DYNAMIC
        if let Some(i) = interp {
            out.extend_from_slice(&i);
        }
        out.extend_from_slice(&strtab);
        out.resize(dyn_off, 0);
        for (tag, val) in dyns {
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&val.to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn fake_elf_round_trips() {
        let deps = Deps {
            interp: Some("/lib64/ld-linux-x86-64.so.2".into()),
            needed: s(&["libfoo.so.1", "libc.so.6"]),
            rpath: s(&["$ORIGIN/../lib", "/opt/x"]),
            runpath: vec![],
        };
        let (kind, got) = parse(&fake::build(&deps)).unwrap();
        assert_eq!(got, deps);
        assert_eq!(
            kind,
            Kind {
                class: 2,
                data: 1,
                machine: 62
            }
        );
    }

    #[test]
    fn not_elf_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("script.py");
        std::fs::write(&p, "print('hi')\n").unwrap();
        assert!(!is_elf(&p).unwrap());
        let err = format!("{:#}", read(&p).unwrap_err());
        assert!(
            err.contains("unreadable ELF file") && err.contains("script.py"),
            "{err}"
        );
        assert_eq!(kind(&p), None);
    }

    #[test]
    fn host_python_needs_libc_and_has_an_interpreter() {
        let py = Path::new("/usr/bin/python3.11");
        if !py.exists() {
            eprintln!("skipped: {} is not installed", py.display());
            return;
        }
        let (kind, deps) = read(py).unwrap();
        assert!(is_elf(py).unwrap());
        assert_eq!(super::kind(py), Some(kind));
        assert!(
            deps.interp.as_deref().unwrap().contains("ld-linux"),
            "{deps:?}"
        );
        assert!(deps.needed.iter().any(|n| n == "libc.so.6"), "{deps:?}");
    }
}
