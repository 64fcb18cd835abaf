//! [`SkillStore`]: the skills directory on the host.
//!
//! Every access goes through a descriptor of the root directory: entries are opened with
//! `openat(O_NOFOLLOW)` and checked to be directories and regular files, so a symlink
//! planted below the root is reported, never followed. Writes build a complete skill in a
//! `.tmp-*` directory and rename or exchange it into place.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, renameat, renameat2, AtFlags, Flock, FlockArg, OFlag, RenameFlags};
use nix::sys::stat::{fchmod, fstatat, mkdirat, Mode, SFlag};

use super::frontmatter::{self, Header};
use super::{name, usage};
use super::{Error, NewSkill, Result, Skill, SkillLanguage, SkillSummary};
use super::{MAX_CODE_BYTES, MAX_DESCRIPTION_BYTES, MAX_SKILLS, MAX_USAGE_BYTES};

/// Prefix of the directories of saves and deletes in progress.
const TEMP_PREFIX: &str = ".tmp-";
/// Largest `SKILL.md` read (hand-written ones may exceed what `save` writes).
const MAX_SKILL_MD_BYTES: usize = 64 * 1024;
/// What `__init__.py` of a Python skill contains.
const PYTHON_INIT: &str = "from .skill import *\n";
/// A read that finds a file missing is retried this many times: a concurrent save or
/// delete may have swapped the directory away between opening it and reading it.
const READ_ATTEMPTS: usize = 3;

const DIR_MODE: u32 = 0o755;
const FILE_MODE: u32 = 0o644;

/// The skills directory: save, list, get and delete skills. `Send + Sync`; saves and
/// deletes are serialised, reads run concurrently with them and see whole skills only.
#[derive(Debug)]
pub struct SkillStore {
    root: PathBuf,
    /// The root directory, opened once: all access is relative to it.
    dir: OwnedFd,
    /// Serialises saves and deletes within this process (an `flock` does so between
    /// processes).
    writer: Mutex<()>,
}

/// Why a read failed: a missing file (maybe a concurrent swap; retried) or an error.
enum Fault {
    Missing(&'static str),
    Failed(Error),
}

impl From<Error> for Fault {
    fn from(e: Error) -> Self {
        Fault::Failed(e)
    }
}

/// What was read of one skill.
struct Loaded {
    markdown: String,
    header: Header,
    usage: String,
    code: Option<String>,
}

/// Held while saving or deleting: the mutex, then the `flock` of the root.
struct WriteLock<'a> {
    _flock: Option<Flock<OwnedFd>>,
    _guard: MutexGuard<'a, ()>,
}

impl SkillStore {
    /// Opens the store at `root`, creating it (0755) if missing, and removes leftover
    /// temporary directories (`.tmp-*`) of interrupted saves and deletes.
    pub fn open(root: &Path) -> Result<SkillStore> {
        let existed = root.symlink_metadata().is_ok();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(root)
            .map_err(|source| io("create the skills directory", root, source))?;
        let dir = nix::fcntl::open(
            root,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io("open the skills directory", root, e.into()))?;
        if !existed {
            // Sandboxes read it as another user: the umask must not narrow 0755.
            fchmod(&dir, Mode::from_bits_truncate(DIR_MODE))
                .map_err(|e| io("set the mode of", root, e.into()))?;
        }
        let store = SkillStore {
            root: root.to_path_buf(),
            dir,
            writer: Mutex::new(()),
        };
        {
            let _lock = store.lock_writes();
            for entry in store.entries()? {
                if entry.starts_with(TEMP_PREFIX) {
                    tracing::info!(entry, root = %root.display(), "removing an interrupted save");
                    store.remove_quietly(&entry);
                }
            }
        }
        Ok(store)
    }

