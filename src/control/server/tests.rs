use super::*;

#[test]
fn peers_are_allowed_by_own_uid_listed_uid_or_listed_gid() {
    const OWN: u32 = 1000;
    let options = |uids: &[u32], gids: &[u32]| ServerOptions {
        allowed_uids: uids.to_vec(),
        allowed_gids: gids.to_vec(),
        ..ServerOptions::default()
    };
    // (options, peer uid, peer gid, allowed)
    let cases = [
        (options(&[], &[]), OWN, 100, true),
        (options(&[], &[]), 0, 0, false),
        (options(&[], &[]), 65534, OWN, false),
        (options(&[65534], &[]), 65534, 65534, true),
        (options(&[65534], &[]), 65533, 65534, false),
        (options(&[], &[50]), 65534, 50, true),
        (options(&[], &[50]), 65534, 51, false),
        (options(&[7], &[50]), OWN, 1, true),
    ];
    for (options, uid, gid, allowed) in cases {
        assert_eq!(
            options.allows(OWN, uid, gid),
            allowed,
            "{options:?} {uid} {gid}"
        );
    }
}

#[test]
fn the_socket_directory_is_searchable_only_when_others_are_allowed() {
    let mut options = ServerOptions::default();
    assert_eq!(options.directory_mode(), 0o700);
    options.allowed_gids = vec![50];
    assert_eq!(options.directory_mode(), 0o711);
    options.allowed_gids.clear();
    options.allowed_uids = vec![65534];
    assert_eq!(options.directory_mode(), 0o711);
}
