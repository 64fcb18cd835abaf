//! Store tests against temporary directories.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use super::*;

fn store() -> (tempfile::TempDir, SkillStore) {
    let tmp = tempfile::tempdir().unwrap();
    let store = SkillStore::open(&tmp.path().join("skills")).unwrap();
    (tmp, store)
}

fn python(name: &str, description: &str) -> NewSkill {
    NewSkill {
        name: name.into(),
        description: description.into(),
        language: SkillLanguage::Python,
        code: "def double(x):\n    return 2 * x\n".into(),
        usage: None,
    }
}

fn typescript(name: &str, description: &str) -> NewSkill {
    NewSkill {
        name: name.into(),
        description: description.into(),
        language: SkillLanguage::Typescript,
        code: "export function double(x: number): number {\n  return 2 * x;\n}\n".into(),
        usage: Some("Call `double(21)`.".into()),
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn python_round_trip_and_layout() {
    let (_tmp, store) = store();
    let saved = store.save(python("foo", "  Doubles numbers  ")).unwrap();
    assert_eq!(saved.description, "Doubles numbers");
    assert_eq!(saved.import, "from skills import foo");
    assert!(
        saved.usage.contains("from skills import foo"),
        "{}",
        saved.usage
    );
    assert!(saved.usage.contains("Doubles numbers"));
    assert!(saved.usage.contains("def double(x)"));
    assert_eq!(store.get("foo").unwrap(), saved);

    let dir = store.root().join("foo");
    assert_eq!(entries(&dir), ["SKILL.md", "__init__.py", "skill.py"]);
    assert_eq!(
        fs::read_to_string(dir.join("__init__.py")).unwrap(),
        "from .skill import *\n"
    );
    assert_eq!(
        fs::read_to_string(dir.join("skill.py")).unwrap(),
        saved.code
    );
    let md = fs::read_to_string(dir.join("SKILL.md")).unwrap();
    assert!(md.starts_with(
        "---\nname: foo\ndescription: \"Doubles numbers\"\nlanguage: python\n---\n# foo\n"
    ));
    assert!(md.ends_with("```\n") && !md.ends_with("\n\n"));
    assert_eq!(mode(store.root()), 0o755);
    assert_eq!(mode(&dir), 0o755);
    for f in ["SKILL.md", "__init__.py", "skill.py"] {
        assert_eq!(mode(&dir.join(f)), 0o644, "{f}");
    }
    assert_eq!(entries(store.root()), ["foo"]);
}

#[test]
fn typescript_round_trip_and_layout() {
    let (_tmp, store) = store();
    let saved = store.save(typescript("ts_math", "Maths")).unwrap();
    assert_eq!(
        saved.import,
        "import * as ts_math from \"/skills/ts_math/skill.ts\""
    );
    assert_eq!(saved.usage, "Call `double(21)`.");
    assert_eq!(saved.language, SkillLanguage::Typescript);
    assert_eq!(store.get("ts_math").unwrap(), saved);
    let dir = store.root().join("ts_math");
    assert_eq!(entries(&dir), ["SKILL.md", "skill.ts"]);
    assert_eq!(
        fs::read_to_string(dir.join("SKILL.md")).unwrap(),
        "---\nname: ts_math\ndescription: \"Maths\"\nlanguage: typescript\n---\nCall `double(21)`.\n"
    );
}

#[test]
fn replace_keeps_one_copy() {
    let (_tmp, store) = store();
    store.save(python("foo", "v1")).unwrap();
    let v2 = store.save(typescript("foo", "v2")).unwrap();
    assert_eq!(store.get("foo").unwrap(), v2);
    assert_eq!(entries(store.root()), ["foo"]);
    assert_eq!(entries(&store.root().join("foo")), ["SKILL.md", "skill.ts"]);
    let mut v3 = python("foo", "v3");
    v3.code = "X = 3\n".into();
    store.save(v3).unwrap();
    assert_eq!(store.get("foo").unwrap().code, "X = 3\n");
    assert_eq!(entries(store.root()), ["foo"]);
    assert_eq!(store.list(None).unwrap().len(), 1);
}

#[test]
fn list_and_query() {
    let (_tmp, store) = store();
    store
        .save(python("csv_to_json", "Convert CSV files to JSON"))
        .unwrap();
    store
        .save(typescript("fetch_page", "Fetch a web page as text"))
        .unwrap();
    store.save(python("add", "Add numbers")).unwrap();
    let names = |q: Option<&str>| -> Vec<String> {
        store.list(q).unwrap().into_iter().map(|s| s.name).collect()
    };
    assert_eq!(names(None), ["add", "csv_to_json", "fetch_page"]);
    assert_eq!(names(Some("")), ["add", "csv_to_json", "fetch_page"]);
    assert_eq!(names(Some("json")), ["csv_to_json"]);
    assert_eq!(names(Some("  CSV   Json ")), ["csv_to_json"]);
    assert_eq!(names(Some("csv page")), Vec::<String>::new());
    assert_eq!(names(Some("fetch WEB")), ["fetch_page"]);
    assert_eq!(names(Some("E")), ["add", "csv_to_json", "fetch_page"]);
    let summary = &store.list(Some("fetch")).unwrap()[0];
    assert_eq!(
        summary,
        &SkillSummary {
            name: "fetch_page".into(),
            description: "Fetch a web page as text".into(),
            language: SkillLanguage::Typescript,
        }
    );
}

#[test]
fn delete() {
    let (_tmp, store) = store();
    store.save(python("foo", "d")).unwrap();
    store.save(python("bar", "d")).unwrap();
    store.delete("foo").unwrap();
    assert!(matches!(store.get("foo"), Err(Error::NotFound { .. })));
    let err = store.delete("foo").unwrap_err();
    assert_eq!(
        err.to_string(),
        "no skill named \"foo\": list_skills shows the saved skills"
    );
    assert_eq!(entries(store.root()), ["bar"]);
    assert_eq!(store.list(None).unwrap().len(), 1);
}

#[test]
fn bad_names_are_refused() {
    let (_tmp, store) = store();
    let long = "a".repeat(65);
    for name in [
        "..", "a/b", "A", "1x", "class", "", &long, "__x", "skills", "x\0", ".tmp-x",
    ] {
        let err = store.save(python(name, "d")).unwrap_err();
        assert!(matches!(err, Error::BadName { .. }), "{name:?}: {err}");
        assert!(err
            .to_string()
            .starts_with(&format!("skill name {name:?} is invalid: ")));
        assert!(matches!(store.get(name), Err(Error::BadName { .. })));
        assert!(matches!(store.delete(name), Err(Error::BadName { .. })));
        assert!(matches!(
            store.read_file(name, "SKILL.md"),
            Err(Error::BadName { .. })
        ));
    }
    assert_eq!(
        store.save(python("../x", "d")).unwrap_err().to_string(),
        "skill name \"../x\" is invalid: use 1-64 lowercase letters, digits and underscores, \
         starting with a letter"
    );
    assert!(entries(store.root()).is_empty());
    assert!(!store.root().parent().unwrap().join("x").exists());
}

#[test]
fn contents_are_checked() {
    let (_tmp, store) = store();
    let with = |f: &dyn Fn(&mut NewSkill)| {
        let mut s = python("foo", "d");
        f(&mut s);
        store.save(s).unwrap_err()
    };
    let too_large = |e: Error, field: &str| match e {
        Error::TooLarge { field: f, .. } => assert_eq!(f, field),
        e => panic!("{e}"),
    };
    let invalid = |e: Error, field: &str| match e {
        Error::Invalid { field: f, .. } => assert_eq!(f, field),
        e => panic!("{e}"),
    };
    too_large(with(&|s| s.code = "x".repeat(MAX_CODE_BYTES + 1)), "code");
    too_large(
        with(&|s| s.description = "x".repeat(MAX_DESCRIPTION_BYTES + 1)),
        "description",
    );
    too_large(
        with(&|s| s.usage = Some("x".repeat(MAX_USAGE_BYTES + 1))),
        "usage",
    );
    invalid(with(&|s| s.description = " ".into()), "description");
    invalid(
        with(&|s| s.description = "two\nlines".into()),
        "description",
    );
    invalid(with(&|s| s.description = "tab\there".into()), "description");
    invalid(with(&|s| s.code = "\n  \n".into()), "code");
    invalid(with(&|s| s.code = "x = 1\0".into()), "code");
    invalid(with(&|s| s.usage = Some("a\0".into())), "usage");
    let e = with(&|s| s.code = "x".repeat(MAX_CODE_BYTES + 1));
    assert_eq!(
        e.to_string(),
        "skill code is 262145 bytes, over the limit of 262144 bytes"
    );
    assert!(entries(store.root()).is_empty());

    // At the limits exactly, all is well.
    let mut s = python("foo", &"d".repeat(MAX_DESCRIPTION_BYTES));
    s.code = "#".repeat(MAX_CODE_BYTES);
    s.usage = Some("u".repeat(MAX_USAGE_BYTES));
    let saved = store.save(s).unwrap();
    assert_eq!(store.get("foo").unwrap(), saved);
}

#[test]
fn blank_usage_is_generated() {
    let (_tmp, store) = store();
    let mut s = typescript("foo", "Doubles");
    s.usage = Some("  \n".into());
    let saved = store.save(s).unwrap();
    assert!(saved
        .usage
        .contains("import * as foo from \"/skills/foo/skill.ts\";"));
    assert!(saved
        .usage
        .contains("export function double(x: number): number"));
}

#[test]
fn at_most_max_skills() {
    let (_tmp, store) = store();
    for i in 0..MAX_SKILLS {
        fs::create_dir(store.root().join(format!("s{i}"))).unwrap();
    }
    // Entries that are not named like skills do not count.
    fs::create_dir(store.root().join("Not_A_Skill")).unwrap();
    let err = store.save(python("one_more", "d")).unwrap_err();
    assert!(matches!(err, Error::TooMany { max: MAX_SKILLS }), "{err}");
    assert!(err.to_string().contains("delete_skill"));
    // Replacing an existing name is still allowed.
    store.save(python("s0", "d")).unwrap();
    store.delete("s1").unwrap();
    store.save(python("one_more", "d")).unwrap();
}

#[test]
fn corrupt_skills_are_skipped_in_list_and_refused_by_get() {
    let (_tmp, store) = store();
    store.save(python("good", "fine")).unwrap();
    for bad in ["garbage", "mismatch", "no_code", "no_md", "binary"] {
        store.save(python(bad, "will break")).unwrap();
    }
    let root = store.root();
    fs::write(root.join("garbage/SKILL.md"), "just text\n").unwrap();
    fs::write(
        root.join("mismatch/SKILL.md"),
        "---\nname: other\ndescription: x\nlanguage: python\n---\n",
    )
    .unwrap();
    fs::remove_file(root.join("no_code/skill.py")).unwrap();
    fs::remove_file(root.join("no_md/SKILL.md")).unwrap();
    fs::write(root.join("binary/skill.py"), b"\xff\xfe").unwrap();
    // A stray file and a stray directory.
    fs::write(root.join("README"), "hi").unwrap();
    fs::write(root.join("plain_file"), "hi").unwrap();

    let names: Vec<_> = store
        .list(None)
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["binary", "good"]); // list does not read the code
    for (name, why) in [
        ("garbage", "does not start with front matter"),
        ("mismatch", "SKILL.md names it \"other\""),
        ("no_code", "skill.py is missing"),
        ("no_md", "SKILL.md is missing"),
        ("binary", "skill.py is not UTF-8"),
        ("plain_file", "it is not a directory"),
    ] {
        let err = store.get(name).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{name}: {err}");
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("skill {name:?} is corrupt: ")),
            "{msg}"
        );
        assert!(msg.contains(why), "{msg}");
        assert!(
            msg.ends_with("save it again or delete it with delete_skill"),
            "{msg}"
        );
    }
    // Corrupt skills can be deleted or saved over.
    store.delete("garbage").unwrap();
    store.delete("plain_file").unwrap();
    store.save(python("mismatch", "fixed")).unwrap();
    assert_eq!(store.get("mismatch").unwrap().description, "fixed");
}