    /// The directory the store lives in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Saves `skill`, replacing a skill of the same name; returns it as [`get`] would.
    ///
    /// [`get`]: SkillStore::get
    pub fn save(&self, skill: NewSkill) -> Result<Skill> {
        let NewSkill {
            name,
            description,
            language,
            code,
            usage,
        } = skill;
        let description = description.trim().to_string();
        check(&name, &description, &code, usage.as_deref())?;
        let usage = match usage.as_deref().map(frontmatter::tidy) {
            Some(u) if !u.is_empty() => u.to_string(),
            _ => frontmatter::tidy(&usage::default_usage(&name, &description, language, &code))
                .to_string(),
        };
        let header = Header {
            name,
            description,
            language,
        };
        let markdown = frontmatter::render(&header, &usage);

        let _lock = self.lock_writes();
        let exists = match fstatat(
            &self.dir,
            header.name.as_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(_) => true,
            Err(Errno::ENOENT) => false,
            Err(e) => return Err(io("inspect", &self.root.join(&header.name), e.into())),
        };
        if !exists && self.count()? >= MAX_SKILLS {
            return Err(Error::TooMany { max: MAX_SKILLS });
        }
        let mut files = vec![
            ("SKILL.md", markdown.as_str()),
            (language.code_file(), &code),
        ];
        if language == SkillLanguage::Python {
            files.push(("__init__.py", PYTHON_INIT));
        }
        let temp = self.build(&files)?;
        let installed = if exists {
            self.replace(&temp, &header.name).map(Some)
        } else {
            renameat(&self.dir, temp.as_str(), &self.dir, header.name.as_str())
                .map(|()| None)
                .map_err(|e| io("rename into place", &self.root.join(&temp), e.into()))
        };
        let old = match installed {
            Ok(old) => old,
            Err(err) => {
                self.remove_quietly(&temp);
                return Err(err);
            }
        };
        let synced = self.sync_root();
        if let Some(old) = old {
            self.remove_quietly(&old);
        }
        synced?;
        tracing::info!(skill = header.name, %language, replaced = exists, "skill saved");
        Ok(Skill {
            import: language.import_line(&header.name),
            name: header.name,
            description: header.description,
            language,
            usage,
            code,
        })
    }

    /// The checks [`save`] makes before writing anything (name, sizes, text).
    ///
    /// [`save`]: SkillStore::save
    pub fn check_new(name: &str, description: &str, code: &str, usage: Option<&str>) -> Result<()> {
        check(name, description.trim(), code, usage)
    }

