//! `scripts/package`: the Debian package holds the binary, the units, the man page, the
//! completions and the copyright file at the paths Debian expects, and its control and
//! copyright files name the crate's version, address and licence.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const COPYRIGHT: &str = "./usr/share/doc/exitproof/copyright";

const EXPECTED_FILES: [&str; 8] = [
    "./usr/bin/exitproof",
    "./lib/systemd/system/exitproof.service",
    "./lib/systemd/system/exitproof.socket",
    "./usr/share/man/man1/exitproof.1.gz",
    "./usr/share/bash-completion/completions/exitproof",
    "./usr/share/zsh/vendor-completions/_exitproof",
    "./usr/share/fish/vendor_completions.d/exitproof.fish",
    COPYRIGHT,
];

/// The text of `path` in the package `deb`.
fn packaged_file(deb: &Path, path: &str) -> String {
    run(Command::new("sh")
        .arg("-c")
        .arg("dpkg-deb --fsys-tarfile \"$1\" | tar -xO \"$2\"")
        .arg("sh")
        .arg(deb)
        .arg(path))
}

/// The copyright file's paragraphs (DEP-5: separated by blank lines), each as its fields in
/// order, a field's continuation lines (those starting with a space) joined to its value.
fn dep5_paragraphs(text: &str) -> Vec<Vec<(String, String)>> {
    let mut paragraphs = Vec::new();
    for block in text.split("\n\n") {
        let mut fields: Vec<(String, String)> = Vec::new();
        for line in block.lines() {
            if let Some(continuation) = line.strip_prefix(' ') {
                let (_, value) = fields.last_mut().expect("a continuation follows a field");
                value.push('\n');
                value.push_str(continuation);
            } else {
                let (name, value) = line.split_once(':').expect("a field is NAME: VALUE");
                fields.push((name.to_owned(), value.trim().to_owned()));
            }
        }
        paragraphs.push(fields);
    }
    paragraphs
}

fn field<'a>(paragraph: &'a [(String, String)], name: &str) -> Option<&'a str> {
    paragraph
        .iter()
        .find(|(field, _)| field == name)
        .map(|(_, value)| value.as_str())
}

fn run(command: &mut Command) -> String {
    let output = command.output().expect("spawn");
    assert!(output.status.success(), "{command:?}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// The package, built once for every test here (two builds at once would share a directory).
fn package() -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(|| {
        // Packaging the test's own build spares a release build; the layout is the same.
        let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let script = manifest_dir.join("scripts/package");
        let printed = run(Command::new(&script).arg(env!("CARGO_BIN_EXE_exitproof")));
        manifest_dir.join(printed.trim())
    })
}

#[test]
fn package_holds_every_installed_file() {
    let deb = package();

    let contents = run(Command::new("dpkg-deb").arg("--contents").arg(deb));
    // Each line ends with the path; the service unit's ExecStart is checked separately below.
    let paths: Vec<&str> = contents
        .lines()
        .filter_map(|line| line.split_whitespace().last())
        .collect();
    for expected in EXPECTED_FILES {
        assert!(
            paths.contains(&expected),
            "{expected} missing from {contents}"
        );
    }

    let version = run(Command::new("dpkg-deb")
        .arg("--field")
        .arg(deb)
        .arg("Version"));
    assert_eq!(version.trim(), env!("CARGO_PKG_VERSION"));

    let homepage = run(Command::new("dpkg-deb")
        .arg("--field")
        .arg(deb)
        .arg("Homepage"));
    assert_eq!(homepage.trim(), env!("CARGO_PKG_REPOSITORY"));

    let unit = packaged_file(deb, "./lib/systemd/system/exitproof.service");
    assert!(
        unit.contains("ExecStart=/usr/bin/exitproof agent"),
        "the packaged service does not start /usr/bin/exitproof"
    );
}

#[test]
fn package_copyright_file_is_dep5_under_the_crates_licences() {
    let text = packaged_file(package(), COPYRIGHT);
    let paragraphs = dep5_paragraphs(&text);

    let header = &paragraphs[0];
    assert_eq!(
        field(header, "Format"),
        Some("https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/")
    );
    assert_eq!(field(header, "Upstream-Name"), Some("exitproof"));
    assert_eq!(field(header, "Source"), Some(env!("CARGO_PKG_REPOSITORY")));

    let files = paragraphs
        .iter()
        .find(|p| field(p, "Files") == Some("*"))
        .expect("a Files: * paragraph");
    assert!(field(files, "Copyright").is_some(), "{text}");
    // Cargo.toml's SPDX `MIT OR Apache-2.0` is DEP-5's `MIT or Apache-2.0`.
    assert_eq!(env!("CARGO_PKG_LICENSE"), "MIT OR Apache-2.0");
    assert_eq!(field(files, "License"), Some("MIT or Apache-2.0"));
    let linked = field(files, "Comment").expect("the statically linked crates");
    assert!(linked.contains("\nzbus "), "{linked}");

    // Each licence named is given its text, or where Debian keeps it, in a paragraph of its own.
    let mit = license_paragraph(&paragraphs, "MIT");
    assert!(mit.contains("Permission is hereby granted"), "{mit}");
    let apache = license_paragraph(&paragraphs, "Apache-2.0");
    assert!(
        apache.contains("/usr/share/common-licenses/Apache-2.0"),
        "{apache}"
    );
}

/// The text of the stand-alone `License: NAME` paragraph.
fn license_paragraph<'a>(paragraphs: &'a [Vec<(String, String)>], name: &str) -> &'a str {
    paragraphs
        .iter()
        .filter(|p| field(p, "Files").is_none())
        .filter_map(|p| field(p, "License"))
        .find(|value| value.lines().next() == Some(name))
        .unwrap_or_else(|| panic!("no License: {name} paragraph"))
}
