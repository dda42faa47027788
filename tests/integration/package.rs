//! `scripts/package`: the Debian package holds the binary, the units, the man page and the
//! completions at the paths Debian expects, and its control file names the crate's version.

use std::path::Path;
use std::process::Command;

const EXPECTED_FILES: [&str; 7] = [
    "./usr/bin/exitproof",
    "./lib/systemd/system/exitproof.service",
    "./lib/systemd/system/exitproof.socket",
    "./usr/share/man/man1/exitproof.1.gz",
    "./usr/share/bash-completion/completions/exitproof",
    "./usr/share/zsh/vendor-completions/_exitproof",
    "./usr/share/fish/vendor_completions.d/exitproof.fish",
];

fn run(command: &mut Command) -> String {
    let output = command.output().expect("spawn");
    assert!(output.status.success(), "{command:?}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

#[test]
fn package_holds_every_installed_file() {
    // Packaging the test's own build spares a release build; the layout is the same.
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = manifest_dir.join("scripts/package");
    let printed = run(Command::new(&script).arg(env!("CARGO_BIN_EXE_exitproof")));
    let deb = manifest_dir.join(printed.trim());

    let contents = run(Command::new("dpkg-deb").arg("--contents").arg(&deb));
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
        .arg(&deb)
        .arg("Version"));
    assert_eq!(version.trim(), env!("CARGO_PKG_VERSION"));

    let unit = run(Command::new("sh")
        .arg("-c")
        .arg("dpkg-deb --fsys-tarfile \"$1\" | tar -xO ./lib/systemd/system/exitproof.service")
        .arg("sh")
        .arg(&deb));
    assert!(
        unit.contains("ExecStart=/usr/bin/exitproof agent"),
        "the packaged service does not start /usr/bin/exitproof"
    );
}
