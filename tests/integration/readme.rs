//! The README's library example is `examples/wait_for_proof.rs`, which `cargo test` builds: the
//! two must say the same, so the README never shows code that does not compile.

#[test]
fn the_readme_shows_the_example_that_is_built() {
    let readme = include_str!("../../README.md");
    let example = include_str!("../../examples/wait_for_proof.rs");
    let code = &example[example.find("\nuse ").expect("the example's code") + 1..];
    assert!(
        readme.contains(&format!("```rust\n{code}```")),
        "README.md's library example differs from examples/wait_for_proof.rs"
    );
}