#[test]
fn symlinks_are_refused_not_followed() {
    let (tmp, store) = store();
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(
        outside.join("SKILL.md"),
        "---\nname: linked\ndescription: secret\nlanguage: python\n---\n",
    )
    .unwrap();
    fs::write(outside.join("skill.py"), "SECRET = 1\n").unwrap();
    let root = store.root();
    symlink(&outside, root.join("linked")).unwrap();
    store.save(python("file_link", "d")).unwrap();
    fs::remove_file(root.join("file_link/skill.py")).unwrap();
    symlink(outside.join("skill.py"), root.join("file_link/skill.py")).unwrap();
    store.save(python("md_link", "d")).unwrap();
    fs::remove_file(root.join("md_link/SKILL.md")).unwrap();
    symlink(outside.join("SKILL.md"), root.join("md_link/SKILL.md")).unwrap();

    assert!(store.list(None).unwrap().is_empty());
    for (name, why) in [
        ("linked", "its directory is a symlink"),
        ("file_link", "skill.py is a symlink"),
        ("md_link", "SKILL.md is a symlink"),
    ] {
        let err = store.get(name).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{name}: {err}");
        assert!(err.to_string().contains(why), "{err}");
        assert!(!err.to_string().contains("SECRET"));
    }
    assert!(matches!(
        store.read_file("file_link", "skill.py"),
        Err(Error::Corrupt { .. })
    ));
    // Deleting removes the link, not what it points to.
    store.delete("linked").unwrap();
    assert!(outside.join("skill.py").exists());
    assert_eq!(entries(root), ["file_link", "md_link"]);
}