    /// The skills, sorted by name. With a `query`, only those whose name or description
    /// contains every word of it (case-insensitive). Corrupt skills are skipped (and
    /// logged).
    pub fn list(&self, query: Option<&str>) -> Result<Vec<SkillSummary>> {
        let words: Vec<String> = query
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_lowercase)
            .collect();
        let mut out = Vec::new();
        for entry in self.entries()? {
            if entry.starts_with('.') {
                continue;
            }
            if let Err(err) = name::validate(&entry) {
                tracing::debug!(%err, root = %self.root.display(), "skipping a stray entry");
                continue;
            }
            let header = match self.load(&entry, false) {
                Ok(loaded) => loaded.header,
                // Deleted since the directory was listed.
                Err(Error::NotFound { .. }) => continue,
                Err(err) => {
                    tracing::warn!(%err, "skipping a corrupt skill");
                    continue;
                }
            };
            let haystack = format!("{}\n{}", header.name, header.description).to_lowercase();
            if words.iter().all(|w| haystack.contains(w.as_str())) {
                out.push(SkillSummary {
                    name: header.name,
                    description: header.description,
                    language: header.language,
                });
            }
        }
        Ok(out)
    }

    /// The skill `name` in full.
    pub fn get(&self, name: &str) -> Result<Skill> {
        name::validate(name)?;
        let loaded = self.load(name, true)?;
        let Header {
            name,
            description,
            language,
        } = loaded.header;
        Ok(Skill {
            import: language.import_line(&name),
            name,
            description,
            language,
            usage: loaded.usage,
            code: loaded.code.unwrap_or_default(),
        })
    }

    /// Deletes the skill `name` (also when it is corrupt).
    pub fn delete(&self, name: &str) -> Result<()> {
        name::validate(name)?;
        let _lock = self.lock_writes();
        let temp = self.temp_name()?;
        match renameat(&self.dir, name, &self.dir, temp.as_str()) {
            Ok(()) => {}
            Err(Errno::ENOENT) => return Err(Error::NotFound { name: name.into() }),
            Err(e) => return Err(io("move away", &self.root.join(name), e.into())),
        }
        self.sync_root()?;
        tracing::info!(skill = name, "skill deleted");
        self.remove_quietly(&temp);
        Ok(())
    }

    /// The names of the entries that are named like skills (corrupt ones included),
    /// sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        Ok(self
            .entries()?
            .into_iter()
            .filter(|e| name::validate(e).is_ok())
            .collect())
    }

    /// A cheap identity of the current version of the skill `name`: inode, size and
    /// modification time of its directory and files, without reading them. A save
    /// swaps in a new directory and an edit in place moves a file's time or size, so a
    /// changed skill changes its fingerprint.
    pub fn fingerprint(&self, name: &str) -> Result<String> {
        name::validate(name)?;
        let mut out = String::new();
        for (i, file) in ["", "SKILL.md", "skill.py", "skill.ts"].iter().enumerate() {
            let rel = if i == 0 {
                name.to_string()
            } else {
                format!("{name}/{file}")
            };
            match fstatat(&self.dir, rel.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => out.push_str(&format!(
                    "{}:{}:{}.{};",
                    st.st_ino, st.st_size, st.st_mtime, st.st_mtime_nsec
                )),
                Err(Errno::ENOENT) if i > 0 => out.push_str("-;"),
                Err(Errno::ENOENT) => return Err(Error::NotFound { name: name.into() }),
                Err(e) => return Err(io("inspect", &self.root.join(&rel), e.into())),
            }
        }
        Ok(out)
    }

    /// The relative paths of the files of the skill `name`, e.g. `["SKILL.md", "skill.py"]`
    /// (`__init__.py` is an implementation detail and not listed).
    pub fn files(&self, name: &str) -> Result<Vec<String>> {
        name::validate(name)?;
        let loaded = self.load(name, false)?;
        Ok(files_of(loaded.header.language))
    }

    /// The text of one file of the skill `name`: `SKILL.md` or its code file (`skill.py`
    /// or `skill.ts`). Any other file is [`Error::NoSuchFile`].
    pub fn read_file(&self, name: &str, file: &str) -> Result<String> {
        name::validate(name)?;
        let loaded = self.load(name, true)?;
        let language = loaded.header.language;
        if file == "SKILL.md" {
            Ok(loaded.markdown)
        } else if file == language.code_file() {
            Ok(loaded.code.unwrap_or_default())
        } else {
            Err(Error::NoSuchFile {
                name: name.into(),
                file: file.into(),
                files: files_of(language),
            })
        }
    }

    /// Reads the skill `name`, retrying when a file vanished under a concurrent swap.
    fn load(&self, name: &str, with_code: bool) -> Result<Loaded> {
        let mut attempt = 1;
        loop {
            match self.try_load(name, with_code) {
                Ok(loaded) => return Ok(loaded),
                Err(Fault::Failed(e)) => return Err(e),
                Err(Fault::Missing(_)) if attempt < READ_ATTEMPTS => attempt += 1,
                Err(Fault::Missing(file)) => {
                    return Err(corrupt(name, format!("{file} is missing")))
                }
            }
        }
    }

    fn try_load(&self, name: &str, with_code: bool) -> Result<Loaded, Fault> {
        let path = self.root.join(name);
        let st = match fstatat(&self.dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Err(Error::NotFound { name: name.into() }.into()),
            Err(e) => return Err(io("inspect", &path, e.into()).into()),
        };
        match file_type(st.st_mode) {
            SFlag::S_IFDIR => {}
            SFlag::S_IFLNK => return Err(corrupt(name, "its directory is a symlink".into()).into()),
            _ => return Err(corrupt(name, "it is not a directory".into()).into()),
        }
        // O_NOFOLLOW: if the entry became a symlink since the fstatat, this fails.
        let dir = match openat(
            &self.dir,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(dir) => dir,
            Err(Errno::ENOENT) => return Err(Error::NotFound { name: name.into() }.into()),
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                return Err(corrupt(name, "it is not a plain directory".into()).into())
            }
            Err(e) => return Err(io("open", &path, e.into()).into()),
        };
        let markdown = read_regular(&dir, name, "SKILL.md", MAX_SKILL_MD_BYTES, &path)?;
        let (header, usage) = frontmatter::parse(&markdown).map_err(|why| corrupt(name, why))?;
        if header.name != name {
            let why = format!("SKILL.md names it {:?}", header.name);
            return Err(corrupt(name, why).into());
        }
        let code_file = header.language.code_file();
        let code = if with_code {
            let code = read_regular(&dir, name, code_file, MAX_CODE_BYTES, &path)?;
            Some(code)
        } else {
            match fstatat(&dir, code_file, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) if file_type(st.st_mode) == SFlag::S_IFREG => None,
                Ok(_) => {
                    let why = format!("{code_file} is not a regular file");
                    return Err(corrupt(name, why).into());
                }
                Err(Errno::ENOENT) => return Err(Fault::Missing(code_file)),
                Err(e) => return Err(io("inspect", &path.join(code_file), e.into()).into()),
            }
        };
        Ok(Loaded {
            markdown,
            header,
            usage,
            code,
        })
    }

    /// Builds a new skill directory holding `files` under a fresh `.tmp-*` name, every
    /// file and the directory fsynced; returns its name. Removed again on failure.
    fn build(&self, files: &[(&str, &str)]) -> Result<String> {
        let temp = self.temp_name()?;
        let path = self.root.join(&temp);
        mkdirat(&self.dir, temp.as_str(), Mode::from_bits_truncate(DIR_MODE))
            .map_err(|e| io("create", &path, e.into()))?;
        let written = (|| {
            let dir = openat(
                &self.dir,
                temp.as_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| io("open", &path, e.into()))?;
            // The umask may have narrowed the mode given to mkdirat.
            fchmod(&dir, Mode::from_bits_truncate(DIR_MODE))
                .map_err(|e| io("set the mode of", &path, e.into()))?;
            for (file, text) in files {
                write_file(&dir, file, text, &path.join(file))?;
            }
            nix::unistd::fsync(&dir).map_err(|e| io("sync", &path, e.into()))
        })();
        if let Err(err) = written {
            self.remove_quietly(&temp);
            return Err(err);
        }
        Ok(temp)
    }

    /// Puts the directory `temp` in place of the existing skill `name`, atomically with
    /// `RENAME_EXCHANGE`; returns the entry now holding the old skill. Where the
    /// filesystem cannot exchange, two renames do (with a moment without the skill).
    fn replace(&self, temp: &str, name: &str) -> Result<String> {
        let path = self.root.join(name);
        match renameat2(
            &self.dir,
            temp,
            &self.dir,
            name,
            RenameFlags::RENAME_EXCHANGE,
        ) {
            Ok(()) => Ok(temp.to_string()),
            Err(err @ (Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP)) => {
                tracing::debug!(?err, "no RENAME_EXCHANGE here; replacing in two steps");
                let old = self.temp_name()?;
                renameat(&self.dir, name, &self.dir, old.as_str())
                    .map_err(|e| io("move away", &path, e.into()))?;
                if let Err(e) = renameat(&self.dir, temp, &self.dir, name) {
                    // Put the old skill back; the caller removes the new one.
                    if let Err(err) = renameat(&self.dir, old.as_str(), &self.dir, name) {
                        tracing::error!(?err, old, skill = name, "cannot restore a skill");
                    }
                    return Err(io("rename into place", &self.root.join(temp), e.into()));
                }
                Ok(old)
            }
            Err(e) => Err(io("swap in", &path, e.into())),
        }
    }

    /// Names of the root's entries (not UTF-8 ones: no skill or temp dir is named so),
    /// sorted.
    fn entries(&self) -> Result<Vec<String>> {
        // A fresh open file description: `getdents` offsets are not shared between threads.
        let mut dir = Dir::openat(
            &self.dir,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io("open", &self.root, e.into()))?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(|e| io("list", &self.root, e.into()))?;
            if let Ok(name) = entry.file_name().to_str() {
                if name != "." && name != ".." {
                    names.push(name.to_string());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// How many entries are named like skills (corrupt ones count: they take the name).
    fn count(&self) -> Result<usize> {
        Ok(self
            .entries()?
            .iter()
            .filter(|e| name::validate(e).is_ok())
            .count())
    }

    /// Removes the entry `entry` of the root: a directory tree (never following
    /// symlinks in it), or a file or symlink.
    fn remove_entry(&self, entry: &str) -> Result<()> {
        let path = self.root.join(entry);
        let removed = match fstatat(&self.dir, entry, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if file_type(st.st_mode) == SFlag::S_IFDIR => std::fs::remove_dir_all(&path),
            Ok(_) => std::fs::remove_file(&path),
            Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        };
        removed.map_err(|source| io("remove", &path, source))
    }

    /// Removes a temporary entry, logging a failure (the next `open` removes it).
    fn remove_quietly(&self, entry: &str) {
        if let Err(err) = self.remove_entry(entry) {
            tracing::warn!(?err, entry, "cannot remove a temporary skill directory");
        }
    }

    /// A `.tmp-<32 hex digits>` name, from the kernel's random source.
    fn temp_name(&self) -> Result<String> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| {
            let source = std::io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EIO));
            io("draw a random name in", &self.root, source)
        })?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(format!("{TEMP_PREFIX}{hex}"))
    }

    fn sync_root(&self) -> Result<()> {
        nix::unistd::fsync(&self.dir).map_err(|e| io("sync", &self.root, e.into()))
    }

    /// Takes the in-process mutex, then an exclusive `flock` on the root, so that two
    /// servers sharing a root neither interleave saves nor remove each other's temporary
    /// directories. Where `flock` is unavailable the mutex alone is held.
    fn lock_writes(&self) -> WriteLock<'_> {
        // The mutex guards no data, so a poisoned one is as good as any.
        let guard = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let flock = openat(
            &self.dir,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| (None, e))
        .and_then(|fd| Flock::lock(fd, FlockArg::LockExclusive).map_err(|(fd, e)| (Some(fd), e)));
        let flock = match flock {
            Ok(flock) => Some(flock),
            Err((_, err)) => {
                tracing::warn!(?err, root = %self.root.display(), "cannot lock the skills directory");
                None
            }
        };
        WriteLock {
            _flock: flock,
            _guard: guard,
        }
    }
}

