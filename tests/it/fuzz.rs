//! Fuzz targets for every parser of user input, run for a bounded time on each test run:
//! topology TOML, scenario TOML, NCCL topology XML, the results CSV that `plot` reads and
//! calibration profiles. Inputs are shipped files cut, mutated or spliced with extreme
//! values, and random bytes. Each must parse or be rejected with an error that names the
//! file and, where the text itself is malformed, the line; none may panic.
//!
//! Each property runs 24 cases (about a second or two per parser in the test profile);
//! `PROPTEST_CASES=5000 cargo test --test it fuzz::` fuzzes longer.

use std::path::{Path, PathBuf};

use fabricsim::calibrate::profile::parse_profile;
use fabricsim::fabric::file::{parse_topology, FileError};
use fabricsim::fabric::nccl_xml::parse_nccl_xml;
use fabricsim::report::csvdata::{DataError, Table};
use fabricsim::scenario::file::parse_plan;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files_in(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no *.{ext} in {dir}");
    v
}

/// The seeds of one parser: (path the text claims to be, text).
type Seeds = Vec<(PathBuf, String)>;

fn read_all(paths: Vec<PathBuf>) -> Seeds {
    paths.into_iter().map(|p| (p.clone(), std::fs::read_to_string(&p).unwrap())).collect()
}

fn topologies() -> &'static Seeds {
    static S: std::sync::OnceLock<Seeds> = std::sync::OnceLock::new();
    S.get_or_init(|| read_all(files_in("topologies", "toml")))
}

fn scenarios() -> &'static Seeds {
    static S: std::sync::OnceLock<Seeds> = std::sync::OnceLock::new();
    S.get_or_init(|| read_all(files_in("scenarios", "toml")))
}

fn xmls() -> &'static Seeds {
    static S: std::sync::OnceLock<Seeds> = std::sync::OnceLock::new();
    S.get_or_init(|| read_all(vec![root().join("tests/data/dgx-h100-nccl.xml")]))
}

fn csvs() -> &'static Seeds {
    static S: std::sync::OnceLock<Seeds> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let mut v = read_all(files_in("validate/reference", "csv").into_iter().take(3).collect());
        v.push((
            PathBuf::from("results.csv"),
            "point,topology,algo,size_bytes,time_us,busbw_GBps,error\n\
             0,dgx-h100,ring,1024,20.6,0.09,\n\
             1,dgx-h100,nvls,1024,,,\"NVLS is not possible\"\n"
                .to_string(),
        ));
        v
    })
}

fn profiles() -> &'static Seeds {
    static S: std::sync::OnceLock<Seeds> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        vec![(
            PathBuf::from("profile.toml"),
            "# a calibration profile\n[params.link.net]\nefficiency = 0.9\nlatency = \"600ns\"\n\n\
             [params.protocol.simple]\nstep_latency = { nvlink = \"12us\", net = \"14us\" }\n"
                .to_string(),
        )]
    })
}

/// Cuts `s` at the char boundary at or before `at`.
fn cut(s: &str, at: usize) -> &str {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    &s[..i]
}

