//! `exitproof completions` and `exitproof man`: texts generated from the command line's
//! definition (`spec.rs`, as a clap command), by clap_complete and by `man`, at test time
//! rather than at run time. The binary carries them deflated (about 10 KB, with an inflater)
//! instead of the generators' code (about 120 KB). The test below checks that the copy in
//! `docs.deflate` is what the generators write now; `EXITPROOF_BLESS_DOCS=1 cargo test --lib
//! cli::docs` writes it anew.

use super::spec::SHELLS;

/// The texts, each followed by a NUL (which none contains): the completion scripts in
/// [`SHELLS`]'s order, then the man page.
const DEFLATED: &[u8] = include_bytes!("docs.deflate");

/// The texts inflated are 118 KB: a tenth over that is room to change, and any more is a broken
/// copy.
const INFLATED_LIMIT: usize = 130_000;

/// A shell `exitproof completions` has a script for: its place in [`SHELLS`], which is also
/// its script's place among the deflated texts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Shell(usize);

impl Shell {
    /// The shell called `name` (one of [`SHELLS`], as the command line's table checks).
    pub(super) fn parse(name: &str) -> Result<Shell, &'static str> {
        SHELLS
            .iter()
            .position(|shell| *shell == name)
            .map(Shell)
            .ok_or("not a shell exitproof completes")
    }
}

/// A text of the binary's own documentation.
#[derive(Clone, Copy, Debug)]
pub(super) enum Doc {
    Completions(Shell),
    Man,
}

impl Doc {
    /// Where the text is among the deflated ones.
    fn position(self) -> usize {
        match self {
            Doc::Completions(Shell(position)) => position,
            Doc::Man => SHELLS.len(),
        }
    }

    /// The text, inflated from the binary's copy.
    pub(super) fn text(self) -> Result<Vec<u8>, String> {
        let texts = inflate(DEFLATED)?;
        texts
            .split(|byte| *byte == 0)
            .nth(self.position())
            .map(<[u8]>::to_vec)
            .ok_or_else(|| format!("the binary's copy of the {self:?} text is missing"))
    }
}

fn inflate(deflated: &[u8]) -> Result<Vec<u8>, String> {
    miniz_oxide::inflate::decompress_to_vec_with_limit(deflated, INFLATED_LIMIT)
        .map_err(|e| format!("the binary's copy of its documentation is broken: {e}"))
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;

    use super::super::{man, spec};
    use super::*;

    /// What the generators write now, each text followed by a NUL, as `DEFLATED` holds them.
    fn generated() -> Vec<u8> {
        let mut texts = Vec::new();
        for generator in clap_complete::Shell::value_variants() {
            let mut command = spec::clap_command();
            clap_complete::generate(*generator, &mut command, spec::NAME, &mut texts);
            texts.push(0);
        }
        texts.extend_from_slice(man::page(spec::clap_command()).as_bytes());
        texts.push(0);
        texts
    }

    #[test]
    fn the_shells_are_clap_completes() {
        let names: Vec<String> = clap_complete::Shell::value_variants()
            .iter()
            .filter_map(ValueEnum::to_possible_value)
            .map(|value| value.get_name().to_owned())
            .collect();
        assert_eq!(SHELLS, names);
    }

    #[test]
    fn a_shell_is_one_of_the_table() {
        assert_eq!(Shell::parse("zsh"), Ok(Shell(4)));
        assert!(Shell::parse("tcsh").is_err());
    }

    #[test]
    fn the_binarys_copy_is_what_the_generators_write() {
        let generated = generated();
        if std::env::var_os("EXITPROOF_BLESS_DOCS").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/cli/docs.deflate");
            let deflated = miniz_oxide::deflate::compress_to_vec(&generated, 10);
            std::fs::write(path, deflated).expect("write src/cli/docs.deflate");
            return;
        }
        let copy = inflate(DEFLATED).expect("inflate src/cli/docs.deflate");
        let texts = |all: &[u8]| -> Vec<String> {
            all.split(|byte| *byte == 0)
                .map(|text| String::from_utf8_lossy(text).into_owned())
                .collect()
        };
        // Text by text, so that a failure shows which one and where.
        for (copy, generated) in texts(&copy).iter().zip(texts(&generated).iter()) {
            assert_eq!(
                copy, generated,
                "src/cli/docs.deflate is out of date: EXITPROOF_BLESS_DOCS=1 cargo test --lib \
                 cli::docs writes it anew"
            );
        }
        assert_eq!(copy, generated, "src/cli/docs.deflate holds other texts");
    }

    #[test]
    fn each_doc_is_its_own_text() {
        let man = Doc::Man.text().expect("the man page");
        assert!(man.starts_with(b".TH EXITPROOF 1 "));
        let bash = Doc::Completions(Shell(0)).text().expect("bash");
        assert!(bash.starts_with(b"_exitproof() {"));
    }
}