/// Checks a skill before saving it; the error says which limit was broken.
fn check(name: &str, description: &str, code: &str, usage: Option<&str>) -> Result<()> {
    name::validate(name)?;
    let invalid = |field, why: &str| {
        Err(Error::Invalid {
            field,
            why: why.to_string(),
        })
    };
    let too_large = |field, size, max| Err(Error::TooLarge { field, size, max });
    if description.is_empty() {
        return invalid(
            "description",
            "it is empty: say in one line what the skill does",
        );
    }
    if description.len() > MAX_DESCRIPTION_BYTES {
        return too_large("description", description.len(), MAX_DESCRIPTION_BYTES);
    }
    if description.chars().any(char::is_control) {
        return invalid(
            "description",
            "it must be a single line without control characters; put details in usage",
        );
    }
    if code.trim().is_empty() {
        return invalid("code", "it is empty");
    }
    if code.len() > MAX_CODE_BYTES {
        return too_large("code", code.len(), MAX_CODE_BYTES);
    }
    if code.contains('\0') {
        return invalid("code", "it contains a NUL character");
    }
    if let Some(usage) = usage {
        if usage.len() > MAX_USAGE_BYTES {
            return too_large("usage", usage.len(), MAX_USAGE_BYTES);
        }
        if usage.contains('\0') {
            return invalid("usage", "it contains a NUL character");
        }
    }
    Ok(())
}