#[test]
fn leftover_temp_dirs_are_removed_on_open() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("skills");
    {
        let store = SkillStore::open(&root).unwrap();
        store.save(python("keep", "d")).unwrap();
    }
    fs::create_dir_all(root.join(".tmp-0123abcd/sub")).unwrap();
    fs::write(root.join(".tmp-0123abcd/sub/SKILL.md"), "half").unwrap();
    fs::write(root.join(".tmp-feed"), "a file").unwrap();
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("precious"), "x").unwrap();
    symlink(&outside, root.join(".tmp-link")).unwrap();
    fs::write(root.join(".keep_me"), "not ours").unwrap();

    let store = SkillStore::open(&root).unwrap();
    assert_eq!(entries(store.root()), [".keep_me", "keep"]);
    assert!(outside.join("precious").exists());
    assert_eq!(store.list(None).unwrap().len(), 1);
}

#[test]
fn open_creates_nested_root() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("a/b/skills");
    let store = SkillStore::open(&root).unwrap();
    assert_eq!(store.root(), root);
    assert!(root.is_dir());
    fs::write(tmp.path().join("file"), "").unwrap();
    assert!(matches!(
        SkillStore::open(&tmp.path().join("file")),
        Err(Error::Io { .. })
    ));
}

#[test]
fn concurrent_saves_and_reads_stay_consistent() {
    let (_tmp, store) = store();
    let store = Arc::new(store);
    let version = |i: usize| {
        let mut s = python("shared", &format!("version {i}"));
        s.code = format!("VERSION = {i}\n");
        s
    };
    store.save(version(0)).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads == 0 {
                let s = store.get("shared").unwrap();
                let i = s.description.strip_prefix("version ").unwrap();
                assert_eq!(s.code, format!("VERSION = {i}\n"));
                assert!(store
                    .list(Some("version"))
                    .unwrap()
                    .iter()
                    .any(|s| s.name == "shared"));
                reads += 1;
            }
            reads
        })
    };
    let writers: Vec<_> = (1..=16)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for round in 0..5 {
                    store.save(version(t * 100 + round)).unwrap();
                    let mut own = if t % 2 == 0 {
                        python(&format!("own_{t}"), &format!("version {round}"))
                    } else {
                        typescript(&format!("own_{t}"), &format!("version {round}"))
                    };
                    own.code.push_str(&format!("// {round}\n"));
                    store.save(own).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);

    let list = store.list(None).unwrap();
    assert_eq!(list.len(), 17);
    for t in 1..=16 {
        let s = store.get(&format!("own_{t}")).unwrap();
        assert_eq!(s.description, "version 4");
        assert!(s.code.ends_with("// 4\n"));
        let files = entries(&store.root().join(format!("own_{t}")));
        assert_eq!(files.len(), if t % 2 == 0 { 3 } else { 2 });
    }
    let shared = store.get("shared").unwrap();
    let i = shared.description.strip_prefix("version ").unwrap();
    assert_eq!(shared.code, format!("VERSION = {i}\n"));
    assert!(
        i.ends_with('4'),
        "the last save of some thread wins, got {i}"
    );
    assert!(entries(store.root()).iter().all(|e| !e.starts_with('.')));
}

