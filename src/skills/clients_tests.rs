//! Per-client skills and the shared set, against temporary directories.

use std::fs;
use std::path::Path;

use super::clients::key_for_tests;
use super::*;

fn skill(name: &str, code: &str) -> NewSkill {
    NewSkill {
        name: name.into(),
        description: format!("{name} does things"),
        language: SkillLanguage::Python,
        code: code.into(),
        usage: None,
    }
}

/// A root and a shared set holding `shared_names` (written by the "operator").
fn setup(shared_names: &[&str]) -> (tempfile::TempDir, ClientSkills) {
    let tmp = tempfile::tempdir().unwrap();
    let shared = tmp.path().join("shared");
    let operator = SkillStore::open(&shared).unwrap();
    for n in shared_names {
        operator
            .save(skill(n, &format!("WHO = 'operator {n}'\n")))
            .unwrap();
    }
    let skills = ClientSkills::open(&tmp.path().join("root"), Some(&shared)).unwrap();
    (tmp, skills)
}

fn names(list: &[ListedSkill]) -> Vec<(String, Origin)> {
    list.iter()
        .map(|s| (s.summary.name.clone(), s.origin))
        .collect()
}

fn code_in(dir: &Path, name: &str) -> String {
    fs::read_to_string(dir.join(name).join("skill.py")).unwrap()
}

#[test]
fn clients_never_see_or_overwrite_each_others_skills() {
    let (_tmp, skills) = setup(&[]);
    skills
        .save("token:alice", skill("tool", "WHO = 'alice'\n"))
        .unwrap();
    // bob saves the same name: his own skill, alice's is untouched.
    skills
        .save("token:bob", skill("tool", "WHO = 'bob'\n"))
        .unwrap();
    assert_eq!(
        skills.get("token:alice", "tool").unwrap().0.code,
        "WHO = 'alice'\n"
    );
    assert_eq!(
        skills.get("token:bob", "tool").unwrap().0.code,
        "WHO = 'bob'\n"
    );
    skills
        .save("token:alice", skill("secret", "X = 1\n"))
        .unwrap();
    assert!(skills
        .get("token:bob", "secret")
        .unwrap_err()
        .is_not_found());
    assert!(skills
        .delete("token:bob", "secret")
        .unwrap_err()
        .is_not_found());
    assert!(skills
        .read_file("token:bob", "secret", "skill.py")
        .unwrap_err()
        .is_not_found());
    assert_eq!(
        names(&skills.list("token:bob", None).unwrap()),
        [("tool".to_string(), Origin::Own)]
    );
    // Each run binds its own client's view.
    let alice = skills.bind_dir("token:alice", false).unwrap().unwrap();
    let bob = skills.bind_dir("token:bob", false).unwrap().unwrap();
    assert_ne!(alice, bob);
    assert_eq!(code_in(&alice, "tool"), "WHO = 'alice'\n");
    assert_eq!(code_in(&bob, "tool"), "WHO = 'bob'\n");
    assert!(!bob.join("secret").exists());
}

#[test]
fn client_directories_are_hashes_never_client_text() {
    let (tmp, skills) = setup(&[]);
    for hostile in ["token:../../etc", "token:/abs", "token:a/b\0c", "stdio"] {
        skills.save(hostile, skill("s", "X = 1\n")).unwrap();
        let dir = skills.client_dir(hostile);
        assert_eq!(dir.parent().unwrap(), tmp.path().join("root/by-client"));
        let leaf = dir.file_name().unwrap().to_str().unwrap();
        assert_eq!(leaf.len(), 32);
        assert!(leaf.bytes().all(|b| b.is_ascii_hexdigit()), "{leaf}");
    }
    assert!(!tmp.path().join("etc").exists());
    // Unauthenticated HTTP connections are one anonymous owner.
    assert_eq!(skills.client_dir("http:1"), skills.client_dir("http:2"));
    assert_eq!(
        skills
            .client_dir("http:1")
            .file_name()
            .unwrap()
            .to_str()
            .unwrap(),
        key_for_tests("http")
    );
    assert_ne!(skills.client_dir("http:1"), skills.client_dir("stdio"));
}

#[test]
fn shared_skills_are_visible_and_read_only() {
    let (tmp, skills) = setup(&["common"]);
    let listed = skills.list("token:alice", None).unwrap();
    assert_eq!(names(&listed), [("common".to_string(), Origin::Shared)]);
    let (got, origin) = skills.get("token:alice", "common").unwrap();
    assert_eq!(
        (got.code.as_str(), origin),
        ("WHO = 'operator common'\n", Origin::Shared)
    );
    let err = skills
        .save("token:alice", skill("common", "WHO = 'alice'\n"))
        .unwrap_err();
    assert!(matches!(err, Error::ReadOnly { .. }), "{err}");
    assert!(err.to_string().contains("read-only"), "{err}");
    let err = skills.delete("token:alice", "common").unwrap_err();
    assert!(matches!(err, Error::ReadOnly { .. }), "{err}");
    assert_eq!(
        code_in(&tmp.path().join("shared"), "common"),
        "WHO = 'operator common'\n"
    );
    // Without skills of its own a client binds the shared set itself (what the pool
    // binds); with some, its view holds both.
    let shared_root = tmp.path().join("shared");
    assert_eq!(
        skills.bind_dir("token:alice", false).unwrap(),
        Some(shared_root)
    );
    skills
        .save("token:alice", skill("mine", "X = 1\n"))
        .unwrap();
    let view = skills.bind_dir("token:alice", false).unwrap().unwrap();
    assert_eq!(code_in(&view, "common"), "WHO = 'operator common'\n");
    assert_eq!(code_in(&view, "mine"), "X = 1\n");
}