/// How an input is changed before it is parsed.
#[derive(Clone, Debug)]
enum Edit {
    /// Cut at a fraction of the text.
    Truncate(prop::sample::Index),
    /// One character replaced.
    Replace(prop::sample::Index, char),
    /// A token inserted.
    Splice(prop::sample::Index, &'static str),
    /// A line removed.
    DropLine(prop::sample::Index),
    /// A line repeated.
    DupLine(prop::sample::Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    let idx = any::<prop::sample::Index>;
    let chars = vec![
        '0', '9', '.', '-', 'e', 'x', '"', '\'', '[', ']', '{', '}', '=', ',', '\n', ' ', '#', '<', '>', '/',
        '\u{e9}',
    ];
    let tokens = vec![
        "4294967295",
        "18446744073709551615",
        "9223372036854775808",
        "1e30",
        "-1",
        "0",
        "1e300",
        "NaN",
        "\"1bps\"",
        "\"16E\"",
        ",,,,",
        "]]",
        "</system>",
        "<gpu/>",
    ];
    prop_oneof![
        idx().prop_map(Edit::Truncate),
        (idx(), prop::sample::select(chars)).prop_map(|(i, c)| Edit::Replace(i, c)),
        (idx(), prop::sample::select(tokens)).prop_map(|(i, t)| Edit::Splice(i, t)),
        idx().prop_map(Edit::DropLine),
        idx().prop_map(Edit::DupLine),
    ]
}

fn apply(text: &str, e: &Edit) -> String {
    match e {
        Edit::Truncate(i) => cut(text, i.index(text.len() + 1)).to_string(),
        Edit::Replace(i, c) => {
            let mut chars: Vec<char> = text.chars().collect();
            if !chars.is_empty() {
                let k = i.index(chars.len());
                chars[k] = *c;
            }
            chars.into_iter().collect()
        }
        Edit::Splice(i, t) => {
            let head = cut(text, i.index(text.len() + 1));
            format!("{head}{t}{}", &text[head.len()..])
        }
        Edit::DropLine(i) | Edit::DupLine(i) => {
            let mut lines: Vec<&str> = text.lines().collect();
            if !lines.is_empty() {
                let k = i.index(lines.len());
                if matches!(e, Edit::DropLine(_)) {
                    lines.remove(k);
                } else {
                    lines.insert(k, lines[k]);
                }
            }
            lines.join("\n")
        }
    }
}

/// A rejected input's error is located: it names a file, and if it names the input, its
/// line is inside the text. `must_have_line`: the text is malformed as a whole (not TOML,
/// not XML), so the error must carry a line.
fn located(e: &FileError, path: &Path, text: &str, must_have_line: bool) -> Result<(), TestCaseError> {
    let name = path.display().to_string();
    match e {
        FileError::At { file, line, col, msg } => {
            prop_assert!(!msg.is_empty(), "{e}");
            prop_assert!(*line >= 1 && *col >= 1, "{e}");
            if *file == name {
                prop_assert!(*line <= text.lines().count() + 1, "line {line} past the end: {e}");
            } else {
                prop_assert!(!file.is_empty(), "{e}");
            }
        }
        FileError::Invalid { file, msg } => {
            prop_assert!(!must_have_line, "malformed input reported without a line: {e}");
            prop_assert!(!file.is_empty() && !msg.is_empty(), "{e}");
        }
        // A reference to another file (an `extends`, a scenario's topology) that is not there.
        FileError::Io { file, .. } => prop_assert!(*file != name, "{e}"),
    }
    Ok(())
}

fn not_toml(text: &str) -> bool {
    text.parse::<toml::Table>().is_err()
}

fn check_topology(path: &Path, text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = parse_topology(text, path) {
        located(&e, path, text, not_toml(text))?;
    }
    Ok(())
}

fn check_scenario(path: &Path, text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = parse_plan(text, path) {
        located(&e, path, text, not_toml(text))?;
    }
    Ok(())
}

fn check_xml(path: &Path, text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = parse_nccl_xml(text, path) {
        let malformed = e.to_string().contains("malformed XML");
        located(&e, path, text, malformed)?;
    }
    Ok(())
}

fn check_csv(path: &Path, text: &str) -> Result<(), TestCaseError> {
    let name = path.display().to_string();
    match Table::from_reader(&name, text.as_bytes()) {
        Ok(t) => {
            for c in t.column_names() {
                let _ = t.numeric(c);
                let _ = t.group_by(c);
            }
        }
        Err(e) => {
            prop_assert!(e.to_string().starts_with(&name) || e.to_string().contains(&name), "{e}");
            if let DataError::Csv { line, .. } = &e {
                prop_assert!(line.is_some(), "a malformed CSV reported without a line: {e}");
            }
        }
    }
    Ok(())
}

fn check_profile(path: &Path, text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = parse_profile(text, &path.display().to_string()) {
        located(&e, path, text, not_toml(text))?;
    }
    Ok(())
}

/// 24 cases per property unless `PROPTEST_CASES` asks for more (or fewer).
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(24);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

fn pick(seeds: &Seeds, i: &prop::sample::Index) -> (PathBuf, String) {
    seeds[i.index(seeds.len())].clone()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn topology_files(i in any::<prop::sample::Index>(), edits in prop::collection::vec(edit(), 1..4)) {
        let (path, mut text) = pick(topologies(), &i);
        for e in &edits {
            text = apply(&text, e);
        }
        check_topology(&path, &text)?;
    }

    #[test]
    fn scenario_files(i in any::<prop::sample::Index>(), edits in prop::collection::vec(edit(), 1..4)) {
        let (path, mut text) = pick(scenarios(), &i);
        for e in &edits {
            text = apply(&text, e);
        }
        check_scenario(&path, &text)?;
    }

    #[test]
    fn nccl_xml_dumps(i in any::<prop::sample::Index>(), edits in prop::collection::vec(edit(), 1..4)) {
        let (path, mut text) = pick(xmls(), &i);
        for e in &edits {
            text = apply(&text, e);
        }
        check_xml(&path, &text)?;
    }

    #[test]
    fn plot_csvs(i in any::<prop::sample::Index>(), edits in prop::collection::vec(edit(), 1..4)) {
        let (path, mut text) = pick(csvs(), &i);
        for e in &edits {
            text = apply(&text, e);
        }
        check_csv(&path, &text)?;
    }

    #[test]
    fn calibration_profiles(i in any::<prop::sample::Index>(), edits in prop::collection::vec(edit(), 1..4)) {
        let (path, mut text) = pick(profiles(), &i);
        for e in &edits {
            text = apply(&text, e);
        }
        check_profile(&path, &text)?;
    }

    #[test]
    fn random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        check_topology(Path::new("random.toml"), &text)?;
        check_scenario(&root().join("scenarios/random.toml"), &text)?;
        check_xml(Path::new("random.xml"), &text)?;
        check_csv(Path::new("random.csv"), &text)?;
        check_profile(Path::new("random-profile.toml"), &text)?;
    }
}

/// The seeds themselves are valid, so that the edits above start from inputs that parse
/// (and a fuzz case that is rejected was rejected because of its edit).
#[test]
fn seeds_parse() {
    for (p, t) in topologies() {
        parse_topology(t, p).unwrap_or_else(|e| panic!("{e}"));
    }
    for (p, t) in scenarios() {
        parse_plan(t, p).unwrap_or_else(|e| panic!("{e}"));
    }
    for (p, t) in xmls() {
        parse_nccl_xml(t, p).unwrap_or_else(|e| panic!("{e}"));
    }
    for (p, t) in csvs() {
        let t = Table::from_reader(&p.display().to_string(), t.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        assert!(t.len() >= 2, "{}", t.source());
    }
    for (p, t) in profiles() {
        assert!(!parse_profile(t, &p.display().to_string()).unwrap().is_empty());
    }
}

/// The located-error check itself rejects what it must: an error without a line for text
/// that is not TOML, and a line past the end of the text.
#[test]
fn located_rejects_unlocated_errors() {
    let p = Path::new("x.toml");
    let bad = FileError::Invalid { file: "x.toml".into(), msg: "broken".into() };
    assert!(located(&bad, p, "a = [", true).is_err());
    assert!(located(&bad, p, "a = 1", false).is_ok());
    let past = FileError::At { file: "x.toml".into(), line: 9, col: 1, msg: "m".into() };
    assert!(located(&past, p, "a = 1\n", false).is_err());
    assert!(check_topology(p, "[gpu\n").is_ok());
}

/// Found by `calibration_profiles`: a float that overflows (`1e30` spliced before a long
/// integer) passed the span parser, which keeps values as text, and failed in the typed
/// parse without its line.
#[test]
fn an_overflowing_float_in_a_profile_is_located() {
    let text = "[params.link.net]\nefficiency = 1e3018446744073709551615\n";
    match parse_profile(text, "profile.toml") {
        Err(FileError::At { line, .. }) => assert_eq!(line, 2),
        other => panic!("{other:?}"),
    }
}