#[test]
fn hand_written_skill_is_read() {
    let (_tmp, store) = store();
    let dir = store.root().join("csv_tools");
    fs::create_dir(&dir).unwrap();
    fs::write(
        dir.join("SKILL.md"),
        "---\nname: csv_tools\ndescription: Parse CSV: quickly\nlanguage: ts\nauthor: me\n---\n\
         \n# csv_tools\n\nUse `parse`.\n",
    )
    .unwrap();
    fs::write(
        dir.join("skill.ts"),
        "export const parse = (s: string) => s.split(\",\");\n",
    )
    .unwrap();
    let s = store.get("csv_tools").unwrap();
    assert_eq!(s.description, "Parse CSV: quickly");
    assert_eq!(s.language, SkillLanguage::Typescript);
    assert_eq!(s.usage, "# csv_tools\n\nUse `parse`.");
    assert_eq!(store.list(Some("quickly")).unwrap().len(), 1);
}

#[test]
fn files_and_read_file() {
    let (_tmp, store) = store();
    store.save(python("foo", "d")).unwrap();
    store.save(typescript("bar", "d")).unwrap();
    assert_eq!(store.files("foo").unwrap(), ["SKILL.md", "skill.py"]);
    assert_eq!(store.files("bar").unwrap(), ["SKILL.md", "skill.ts"]);
    let md = fs::read_to_string(store.root().join("foo/SKILL.md")).unwrap();
    assert_eq!(store.read_file("foo", "SKILL.md").unwrap(), md);
    assert_eq!(
        store.read_file("foo", "skill.py").unwrap(),
        python("foo", "d").code
    );
    assert_eq!(
        store.read_file("bar", "skill.ts").unwrap(),
        typescript("bar", "d").code
    );
    for (name, file) in [
        ("foo", "skill.ts"),
        ("foo", "__init__.py"),
        ("foo", "../bar/skill.ts"),
        ("bar", "skill.py"),
        ("foo", ""),
    ] {
        let err = store.read_file(name, file).unwrap_err();
        assert!(matches!(err, Error::NoSuchFile { .. }), "{err}");
        assert!(err.is_not_found());
    }
    assert_eq!(
        store.read_file("foo", "x").unwrap_err().to_string(),
        "skill \"foo\" has no file \"x\": its files are SKILL.md, skill.py"
    );
    let err = store.read_file("nope", "SKILL.md").unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }) && err.is_not_found());
    assert!(matches!(store.files("nope"), Err(Error::NotFound { .. })));
}