#[test]
fn an_own_skill_saved_before_a_shared_one_shadows_it() {
    let (tmp, skills) = setup(&[]);
    skills
        .save("token:alice", skill("late", "WHO = 'alice'\n"))
        .unwrap();
    // The operator adds a shared skill of the same name afterwards.
    let operator = SkillStore::open(&tmp.path().join("shared")).unwrap();
    operator.save(skill("late", "WHO = 'operator'\n")).unwrap();
    assert_eq!(
        names(&skills.list("token:alice", None).unwrap()),
        [("late".to_string(), Origin::Own)]
    );
    // alice may still replace hers; bob sees the shared one and cannot save the name.
    skills
        .save("token:alice", skill("late", "WHO = 'alice 2'\n"))
        .unwrap();
    let view = skills.bind_dir("token:alice", false).unwrap().unwrap();
    assert_eq!(code_in(&view, "late"), "WHO = 'alice 2'\n");
    assert_eq!(skills.get("token:bob", "late").unwrap().1, Origin::Shared);
    assert!(matches!(
        skills.save("token:bob", skill("late", "X = 1\n")),
        Err(Error::ReadOnly { .. })
    ));
    // Once alice deletes hers, the shared one shows through, in her view too.
    skills.delete("token:alice", "late").unwrap();
    skills
        .save("token:alice", skill("other", "X = 1\n"))
        .unwrap();
    let view = skills.bind_dir("token:alice", false).unwrap().unwrap();
    assert_eq!(code_in(&view, "late"), "WHO = 'operator'\n");
}

#[test]
fn views_follow_saves_deletes_and_operator_edits() {
    let (tmp, skills) = setup(&["common"]);
    let operator = SkillStore::open(&tmp.path().join("shared")).unwrap();
    skills.save("stdio", skill("a", "A = 1\n")).unwrap();
    skills.save("stdio", skill("b", "B = 1\n")).unwrap();
    let view = skills.bind_dir("stdio", false).unwrap().unwrap();
    assert_eq!(code_in(&view, "a"), "A = 1\n");
    skills.save("stdio", skill("a", "A = 2\n")).unwrap();
    skills.delete("stdio", "b").unwrap();
    operator
        .save(skill("common", "WHO = 'operator v2'\n"))
        .unwrap();
    operator.save(skill("added", "NEW = 1\n")).unwrap();
    let view = skills.bind_dir("stdio", false).unwrap().unwrap();
    assert_eq!(code_in(&view, "a"), "A = 2\n");
    assert!(!view.join("b").exists());
    assert_eq!(code_in(&view, "common"), "WHO = 'operator v2'\n");
    assert_eq!(code_in(&view, "added"), "NEW = 1\n");
    operator.delete("added").unwrap();
    let view = skills.bind_dir("stdio", false).unwrap().unwrap();
    assert!(!view.join("added").exists());
    // Deleting the last own skill falls back to the shared set (pool-friendly).
    skills.delete("stdio", "a").unwrap();
    assert_eq!(
        skills.bind_dir("stdio", false).unwrap(),
        Some(tmp.path().join("shared"))
    );
}

#[test]
fn without_a_shared_set_a_client_without_skills_binds_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let skills = ClientSkills::open(&tmp.path().join("root"), None).unwrap();
    assert_eq!(skills.bind_dir("stdio", false).unwrap(), None);
    assert!(skills.list("stdio", None).unwrap().is_empty());
    let missing = tmp.path().join("nope");
    assert!(ClientSkills::open(&tmp.path().join("root"), Some(&missing)).is_err());
    assert!(!missing.exists(), "a missing shared set is not created");
}

#[test]
fn a_session_binds_its_view_which_follows_saves_at_once() {
    let (tmp, skills) = setup(&["common"]);
    // A session asks for the view even without own skills: it holds the shared ones.
    let view = skills.bind_dir("stdio", true).unwrap().unwrap();
    assert_ne!(view, tmp.path().join("shared"));
    assert_eq!(code_in(&view, "common"), "WHO = 'operator common'\n");
    // A live interpreter keeps that directory: a save shows in it without another run.
    skills.save("stdio", skill("later", "L = 1\n")).unwrap();
    assert_eq!(code_in(&view, "later"), "L = 1\n");
    skills.delete("stdio", "later").unwrap();
    assert!(!view.join("later").exists());
}