/// Reads the regular file `file` of the skill directory `dir`, refusing symlinks, other
/// file types, files over `max` bytes and text that is not UTF-8.
fn read_regular(
    dir: &OwnedFd,
    name: &str,
    file: &'static str,
    max: usize,
    skill_path: &Path,
) -> Result<String, Fault> {
    let path = skill_path.join(file);
    // O_NONBLOCK: opening a FIFO planted here must not hang; regular files ignore it.
    let fd = match openat(
        dir,
        file,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Err(Fault::Missing(file)),
        Err(Errno::ELOOP) => return Err(corrupt(name, format!("{file} is a symlink")).into()),
        Err(e) => return Err(io("open", &path, e.into()).into()),
    };
    let file_handle = File::from(fd);
    let meta = file_handle
        .metadata()
        .map_err(|source| io("inspect", &path, source))?;
    if !meta.is_file() {
        return Err(corrupt(name, format!("{file} is not a regular file")).into());
    }
    let mut bytes = Vec::new();
    file_handle
        .take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| io("read", &path, source))?;
    if bytes.len() > max {
        return Err(corrupt(name, format!("{file} is larger than {max} bytes")).into());
    }
    String::from_utf8(bytes).map_err(|_| corrupt(name, format!("{file} is not UTF-8")).into())
}

/// Creates `file` in `dir` (0644, even under a narrow umask) holding `text`, fsynced.
fn write_file(dir: &OwnedFd, file: &str, text: &str, path: &Path) -> Result<()> {
    let fd = openat(
        dir.as_fd(),
        file,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(FILE_MODE),
    )
    .map_err(|e| io("create", path, e.into()))?;
    fchmod(&fd, Mode::from_bits_truncate(FILE_MODE))
        .map_err(|e| io("set the mode of", path, e.into()))?;
    let mut f = File::from(fd);
    f.write_all(text.as_bytes())
        .map_err(|source| io("write", path, source))?;
    f.sync_all().map_err(|source| io("sync", path, source))
}

fn files_of(language: SkillLanguage) -> Vec<String> {
    language.files().iter().map(|f| f.to_string()).collect()
}

fn file_type(mode: libc::mode_t) -> SFlag {
    SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits())
}

fn corrupt(name: &str, why: String) -> Error {
    Error::Corrupt {
        name: name.into(),
        why,
    }
}

fn io(doing: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        doing,
        path: path.to_path_buf(),
        source,
    }
}