#[test]
fn language_parsing() {
    for (s, want) in [
        ("python", SkillLanguage::Python),
        ("py", SkillLanguage::Python),
        ("TypeScript", SkillLanguage::Typescript),
        ("ts", SkillLanguage::Typescript),
    ] {
        assert_eq!(s.parse::<SkillLanguage>().unwrap(), want);
    }
    assert_eq!(
        "rust".parse::<SkillLanguage>().unwrap_err().to_string(),
        "skill language is invalid: \"rust\" is not a skill language: use \"python\" or \
         \"typescript\""
    );
    assert_eq!(
        serde_json::to_string(&SkillLanguage::Typescript).unwrap(),
        "\"typescript\""
    );
    let ts: SkillLanguage = serde_json::from_str("\"ts\"").unwrap();
    assert_eq!(ts, SkillLanguage::Typescript);
}

#[test]
fn store_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SkillStore>();
}

/// Proves the layout: the host's python3 imports a saved skill both ways.
#[test]
fn python_imports_a_saved_skill() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipping: no python3 on this host");
        return;
    }
    let (tmp, store) = store();
    store.save(python("foo", "Doubles")).unwrap();
    let mut helper = python("helper_lib", "Helpers");
    helper.code =
        "from skills import foo\n\ndef quadruple(x):\n    return foo.double(foo.double(x))\n"
            .into();
    store.save(helper).unwrap();
    let script = format!(
        "import sys; sys.path.insert(0, {:?})\n\
         from skills import foo\nprint(foo.double(21))\n\
         from skills.foo import double\nprint(double(2))\n\
         from skills import helper_lib\nprint(helper_lib.quadruple(1))\n",
        tmp.path().to_str().unwrap()
    );
    // -B: no __pycache__ in the store; -I: no user site or environment.
    let out = std::process::Command::new("python3")
        .args(["-B", "-I", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n4\n4\n");
    assert_eq!(
        entries(&store.root().join("foo")),
        ["SKILL.md", "__init__.py", "skill.py"]
    );
}
