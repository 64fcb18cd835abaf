//! This binary's GNU build ID (`NT_GNU_BUILD_ID`), read from its own loaded program
//! headers: the host and the guest init must be one build, and `strip` keeps the note.

/// The build ID as lower-case hex, or `None` when the binary has none (linked without
/// `--build-id`).
pub fn own() -> Option<String> {
    let mut found: Option<String> = None;
    // SAFETY: dl_iterate_phdr calls `callback` synchronously with pointers valid for the
    // call; `data` points at `found`, which outlives the call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(callback),
            (&mut found as *mut Option<String>).cast::<libc::c_void>(),
        );
    }
    found
}

unsafe extern "C" fn callback(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: the loader passes a valid info for the duration of the call; `data` is the
    // `Option<String>` given to dl_iterate_phdr above.
    let (info, found) = unsafe { (&*info, &mut *data.cast::<Option<String>>()) };
    // The first object is the main program; stop after it either way.
    let headers = if info.dlpi_phdr.is_null() {
        &[][..]
    } else {
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers of the loaded object.
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
    };
    for ph in headers {
        if ph.p_type != libc::PT_NOTE {
            continue;
        }
        let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
        // SAFETY: a PT_NOTE segment of a loaded object lies within one of its mapped
        // PT_LOAD segments (the linker puts .note.gnu.build-id in the first one).
        let notes = unsafe { std::slice::from_raw_parts(start as *const u8, ph.p_memsz as usize) };
        if let Some(id) = find_build_id(notes) {
            *found = Some(id);
            break;
        }
    }
    1
}

/// Walks ELF notes (`namesz`, `descsz`, `type`, name and desc each padded to 4 bytes) for
/// the GNU build ID.
pub fn find_build_id(mut notes: &[u8]) -> Option<String> {
    let word = |b: &[u8]| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let pad = |n: usize| n.div_ceil(4) * 4;
    while notes.len() >= 12 {
        let (namesz, descsz, kind) = (word(&notes[0..]), word(&notes[4..]), word(&notes[8..]));
        let name_end = 12usize.checked_add(pad(namesz))?;
        let desc_end = name_end.checked_add(pad(descsz))?;
        if desc_end > notes.len() {
            return None;
        }
        if kind == 3 && namesz == 4 && &notes[12..16] == b"GNU\0" {
            let desc = &notes[name_end..name_end + descsz];
            return Some(desc.iter().map(|b| format!("{b:02x}")).collect());
        }
        notes = &notes[desc_end..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_has_one() {
        let id = own().expect("cargo links with --build-id");
        assert!(
            id.len() >= 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
    }

    #[test]
    fn notes_are_walked_and_bounded() {
        let mut n = Vec::new();
        // An unrelated note first: name "ab" (padded), desc of 3 bytes (padded).
        n.extend(3u32.to_ne_bytes());
        n.extend(3u32.to_ne_bytes());
        n.extend(1u32.to_ne_bytes());
        n.extend(b"ab\0\0xyz\0");
        n.extend(4u32.to_ne_bytes());
        n.extend(2u32.to_ne_bytes());
        n.extend(3u32.to_ne_bytes());
        n.extend(b"GNU\0\xab\xcd\0\0");
        assert_eq!(find_build_id(&n).as_deref(), Some("abcd"));
        // A size that runs past the end is refused, not read.
        let mut bad = Vec::new();
        bad.extend(4u32.to_ne_bytes());
        bad.extend(u32::MAX.to_ne_bytes());
        bad.extend(3u32.to_ne_bytes());
        bad.extend(b"GNU\0");
        assert_eq!(find_build_id(&bad), None);
    }
}
