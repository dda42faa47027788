//! contrib/exitproof.socket and contrib/exitproof.service agree with each other and with the
//! agent: the socket is the agent's default one, in the service's runtime directory, which
//! outlives the agent's stops so the socket stays reachable across restarts.

use std::path::Path;

use exitproof::agent::Bus;
use exitproof::cli::default_socket;

/// The values of `key=` in a unit file, in order.
fn values(unit: &str, key: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("contrib")
        .join(unit);
    let text = std::fs::read_to_string(&path).expect("read the unit");
    text.lines()
        .filter_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_owned)
        .collect()
}

fn one(unit: &str, key: &str) -> String {
    let mut found = values(unit, key);
    assert_eq!(found.len(), 1, "{unit}: {key}= {found:?}");
    found.remove(0)
}

#[test]
fn the_socket_unit_listens_on_the_agents_default_socket_in_the_services_runtime_directory() {
    let listen = one("exitproof.socket", "ListenStream");
    assert_eq!(Path::new(&listen), default_socket(Bus::System));
    let runtime = one("exitproof.service", "RuntimeDirectory");
    assert_eq!(
        Path::new(&listen).parent(),
        Some(Path::new("/run").join(runtime).as_path())
    );
}

#[test]
fn the_runtime_directory_outlives_the_agent_so_the_socket_does() {
    assert_eq!(one("exitproof.service", "RuntimeDirectoryPreserve"), "yes");
    assert_eq!(one("exitproof.service", "Also"), "exitproof.socket");
}

#[test]
fn the_socket_has_the_modes_the_agent_would_give_it() {
    assert_eq!(one("exitproof.socket", "SocketMode"), "0600");
    assert_eq!(one("exitproof.socket", "Accept"), "no");
    // RuntimeDirectoryMode= is left at its default, 0755, as is the socket's DirectoryMode=.
    assert!(values("exitproof.service", "RuntimeDirectoryMode").is_empty());
    assert_eq!(one("exitproof.socket", "DirectoryMode"), "0755");
}

#[test]
fn the_units_documentation_is_the_crates_repository() {
    for unit in ["exitproof.service", "exitproof.socket"] {
        assert_eq!(
            one(unit, "Documentation"),
            env!("CARGO_PKG_REPOSITORY"),
            "{unit}"
        );
    }
}
